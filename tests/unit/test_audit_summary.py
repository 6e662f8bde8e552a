"""A run's status.audit from the points gVisor's remote sink sends, built with gVisor's own classes: what the
program touched, apart from what the runner did, bounded however hostile the program."""
import errno
import os
import socket
import struct

import pytest

from coderun.audit import wire
from coderun.audit.points import syscall_pb2
from coderun.audit.summary import Bounds, RunAudit
from support.audit import (CID, CLONE_THREAD, HELPER, MT, NS_INIT, O_CREAT, O_TRUNC, O_WRONLY, PROGRAM, RUNNER, Sandbox,
                           inet)


def test_the_issues_program_gets_each_thing_it_did_attributed_to_it():
    sandbox = Sandbox().program_started()
    sandbox.open(PROGRAM, "data/visits.csv")
    sandbox.open(PROGRAM, "/usr/lib/python3.11/csv.py")
    sandbox.open(PROGRAM, "/etc/passwd", number=errno.EACCES)
    sandbox.socket(PROGRAM).connect(PROGRAM, inet("10.96.0.1", 443), errno.ETIMEDOUT)
    sandbox.clone(PROGRAM, 14).execve(14, ["sh", "-c", "curl https://example.com"])
    sandbox.failed_execve(14, "/usr/bin/curl").exit(14, code=127)
    sandbox.open(PROGRAM, "/tmp/outputs/plot.png", O_WRONLY | O_CREAT | O_TRUNC)
    sandbox.exit(PROGRAM, code=1)
    sandbox.open(NS_INIT, "/proc", cwd="/")                           # the namespace init counting processes
    sandbox.exit(NS_INIT).exit(HELPER, code=1).task_exit(RUNNER)
    audit = sandbox.summary()

    assert audit["source"] == "gvisor-trace" and audit["complete"] is True
    assert audit["filesRead"] == [{"path": "data/visits.csv", "count": 1}]
    assert audit["filesWritten"] == [{"path": "/tmp/outputs/plot.png", "count": 1}]
    assert audit["outsideWorkdir"] == {"reads": 2, "writes": 0, "denied": 1, "examples": ["/etc/passwd"]}
    assert audit["connectAttempts"] == [{"family": "inet", "address": "10.96.0.1", "port": 443,
                                         "result": "timedOut", "count": 1}]
    assert audit["socketsOpened"] == [{"family": "inet", "protocol": "tcp", "result": "created", "count": 1}]
    assert audit["processes"] == [{"argv": ["python3", "-u", "main.py"], "exitCode": 1},
                                  {"argv": ["sh", "-c", "curl https://example.com"], "exitCode": 127}]
    assert audit["counts"] == {"processes": 2, "failedExecs": 1, "connectAttempts": 1, "syscallsDenied": 1,
                               "openat2": 0, "addressedSends": 0, "pointsLost": 0, "pointsUnknown": 0}
    # The runner's input read, the preexec's write, the init's /proc and its two helpers: counted apart.
    assert audit["runner"] == {"filesRead": 2, "filesWritten": 1, "processes": 2}
    assert "omitted" not in audit


def test_a_program_that_does_nothing_gets_an_audit_that_says_so():
    audit = Sandbox().program_started(["python3", "-u", "main.py"]).exit(PROGRAM).task_exit(RUNNER).summary()
    assert audit["complete"] and audit["processes"] == [{"argv": ["python3", "-u", "main.py"], "exitCode": 0}]
    assert audit["filesRead"] == audit["filesWritten"] == audit["connectAttempts"] == []
    assert audit["outsideWorkdir"] == {"reads": 0, "writes": 0, "denied": 0, "examples": []}


def test_no_trace_of_the_container_is_never_an_empty_record():
    sandbox = Sandbox(container_id="pause").start().open(RUNNER, "/etc/passwd")
    audit = RunAudit(CID)
    for packet in sandbox.packets:
        audit.add(wire.decode_point(packet))
    assert audit.summary() == {"source": "gvisor-trace", "complete": False,
                               "message": "no trace of this container reached the audit agent"}


def test_other_containers_of_the_sandbox_are_not_the_runs():
    sandbox = Sandbox().program_started()
    sandbox.open(PROGRAM, "/etc/shadow", number=errno.EACCES)
    sandbox.send(syscall_pb2.Open(context_data=sandbox.context(1, container_id="pause"), pathname="/etc/hosts",
                                  fd=-100), MT.MESSAGE_SYSCALL_OPEN)
    assert Sandbox.summary(sandbox)["outsideWorkdir"]["examples"] == ["/etc/shadow"]


def test_complete_once_every_program_process_or_the_runner_itself_ended():
    sandbox = Sandbox().program_started().clone(PROGRAM, 14).exit(PROGRAM)
    assert sandbox.summary()["complete"] is False                     # its child has not ended yet
    sandbox.task_exit(RUNNER, tid=RUNNER + 100)                       # a runner thread, not the runner
    assert sandbox.summary()["complete"] is False
    assert sandbox.task_exit(14).summary()["complete"] is True        # a warm frame may come before the runner ends
    assert Sandbox().program_started().task_exit(RUNNER).summary()["complete"] is True
    assert Sandbox().start().summary()["complete"] is False           # no program yet: never "ended"


def test_a_flood_of_opens_is_bounded_and_says_what_it_left_out():
    sandbox = Sandbox().program_started()
    for n in range(3000):
        sandbox.open(PROGRAM, f"f{n}.txt")
        sandbox.open(PROGRAM, f"/etc/probe{n}", number=errno.ENOENT)
    audit = sandbox.summary()
    assert len(audit["filesRead"]) == 50 and audit["filesRead"][0] == {"path": "f0.txt", "count": 1}
    assert audit["omitted"] == {"filesRead": 2950, "outsideWorkdirExamples": 2990}
    assert audit["outsideWorkdir"]["reads"] == 3000 and len(audit["outsideWorkdir"]["examples"]) == 10


def test_the_tracked_keys_are_bounded_too_not_only_what_is_shown():
    sandbox = Sandbox().program_started()
    for n in range(300):
        sandbox.open(PROGRAM, f"f{n}.txt").connect(PROGRAM, inet("10.0.0.1", 1000 + n), errno.ECONNREFUSED)
    audit = sandbox.summary(bounds=Bounds(files=5, connects=5, tracked=100))
    assert len(audit["filesRead"]) == 5 and audit["omitted"]["filesRead"] == 295
    assert audit["counts"]["connectAttempts"] == 300 and audit["omitted"]["connectAttempts"] == 295


def test_control_characters_and_reordering_in_paths_and_argv_are_escaped():
    sandbox = Sandbox().program_started(["python3", "main.py\n\x1b[2Kfake line", "\u202eexe.txt"])
    sandbox.open(PROGRAM, "out\rput\x00.csv", O_WRONLY | O_CREAT)
    sandbox.open(PROGRAM, "/etc/pass\\wd\x7f", number=errno.EACCES)
    audit = sandbox.summary()
    assert audit["processes"][0]["argv"] == ["python3", "main.py\\x0a\\x1b[2Kfake line", "\\u202eexe.txt"]
    assert audit["filesWritten"][0]["path"] == "out\\x0dput\\x00.csv"
    assert audit["outsideWorkdir"]["examples"] == ["/etc/pass\\\\wd\\x7f"]


def test_long_paths_and_long_argv_are_cut():
    sandbox = Sandbox().program_started(["python3"] + [f"arg{n}" for n in range(40)] + ["x" * 1000])
    sandbox.open(PROGRAM, "d/" * 600 + "f")
    audit = sandbox.summary()
    assert len(audit["filesRead"][0]["path"]) == 512 and audit["filesRead"][0]["path"].endswith("…")
    assert len(audit["processes"][0]["argv"]) == 16 and audit["processes"][0]["argvOmitted"] == 26


def test_relative_paths_resolve_against_the_directory_fd_or_the_cwd_lexically():
    sandbox = Sandbox().program_started()
    sandbox.open(PROGRAM, "x.csv", fd=5, fd_path="/tmp/work/data")
    sandbox.open(PROGRAM, "../../etc/hosts")                          # from /tmp/work: outside
    sandbox.open(PROGRAM, "y.csv", fd=9, fd_path="[err: FD not found]")
    audit = sandbox.summary()
    assert audit["filesRead"] == [{"path": "data/x.csv", "count": 1}]
    assert audit["outsideWorkdir"]["examples"] == ["/etc/hosts", "y.csv"]


def test_failed_and_denied_opens_of_the_runs_files_are_counted_per_file():
    sandbox = Sandbox().program_started()
    sandbox.open(PROGRAM, "missing.csv", number=errno.ENOENT).open(PROGRAM, "ro.csv", O_WRONLY, errno.EROFS)
    audit = sandbox.summary()
    assert audit["filesRead"] == [{"path": "missing.csv", "count": 0, "failed": 1}]
    assert audit["filesWritten"] == [{"path": "ro.csv", "count": 0, "denied": 1}]
    assert audit["counts"]["syscallsDenied"] == 1


def test_processes_racing_the_exit_are_still_the_programs():
    sandbox = Sandbox().program_started()
    sandbox.clone(PROGRAM, PROGRAM, flags=CLONE_THREAD)               # a thread: not a process
    sandbox.clone(PROGRAM, 20).exit(PROGRAM, signal=9)
    sandbox.task_exit(RUNNER)                                         # the runner ended first ...
    sandbox.execve(20, ["sleep", "100"]).open(20, "/etc/hostname")    # ... points of the race come after
    sandbox.parents[21] = 99                                          # created where no point was seen
    sandbox.open(21, "/etc/passwd", number=errno.EACCES)
    audit = sandbox.summary()
    assert audit["processes"] == [{"argv": ["python3", "-u", "main.py"], "signal": "SIGKILL"},
                                  {"argv": ["sleep", "100"]},         # never seen ending: no exit claimed
                                  {"argv": []}]                       # of unknown origin: the program's
    assert audit["outsideWorkdir"]["examples"] == ["/etc/passwd", "/etc/hostname"]  # the denied one first
    assert audit["counts"]["processes"] == 3


def test_clone_parent_cannot_move_a_process_to_the_runners_side():
    sandbox = Sandbox().program_started()
    sandbox.clone(PROGRAM, 30)
    sandbox.parents[30] = NS_INIT                                     # CLONE_PARENT: the init is its parent
    sandbox.open(30, "/etc/passwd", number=errno.EACCES)
    audit = sandbox.summary()
    assert audit["outsideWorkdir"]["denied"] == 1 and audit["runner"]["filesRead"] == 1


def test_a_process_the_runner_forks_that_never_execs_stays_the_runners():
    sandbox = Sandbox().program_started()
    sandbox.clone(NS_INIT, 40).open(40, "/proc/40/status", cwd="/")
    audit = sandbox.summary()
    assert audit["counts"]["processes"] == 1 and audit["outsideWorkdir"]["reads"] == 0


def test_a_binary_run_from_memory_is_flagged():
    sandbox = Sandbox().program_started()
    sandbox.clone(PROGRAM, 50).execve(50, ["payload"], memfd=True)
    assert sandbox.summary()["processes"][1] == {"argv": ["payload"], "fromMemfd": True}


def test_sends_with_an_address_gvisor_does_not_record_and_openat2_are_counted():
    sandbox = Sandbox().program_started()
    sandbox.socket(PROGRAM, kind=socket.SOCK_DGRAM)
    sandbox.raw(PROGRAM, 44, arg5=0x7FFF0000, number=errno.ENETUNREACH)   # sendto with a destination
    sandbox.raw(PROGRAM, 44, arg5=0)                                       # send() on a connected socket
    sandbox.raw(PROGRAM, 46).raw(PROGRAM, 437)
    sandbox.raw(NS_INIT, 46)                                               # the runner's: not counted
    sandbox.socket(PROGRAM, socket.AF_PACKET, socket.SOCK_RAW, errno.EPERM)
    audit = sandbox.summary()
    assert audit["counts"]["addressedSends"] == 2 and audit["counts"]["openat2"] == 1
    assert audit["socketsOpened"] == [
        {"family": "inet", "protocol": "udp", "result": "created", "count": 1},
        {"family": "packet", "protocol": "packet", "result": "denied", "count": 1}]
    assert audit["counts"]["syscallsDenied"] == 1


def test_a_warm_pod_keeps_only_what_came_after_the_claim():
    sandbox = Sandbox().start().open(RUNNER, "/opt/coderun/main.py", cwd="/")
    sandbox.clone(RUNNER, 60)                                          # a runner thread pool, before the claim
    claim = sandbox.now + 1
    sandbox.open(RUNNER, "/coderun/stdin", cwd="/")
    sandbox.clone(RUNNER, HELPER).clone(HELPER, NS_INIT).clone(NS_INIT, PROGRAM)
    sandbox.execve(PROGRAM, ["python3", "-u", "main.py"]).open(PROGRAM, "data.csv")
    audit = sandbox.summary(since_ns=claim)
    assert audit["runner"] == {"filesRead": 1, "filesWritten": 0, "processes": 2}
    assert audit["filesRead"] == [{"path": "data.csv", "count": 1}]


def test_a_session_run_has_only_its_own_processes_and_is_complete_once_they_end():
    """A session's container ran earlier runs: their programs ended before this run's start and are not its own."""
    sandbox = Sandbox().program_started()
    sandbox.open(PROGRAM, "state.txt", flags=os.O_WRONLY | os.O_CREAT).exit(PROGRAM)
    since = sandbox.now + 1
    second = PROGRAM + 10
    sandbox.clone(NS_INIT, second).execve(second, ["python3", "-u", "main.py"]).open(second, "state.txt")
    audit = sandbox.summary(since_ns=since)
    assert audit["processes"] == [{"argv": ["python3", "-u", "main.py"]}] and audit["counts"]["processes"] == 1
    assert audit["filesRead"] == [{"path": "state.txt", "count": 1}] and audit["filesWritten"] == []
    assert not audit["complete"]  # the earlier run's ended program is not this one's end
    assert sandbox.exit(second).summary(since_ns=since)["complete"]


@pytest.mark.parametrize("bootstrap", [
    ["python3", "-u", "-c", "from coderun.sandbox.runner.prestarted import main"],
    ["node", "-r", "/opt/coderun/coderun/sandbox/runner/prestarted.js", "main.js"],
], ids=["python", "node"])
def test_a_prestarted_interpreter_is_the_runs_from_its_start_and_says_it_started_before(bootstrap):
    """A warm or session pod's interpreter, started (and its libraries read) before the run came: the run lists it,
    marked, with what it did from the run's start on; the earlier run's ended program is still not this one's."""
    sandbox = Sandbox().program_started()
    sandbox.exit(PROGRAM)                                                     # an earlier run's program, ended
    prestarted = PROGRAM + 10
    sandbox.clone(NS_INIT, prestarted).execve(prestarted, bootstrap).open(prestarted, "/usr/lib/numpy.py", cwd="/")
    since = sandbox.now + 1
    sandbox.open(prestarted, "data.csv")
    audit = sandbox.summary(since_ns=since)
    assert audit["processes"] == [{"argv": bootstrap, "startedBeforeRun": True}], audit["processes"]
    assert audit["filesRead"] == [{"path": "data.csv", "count": 1}] and audit["outsideWorkdir"]["reads"] == 0
    assert not audit["complete"] and sandbox.exit(prestarted).summary(since_ns=since)["complete"]


def test_points_lost_on_the_way_take_the_largest_counter_seen_and_never_a_decrease_as_a_wrap():
    """Concurrent writers deliver gVisor's cumulative drop counter out of order: a smaller one is an older packet
    (the cluster saw 77,309,472,059 lost when 2 ** 32 multiples were added for each decrease)."""
    sandbox = Sandbox().program_started()
    for dropped in (5, 3, 9, 8, 9, 2):
        sandbox.send(syscall_pb2.Open(context_data=sandbox.context(PROGRAM), pathname="a"),
                     MT.MESSAGE_SYSCALL_OPEN, dropped=dropped)
    sandbox.packets.append(struct.pack("<HHI", 8, 999, 4))           # a type this schema does not know
    sandbox.exit(PROGRAM).task_exit(RUNNER)
    audit = RunAudit(CID)
    for packet in sandbox.packets:
        audit.add(wire.decode_point(packet))
    summary = audit.summary()
    assert summary["counts"]["pointsLost"] == 9 and summary["counts"]["pointsUnknown"] == 1
    # Ended, but not whole: never complete, and the message says from when.
    assert summary["complete"] is False and "9 trace points were lost" in summary["message"]
    assert "1970-01-01T00:00:00.000Z" in summary["message"]  # the test's clock: 1,000 ns past the epoch
    audit.losses.add(7)                                               # the agent's own, on top
    assert audit.summary()["counts"]["pointsLost"] == 16


def test_without_a_loss_the_same_run_is_complete_and_says_nothing_of_losses():
    sandbox = Sandbox().program_started()
    sandbox.open(PROGRAM, "a").exit(PROGRAM).task_exit(RUNNER)
    summary = sandbox.summary()
    assert summary["complete"] is True and summary["counts"]["pointsLost"] == 0 and "message" not in summary


def test_a_loss_before_the_runs_start_is_not_the_runs():
    sandbox = Sandbox().start()
    sandbox.send(syscall_pb2.Open(context_data=sandbox.context(RUNNER), pathname="a"), MT.MESSAGE_SYSCALL_OPEN,
                 dropped=4)
    since = sandbox.now + 1
    sandbox.clone(RUNNER, HELPER).clone(HELPER, NS_INIT).clone(NS_INIT, PROGRAM).execve(PROGRAM, ["python3"])
    sandbox.exit(PROGRAM)
    assert sandbox.summary()["counts"]["pointsLost"] == 4
    later = sandbox.summary(since_ns=since)
    assert later["counts"]["pointsLost"] == 0 and later["complete"] is True


def test_execve_calls_without_an_errno_count_as_failed_unless_the_exec_follows():
    """Python's PATH search as the cluster recorded it: three calls for a missing wget, each without an errno, then
    the thread's end; and the shell's exec that worked (its call, then the exec itself)."""
    sandbox = Sandbox().program_started()
    sandbox.clone(PROGRAM, 14)
    for directory in ("/usr/local/bin", "/usr/bin", "/bin"):
        sandbox.execve_call(14, f"{directory}/wget")
    sandbox.task_exit(14, code=255).exit(14, code=255)
    sandbox.clone(PROGRAM, 15).execve_call(15, "/bin/sh").execve(15, ["sh", "-c", "true"])
    sandbox.exit(15).exit(PROGRAM).exit(NS_INIT).exit(HELPER).task_exit(RUNNER)
    audit = sandbox.summary()
    assert audit["counts"]["failedExecs"] == 3, audit["counts"]


def test_the_next_runs_interpreter_started_as_this_run_ended_is_not_this_runs():
    """A session's runner prestarts the next run's interpreter the moment a run's program ends: asked about the run
    after that, the agent lists the run's own program, complete, and not the next one's interpreter (alive)."""
    sandbox = Sandbox().start()
    since = sandbox.now + 1
    sandbox.clone(RUNNER, HELPER).clone(HELPER, NS_INIT).clone(NS_INIT, PROGRAM)
    sandbox.execve(PROGRAM, ["python3", "-u", "main.py"]).exit(PROGRAM)
    following = PROGRAM + 10
    bootstrap = ["python3", "-u", "-c", "import sys; from coderun.sandbox.runner.prestarted import main"]
    sandbox.clone(NS_INIT, following).execve(following, bootstrap)
    audit = sandbox.summary(since_ns=since)
    assert audit["processes"] == [{"argv": ["python3", "-u", "main.py"], "exitCode": 0}] and audit["complete"]


def test_a_process_the_program_starts_with_the_bootstrap_argv_is_still_the_programs():
    """Only the runner's side starts interpreters: a program cannot hide a child by giving it that command line."""
    sandbox = Sandbox().start()
    since = sandbox.now + 1
    sandbox.clone(RUNNER, HELPER).clone(HELPER, NS_INIT).clone(NS_INIT, PROGRAM)
    sandbox.execve(PROGRAM, ["python3", "-u", "main.py"])
    disguised = PROGRAM + 20
    bootstrap = ["python3", "-u", "-c", "import sys; from coderun.sandbox.runner.prestarted import main"]
    sandbox.clone(PROGRAM, disguised).exit(PROGRAM).execve(disguised, bootstrap)
    audit = sandbox.summary(since_ns=since)
    assert [p["argv"] for p in audit["processes"]] == [["python3", "-u", "main.py"], bootstrap], audit


def test_the_prestarted_interpreter_is_marked_by_what_it_is_whatever_the_clocks_say():
    """The run's start (the operator's clock) can fall before the interpreter's start (the Sentry's) when a session's
    runs come back to back: it is still the run's prestarted interpreter, and marked so."""
    sandbox = Sandbox().start()
    since = sandbox.now - 1_000_000  # the operator's stamp, a millisecond behind the sandbox's clock
    bootstrap = ["python3", "-u", "-c", "import sys; from coderun.sandbox.runner.prestarted import main"]
    sandbox.clone(RUNNER, HELPER).clone(HELPER, NS_INIT).clone(NS_INIT, PROGRAM).execve(PROGRAM, bootstrap)
    audit = sandbox.summary(since_ns=since)
    assert audit["processes"] == [{"argv": bootstrap, "startedBeforeRun": True}], audit["processes"]


FORK_SERVER_BOOTSTRAP = ["python3", "-u", "-c",
                         "import sys; from coderun.sandbox.runner.prestarted import main; main('/opt', serve_forks=True)"]


def test_a_session_fork_servers_programs_are_the_runs_and_the_server_is_the_runners():
    """The fork server (the runner's own child, exec'ing the marked bootstrap) forks each run's program through the
    mirror and the namespace's init: the program is the run's from its clone on, marked as started before the run;
    the server and its helpers are the runner's; the next run's fork, made as this run ended, is not this run's."""
    sandbox = Sandbox().start()
    server, mirror, init = RUNNER + 100, RUNNER + 101, RUNNER + 102
    sandbox.clone(RUNNER, server).execve(server, FORK_SERVER_BOOTSTRAP).open(server, "/usr/lib/python3/json.py")
    sandbox.clone(server, mirror).clone(mirror, init).clone(init, PROGRAM)
    since = sandbox.now + 1
    sandbox.open(PROGRAM, "data.csv")
    sandbox.clone(PROGRAM, PROGRAM + 1).execve(PROGRAM + 1, ["ls"]).exit(PROGRAM + 1).exit(PROGRAM)
    sandbox.clone(server, mirror + 10).clone(mirror + 10, init + 10).clone(init + 10, PROGRAM + 10)
    audit = sandbox.summary(since_ns=since)
    assert audit["processes"] == [{"argv": FORK_SERVER_BOOTSTRAP, "startedBeforeRun": True, "exitCode": 0},
                                  {"argv": ["ls"], "exitCode": 0}], audit["processes"]
    assert audit["filesRead"] == [{"path": "data.csv", "count": 1}] and audit["complete"]


def test_a_program_cannot_pass_for_the_fork_server():
    """Only the runner's own child exec'ing the marked bootstrap is the server: a program exec'ing it, or a helper
    of the runner's that is not its direct child, is the program's, and so is everything it forks."""
    sandbox = Sandbox().start()
    sandbox.clone(RUNNER, HELPER).clone(HELPER, NS_INIT).clone(NS_INIT, PROGRAM)
    since = sandbox.now + 1
    sandbox.execve(PROGRAM, FORK_SERVER_BOOTSTRAP)
    for forked in (PROGRAM + 1, PROGRAM + 2, PROGRAM + 3):
        sandbox.clone(forked - 1, forked)
    sandbox.open(PROGRAM + 3, "secret.txt")
    audit = sandbox.summary(since_ns=since)
    assert len(audit["processes"]) == 4 and audit["filesRead"] == [{"path": "secret.txt", "count": 1}], audit


def test_a_fork_servers_program_whose_clone_was_lost_is_still_the_programs():
    """The point of the init's fork was dropped on the way: the program, first seen by what it does, is still the
    program's (a lost point never hides a process as the runner's)."""
    sandbox = Sandbox().start()
    server, mirror, init = RUNNER + 100, RUNNER + 101, RUNNER + 102
    sandbox.clone(RUNNER, server).execve(server, FORK_SERVER_BOOTSTRAP)
    sandbox.clone(server, mirror).clone(mirror, init)
    since = sandbox.now + 1
    sandbox.parents[PROGRAM] = init  # its clone's point never came; its own points name its parent
    sandbox.open(PROGRAM, "data.csv")
    audit = sandbox.summary(since_ns=since)
    assert audit["filesRead"] == [{"path": "data.csv", "count": 1}], audit


@pytest.mark.parametrize("routine_spent", [False, True], ids=["room", "routine-share-spent"])
def test_a_session_run_asked_after_the_fold_counts_none_of_an_earlier_runs_files_even_with_the_budget_spent(
        routine_spent):
    """The agent folds with no start known (since 0) and is asked later from a run's start: the quiet gap between
    a session's runs starts a segment, also when the sandbox's routine share is spent (a segment refused for room
    made a later run count every earlier run's files)."""
    sandbox = Sandbox().program_started()
    sandbox.open(PROGRAM, "data/in.txt").exit(PROGRAM)
    sandbox.now += 2_000_000_000                                              # between two runs of the session
    since = sandbox.now + 1
    second = PROGRAM + 10
    sandbox.clone(NS_INIT, second).execve(second, ["python3", "-u", "main.py"]).open(second, "other.txt")
    charged = []
    audit = RunAudit(CID, charge=lambda size, reserved: charged.append(reserved) or reserved or not routine_spent)
    for packet in sandbox.packets:
        audit.add(wire.decode_point(packet))
    assert audit.summary(since)["filesRead"] == [{"path": "other.txt", "count": 1}]
    assert audit.summary(0)["filesRead"] == [{"path": "data/in.txt", "count": 1}, {"path": "other.txt", "count": 1}]
    assert False in charged  # the routine share was asked (and, in the second case, refused)


@pytest.mark.parametrize("with_marker", [True, False], ids=["run-json", "no-marker"])
def test_a_long_quiet_session_run_never_blurs_its_start_with_the_earlier_runs(with_marker):
    """A session run that spins (no points of its own) while the runner looks at /proc every 200 ms makes a segment
    a look: past the cap the oldest merge, and a run's start merged into an earlier run's counted that run's files
    (e2e test_session's timeout run read data/in.txt). The runner's run.json starts each run's segment, which no
    merge folds into the one before it."""
    sandbox = Sandbox().program_started()
    sandbox.exit(PROGRAM)
    sandbox.now += 1_000_000_000
    earlier = PROGRAM + 5                                                       # an earlier run of the session
    sandbox.clone(NS_INIT, earlier).execve(earlier, ["python3", "-u", "main.py"])
    sandbox.open(earlier, "data/in.txt").exit(earlier)
    for _ in range(3):                                                          # its quiet stretches
        sandbox.now += 300_000_000
        sandbox.open(RUNNER, "/proc/2/stat", cwd="/")
    sandbox.now += 2_000_000_000
    since = sandbox.now + 1
    if with_marker:
        sandbox.open(RUNNER, "/coderun/input/run.json", flags=O_WRONLY | O_CREAT, cwd="/")
    second = PROGRAM + 10
    sandbox.clone(NS_INIT, second).execve(second, ["python3", "-u", "main.py"]).open(second, "main.py")
    for _ in range(12):                                                         # while True: pass, for 2.4 s
        sandbox.now += 200_000_000
        sandbox.open(RUNNER, "/proc/2/stat", cwd="/")
    audit = RunAudit(CID)
    for packet in sandbox.packets:
        audit.add(wire.decode_point(packet))
    read = audit.summary(since)["filesRead"]
    if with_marker:
        assert read == [{"path": "main.py", "count": 1}], read
    else:  # the positive control: without the runner's mark the merge blurs the start, as it did
        assert {"path": "data/in.txt", "count": 1} in read, read
