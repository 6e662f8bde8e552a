"""The committed CRD is exactly what the models generate, and the schema is one the API server accepts."""
from pathlib import Path

import pytest
import yaml

from coderun.api import crd, reference

CRD_DIR = Path(__file__).parents[2] / "crds"
REFERENCE = Path(__file__).parents[2] / "docs" / "reference.md"
CRD_FILE = CRD_DIR / "coderun.io_coderuns.yaml"


def _walk(schema, path="$"):
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def test_committed_crds_match_models():
    for name in crd.CRDS:
        assert (CRD_DIR / name).read_text() == crd.render(name), f"run `make crds` and commit crds/{name}"


def test_the_committed_reference_is_what_the_crds_make():
    assert REFERENCE.read_text() == reference.render(), "run `make crds` and commit docs/reference.md"


@pytest.mark.parametrize("title, generate", reference.KINDS)
def test_the_reference_has_a_described_row_for_every_field_of_the_crd(title, generate):
    schema = generate()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = {path.replace("$.", "", 1) for path, _ in _walk(schema) if path.count(".") >= 2}
    fields = {f for f in fields if not f.endswith("[]") and "{}" not in f}  # a list's items are its own row
    listed = {path: text for part in ("spec", "status") if part in schema["properties"]
              for path, _, text in reference.rows(schema["properties"][part], part)}
    assert set(listed) == fields, (title, set(listed) ^ fields)
    assert all(listed.values()), [path for path, text in listed.items() if not text]


def test_a_reference_row_says_the_type_and_the_bounds_the_api_server_enforces():
    text = REFERENCE.read_text()
    assert "| `spec.limits.timeoutSeconds` | integer | Wall-clock limit" in text and "(≥ 1; ≤ 3600) |" in text
    assert "| `spec.files[].path` | string |" in text and "(**required**; not empty; at most 255 characters)" in text
    assert '| `status.startMode` | `"Warm"` \\| `"Cold"` \\| `"Session"` |' in text


@pytest.mark.parametrize("generate", [crd.crd, crd.policy_crd, crd.session_crd],
                         ids=["coderun", "coderunpolicy", "coderunsession"])
def test_schema_is_structural(generate):
    schema = generate()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
        assert "type" in node, f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path


def test_every_status_field_the_issue_names_is_declared():
    status = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    for field in ["phase", "reason", "message", "exitCode", "stdout", "stderr", "stdoutTruncated",
                  "stderrTruncated", "error", "metrics", "artifacts", "validation", "codeHash", "image", "podName",
                  "startTime", "completionTime", "observedGeneration", "conditions"]:
        assert field in status, field
    assert set(status["metrics"]["properties"]) >= {"wallMillis", "cpuMillis", "maxRSSBytes", "queueMillis",
                                                    "startupMillis", "totalMillis"}
    assert set(status["artifacts"]["items"]["properties"]) >= {"name", "size", "sha256", "configMap"}


# The API server publishes these three itself, with ObjectMeta's and TypeMeta's descriptions.
_SERVED_BY_THE_API_SERVER = {"$.apiVersion", "$.kind", "$.metadata"}


@pytest.mark.parametrize("generate", [crd.crd, crd.policy_crd, crd.session_crd],
                         ids=["coderun", "coderunpolicy", "coderunsession"])
def test_kubectl_explain_describes_every_field(generate):
    schema = generate()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    walked = list(_walk(schema))
    assert any(path.startswith("$.status.conditions[].") for path, _ in walked) or "status" not in schema["properties"]
    undescribed = [path for path, node in walked if path != "$" and path not in _SERVED_BY_THE_API_SERVER
                   and not path.endswith("[]") and not path.endswith("{}") and not node.get("description")]
    assert undescribed == [], "describe these fields in the models (Field(description=...)), then `make crds`"


def test_spec_carries_cel_rules_and_printer_columns():
    version = crd.crd()["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [v["rule"] for v in spec["x-kubernetes-validations"]]
    assert "self == oldSelf" in rules
    assert any("786432" in r for r in rules)
    assert spec["properties"]["language"]["pattern"]
    assert spec["properties"]["code"]["maxLength"] == 128 * 1024
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]][:4] == ["Phase", "Reason", "Exit", "Duration-ms"]
    assert yaml.safe_load(CRD_FILE.read_text())["spec"]["names"]["shortNames"] == ["crun"]


def test_no_category_is_also_the_name_of_a_resource():
    """kubectl expands a category before it resolves a resource: a category spelled like a singular, plural or
    short name turns `kubectl get coderun NAME` into 'you must specify only one resource'."""
    definitions = [crd.crd(), crd.policy_crd(), crd.session_crd()]
    names = {n for d in definitions for n in (d["spec"]["names"]["singular"], d["spec"]["names"]["plural"],
                                              *d["spec"]["names"]["shortNames"], d["spec"]["names"]["kind"].lower())}
    categories = {c for d in definitions for c in d["spec"]["names"].get("categories", ())}
    assert categories and not categories & names, categories & names


def test_committed_admission_policies_match_identity_py():
    chart = CRD_DIR.parent / "charts" / "coderun"
    assert (CRD_DIR / crd.ADMISSION_POLICIES_FILE).read_text() == crd.render_admission_policies(), "run `make crds`"
    assert (chart / crd.ADMISSION_POLICIES_TEMPLATE).read_text() == crd.render_admission_policies(chart=True)
    kinds = [d["kind"] for d in yaml.safe_load_all((CRD_DIR / crd.ADMISSION_POLICIES_FILE).read_text()) if d]
    # ValidatingAdmissionPolicy only (GA since Kubernetes 1.30): nothing that needs a newer API server.
    assert kinds == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy",
                     "ValidatingAdmissionPolicyBinding"]
