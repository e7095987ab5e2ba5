"""Command-line options of the load scripts whose settings are plain numbers."""

from __future__ import annotations

import argparse


def parse_numbers(doc: str | None, argv: list[str] | None, **defaults: float) -> argparse.Namespace:
    """Parse `--name value` options, one per keyword (its underscores written as dashes), each of
    the type of its default; --help prints `doc` and every default."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in defaults.items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default,
                            help=f"(default {default:,})")
    return parser.parse_args(argv)
