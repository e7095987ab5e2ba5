"""Issue 11's rule for the non-test tree: a source file over 600 lines says at its top why it is
one file, so that a reader meets the reason before the length."""
from __future__ import annotations

import ast
import os

from tests.harness import REPO
from tests.unit.test_architecture_doc import _tracked

LIMIT = 600
REASON = "One file, over 600 lines, because"


def _long_sources() -> list[str]:
    found = []
    for path in _tracked():
        if not path.endswith(".py") or path.startswith("tests/") or path.endswith("_pb2.py"):
            continue
        full = os.path.join(REPO, path)
        if not os.path.isfile(full):
            continue
        with open(full, encoding="utf-8") as f:
            if sum(1 for _ in f) > LIMIT:
                found.append(path)
    return found


def test_the_check_sees_the_long_files() -> None:
    assert "workers/queue.py" in _long_sources()  # else the walk found nothing to check


def test_every_long_source_file_says_why_it_is_one_file() -> None:
    silent = []
    for path in _long_sources():
        with open(os.path.join(REPO, path), encoding="utf-8") as f:
            doc = ast.get_docstring(ast.parse(f.read(), path)) or ""
        if REASON not in " ".join(doc.split()):
            silent.append(path)
    assert not silent, f"over {LIMIT} lines without '{REASON} ...' in the module docstring: {silent}"
