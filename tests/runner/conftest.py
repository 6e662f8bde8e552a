"""Fixtures for the runner tier: the real runner, run as a subprocess."""

import os
import subprocess

import pytest

from runner_harness import load_runner_module, runner_in


@pytest.fixture(scope="session")
def runner():
    """The runner module, imported by path (for its pure functions)."""
    return load_runner_module()


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
