import pytest


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
