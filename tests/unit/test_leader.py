"""Leader election: the pure rules, and two electors racing over one in-memory Lease with the API server's
resourceVersion semantics (a write based on a stale read is refused with 409)."""
import threading
from datetime import datetime, timezone

import pytest

from coderun_operator import k8s, leader
from coderun_operator.leader import Observation, Record, held_by, may_take, observe, record_of, released

NOW = datetime(2026, 11, 23, 12, 0, 0, 123456, tzinfo=timezone.utc)


def test_a_missing_or_unheld_lease_may_be_taken_at_once():
    assert may_take(Observation(None, 100.0), "a", 100.0)
    assert may_take(Observation(Record("", "", 3, 15), 100.0), "a", 100.0)


def test_a_held_lease_may_be_taken_only_after_it_went_unchanged_for_its_duration():
    held = Record("b", "t1", 0, 15)
    seen = observe(None, held, 100.0)
    assert not may_take(seen, "a", 114.9)
    assert may_take(observe(seen, held, 115.0), "a", 115.0)


def test_a_renewal_restarts_the_clock():
    seen = observe(None, Record("b", "t1", 0, 15), 100.0)
    renewed = observe(seen, Record("b", "t2", 0, 15), 110.0)
    assert renewed.since == 110.0
    assert not may_take(renewed, "a", 120.0)


def test_the_holder_itself_may_always_take_it_again():
    assert may_take(observe(None, Record("a", "t", 0, 15), 100.0), "a", 100.0)


def test_taking_over_counts_a_transition_and_stamps_acquire_time():
    spec = held_by(Record("b", "t", 4, 15), "a", NOW)
    assert spec["holderIdentity"] == "a" and spec["leaseTransitions"] == 5
    assert spec["acquireTime"] == spec["renewTime"] == "2026-11-23T12:00:00.123456Z"
    renewal = held_by(Record("a", "t", 5, 15), "a", NOW)
    assert renewal["leaseTransitions"] == 5 and "acquireTime" not in renewal
    assert held_by(None, "a", NOW)["leaseTransitions"] == 0


def test_a_release_leaves_no_holder():
    spec = released(Record("a", "t", 2, 15))
    assert record_of({"spec": spec}).holder == "" and spec["leaseTransitions"] == 2


class FakeLeases:
    """One Lease as the API server keeps it: every write needs the resourceVersion of the latest read."""

    def __init__(self):
        self.lease, self.version, self.lock = None, 0, threading.Lock()

    def read(self, namespace, name):
        with self.lock:
            if self.lease is None:
                return None
            return {"metadata": {"resourceVersion": str(self.version)}, "spec": dict(self.lease)}

    def write(self, namespace, name, spec, resource_version):
        with self.lock:
            if (self.lease is None) != (resource_version is None) or (
                    resource_version is not None and resource_version != str(self.version)):
                raise k8s.Conflict("409 Conflict")
            self.lease, self.version = dict(spec), self.version + 1


@pytest.fixture
def leases(monkeypatch):
    fake = FakeLeases()
    monkeypatch.setattr(k8s, "read_lease", fake.read)
    monkeypatch.setattr(k8s, "write_lease", fake.write)
    monkeypatch.setattr(leader, "RETRY_SECONDS", 0.01)
    monkeypatch.setattr(leader, "RENEW_SECONDS", 0.01)
    return fake


def test_of_two_racing_replicas_exactly_one_leads_until_the_other_is_released(leases):
    electors = [leader.LeaderElector("ns", "lease", name, on_lost=lambda why: None) for name in ("a", "b")]
    threads = [threading.Thread(target=e.acquire, daemon=True) for e in electors]
    for t in threads:
        t.start()
    for _ in range(200):
        if any(e.leading for e in electors):
            break
        threading.Event().wait(0.01)
    threading.Event().wait(0.2)  # time for a second, wrong winner to appear
    winners = [e for e in electors if e.leading]
    assert len(winners) == 1, "both or neither took the Lease"
    loser = next(e for e in electors if not e.leading)
    assert leases.lease["holderIdentity"] == winners[0].identity
    winners[0].release()
    for t in threads:
        t.join(2)
    assert loser.leading and leases.lease["holderIdentity"] == loser.identity
    assert leases.lease["leaseTransitions"] == 1


def test_a_leader_whose_lease_was_taken_is_told_at_its_next_renewal(leases):
    lost = threading.Event()
    elector = leader.LeaderElector("ns", "lease", "a", on_lost=lambda why: lost.set())
    elector.acquire()
    elector.renew_forever()
    current = leases.read("ns", "lease")
    leases.write("ns", "lease", held_by(record_of(current), "b", NOW), current["metadata"]["resourceVersion"])
    assert lost.wait(2), "the old leader did not notice it lost the Lease"
    assert not elector.leading


def test_a_leader_that_cannot_renew_gives_up_before_the_lease_could_expire(leases, monkeypatch):
    # the last attempt before the deadline (a pause, a read, a write) ends before the Lease may expire, and a
    # leader whose API server hiccups once still gets a second attempt
    attempt = leader.RENEW_SECONDS + 2 * k8s.LEASE_REQUEST_TIMEOUT_SECONDS
    assert leader.RENEW_DEADLINE_SECONDS + attempt <= leader.LEASE_SECONDS
    assert leader.RENEW_DEADLINE_SECONDS > attempt - k8s.LEASE_REQUEST_TIMEOUT_SECONDS
    lost = []
    elector = leader.LeaderElector("ns", "lease", "a", on_lost=lost.append)
    elector.acquire()
    monkeypatch.setattr(leader, "RENEW_DEADLINE_SECONDS", 0.05)

    def unreachable(*_):
        raise k8s.Transient("connection refused")
    monkeypatch.setattr(k8s, "read_lease", unreachable)
    elector.renew_forever().join(2)
    assert lost and "not renewed" in lost[0]
