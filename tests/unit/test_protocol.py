"""Both sides of the runner protocol, spelt once: the builders' input ConfigMap goes through the runner's own
parser, and the operator reads the runner's constants instead of repeating them."""
import base64
import io
import json

from coderun.api.models import CodeRunSpec
from coderun.api.reasons import Reason
from coderun_operator.builders import build_input_configmap, warm_input
from coderun_operator.builders.objects import REDACTION_MARGIN_BYTES
from coderun_operator.data_plane import INPUT_REASONS
from coderun_operator.policy import DEFAULT_POLICY, evaluate
from coderun_operator.results import frame
from coderun.sandbox.runner import protocol
from coderun.sandbox.runner.inputs import load_run_spec, materialise_inputs, read_stdin_input


def test_the_builders_input_is_what_the_runner_parses_and_materialises(run_body, tmp_path):
    spec = CodeRunSpec.model_validate({
        "language": "python", "code": "print(open('data/in.csv').read())", "stdin": "hello",
        "files": [{"path": "data/in.csv", "content": "a,b\n1,2\n"},
                  {"path": "blob.bin", "contentBase64": base64.b64encode(b"\x00\xff").decode()}],
        "limits": {"timeoutSeconds": 7, "disk": "16Mi", "outputBytes": 4096}})
    decision = evaluate(spec, DEFAULT_POLICY)
    configmap = build_input_configmap(run_body(), spec, decision)
    input_dir, work_dir = tmp_path / "input", tmp_path / "work"
    input_dir.mkdir()
    for key, value in configmap["data"].items():
        (input_dir / key).write_text(value)
    for key, value in (configmap.get("binaryData") or {}).items():
        (input_dir / key).write_bytes(base64.b64decode(value))

    parsed = load_run_spec(str(input_dir))
    materialise_inputs(parsed, str(input_dir), str(work_dir))

    assert parsed["command"] == list(decision.runtime.command) and parsed["timeoutSeconds"] == 7
    assert parsed["outputBytes"] == 4096 + REDACTION_MARGIN_BYTES  # the margin the operator redacts within
    assert json.loads(configmap["data"]["run.json"])["diskBytes"] == 16 * 1024 * 1024
    assert (work_dir / "main.py").read_text() == spec.code
    assert (work_dir / "data/in.csv").read_text() == "a,b\n1,2\n"
    assert (work_dir / "blob.bin").read_bytes() == b"\x00\xff"
    assert (input_dir / parsed["stdinKey"]).read_text() == "hello"


def test_the_operator_speaks_the_runners_words():
    assert frame.PREFIX == protocol.FRAME_PREFIX
    runner_reasons = {value for name, value in vars(protocol).items()
                      if name.isupper() and isinstance(value, str) and value[:1].isupper() and value.isalpha()}
    assert runner_reasons == set(protocol.REASONS)  # every reason the protocol spells is one a frame can carry
    # InputIncomplete: a warm pod whose input broke off; the operator starts that run cold (warm.go_cold).
    # The data plane's input reasons (a frame's inputError) the operator words itself (data_plane.INPUT_REASONS).
    assert runner_reasons - {r.value for r in Reason} - INPUT_REASONS <= {"InvalidInput", "RunnerError",
                                                                         "InputIncomplete"}
    assert set(protocol.INPUT_REASONS) <= INPUT_REASONS


def test_a_warm_pods_input_is_the_input_configmap_with_a_nonce(run_body, tmp_path):
    """What the operator sends over attach is what the runner lays out as if the ConfigMap were mounted."""
    spec = CodeRunSpec.model_validate({
        "language": "python", "code": "print(1)", "stdin": "hello",
        "files": [{"path": "blob.bin", "contentBase64": base64.b64encode(b"\x00\xff").decode()}]})
    configmap = build_input_configmap(run_body(), spec, evaluate(spec, DEFAULT_POLICY))
    nonce = "ab" * 32
    stream = io.BytesIO(warm_input(configmap, nonce))

    assert read_stdin_input(stream, str(tmp_path / "input")) == nonce
    for key, value in configmap["data"].items():
        assert (tmp_path / "input" / key).read_text() == value
    assert (tmp_path / "input" / "file-0").read_bytes() == b"\x00\xff"
    assert stream.read() == b""  # exactly the announced length was read
