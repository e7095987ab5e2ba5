"""docs/architecture.md names files that exist: a newcomer follows it file by file, so a renamed or
removed file must fail here rather than leave the doc pointing at nothing."""
from __future__ import annotations

import os
import re
import subprocess

from tests.harness import REPO

DOC = os.path.join(REPO, "docs", "architecture.md")


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    if out:
        return out
    return [os.path.relpath(os.path.join(root, f), REPO) for root, _, files in os.walk(REPO) for f in files]


def test_every_file_the_architecture_doc_names_exists() -> None:
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    tracked = _tracked()
    missing = [p for p in sorted(set(re.findall(r"\b[\w.]+(?:/[\w.-]+)+\.(?:py|proto|md|toml)\b", doc)))
               if not os.path.isfile(os.path.join(REPO, p))]
    for name in sorted(set(re.findall(r"(?<![/\w])(\w+\.(?:py|proto))\b", doc))):
        if not any(t == name or t.endswith("/" + name) for t in tracked):
            missing.append(name)
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"
