"""`coderun-operator` embeds kopf with kopf.run (no rewritten sys.argv): this package's handlers, every namespace,
standalone, the liveness endpoint, and kopf's logging flags."""
import json
import logging
import sys

import kopf
import pytest

from coderun import extras
from coderun_operator import command, main


@pytest.mark.parametrize("argv, verbose", [([], False), (["--verbose"], True)])
def test_the_entry_point_runs_kopf_everywhere_standalone_with_a_liveness_endpoint(monkeypatch, argv, verbose):
    ran, configured = [], []
    monkeypatch.setattr(kopf, "run", lambda **options: ran.append(options))
    monkeypatch.setattr(kopf, "configure", lambda **flags: configured.append(flags))
    monkeypatch.setattr(sys, "argv", ["coderun-operator", *argv])
    monkeypatch.delenv("CODERUN_LEADER_ELECTION", raising=False)
    monkeypatch.setenv("CODERUN_LIVENESS", "http://0.0.0.0:8080/healthz")
    main.main()
    assert ran == [{"clusterwide": True, "standalone": True, "liveness_endpoint": "http://0.0.0.0:8080/healthz"}]
    # log_prefix None: kopf prefixes its lines about an object with namespace/name, as `kopf run` did.
    assert configured == [{"verbose": verbose, "debug": False, "quiet": False, "log_format": kopf.LogFormat.FULL,
                           "log_prefix": None, "log_refkey": None}]
    handlers = {h.fn for h in kopf.get_default_registry()._watching.get_all_handlers()}
    assert {main.handlers.run_changed, main.handlers.pod_changed, main.handlers.policy_changed} <= handlers


def test_unknown_arguments_are_refused_with_usage(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["coderun-operator", "--no-such-flag"])
    with pytest.raises(SystemExit) as exit_:
        main.main()
    assert exit_.value.code == 2 and "usage: coderun-operator" in capsys.readouterr().err


def test_kopfs_logging_flags_pass_through(monkeypatch):
    configured = []
    monkeypatch.setattr(kopf, "run", lambda **options: None)
    monkeypatch.setattr(kopf, "configure", lambda **flags: configured.append(flags))
    monkeypatch.setattr(sys, "argv", ["coderun-operator", "--log-format", "json", "--no-log-prefix",
                                      "--log-refkey", "k8s"])
    monkeypatch.delenv("CODERUN_LEADER_ELECTION", raising=False)
    main.main()
    assert configured[0]["log_format"] == kopf.LogFormat.JSON
    assert (configured[0]["log_prefix"], configured[0]["log_refkey"]) == (False, "k8s")


def test_with_the_operator_extra_installed_an_import_error_is_not_disguised_as_a_missing_extra(monkeypatch):
    """The missing-extra line is for a light install (tests/unit/test_packaging.py runs one); here every requirement
    of the extra is installed, so a broken import keeps its traceback."""
    assert extras.missing_requirements("operator") == []
    monkeypatch.setitem(sys.modules, "coderun_operator.main", None)  # importing it raises ModuleNotFoundError
    with pytest.raises(ModuleNotFoundError):
        command.main()


def test_a_standbys_lines_take_the_chosen_log_format_too(monkeypatch, capsys):
    """With leader election (the chart's mode) the lines before kopf runs, a standby's waiting among them, are
    JSON when --log-format json asks for it: a log pipeline parses every line of every replica."""
    class Elector:
        def __init__(self, *args, **kwargs):
            pass

        def acquire(self):
            logging.getLogger("coderun.leader").info("waiting for the Lease")

        renew_forever = release = lambda self: None

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))  # kopf.configure replaces them; restored after
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(kopf, "run", lambda **options: None)
    monkeypatch.setattr(main.metrics, "serve", lambda *args, **kwargs: None)
    monkeypatch.setattr(main.health, "serve", lambda *args: None)
    monkeypatch.setattr(main.leader, "mark_own_pod", lambda *args, **kwargs: None)
    monkeypatch.setattr(main.leader, "LeaderElector", Elector)
    monkeypatch.setattr(main.signal, "signal", lambda *args: None)
    monkeypatch.setattr(sys, "argv", ["coderun-operator", "--log-format", "json"])
    for name, value in {"CODERUN_LEADER_ELECTION": "true", "POD_NAMESPACE": "coderun-system", "POD_NAME": "op-0"}.items():
        monkeypatch.setenv(name, value)
    main.main()
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [line["message"] for line in lines if line["message"].startswith("waiting")] == ["waiting for the Lease"]
