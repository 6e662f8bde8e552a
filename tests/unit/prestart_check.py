"""What a pool or session pod's `--prestart` argument must be: settings the runner takes, under which the runs the
operator then sends it start in the prestarted process (prestart.fits), not cold."""
import json

from coderun.api.models import CodeRunSpec
from coderun.sandbox.runner.inputs import parse_run_spec
from coderun.sandbox.runner.prestart import fits, parse_settings
from coderun.sandbox.runner.protocol import can_prestart
from coderun_operator.builders import build_input_configmap
from coderun_operator.policy import Decision


def assert_prestarts_as_the_decision_runs(argument: str, decision: Decision) -> None:
    option, _, text = argument.partition("=")
    assert option == "--prestart"
    settings = parse_settings(text)
    assert can_prestart(settings) == (decision.runtime.language in ("python", "javascript"))
    spec = CodeRunSpec.model_validate({"language": decision.runtime.language, "code": "print(1)", "stdin": "x"})
    run = {"metadata": {"name": "r", "namespace": "ns", "uid": "u"}}
    run_json = json.loads(build_input_configmap(run, spec, decision)["data"]["run.json"])
    # Node takes no stdin fd from the runner: such a run starts cold; one without stdin uses it.
    assert fits(settings, parse_run_spec(run_json)) == (decision.runtime.language == "python")
    assert fits(settings, parse_run_spec({**run_json, "stdinKey": None}))
    # A run that sets a variable the interpreter reads as it starts cannot use it.
    for variable in ("PYTHONPATH", "NODE_OPTIONS"):
        assert not fits(settings, parse_run_spec({**run_json, "stdinKey": None, "env": {variable: "/x"}}))
