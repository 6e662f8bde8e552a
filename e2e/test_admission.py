"""Bad specs are refused by the real API server at `kubectl apply`, with a message that names the field."""
import json

import pytest
import yaml

from coderun.api.models import GROUP, PLURAL, VERSION


def manifest(spec: dict, name: str = "bad") -> str:
    return yaml.safe_dump({"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRun",
                           "metadata": {"name": name}, "spec": spec})


BASE = {"language": "python", "code": "print(1)"}

REFUSED = [
    ("wrong type", {**BASE, "limits": {"timeoutSeconds": "five"}}, "spec.limits.timeoutSeconds"),
    ("unknown field", {**BASE, "priviledged": True}, 'unknown field "spec.priviledged"'),
    ("oversize code", {**BASE, "code": "x" * (128 * 1024 + 1)}, "spec.code"),
    ("timeout out of range", {**BASE, "limits": {"timeoutSeconds": 99999}}, "spec.limits.timeoutSeconds"),
    ("memory out of range", {**BASE, "limits": {"memory": "100Gi"}}, "spec.limits.memory"),
    ("cpu not a quantity", {**BASE, "limits": {"cpu": "lots"}}, "spec.limits.cpu"),
    ("path traversal", {**BASE, "files": [{"path": "../../etc/cron.d/x", "content": "boom"}]},
     "spec.files[0].path"),
    ("absolute path", {**BASE, "files": [{"path": "/etc/passwd", "content": "boom"}]}, "spec.files[0].path"),
    ("both contents", {**BASE, "files": [{"path": "a", "content": "x", "contentBase64": "eA=="}]},
     "exactly one of content or contentBase64"),
    ("duplicate paths", {**BASE, "files": [{"path": "a", "content": "1"}, {"path": "a", "content": "2"}]},
     "file paths must be unique"),
    ("bad language", {**BASE, "language": "Python 3!"}, "spec.language"),
    ("missing code", {"language": "python"}, "spec.code"),
]


@pytest.mark.parametrize("spec,field", [(s, f) for _, s, f in REFUSED], ids=[c for c, _, _ in REFUSED])
def test_kubectl_apply_refuses_bad_spec_naming_the_field(operator, namespace, spec, field):
    result = operator.kubectl("apply", "-n", namespace, "-f", "-", input=manifest(spec), check=False)
    assert result.returncode != 0, "the API server accepted a bad spec"
    assert field in result.stderr, result.stderr
    assert not operator.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]


def test_spec_is_immutable_once_created(operator, namespace):
    operator.kubectl("apply", "-n", namespace, "-f", "-", input=manifest(BASE, name="fixed"))
    patch = json.dumps({"spec": {"code": "print(2)"}})
    result = operator.kubectl("patch", "crun", "fixed", "-n", namespace, "--type", "merge", "-p", patch, check=False)
    assert result.returncode != 0 and "spec is immutable" in result.stderr, result.stderr


def test_explain_documents_the_fields(operator):
    result = operator.kubectl("explain", "crun.spec.limits")
    assert "timeoutSeconds" in result.stdout and "OOMKilled" in result.stdout
