"""Command-line options of the load scripts: the numeric ones are declared by their defaults."""

from __future__ import annotations

import argparse

Number = int | float


def number_options(doc: str | None, **options: Number | tuple[Number, str]) -> argparse.ArgumentParser:
    """A parser with one `--name value` option per keyword (underscores written as dashes), of
    the type of its default; a keyword is a default, or (default, help). --help prints `doc` and
    every default. The caller may add other options before parsing."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, option in options.items():
        default, text = option if isinstance(option, tuple) else (option, "")
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default,
                            help=f"{text} (default {default:,})".lstrip())
    return parser


def parse_numbers(doc: str | None, argv: list[str] | None, **options: Number | tuple[Number, str]) -> argparse.Namespace:
    """number_options(doc, **options), parsed from argv."""
    return number_options(doc, **options).parse_args(argv)
