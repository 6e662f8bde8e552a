"""The README and docs/ point at what exists: every relative link names a file of the repository, and every
#anchor a heading of the page it names (GitHub's slugs)."""
import json
import re
import subprocess
from pathlib import Path

import pytest

from coderun.api.reasons import INFRASTRUCTURE_REASONS, ConditionType, Phase, Reason, StartMode

REPO = Path(__file__).parents[2]
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [REPO / "README.md", *DOCS, REPO / "charts" / "coderun" / "README.md"]


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
    assert [p.name for p in DOCS if f"](docs/{p.name})" not in readme] == []


def test_every_example_is_run_by_a_test():
    """A new file in examples/ fails here until e2e/test_examples.py runs it against the cluster, or (needing a
    model key) tests/frameworks drives it through a scripted model."""
    testers = [REPO / "e2e" / "test_examples.py", *sorted((REPO / "tests" / "frameworks").glob("*.py"))]
    mentioned = "\n".join(path.read_text() for path in testers)
    examples = sorted(path.name for path in (REPO / "examples").iterdir() if path.is_file())
    # By file name, or (tests/frameworks' loader) as example("stem").
    unrun = [name for name in examples if name not in mentioned and f'example("{Path(name).stem}")' not in mentioned]
    assert examples and unrun == []


def test_the_readmes_mcp_host_config_is_the_example():
    """The README says its MCP host configuration is examples/mcp-client-config.json, which e2e runs."""
    blocks = re.findall(r"```json\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    configs = [json.loads(block) for block in blocks if '"mcpServers"' in block]
    assert configs == [json.loads((REPO / "examples" / "mcp-client-config.json").read_text())]


def test_the_troubleshooting_page_names_only_real_reasons():
    """Every `CamelCase` word the page quotes is a phase, reason, condition or start mode of reasons.py, or one of
    the few other words it quotes (so it cannot name a reason that does not exist); every reason that says the
    platform failed has its entry."""
    known = {str(v) for enum in (Phase, Reason, ConditionType, StartMode) for v in enum}
    other = {"RunTimeout", "FailedCreatePodSandBox", "Enforce", "Record", "True", "False", "ResourceQuota",
             "LimitRange", "RuntimeClass", "CodeRunPlatformFailures"}
    quoted = set(re.findall(r"`([A-Z][A-Za-z]*[a-z][A-Za-z]*)`", (REPO / "docs" / "troubleshooting.md").read_text()))
    assert quoted - known - other == set()
    assert {str(r) for r in INFRASTRUCTURE_REASONS} - quoted == set()


def test_no_file_holds_a_merge_conflict_left_unresolved():
    """A conflict marker that slipped into a commit (once, in the README) fails here, not in a reader's eyes."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    marker = re.compile(r"^(<{7} |>{7} |={7}$)", re.MULTILINE)
    found = [name for name in tracked if (REPO / name).is_file() and not name.endswith((".png", ".tar", ".whl"))
             and marker.search((REPO / name).read_text(errors="replace"))]
    assert not found, found
