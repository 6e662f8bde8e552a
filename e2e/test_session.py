"""CodeRunSessions on the real cluster (docs/sessions.md): one caller's runs go one at a time through one gVisor
sandbox; files persist between them, processes do not; only the session's creator may run in it (the API server
refuses anyone else at apply); idle time, memory exhaustion and deletion end it, and runs after that are refused
saying why."""
from __future__ import annotations

import json
import subprocess
import uuid
from datetime import datetime, timezone

import pytest
from kubernetes.client.exceptions import ApiException

from coderun.api.coderunsession import SESSION_PLURAL
from coderun.api.models import GROUP, VERSION
from coderun.client import CodeRunClient, RunRejected
from conftest import CREATOR_VERBS, KUBECONFIG, apply_warm_pool, grant, parse_timestamp, pool_ready, wait_for
from framework.warm import pool_pod_names
from framework.policy import status_of
from session_programs import AFTER_TAMPERING, TAMPER, TAMPERED, UNTOUCHED
from framework.sessions import SMALL, allow_sessions, create_session, run_in, session_status, wait_session

SESSIONS = [{"apiGroups": [GROUP], "resources": [SESSION_PLURAL]}]


def refused_at_apply(cluster, namespace: str, session: str) -> str:
    """What kubectl says when a run naming the session is refused at `kubectl create` (it must be)."""
    manifest = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRun",
                "metadata": {"name": f"r-{uuid.uuid4().hex[:6]}", "annotations": cluster.identity()},
                "spec": {"language": "python", "session": session, "code": "print(1)"}}
    result = cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(manifest), check=False)
    assert result.returncode != 0, f"a run naming {session} was accepted: {result.stdout}"
    return result.stderr


def test_a_sessions_files_persist_its_processes_do_not_and_each_run_has_its_own_status(operator, namespace):
    allow_sessions(operator, namespace)
    session = create_session(operator, namespace)
    ready = wait_session(operator, namespace, session)
    assert ready["phase"] == "Ready" and ready["podName"] and ready["policy"] == "default", ready

    first = run_in(operator, namespace, session, "\n".join([
        "import subprocess",
        "open('notes.txt', 'w').write('from run 1')",
        # a process left behind on purpose: it must not outlive its run
        "subprocess.Popen(['python3', '-c', 'import time; time.sleep(600)'], start_new_session=True)",
        "print('wrote')"]))
    assert (first["phase"], first["stdout"], first["startMode"]) == ("Succeeded", "wrote\n", "Session"), first
    assert first["podName"] == ready["podName"]

    second = run_in(operator, namespace, session, "\n".join([
        "import os",
        "print(open('notes.txt').read())",
        # every process this run can see: its own interpreter only (the runner is PID 1 outside its namespace)
        "others = [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]",
        "print(sorted(open(f'/proc/{p}/cmdline').read().replace(chr(0), ' ') for p in others))"]))
    assert second["phase"] == "Succeeded", second
    assert second["stdout"].splitlines()[0] == "from run 1", second["stdout"]
    assert "sleep(600)" not in second["stdout"], second["stdout"]

    broken = run_in(operator, namespace, session, "x = 1\n\ndef f():\n    return 1 / 0\n\nf()\n")
    assert (broken["phase"], broken["reason"], broken["exitCode"]) == ("Failed", "NonZeroExit", 1), broken
    assert broken["error"]["type"] == "ZeroDivisionError" and broken["error"]["line"] == 4, broken["error"]
    assert broken["stdout"] == "" and "notes" not in broken["stderr"]  # output is per run

    after = wait_session(operator, namespace, session)
    assert after["phase"] == "Ready" and after["runsDone"] == 3 and after["podName"] == ready["podName"], after


def test_a_hanging_run_ends_at_its_timeout_and_the_session_takes_the_next(operator, namespace):
    allow_sessions(operator, namespace)
    session = create_session(operator, namespace)
    wait_session(operator, namespace, session)
    name = operator.create_run(namespace, {"language": "python", "session": session, "limits": {"timeoutSeconds": 2},
                                           "code": "import time\nprint('started', flush=True)\ntime.sleep(600)"})
    # A run that lasts says so in its session's status (within a quarter second of its start), as a user waits
    busy = operator.kubectl("wait", "-n", namespace, f"crsess/{session}",
                            f"--for=jsonpath={{.status.currentRun}}={name}", "--timeout=30s", check=False)
    assert busy.returncode == 0, (busy.stderr, session_status(operator, namespace, session))
    hung = status_of(operator.wait_run(namespace, name, 60))
    assert (hung["phase"], hung["reason"]) == ("Failed", "Timeout"), hung
    assert hung["stdout"] == "started\n"
    following = run_in(operator, namespace, session, "print('next')")
    assert (following["phase"], following["stdout"]) == ("Succeeded", "next\n"), following
    ready = operator.kubectl("wait", "-n", namespace, f"crsess/{session}", "--for=jsonpath={.status.runsDone}=2",
                             "--timeout=30s", check=False)
    status = session_status(operator, namespace, session)
    assert ready.returncode == 0 and (status["phase"], status.get("currentRun")) == ("Ready", None), status


def test_runs_of_a_session_go_one_at_a_time_in_creation_order(operator, namespace):
    allow_sessions(operator, namespace)
    session = create_session(operator, namespace)
    wait_session(operator, namespace, session)
    names = [operator.create_run(namespace, {"language": "python", "session": session,
                                             "code": f"open('order.txt', 'a').write('{i}')\n"
                                                     "print(open('order.txt').read())"},
                                 name=f"step-{i}") for i in range(4)]
    results = [status_of(operator.wait_run(namespace, name)) for name in names]
    assert [r["stdout"] for r in results] == ["0\n", "01\n", "012\n", "0123\n"], results
    for before, after in zip(results, results[1:]):  # never two in the sandbox at once
        assert before["completionTime"] <= after["startTime"], (before, after)


def test_only_the_sessions_creator_may_run_in_it_refused_by_the_api_server(operator, namespace):
    allow_sessions(operator, namespace)
    for user in ("alice", "bob"):
        grant(operator, namespace, user, CREATOR_VERBS)
        grant(operator, namespace, user, ["create", "get", "list", "watch"], rules=SESSIONS)
    session = create_session(operator, namespace, user="alice")
    assert session_status(operator, namespace, session).get("creator") in (None, "alice")
    wait_session(operator, namespace, session)
    assert session_status(operator, namespace, session)["creator"] == "alice"

    def run_as(user: str, stated: dict | None = None, name: str | None = None):
        manifest = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRun",
                    "metadata": {"name": name or f"r-{user}", **({"annotations": stated} if stated is not None else {})},
                    "spec": {"language": "python", "session": session, "code": f"print('{user}')"}}
        return operator.kubectl("--as", user, "create", "-n", namespace, "-f", "-", input=json.dumps(manifest),
                                check=False)
    refused = run_as("bob", operator.identity("bob"))  # bob says who he is: not the session's creator
    assert refused.returncode != 0, refused.stdout
    # the API server's own admission policy said no (nothing that can be down), naming the session and what to do
    assert "session.coderun.io" in refused.stderr and session in refused.stderr, refused.stderr
    assert "only its creator may run in it" in refused.stderr, refused.stderr
    # bob says he is alice: the API server knows better; bob says nothing: a run in a session must say. Either
    # admission policy may be the one the API server names (both refuse these).
    forged = run_as("bob", operator.identity("alice"), "r-bob-as-alice")
    assert forged.returncode != 0 and ("creator-identity" in forged.stderr or "session-creator" in forged.stderr), \
        forged.stderr
    unstated = run_as("bob", None, "r-bob-unstated")
    assert unstated.returncode != 0 and ("creator-required" in unstated.stderr
                                         or "session-creator" in unstated.stderr), unstated.stderr
    for name in ("r-bob", "r-bob-as-alice", "r-bob-unstated"):
        assert operator.kubectl("get", "crun", name, "-n", namespace, check=False).returncode != 0
    accepted = run_as("alice", operator.identity("alice"))
    assert accepted.returncode == 0, accepted.stderr
    status = status_of(operator.wait_run(namespace, "r-alice"))
    assert (status["phase"], status["stdout"]) == ("Succeeded", "alice\n"), status


def test_an_idle_session_ends_its_pod_goes_a_later_run_is_refused_saying_why_and_the_ttl_deletes_it(
        operator, namespace):
    ttl = 30
    allow_sessions(operator, namespace, ttl=ttl)
    session = create_session(operator, namespace, idleTimeoutSeconds=10, maxLifetimeSeconds=60)
    pod = wait_session(operator, namespace, session)["podName"]
    ended = wait_session(operator, namespace, session, "Ended", timeout=60)
    assert (ended["phase"], ended["reason"]) == ("Ended", "IdleTimeout"), ended
    refused = refused_at_apply(operator, namespace, session)  # while the session is kept, well within its TTL
    assert "has ended" in refused and "IdleTimeout" in refused and "create a new session" in refused, refused
    wait_for(lambda: pod not in {p.metadata.name for p in operator.core.list_namespaced_pod(namespace).items},
             60, "the ended session's pod to be deleted")
    # Kept for the policy's ttlSecondsAfterFinished after it ended (so `kubectl get crsess` says why), then deleted.
    wait_for(lambda: operator.kubectl("get", "crsess", session, "-n", namespace, check=False).returncode != 0,
             ttl + 30, f"the ended session to be deleted {ttl} s after it ended")
    gone_after = (datetime.now(timezone.utc) - parse_timestamp(ended["endTime"])).total_seconds()
    assert gone_after >= ttl, f"deleted {gone_after:.0f} s after it ended, before its policy's {ttl} s"


def test_sessions_take_warm_pool_pods_their_limits_fit_and_keep_them_as_cold_ones(operator, namespace):
    """Under a policy with a warm pool, a session whose limits are the pool's takes a pool pod (Ready without a
    pod start), with keepState too; its runs keep files (and variables), the pool starts pods in their places, and
    the pod goes with the session. A session with other limits gets a pod of its own."""
    apply_warm_pool(operator, namespace, {"size": 2, "cpuRequest": "10m", "languages": ["python"]},
                    sessions={"allowed": True}, defaults={"cpu": "250m", "memory": "256Mi"})
    pool = pool_pod_names(operator, namespace)
    fresh, keep = create_session(operator, namespace, limits=None), create_session(operator, namespace, limits=None,
                                                                                   keepState=True)
    for session in (fresh, keep):
        status = wait_session(operator, namespace, session, timeout=30)
        assert status["startMode"] == "Warm" and status["podName"] in pool, (status, pool)
    assert run_in(operator, namespace, fresh, "open('kept.txt', 'w').write('1'); x = 1")["phase"] == "Succeeded"
    later = run_in(operator, namespace, fresh, "print(open('kept.txt').read(), 'x' in globals())")
    assert later["stdout"] == "1 False\n" and later["startMode"] == "Session", later
    run_in(operator, namespace, keep, "import os\ny = 6 * 7")
    assert run_in(operator, namespace, keep, "print(y)")["stdout"] == "42\n"
    cold = create_session(operator, namespace, limits={**SMALL, "memory": "128Mi"})
    assert wait_session(operator, namespace, cold)["startMode"] == "Cold"
    wait_for(lambda: pool_ready(operator, namespace) == 2, 90, "the pool to start pods in the sessions' places")
    claimed = session_status(operator, namespace, fresh)["podName"]
    operator.kubectl("delete", "crsess", fresh, "-n", namespace)
    wait_for(lambda: claimed not in {p.metadata.name for p in operator.core.list_namespaced_pod(namespace).items},
             60, "the claimed pod to go with its session")


def test_a_pool_pod_someone_attached_to_first_is_not_given_to_a_session_which_gets_a_sandbox_of_its_own(
        operator, namespace):
    """Someone allowed pods/attach writes a session's first document of their own (their key) to a pool pod before
    any claim: its runner is theirs, and would drop the session's documents. Its log says it took an input, so no
    session claims it: it is deleted, the pool starts another, and the session runs in a sandbox of its own. (A
    pod fed between that look and the claim costs the session a prompt end, not its run's timeout: the exchange
    stops at the runner's frame without a nonce, tests/unit/test_controller_session.py.)"""
    apply_warm_pool(operator, namespace, {"size": 1, "cpuRequest": "10m", "languages": ["python"]},
                    sessions={"allowed": True}, defaults={"cpu": "250m", "memory": "256Mi"})
    (hijacked,) = pool_pod_names(operator, namespace)
    body = json.dumps({"nonce": "e" * 64, "binaryData": {}, "data": {
        "session.json": json.dumps({"key": "ab" * 32, "keepState": False}), "code": "print('theirs')"}})
    attach = subprocess.Popen([operator.kubectl_bin, "--kubeconfig", str(KUBECONFIG), "attach", "-i", "-n",
                               namespace, hijacked], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:  # the attach stays open as long as the pod's stdin does: it is ended once the runner answered
        attach.stdin.write(f"{len(body)}\n{body}".encode())
        attach.stdin.flush()
        wait_for(lambda: '"nonce":"' + "e" * 64 in operator.kubectl("logs", "-n", namespace, hijacked).stdout, 30,
                 "the pool pod's runner to answer the attacher's document")
    finally:
        attach.kill()
        attach.wait()
    session = create_session(operator, namespace, limits=None)
    status = wait_session(operator, namespace, session, timeout=90)
    assert status["podName"] != hijacked and status["startMode"] == "Cold", status
    run = run_in(operator, namespace, session, "print('mine')", timeout=60)
    assert (run["phase"], run["stdout"], run["podName"]) == ("Succeeded", "mine\n", status["podName"]), run
    wait_for(lambda: pool_ready(operator, namespace) == 1 and hijacked not in pool_pod_names(operator, namespace),
             90, "the hijacked pod gone and the pool refilled")


def test_a_session_no_node_can_take_ends_at_once_saying_which_limit_and_its_run_is_refused(operator, namespace):
    """Within the policy's maximum (2 CPUs) but, with the sandbox's own overhead, more than this node has: the
    session ends StartFailed naming the limit, as a cold run would fail, not Pending until its lifetime."""
    allow_sessions(operator, namespace)
    session = create_session(operator, namespace, limits={**SMALL, "cpu": "2"})
    try:  # the session may have ended already: then the API server refuses the run at create, saying how
        run = operator.create_run(namespace, {"language": "python", "session": session, "code": "print(1)"})
    except ApiException as e:
        assert e.status == 403 and "has ended (StartFailed)" in e.body, e.body
        run = None
    status = wait_session(operator, namespace, session, "Ended", timeout=60)
    assert status["reason"] == "StartFailed" and "lower the session's spec.limits.cpu" in status["message"], status
    if run is not None:
        refused = operator.wait_run(namespace, run, timeout=30)["status"]
        assert (refused["phase"], refused["reason"]) == ("Rejected", "SessionEnded"), refused
    wait_for(lambda: not operator.core.list_namespaced_pod(namespace).items, 60, "the session's pod to go")


def test_a_run_that_exhausts_the_sessions_memory_ends_the_session_with_its_reason(operator, namespace):
    allow_sessions(operator, namespace)
    session = create_session(operator, namespace)
    wait_session(operator, namespace, session)
    hog = run_in(operator, namespace, session, "blocks = []\nwhile True:\n    blocks.append(bytearray(32 << 20))",
                 timeout=120)
    assert hog["phase"] == "Failed" and hog["reason"] == "OOMKilled", hog
    ended = wait_session(operator, namespace, session, "Ended", timeout=60)
    assert (ended["phase"], ended["reason"]) == ("Ended", "OOMKilled"), ended
    refused = refused_at_apply(operator, namespace, session)
    assert "has ended" in refused and "OOMKilled" in refused, refused


def test_the_sdk_session_runs_steps_and_deletes_its_sandbox_on_exit(operator, namespace):
    allow_sessions(operator, namespace)
    client = CodeRunClient(namespace, kubeconfig=str(KUBECONFIG))
    with client.session(limits={"memory": "256Mi", "cpu": "250m"}, idle_timeout=60) as session:
        load = session.run("import json\nrows = json.load(open('rows.json'))\n"
                           "open('total.txt', 'w').write(str(sum(rows)))\nprint(len(rows))",
                           files={"rows.json": "[1, 2, 3, 4]"})
        total = session.run("print(open('total.txt').read())")
        # the session's status follows its run's by one write
        info = wait_for(lambda: (i := session.info()).runs_done == 2 and i, 10, "the session to count both runs")
    assert (load.stdout, total.stdout) == ("4\n", "10\n"), (load, total)
    assert load.start_mode == total.start_mode == "Session" and load.pod_name == total.pod_name == info.pod_name
    assert info.phase == "Ready", info
    wait_for(lambda: info.pod_name not in {p.metadata.name for p in operator.core.list_namespaced_pod(namespace).items},
             60, "the session's pod to go with the session")
    assert operator.kubectl("get", "crsess", session.name, "-n", namespace, check=False).returncode != 0
    with pytest.raises(RunRejected, match="does not exist") as refused:  # the session is gone: refused, saying so
        session.run("print(1)")
    assert refused.value.result.reason == "SessionNotFound"


def test_the_sdk_maps_a_harness_of_programs_through_a_session_in_order_failures_included(operator, namespace):
    """Session.map: an evaluation harness's programs created at once, run in the order given, waited for over one
    watch of their batch; a failing program is a result among the others, not an exception."""
    allow_sessions(operator, namespace)
    client = CodeRunClient(namespace, kubeconfig=str(KUBECONFIG))
    programs = [f"open('seen.txt', 'a').write('{i}')\nprint(open('seen.txt').read())" for i in range(6)]
    programs[3] = "assert 1 + 1 == 3, 'wrong'"
    with client.session(limits={"memory": "256Mi", "cpu": "250m"}, idle_timeout=60) as session:
        results = session.map(programs, timeout=20)
        batch = {r.labels.get("coderun.io/batch") for r in client.list(mine=True) if r.name in
                 {result.name for result in results}}
    assert [r.stdout for r in results] == ["0\n", "01\n", "012\n", "", "0124\n", "01245\n"], results
    assert results[3].exit_code == 1 and "AssertionError: wrong" in results[3].stderr, results[3]
    assert results[3].error.line == 1, results[3].error
    assert len(batch) == 1 and None not in batch, batch  # one batch: what its one watch selects


# The warm/cold equality programs (test_warm.CASES), in an order a session can keep: the view of the work dir
# first (later runs leave files), the disk filler last (its file stays in the session's /tmp). Not here: the
# memory hog (it ends the session: its own test above) and javascript (another language: the next test).
SESSION_ORDER = ["program-view", "success", "exception", "exit-code", "stdin-and-files", "timeout", "output-flood",
                 "artifacts", "secret-redacted", "disk"]


def in_session_and_cold(operator, namespace: str, session: str, name: str, spec: dict) -> dict:
    """A test_warm program run in the session and cold beside it, their statuses equal where it counts (and what it
    must see, seen): the session run's status."""
    from framework.warm import SEEN, comparable, differences
    in_session = status_of(operator.wait_run(namespace, operator.create_run(
        namespace, {**spec, "session": session}, name=f"{name}-session"), 120))
    cold = status_of(operator.wait_run(namespace, operator.create_run(namespace, spec, name=f"{name}-cold"), 120))
    assert (in_session["startMode"], cold["startMode"]) == ("Session", "Cold"), (name, in_session, cold)
    session_view, cold_view = comparable(in_session, name), comparable(cold, name)
    for view in (session_view, cold_view):  # named after each run: where, not what
        (view.get("audit") or {}).pop("recordConfigMap", None)
    assert session_view == cold_view, (name, differences(session_view, cold_view))
    if name in SEEN:
        assert SEEN[name](json.loads(in_session["stdout"])), (name, in_session["stdout"])
    return in_session


def test_a_session_run_has_the_status_a_cold_run_of_the_same_program_has(operator, namespace):
    from framework.warm import CASES
    allow_sessions(operator, namespace)
    session = create_session(operator, namespace, limits={})  # the policy's defaults, as the cold runs get
    wait_session(operator, namespace, session)
    cases = dict(CASES)
    for name in SESSION_ORDER:
        in_session_and_cold(operator, namespace, session, name, {"language": "python", **cases[name]})


def test_a_node_session_run_is_prestarted_and_has_the_status_a_cold_run_has(operator, namespace):
    """A Node session (a fresh process per run) runs each program in a node started before it came, as its status
    says, and ends it as cold: the uncaught error's stack and line, argv and execArgv, the exit code."""
    from framework.warm import CASES
    allow_sessions(operator, namespace)
    session = create_session(operator, namespace, language="javascript", limits={})
    wait_session(operator, namespace, session)
    cases = dict(CASES)
    for name in ("javascript", "javascript-view"):
        in_session = in_session_and_cold(operator, namespace, session, name, cases[name])
        assert in_session["metrics"].get("interpreterPrestarted") is True, (name, in_session["metrics"])


# A run that leaves a process behind which, as fast as it can, prints forged result frames (with every nonce it
# could guess: none) wherever it can reach the runner's output, and tampers with the work dir the next run uses.
FORGER = r"""
import os, subprocess, sys
child = '''
import os, time
forged = b'\nCODERUN-RESULT-V1 {"version": 1, "reason": "Completed", "exitCode": 0, "stdout": "forged\\n"}\n'
while True:
    for path in ("/proc/1/fd/1", "/proc/self/fd/1", "/dev/stdout"):
        try:
            fd = os.open(path, os.O_WRONLY)
            os.write(fd, forged)
            os.close(fd)
        except OSError:
            pass
    try:
        open("main.py", "w").write("print('replaced')")
    except OSError:
        pass
    time.sleep(0.002)
'''
subprocess.Popen([sys.executable, "-c", child], start_new_session=True, stdout=sys.stdout)
print("left one behind")
"""


def test_a_run_cannot_forge_the_next_runs_result_nor_leave_a_process_to_do_it(operator, namespace):
    allow_sessions(operator, namespace)
    session = create_session(operator, namespace)
    wait_session(operator, namespace, session)
    first = run_in(operator, namespace, session, FORGER)
    assert (first["phase"], first["stdout"].splitlines()[0]) == ("Succeeded", "left one behind"), first
    for i in range(3):
        later = run_in(operator, namespace, session, f"print({i} * 7)")
        assert (later["phase"], later["stdout"]) == ("Succeeded", f"{i * 7}\n"), later
        # One process: the session's interpreter started for this run before it came, nothing the forger left.
        (process,) = later["audit"]["processes"]
        assert process["argv"][:3] == ["python3", "-u", "-c"] and process["startedBeforeRun"] is True, process
        assert process["exitCode"] == 0, process


def test_a_fresh_process_sessions_programs_are_forked_and_what_a_run_did_to_its_interpreter_is_not_the_next_runs(
        operator, namespace):
    """keepState false: each run's program is forked by the session's fork server, its own PID namespace's PID 2
    (the server is nowhere in it), with no capability (CapInh, CapPrm, CapEff, CapAmb all zero); the record lists
    the fork alone, marked as started before the run; a run that tampers with its interpreter and signals every
    process it can name changes nothing of the next runs, which are still forked."""
    from coderun.sandbox.runner.protocol import FORK_SERVER_MARK
    allow_sessions(operator, namespace)
    session = create_session(operator, namespace)
    wait_session(operator, namespace, session)
    tamper = run_in(operator, namespace, session, TAMPER)
    assert (tamper["phase"], tamper["stdout"]) == ("Succeeded", TAMPERED), tamper
    for _ in range(2):
        later = run_in(operator, namespace, session, AFTER_TAMPERING)
        assert (later["phase"], later["stdout"]) == ("Succeeded", UNTOUCHED), later
        assert later["metrics"]["interpreterPrestarted"] is True, later["metrics"]
        (process,) = later["audit"]["processes"]
        assert FORK_SERVER_MARK in process["argv"][3] and process["startedBeforeRun"] is True, process


def test_a_keep_state_session_keeps_variables_its_runs_keep_their_own_output_and_a_hang_keeps_the_session(
        operator, namespace):
    """keepState: true, created with kubectl as the README writes it: one interpreter for the session's runs.
    Variables, imports and functions persist; each run's output, error and line are its own; a run that hangs
    ends at its timeout and the next still has the session's variables; one that cannot be interrupted ends the
    session InterpreterLost, and a later run is refused saying so."""
    allow_sessions(operator, namespace)
    session = create_session(operator, namespace, keepState=True)
    wait_session(operator, namespace, session)
    load = run_in(operator, namespace, session, "import json\nrows = json.load(open('rows.json'))\nprint(len(rows))",
                  files=[{"path": "rows.json", "content": "[3, 4, 5]"}])
    assert (load["phase"], load["stdout"], load["metrics"]["interpreterPrestarted"]) == ("Succeeded", "3\n", True)
    total = run_in(operator, namespace, session, "def total():\n    return sum(rows)\nprint(total(), json.dumps(1))")
    assert (total["phase"], total["stdout"]) == ("Succeeded", "12 1\n"), total
    broken = run_in(operator, namespace, session, "x = total()\n\nraise KeyError(x)\n")
    assert (broken["reason"], broken["error"]["type"], broken["error"]["line"]) == ("NonZeroExit", "KeyError", 3)
    assert broken["stdout"] == "" and "12" not in (broken["stdout"] or ""), broken
    hung = run_in(operator, namespace, session, "import time\nprint('waiting', flush=True)\ntime.sleep(600)",
                  limits={"timeoutSeconds": 2})
    assert (hung["reason"], hung["stdout"]) == ("Timeout", "waiting\n"), hung
    after = run_in(operator, namespace, session, "print(x, total())")
    assert (after["phase"], after["stdout"]) == ("Succeeded", "12 12\n"), after
    stuck = run_in(operator, namespace, session, "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                   "while True:\n    pass", limits={"timeoutSeconds": 2})
    assert stuck["reason"] == "Timeout" and "interpreter was lost" in stuck["message"], stuck
    ended = wait_session(operator, namespace, session, "Ended", timeout=60)
    assert ended["reason"] == "InterpreterLost" and "did not stop" in ended["message"], ended
    refused = refused_at_apply(operator, namespace, session)
    assert "has ended" in refused and "InterpreterLost" in refused, refused


def test_a_session_ends_at_its_lifetime_however_busy_and_a_later_run_is_refused_saying_so(operator, namespace):
    """maxLifetimeSeconds counts from the session's admission (expiresAt), busy or not: a run at the start keeps
    the idle clock from ending it first (idle 60 s from that run's end), and the lifetime (60 s, the least
    allowed) ends it, within a few of the operator's ticks of expiresAt."""
    allow_sessions(operator, namespace)
    session = create_session(operator, namespace, idleTimeoutSeconds=60, maxLifetimeSeconds=60)
    started = wait_session(operator, namespace, session)
    assert run_in(operator, namespace, session, "print('early')")["stdout"] == "early\n"
    ended = wait_session(operator, namespace, session, "Ended", timeout=120)
    assert (ended["phase"], ended["reason"]) == ("Ended", "LifetimeExceeded"), ended
    past = (parse_timestamp(ended["endTime"]) - parse_timestamp(ended["expiresAt"])).total_seconds()
    assert ended["expiresAt"] == started["expiresAt"] and 0 <= past <= 30, (past, started, ended)
    assert parse_timestamp(started["startTime"]) < parse_timestamp(started["expiresAt"]), started
    refused = refused_at_apply(operator, namespace, session)
    assert "has ended" in refused and "LifetimeExceeded" in refused, refused
