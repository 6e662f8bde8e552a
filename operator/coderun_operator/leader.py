"""One active operator among replicas: a coordination.k8s.io Lease, as client-go's leader election does it.

A replica waits as a standby until the Lease is free or its holder has stopped renewing it, takes it with a
write conditioned on the resourceVersion it read (so two replicas can never both take it), and only then
starts kopf. The leader renews every RENEW_SECONDS from its own thread; if it cannot renew for
RENEW_DEADLINE_SECONDS, or finds that someone else holds the Lease, it exits at once and its container restarts as
a standby: a replica that might no longer lead must stop writing before another starts. A leader that shuts down
cleanly (SIGTERM) releases the Lease, so a standby takes over within RETRY_SECONDS rather than LEASE_SECONDS.

Expiry is judged by the standby's own clock (how long the record has gone unchanged), never by comparing the
holder's timestamps with ours, so clock skew between nodes cannot hand the Lease to two replicas.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from . import k8s

LEASE_SECONDS = 15
RENEW_SECONDS = 2
# A leader that has not renewed for this long gives up: one more attempt (a pause, a read and a write, each
# bounded by the Lease's request timeout) could end only after a standby may take over.
RENEW_DEADLINE_SECONDS = LEASE_SECONDS - RENEW_SECONDS - 2 * k8s.LEASE_REQUEST_TIMEOUT_SECONDS
RETRY_SECONDS = 1
LEADER_LABEL = "coderun.io/leader"  # on the leading replica's pod: the webhook Service selects it

log = logging.getLogger("coderun.leader")


# ------------------------------------------------------------------------------------------ pure core
@dataclasses.dataclass(frozen=True)
class Record:
    """What the Lease says: who holds it, the holder's last renewal (as written), how often it changed hands."""
    holder: str
    renew_time: str
    transitions: int
    lease_seconds: int


@dataclasses.dataclass(frozen=True)
class Observation:
    """A record, and when (on our monotonic clock) we first saw it unchanged."""
    record: Record | None
    since: float


def record_of(lease: Mapping[str, Any] | None) -> Record | None:
    if lease is None:
        return None
    spec = lease.get("spec") or {}
    return Record(holder=spec.get("holderIdentity") or "", renew_time=str(spec.get("renewTime") or ""),
                  transitions=int(spec.get("leaseTransitions") or 0),
                  lease_seconds=int(spec.get("leaseDurationSeconds") or LEASE_SECONDS))


def observe(previous: Observation | None, record: Record | None, now: float) -> Observation:
    """The clock restarts whenever the record changes: a holder that renews keeps its Lease."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


def may_take(observation: Observation, identity: str, now: float) -> bool:
    record = observation.record
    return (record is None or not record.holder or record.holder == identity
            or now - observation.since >= record.lease_seconds)


def held_by(record: Record | None, identity: str, now_wall: datetime,
            lease_seconds: int = LEASE_SECONDS) -> dict[str, Any]:
    """The Lease spec that says `identity` holds it as of now_wall."""
    changes_hands = record is None or record.holder != identity
    stamp = now_wall.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec: dict[str, Any] = {
        "holderIdentity": identity, "leaseDurationSeconds": lease_seconds, "renewTime": stamp,
        "leaseTransitions": (record.transitions if record else 0) + (1 if record and changes_hands else 0)}
    if changes_hands:
        spec["acquireTime"] = stamp
    return spec


def released(record: Record) -> dict[str, Any]:
    """The Lease spec of a clean handover: no holder, so the next replica need not wait for expiry."""
    return {"holderIdentity": None, "leaseDurationSeconds": 1, "leaseTransitions": record.transitions}


# ------------------------------------------------------------------------------------------ the elector
def _now_wall() -> datetime:
    return datetime.now(timezone.utc)


class LeaderElector:
    def __init__(self, namespace: str, name: str, identity: str, on_lost: Callable[[str], None]):
        self.namespace, self.name, self.identity = namespace, name, identity
        self._on_lost = on_lost
        self._resource_version: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.leading = False

    def _read(self) -> Record | None:
        lease = k8s.read_lease(self.namespace, self.name)
        self._resource_version = (lease or {}).get("metadata", {}).get("resourceVersion")
        return record_of(lease)

    def _write(self, spec: dict[str, Any]) -> None:
        k8s.write_lease(self.namespace, self.name, spec, self._resource_version)

    def acquire(self) -> None:
        """Block until this replica holds the Lease."""
        observation: Observation | None = None
        announced = False
        while True:
            try:
                record, now = self._read(), time.monotonic()
                observation = observe(observation, record, now)
                if may_take(observation, self.identity, now):
                    self._write(held_by(record, self.identity, _now_wall()))
                    self.leading = True
                    log.info("leading: Lease %s/%s is held by %s", self.namespace, self.name, self.identity)
                    return
                if not announced:
                    log.info("standby: Lease %s/%s is held by %s", self.namespace, self.name,
                             record.holder if record else None)  # (never None here: may_take takes a free one)
                    announced = True
            except (k8s.Conflict, k8s.Transient, k8s.Refused) as e:
                log.info("standby: Lease %s/%s not taken: %s", self.namespace, self.name, str(e)[:200])
            time.sleep(RETRY_SECONDS)

    def renew_forever(self) -> threading.Thread:
        self._renewer = threading.Thread(target=self._renew_loop, name="lease-renewer", daemon=True)
        self._renewer.start()
        return self._renewer

    def _renew_loop(self) -> None:
        last_renewed = time.monotonic()
        while not self._stop.wait(RENEW_SECONDS):
            try:
                record = self._read()
                if record is None or record.holder != self.identity:
                    return self._lose(f"the Lease is now held by {record.holder if record else 'nobody'}")
                self._write(held_by(record, self.identity, _now_wall()))
                last_renewed = time.monotonic()
            except k8s.Conflict:
                return self._lose("another replica wrote the Lease")
            except (k8s.Transient, k8s.Refused) as e:
                if time.monotonic() - last_renewed > RENEW_DEADLINE_SECONDS:
                    return self._lose(f"not renewed for {RENEW_DEADLINE_SECONDS} s: {str(e)[:200]}")
                log.warning("Lease renewal failed, retrying: %s", str(e)[:200])

    def _lose(self, why: str) -> None:
        if self._stop.is_set():
            return  # released on purpose
        self.leading = False
        self._on_lost(why)

    def release(self) -> None:
        """Hand the Lease over (best effort): called once this replica has stopped processing."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(2 * k8s.LEASE_REQUEST_TIMEOUT_SECONDS)  # its last write must not race the release
        if not self.leading:
            return
        self.leading = False
        for _ in range(3):  # a Conflict here is a write we did not see: read again
            try:
                record = self._read()
                if record is not None and record.holder == self.identity:
                    self._write(released(record))
                    log.info("released Lease %s/%s", self.namespace, self.name)
                return
            except k8s.Conflict:
                continue
            except (k8s.Transient, k8s.Refused) as e:
                log.warning("could not release the Lease (a standby takes over when it expires): %s", str(e)[:200])
                return


def exit_now(why: str) -> None:
    """Lost leadership: stop every write at once; the container restarts as a standby."""
    log.critical("lost the Lease (%s): exiting so that only one replica acts", why)
    logging.shutdown()
    os._exit(70)


def mark_own_pod(namespace: str, pod: str, leading: bool) -> None:
    """Label this replica's pod as leader (or not), for the webhook Service. Best effort: without the label the
    webhook is unreachable and its failurePolicy applies, the operator still decides every run."""
    try:
        k8s.label_pod(namespace, pod, {LEADER_LABEL: "true" if leading else None})
    except (k8s.Transient, k8s.Refused) as e:
        log.warning("could not label pod %s as %s: %s", pod, "leader" if leading else "standby", str(e)[:200])
