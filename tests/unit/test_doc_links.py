"""The docs' links into the repository lead somewhere: every relative link of README.md and
docs/*.md names a file that exists and, with a #fragment, a heading of that file (as GitHub
makes its anchors). And docs/benchmarks.md opens with the current figures."""
from __future__ import annotations

import re
from pathlib import Path

from tests.harness import REPO

ROOT = Path(REPO)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_BLOCK = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file: lower case, punctuation but
    `-` and `_` dropped, spaces as `-`; a repeated one gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for line in CODE_BLOCK.sub("", path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_relative_link_of_the_docs_leads_to_a_file_and_heading():
    broken = []
    for doc in DOCS:
        text = CODE_BLOCK.sub("", doc.read_text(encoding="utf-8"))
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, fragment = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and path.suffix == ".md" and fragment not in anchors(path):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_benchmarks_doc_opens_with_the_current_figures():
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    sections = re.split(r"^## ", text, flags=re.M)
    assert sections[1].startswith("Current figures\n"), "docs/benchmarks.md's first section: Current figures"
    current = sections[1]
    assert re.search(r"\b20\d\d-\d\d-\d\d\b", current), "the date of the figures"
    assert re.search(r"\bcommit [0-9a-f]{7,}\b", current), "the commit they were measured at"
    assert "python load/bench.py" in current, "the command"
    assert "AMD EPYC" in current and "core" in current, "the machine"
    assert len(re.findall(r"^\|.*\|$", current, flags=re.M)) >= 5, "the table"
    assert sections[2].startswith("How they are measured\n"), "then the method"
