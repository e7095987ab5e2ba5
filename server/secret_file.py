"""Files of secrets (config `auth_token_file`, `cluster_secret_file`): one secret per line, so
that a new one can stand beside the old one while it is rolled out. Blank lines and lines
starting with `#` are ignored; whitespace around a line is dropped. Also makes a new cluster
secret (`queue-server keygen`), without ZeroMQ, which the supervisor does not load."""
from __future__ import annotations

import os
import secrets

SECRET_BYTES = 32  # of a new cluster secret


def parse(text: bytes) -> list[bytes]:
    """The secrets in a file's content, in order, each once."""
    found: list[bytes] = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(b"#") and line not in found:
            found.append(line)
    return found


def read(path: str, key: str, what: str) -> list[bytes]:
    """The secrets (each a `what`) in `path`. ValueError with a one-line reason naming the config
    `key` if the file cannot be read or holds none."""
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"config key '{key}': cannot read {path}: {exc.strerror or exc}") from None
    found = parse(text)
    if not found:
        raise ValueError(f"config key '{key}': {path} holds no {what} (one per line; blank lines and # comments are ignored)")
    return found


def new_secret() -> str:
    """A fresh cluster secret, as the text a secret file holds."""
    return secrets.token_hex(SECRET_BYTES)


def write_secret(path: str, mode: int = 0o600) -> None:
    """Write a new secret to `path` (an existing file is not overwritten). OSError if it cannot."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(new_secret() + "\n")
        os.fchmod(f.fileno(), mode)


def read_secrets(path: str) -> list[bytes]:
    """The secrets in `path`, one per line, the one this node serves with first. ValueError with
    a one-line reason naming the config key if it cannot be read or a line is too short to be one."""
    secrets_ = read(path, "cluster_secret_file", "secret")
    for secret in secrets_:
        if len(secret) < 16:
            raise ValueError(f"config key 'cluster_secret_file': {path} holds a line that is no secret of at least "
                             f"16 characters (make one with: queue-server keygen --out {path})")
    return secrets_
