"""kubectl as the README writes it: get, describe, wait, annotate, explain, delete, with the resource names a
person types (`coderun`, `coderuns`, `crun`, `coderunpolicy`). (`make demo` itself runs in `make test`.)"""
import pytest

from conftest import REPO

EXAMPLE = REPO / "examples" / "coderun.yaml"
POLICY = """apiVersion: coderun.io/v1alpha1
kind: CodeRunPolicy
metadata:
  name: default
spec:
  admission: Record
"""


@pytest.fixture
def kubectl(operator, namespace):
    return lambda *args, **kw: operator.kubectl("-n", namespace, *args, **kw)


def test_every_name_of_a_coderun_resolves_to_one_resource(kubectl):
    """`kubectl get coderun NAME` (the singular) once failed with 'you must specify only one resource' because a
    category was spelled like it; every spelling a person types must name exactly one resource."""
    kubectl("apply", "-f", "-", input=POLICY)
    kubectl("apply", "-f", str(EXAMPLE))
    for resource in ("coderun", "coderuns", "crun", "coderuns.coderun.io", "coderun.coderun.io"):
        got = kubectl("get", resource, "conversion-rate", "-o", "name")
        assert got.stdout.strip() == "coderun.coderun.io/conversion-rate", (resource, got.stdout)
    for resource in ("coderunpolicy", "coderunpolicies", "crpol"):
        got = kubectl("get", resource, "default", "-o", "name", check=False)
        assert got.returncode == 0 and got.stdout.strip() == "coderunpolicy.coderun.io/default", \
            (resource, got.stdout, got.stderr)
    both = kubectl("get", "coderun-all", "-o", "name").stdout.split()
    assert sorted(both) == ["coderun.coderun.io/conversion-rate", "coderunpolicy.coderun.io/default"]


def test_wait_describe_annotate_explain_and_delete_as_the_readme_writes_them(kubectl):
    kubectl("apply", "-f", str(EXAMPLE))
    waited = kubectl("wait", "--for=condition=Finished", "crun/conversion-rate", "--timeout=120s", check=False)
    assert waited.returncode == 0, waited.stderr
    assert kubectl("wait", "--for=jsonpath={.status.phase}=Succeeded", "coderun/conversion-rate",
                   "--timeout=10s").returncode == 0
    assert kubectl("wait", "--for=condition=Complete", "crun/conversion-rate", "--timeout=10s").returncode == 0
    row = kubectl("get", "coderun", "conversion-rate").stdout.splitlines()
    assert row[0].split()[:3] == ["NAME", "PHASE", "REASON"] and row[1].split()[:3] == \
        ["conversion-rate", "Succeeded", "Completed"]
    described = kubectl("describe", "coderun", "conversion-rate").stdout
    assert "Phase:" in described and "Succeeded" in described and "Conditions:" in described
    kubectl("annotate", "coderun", "conversion-rate", "team=analytics")
    got = kubectl("get", "coderun", "conversion-rate", "-o", "jsonpath={.metadata.annotations.team}")
    assert got.stdout == "analytics"
    explained = kubectl("explain", "coderun.spec.limits").stdout
    assert "timeoutSeconds" in explained and "memory" in explained
    assert "Finished" in kubectl("explain", "coderun.status.conditions").stdout  # every status field is described
    kubectl("delete", "coderun", "conversion-rate", "--wait=true", "--timeout=60s")
    assert kubectl("get", "coderun", "-o", "name").stdout.strip() == ""


def test_delete_all_coderuns_leaves_the_namespaces_policies(kubectl):
    """`kubectl delete coderun --all` deletes runs, never the policies beside them (it once did, through the
    category that shared the singular's name)."""
    kubectl("apply", "-f", "-", input=POLICY)
    kubectl("apply", "-f", str(EXAMPLE))
    deleted = kubectl("delete", "coderun", "--all", "--wait=true", "--timeout=60s").stdout
    assert "coderunpolicy" not in deleted
    assert kubectl("get", "coderunpolicy", "-o", "name").stdout.split() == ["coderunpolicy.coderun.io/default"]



FAILING = """apiVersion: coderun.io/v1alpha1
kind: CodeRun
metadata:
  name: divide
spec:
  language: python
  code: print(1 / 0)
"""


def test_kubectl_wait_for_finished_returns_on_a_failed_run_too(kubectl):
    """`kubectl wait --for=condition=Complete` never returns for a run that failed; Finished is True on every
    outcome, so one wait serves any run (docs/api.md, Waiting with kubectl)."""
    kubectl("apply", "-f", "-", input=FAILING)
    waited = kubectl("wait", "--for=condition=Finished", "crun/divide", "--timeout=120s", check=False)
    assert waited.returncode == 0, waited.stderr
    ended = kubectl("get", "crun", "divide", "-o", "jsonpath={.status.phase}/{.status.reason}").stdout
    assert ended == "Failed/NonZeroExit"
    failed = kubectl("get", "crun", "divide", "-o", "jsonpath={.status.conditions[?(@.type=='Failed')].status}")
    assert failed.stdout == "True"
    # Complete stays absent: a wait on it runs out (a second is enough: the run has already ended).
    assert kubectl("wait", "--for=condition=Complete", "crun/divide", "--timeout=1s", check=False).returncode != 0
