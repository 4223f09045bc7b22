"""Every relative link in README.md and docs/*.md leads to a file that exists and, when it names a
section, to a heading of that file (as GitHub makes anchors of headings)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of the headings of ``path``: lower case, punctuation dropped, spaces to
    hyphens, a repeated heading numbered from -1."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
            continue
        heading = None if fence else re.match(r"^#{1,6} (.*)$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def test_anchor_rules() -> None:
    assert {"summary-what-is-fastest-where", "precisionauto-what-wins-on-which-cpu"} <= anchors(
        REPO / "docs" / "benchmarks.md"
    ) | anchors(REPO / "docs" / "benchmarks-notebook.md")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:
        file, _, anchor = target.partition("#")
        dest = doc.parent / file if file else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no such section")
    assert broken == []
