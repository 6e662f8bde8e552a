"""The README and docs/ point at what exists: every relative link names a file of the repository, and every
#anchor a heading of the page it names (GitHub's slugs)."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose(page: Path) -> list[str]:
    """The page's lines outside code blocks."""
    lines, in_code = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code:
            lines.append(line)
    return lines


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_resolves(page):
    for line in prose(page):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.name}: {target}"
            if anchor and linked.suffix == ".md":
                headings = {slug(h.lstrip("#")) for h in prose(linked) if h.startswith("#")}
                assert anchor in headings, f"{page.name}: {target}"


def test_the_readme_indexes_every_docs_page():
    readme = (REPO / "README.md").read_text()
    assert [p.name for p in PAGES[1:] if f"](docs/{p.name})" not in readme] == []
