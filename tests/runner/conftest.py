"""Fixtures for the runner tier: the real runner, run as a subprocess."""

import pytest

from runner_harness import load_runner_module, runner_in


@pytest.fixture(scope="session")
def runner():
    """The runner module, imported by path (for its pure functions)."""
    return load_runner_module()


@pytest.fixture
def run_runner(tmp_path):
    return runner_in(tmp_path)
