"""Files of secrets (config `auth_token_file`, `cluster_secret_file`): one secret per line, so
that a new one can stand beside the old one while it is rolled out. Blank lines and lines
starting with `#` are ignored; whitespace around a line is dropped."""
from __future__ import annotations


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
