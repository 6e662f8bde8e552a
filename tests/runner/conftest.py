"""Fixtures for the runner tier: the real runner, run as a subprocess."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from support.runner import NOBODY, SYSTEM_PYTHON, runner_in


@pytest.fixture
def run_runner(tmp_path):
    return runner_in(tmp_path)


PID1_WRAPPER = ("unshare", "--pid", "--fork", "--mount-proc")


@pytest.fixture(scope="session")
def as_pid1():
    """A command prefix that runs the runner as PID 1 of a new PID namespace,
    as in the sandbox, so its kill-everything path runs for real."""
    if os.geteuid() != 0:
        pytest.skip("a PID namespace needs root")
    probe = subprocess.run([*PID1_WRAPPER, "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"unshare cannot make a PID namespace here: {probe.stderr.decode().strip()}")
    return PID1_WRAPPER


@pytest.fixture
def as_nobody():
    """(run, PID-1 wrapper) for the runner as an unprivileged uid, as in the pod: no root override of file
    modes, RLIMIT_NPROC enforced, /proc of a non-dumpable PID 1 closed to the program. Everything lives in
    a directory nobody owns (pytest's tmp_path is private to root)."""
    if os.geteuid() != 0 or not shutil.which("setpriv") or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("needs root, setpriv and a system python3 to drop to an unprivileged uid")
    base = Path(tempfile.mkdtemp(prefix="coderun-runner-"))
    os.chmod(base, 0o755)
    os.chown(base, NOBODY, NOBODY)
    drop = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    try:
        yield runner_in(base, owner=NOBODY, interpreter=SYSTEM_PYTHON), drop
    finally:
        shutil.rmtree(base, ignore_errors=True)


USER_MOUNT_PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.getuid(), os.getgid()
assert libc.unshare(0x10000000 | 0x20000) == 0, "unshare"
for name, content in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
    fd = os.open(f"/proc/self/{name}", os.O_WRONLY); os.write(fd, content.encode()); os.close(fd)
assert libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, b"nr_inodes=8,size=8192") == 0, "mount"
"""


@pytest.fixture(scope="session")
def user_mounts():
    """Skip where an unprivileged process may not mount a tmpfs in a user namespace of its own (the pod's gVisor
    allows it; so does Linux unless unprivileged user namespaces are turned off)."""
    if os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("needs root to drop to an unprivileged uid")
    probe = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                            SYSTEM_PYTHON, "-I", "-c", USER_MOUNT_PROBE], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"no tmpfs in an unprivileged user namespace here: {probe.stderr.decode().strip()[-200:]}")
