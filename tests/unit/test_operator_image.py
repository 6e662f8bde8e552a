"""The operator image is reproducible: its dependencies are pinned in operator/requirements.txt."""
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).parents[2]


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_operator_image_lock_pins_every_dependency():
    """operator/requirements.txt (make operator-lock) pins each requirement the image installs."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["operator"]
    pinned = {normal(line.split("==")[0]) for line in (REPO / "operator" / "requirements.txt").read_text().splitlines()
              if "==" in line and not line.startswith("#")}
    missing = [r for r in wanted if normal(re.split(r"[<>=!~\[ ;]", r)[0]) not in pinned]
    assert not missing, f"not pinned in operator/requirements.txt (run make operator-lock): {missing}"
