"""The installed queue-server's version, as `--version` of each command (queue-server, queue-cli,
queue-cluster) prints it. It imports nothing of the project, so every layer may use it."""
from __future__ import annotations

import argparse
from importlib import metadata


def version() -> str:
    """The installed queue-server's version ("unknown (not installed)" when it is not installed)."""
    try:
        return metadata.version("queue-server")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def add_version_option(parser: argparse.ArgumentParser) -> None:
    """`--version`: print "<the parser's prog> <version>" and exit 0."""
    parser.add_argument("--version", action="version", version=f"{parser.prog} {version()}")
