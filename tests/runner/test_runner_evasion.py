"""Programs that try to get round the runner's own limits: disk hidden where a naive walk does not look,
processes that change identity faster than a kill loop, a file killed at the size limit. Some run as an
unprivileged uid (as_nobody), as in the pod, where the runner has no root override of file modes."""
from __future__ import annotations

import os
import signal
import textwrap

import pytest

from support.runner import assert_nothing_after_the_frame

MIB = 1024 * 1024


def program(source: str) -> str:
    return textwrap.dedent(source).lstrip()


# Fills the scratch dir (TMPDIR) with files each well under the disk limit, so that no single write fails and
# only the runner's walk can see the total, then waits: the run must end on the limit long before the timeout.
HIDE_AND_FILL = """
import os, time
os.chdir(os.environ["TMPDIR"])
held = []
{hide}
print("ready", flush=True)
for i in range(8):
    with open(f"f{{i}}", "wb") as f:
        f.write(b"x" * (1024 * 1024))
    {per_file}
time.sleep(30)
"""

HIDING_PLACES = [
    pytest.param("", "pass", id="in-plain-sight"),
    pytest.param(  # a path longer than PATH_MAX: scandir() by path fails there
        "for _ in range(24):\n    os.mkdir('d' * 250)\n    os.chdir('d' * 250)", "pass", id="beyond-PATH_MAX"),
    pytest.param(  # deeper than the walk holds directories open
        "for _ in range(200):\n    os.mkdir('d')\n    os.chdir('d')", "pass", id="deeper-than-held-dirs"),
    pytest.param(  # deleted while open: the blocks stay allocated, no directory entry names them
        "", "held.append(open(f'f{i}', 'rb')); os.unlink(f'f{i}')", id="unlinked-but-open"),
]


@pytest.mark.parametrize("hide, per_file", HIDING_PLACES)
def test_disk_use_cannot_hide_from_the_walk(run_runner, hide, per_file):
    run = run_runner(program(HIDE_AND_FILL.format(hide=hide, per_file=per_file)), diskBytes=4 * MIB,
                     timeoutSeconds=30)
    assert run.frame["stdout"] == "ready\n", run.frame  # the hiding place was made
    assert run.frame["reason"] == "DiskLimitExceeded" and run.frame["limit"]["kind"] == "disk"
    assert run.frame["limit"]["observed"] > 4 * MIB
    assert run.frame["metrics"]["wallMillis"] < 2500  # seen by the walk within a few checks, not at the timeout


@pytest.mark.parametrize("mode", [0o000, 0o300, 0o600], ids=["no-access", "no-read", "no-search"])
def test_a_directory_made_unreadable_cannot_hide_disk_use(as_nobody, mode):
    # With write and search but no read (0o300) the files go in after the door is shut; the others are shut
    # after the files are in (a check in between sees them anyway, and the run ends the same way).
    run, drop = as_nobody
    code = program(f"""
        import os, time
        os.chdir(os.environ["TMPDIR"])
        os.makedirs("hidden/inner")
        shut_first = {mode:#o} == 0o300
        if shut_first:
            os.chmod("hidden", {mode:#o})
        print("ready", flush=True)
        for i in range(8):
            with open(f"hidden/inner/f{{i}}", "wb") as f:
                f.write(b"x" * (1024 * 1024))
        if not shut_first:
            os.chmod("hidden/inner", {mode:#o})
            os.chmod("hidden", {mode:#o})
        time.sleep(30)
    """)
    result = run(code, wrapper=drop, diskBytes=4 * MIB, timeoutSeconds=30)
    assert result.frame["stdout"] == "ready\n", result.frame
    assert result.frame["reason"] == "DiskLimitExceeded" and result.frame["limit"]["kind"] == "disk"
    assert result.frame["metrics"]["wallMillis"] < 2500


def test_hard_links_and_symlinks_are_not_counted_twice(run_runner):
    code = program("""
        import os
        os.chdir(os.environ["TMPDIR"])
        with open("big", "wb") as f:
            f.write(b"x" * (3 * 1024 * 1024))
        for i in range(20):
            os.link("big", f"link{i}")
        os.symlink("/usr", "usr")  # a big tree outside: never followed
        os.symlink("big", "big-again")
        print("ok")
    """)
    run = run_runner(code, diskBytes=4 * MIB, maxInodes=200)
    assert (run.frame["reason"], run.frame["stdout"]) == ("Completed", "ok\n"), run.frame
    assert "limit" not in run.frame


def test_killed_at_the_file_size_limit_is_a_disk_limit(run_runner):
    # Python ignores SIGXFSZ (and gets EFBIG); a program that keeps the default is killed by the kernel.
    code = program("""
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        with open("big", "wb") as f:
            while True:
                f.write(b"x" * 65536)
    """)
    run = run_runner(code, diskBytes=2 * MIB)
    assert (run.frame["reason"], run.frame["signal"]) == ("DiskLimitExceeded", signal.SIGXFSZ), run.frame
    assert run.frame["limit"]["kind"] == "disk" and run.frame["limit"]["limit"] == 2 * MIB
    assert isinstance(run.frame["limit"]["observed"], int) and run.frame["limit"]["observed"] >= 2 * MIB
    assert (run.work / "big").stat().st_size == 2 * MIB  # RLIMIT_FSIZE is the disk limit itself


@pytest.mark.parametrize("disk, reason", [(2 * MIB, "DiskLimitExceeded"), (None, "Signaled")],
                         ids=["with-a-disk-limit", "without"])
def test_sigxfsz_means_the_disk_limit_only_when_there_is_one(run_runner, disk, reason):
    code = "import os, signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_DFL)\nos.kill(os.getpid(), signal.SIGXFSZ)\n"
    run = run_runner(code, **({} if disk is None else {"diskBytes": disk}))
    assert (run.frame["reason"], run.frame["signal"]) == (reason, signal.SIGXFSZ)
    if disk is not None:
        assert run.frame["limit"]["kind"] == "disk" and 0 < run.frame["limit"]["observed"] < disk


CHAIN_WRITER = """
import os, sys, time
try:
    runner_stdout = os.open("/proc/1/fd/1", os.O_WRONLY)
except OSError:  # PID 1 of the program's own namespace is not the runner: its own stdout, then
    print("refused", file=sys.stderr, flush=True)
    runner_stdout = 1
if os.fork() == 0:
    os.setsid()
    while True:  # a new process every few microseconds: a pid listed is gone by the time it is killed
        if os.fork():
            os._exit(0)
        os.write(runner_stdout, b"LATE\\n")
time.sleep(0.3)
print("parent done", flush=True)
"""


def test_a_process_that_keeps_changing_its_pid_is_dead_before_the_frame(run_runner, as_pid1):
    # Thousands of processes a second: a process cap out of reach, so the run ends normally and the runner's
    # final sweep is what is tested.
    run = run_runner(program(CHAIN_WRITER), wrapper=as_pid1, timeoutSeconds=10, maxProcesses=4194304)
    assert run.frame["reason"] == "Completed" and "parent done" in run.frame["stdout"], run.frame
    assert run.frame["stderr"].startswith("refused\n")  # the program cannot reach the runner's stdout
    assert "LATE" in run.frame["stdout"]  # the chain did run
    assert_nothing_after_the_frame(run)


def test_as_pid1_orphans_that_come_and_go_are_reaped_and_no_fork_bomb(run_runner, as_pid1):
    # 400 short-lived orphans over about 2 s: the runner, their init, reaps them as it goes, so they neither
    # add up to the process cap (128 by default) nor hold PIDs until the end.
    code = program("""
        import os, time
        for _ in range(400):
            if os.fork() == 0:
                if os.fork() == 0:
                    os._exit(0)  # the grandchild ends after its parent: an orphan, handed to PID 1
                os._exit(0)
            os.wait()
            time.sleep(0.005)
        zombies = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                zombies += open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
            except OSError:
                pass
        print("zombies", zombies)
    """)
    run = run_runner(code, wrapper=as_pid1, timeoutSeconds=20)
    assert run.frame["reason"] == "Completed", run.frame
    assert int(run.frame["stdout"].split()[1]) < 128


def test_as_nobody_a_fork_bomb_meets_the_cap_and_rlimit_nproc(as_nobody, as_pid1):
    run, drop = as_nobody
    code = program("""
        import os, time
        failed = 0
        while True:
            try:
                os.fork()
            except BlockingIOError:  # EAGAIN: RLIMIT_NPROC
                failed += 1
                time.sleep(0.01)
    """)
    result = run(code, wrapper=(*as_pid1, *drop), maxProcesses=40, timeoutSeconds=20)
    assert result.frame["reason"] == "ProcessLimitExceeded", result.frame
    assert result.frame["limit"] == {"kind": "processes", "limit": 40, "observed": result.frame["limit"]["observed"]}
    assert result.frame["limit"]["observed"] >= 40 and result.elapsed < 10


def test_as_nobody_the_program_cannot_reach_the_runner_through_proc(as_nobody, as_pid1):
    # PID 1 is not dumpable: its /proc entries belong to root, so the same uid cannot write the runner's stdout,
    # read its memory or environment, or see its fds (e.g. the termination log it holds).
    run, drop = as_nobody
    code = program("""
        import os
        for path, mode in [("/proc/1/fd/1", os.O_WRONLY), ("/proc/1/mem", os.O_RDONLY),
                           ("/proc/1/environ", os.O_RDONLY)]:
            try:
                os.close(os.open(path, mode))
                print("opened", path)
            except PermissionError:
                print("refused", path)
        try:
            print("fds", os.listdir("/proc/1/fd"))
        except PermissionError:
            print("refused fds")
    """)
    result = run(code, wrapper=(*as_pid1, *drop))
    assert result.frame["stdout"].splitlines() == [
        "refused /proc/1/fd/1", "refused /proc/1/mem", "refused /proc/1/environ", "refused fds"], result.frame


def test_limits_above_what_the_kernel_allows_are_clamped_not_a_runner_error(run_runner, as_pid1):
    # RLIMIT_NPROC cannot be raised past the hard limit the sandbox starts with; the cap still holds.
    run = run_runner("import resource\nprint(resource.getrlimit(resource.RLIMIT_NPROC)[0])\n", wrapper=as_pid1,
                     maxProcesses=4194304, diskBytes=2**62)
    assert run.frame["reason"] == "Completed", run.frame
    assert 0 < int(run.frame["stdout"]) <= 4194304 + 64


def test_as_nobody_a_shell_fork_bomb_of_short_lived_processes_meets_the_cap(as_nobody, as_pid1):
    # Each process forks two and exits at once: few are alive at any moment, the orphans' zombies are PID 1's.
    run, drop = as_nobody
    code = "import os\nos.execl('/bin/sh', 'sh', '-c', 'f() { f | f & }; f; sleep 30')\n"
    result = run(code, wrapper=(*as_pid1, *drop), timeoutSeconds=20)
    assert result.frame["reason"] == "ProcessLimitExceeded", result.frame
    assert result.frame["limit"]["limit"] == 128 and result.elapsed < 10


def test_a_program_that_ends_right_after_reaching_the_cap_is_still_caught(run_runner, as_pid1):
    # The first check is at the start and the next one 0.2 s later: the program forks past the cap and ends in
    # between, as the first process of a fork bomb does when its own fork fails.
    code = program("""
        import os, time
        for _ in range(50):
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
    """)
    run = run_runner(code, maxProcesses=40, wrapper=as_pid1)
    assert (run.frame["reason"], run.frame["exitCode"]) == ("ProcessLimitExceeded", 0), run.frame
    assert run.frame["limit"]["observed"] >= 40 and run.elapsed < 5


NAMESPACE_PROBE = program("""
    import ctypes, os, signal, threading
    libc = ctypes.CDLL(None, use_errno=True)
    print("pid", os.getpid(), "uid", os.getuid())
    for number in (signal.SIGSTOP, signal.SIGKILL, signal.SIGTERM):  # at PID 1, which is not the runner
        os.kill(1, number)
    def attempt(name, result):
        print(name, "refused" if result == -1 and ctypes.get_errno() == 1 else f"allowed {result}")
    attempt("unshare-user", libc.unshare(0x10000000))
    attempt("clone-newnet", libc.syscall(56, 0x40000000 | 17, 0, 0, 0, 0))  # x86_64 clone(CLONE_NEWNET|SIGCHLD)
    attempt("mount", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
    attempt("io_uring", libc.syscall(425, 1, ctypes.create_string_buffer(120)))
    child = os.fork()
    if child == 0:
        os._exit(7)
    thread = threading.Thread(target=lambda: None)
    thread.start(); thread.join()
    print("fork", os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), "thread ok")
""")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe calls x86_64 syscall numbers")
def test_as_pid1_the_program_can_neither_signal_the_runner_nor_make_namespaces(as_nobody, as_pid1):
    run, drop = as_nobody
    result = run(NAMESPACE_PROBE, wrapper=(*as_pid1, *drop))
    assert result.frame["reason"] == "Completed", result.frame
    assert result.frame["stdout"].splitlines() == [
        "pid 2 uid 65534", "unshare-user refused", "clone-newnet refused", "mount refused", "io_uring refused",
        "fork 7 thread ok"], result.frame


def test_not_as_pid1_the_syscall_filter_still_holds(run_runner):
    # On a host the runner is not PID 1 and makes no namespace; the program's syscall filter is the same.
    run = run_runner("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                     "print(libc.unshare(0x10000000), ctypes.get_errno())\n")
    assert (run.frame["reason"], run.frame["stdout"]) == ("Completed", "-1 1\n"), run.frame
