"""Where a client program finds the cluster's client token (the nodes' auth_token_file)."""
from __future__ import annotations

import os

ENV = "QUEUE_TOKEN"


def load_token(path: str | None = None) -> str | None:
    """The token in the file `path` (whitespace around it dropped), else the QUEUE_TOKEN
    environment variable, else None (no authentication). OSError if the file cannot be read."""
    if path:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    return os.environ.get(ENV) or None
