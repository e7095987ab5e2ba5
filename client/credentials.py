"""Where a client program finds the cluster's client token (the nodes' auth_token_file)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Union

ENV = "QUEUE_TOKEN"


def load_token(path: str | None = None) -> str | None:
    """The token in the file `path` (whitespace around it dropped), else the QUEUE_TOKEN
    environment variable, else None (no authentication). OSError if the file cannot be read."""
    if path:
        return TokenFile(path).read()
    return os.environ.get(ENV) or None


@dataclass(frozen=True)
class TokenFile:
    """The token named by its file instead of held: a client made with token=TokenFile(path)
    reads it when it is made, and a pickled one carries the path, not the token, and reads the
    file again where it is unpickled (a Spark executor, a multiprocessing worker)."""

    path: str

    def read(self) -> str | None:
        """The token in the file, as load_token reads it; OSError if the file cannot be read."""
        with open(self.path, encoding="utf-8") as f:
            return f.read().strip() or None


TokenOption = Union[str, TokenFile, None]


def token_of(option: TokenOption) -> str | None:
    """The token a client presents for its `token=` option."""
    return option.read() if isinstance(option, TokenFile) else option
