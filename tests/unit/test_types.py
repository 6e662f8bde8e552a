"""The types the code states hold: mypy as pyproject.toml's [tool.mypy] configures it (strict on the operator and
the API models), and the operator's API seam (kube_api.KubeApi) satisfied by both the real module and the fake."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    # A subprocess, as lint-imports runs in test_layout: mypy reads the source tree as it is, with its own cache
    # (pyproject's cache_dir, outside the checkout) so a warm run takes seconds.
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_the_code_type_checks():
    checked = mypy()
    assert checked.returncode == 0, checked.stdout[-8000:] + checked.stderr[-2000:]
    assert checked.stdout.startswith("Success: no issues found"), checked.stdout


def test_a_fake_that_drifts_from_the_api_seam_is_found(tmp_path):
    # The positive control of the check above: a stand-in missing one call of the seam, and one with another
    # signature, are each refused by the same typing-only assignment fake_k8s.py ends with.
    drifted = tmp_path / "drifted_fake.py"
    drifted.write_text(
        "from fake_k8s import FakeK8s\n"
        "from coderun_operator.kube_api import KubeApi\n"
        "class Missing(FakeK8s):\n"
        "    nodes = None  # type: ignore[assignment]\n"
        "class Changed(FakeK8s):\n"
        "    def delete_run(self, namespace: str, name: str, uid: int) -> None: ...  # type: ignore[override]\n"
        "missing: KubeApi = Missing()\n"
        "changed: KubeApi = Changed()\n"
        "kept: KubeApi = FakeK8s()\n")
    checked = mypy(str(drifted))
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in errors] == ["7", "8"], checked.stdout
    assert all('variable has type "KubeApi"' in line for line in errors), checked.stdout
