import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]


@pytest.fixture
def run_body():
    """A CodeRun as the API server hands it to the operator."""
    def make(spec: dict | None = None, name: str = "demo", **meta):
        return {
            "apiVersion": "coderun.io/v1alpha1", "kind": "CodeRun",
            "metadata": {"name": name, "namespace": "team-a", "uid": "0a1b2c3d-0000-4000-8000-000000000001",
                         "generation": 1, "creationTimestamp": "2026-11-22T10:00:00Z", **meta},
            "spec": spec or {"language": "python", "code": "print(6*7)"},
        }
    return make


@pytest.fixture(scope="session")
def helm() -> str:
    """The real helm, built into the cache like the cluster's binaries (the chart's tests and the packaged chart's)."""
    found = subprocess.run(["bash", "-c", "source e2e/cluster/versions.sh && echo $CODERUN_CACHE/bin/helm-$HELM_VERSION"
                            "/helm"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    if not Path(found).exists():  # `make test-unit` builds it first; a bare pytest builds it here (cached after)
        subprocess.run(["bash", "e2e/cluster/build-binaries.sh", "helm"], cwd=REPO, check=True)
    return found
