"""When a run was created, as its metrics count from: the client's millisecond stamp only within the second the
API server stamped."""
import pytest

from coderun_operator.results.status import created_at, parse_time


@pytest.mark.parametrize("stamp, expected", [
    ("2026-11-27T10:00:00.250Z", "2026-11-27T10:00:00.250Z"),  # within the server's second: the finer figure
    ("2026-11-27T09:59:00.000Z", "2026-11-27T10:00:00Z"),      # a minute early: a forged queue time, not believed
    ("2026-11-27T10:00:01.500Z", "2026-11-27T10:00:00Z"),      # past the second
    ("not a time", "2026-11-27T10:00:00Z"),
    (None, "2026-11-27T10:00:00Z"),
])
def test_the_clients_stamp_counts_only_within_the_servers_second(stamp, expected):
    annotations = {"coderun.io/created-at": stamp} if stamp else {}
    run = {"metadata": {"creationTimestamp": "2026-11-27T10:00:00Z", "annotations": annotations}}
    assert created_at(run) == parse_time(expected)
