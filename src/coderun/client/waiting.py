"""Wait for a CodeRun to finish with a watch, not a sleep loop, and survive a watch that drops.

The loop: list the one object (field selector on its name) to get its state and a resourceVersion; if it is
not finished, watch from that resourceVersion; when the watch ends for any reason (server-side timeout,
410 Gone, a dropped connection) list again and watch again, all under one overall deadline. Listing after
every watch means an event missed while no watch was open can never be lost.

The loop is a plan of steps (steps.py): the sync and the async client run the same one, and tests drive it with
scripted fakes, without a cluster.
"""
from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from ..api.models import CodeRunSpec
from ..api.policy import START_DEADLINE_SECONDS
from .errors import ADMISSION_DENIAL, CodeRunError, PolicyDenied, RunNotFound, RunTimeout
from .result import RunResult, is_finished, result_from_object

_finished = is_finished
from .steps import Fetch, FetchAll, NextEvent, OpenWatch, Plan, Sleep

log = logging.getLogger("coderun.client")

# The caller's default wait: the run's own time limit plus the operator's own bound on a pod that has not started
# (a run whose pod no node takes ends Unschedulable then, saying why: the caller sees that, not its own give-up),
# and a margin for the operator's write and the result's read.
STARTUP_ALLOWANCE_SECONDS = START_DEADLINE_SECONDS + 60
UNKNOWN_RUN_TIMEOUT_SECONDS = 60
DEFAULT_WAIT_SECONDS = 300
# How the API server words a ValidatingAdmissionPolicy's refusal (403, the policy's own message after it): coderun's
# policies say what to do (a session that ended, another identity's session, approval), and it is not RBAC.
ADMISSION_POLICY_DENIAL = "denied request:"
# One watch request lasts at most this long server-side; then the client lists and watches again.
DEFAULT_WATCH_SECONDS = 60
API_REQUEST_TIMEOUT = 30


def default_wait_seconds(run_timeout: int | None) -> float:
    return (run_timeout or UNKNOWN_RUN_TIMEOUT_SECONDS) + STARTUP_ALLOWANCE_SECONDS


def run_wait_seconds(spec: CodeRunSpec, wait_timeout: float | None) -> float:
    """How long `run` and `submit` wait: the caller's `wait_timeout`, else the run's limit plus start-up."""
    if wait_timeout is not None:
        return wait_timeout
    return default_wait_seconds(spec.limits.timeout_seconds if spec.limits else None)

class WatchDropped(Exception):
    """The watch ended abnormally (connection lost, 410 Gone, 5xx): list again and watch again."""


@dataclass
class WaitStats:
    """What the wait did; tests and debug logs use it to show a dropped watch was survived."""
    lists: int = 0
    watches: int = 0
    drops: int = 0
    events: int = 0
    phases: list[str] = field(default_factory=list)


def wait_plan(name: str, deadline: float, *, max_watch_seconds: float, clock: Callable[[], float] = time.monotonic,
              on_update: Callable[[Mapping[str, Any]], None] | None = None,
              stats: WaitStats | None = None,
              until: Callable[[Mapping[str, Any] | None], bool] | None = None
              ) -> Plan[tuple[dict[str, Any] | None, bool]]:
    """(last object seen, finished?). Returns unfinished when the deadline passed; raises RunNotFound when the
    object is absent or deleted, CodeRunError for API refusals (the steps raise those themselves). `until`: the
    state to wait for instead of the run's end (is_finished)."""
    is_finished = until or _finished
    stats = stats if stats is not None else WaitStats()
    last: dict[str, Any] | None = None
    backoff = 0.0

    def seen(obj: Mapping[str, Any]) -> None:
        nonlocal last
        last = dict(obj)
        phase = (last.get("status") or {}).get("phase") or ""
        if not stats.phases or stats.phases[-1] != phase:
            stats.phases.append(phase)
        if on_update:
            on_update(last)

    while True:
        try:
            obj, resource_version = yield Fetch(name)
            stats.lists += 1
            if obj is None:
                raise RunNotFound("the CodeRun does not exist (deleted, or expired after its TTL)", status=404)
            seen(obj)
            if is_finished(obj):
                return last, True
            remaining = deadline - clock()
            if remaining <= 0:
                return last, False
            stats.watches += 1
            yield OpenWatch(name, resource_version, min(remaining, max_watch_seconds))
            while (event := (yield NextEvent())) is not None:
                event_type, event_obj = event
                stats.events += 1
                if event_type == "DELETED":
                    raise RunNotFound("the CodeRun was deleted while waiting for it", status=404)
                if event_type in ("ADDED", "MODIFIED"):
                    seen(event_obj)
                    if is_finished(event_obj):
                        return last, True
            backoff = 0.0
            log.debug("watch ended after its server-side timeout; listing again")
        except WatchDropped as e:
            backoff = yield from after_drop(e, backoff, stats, deadline, clock)
        if deadline - clock() <= 0:
            return last, False


def after_drop(error: WatchDropped, backoff: float, stats: WaitStats, deadline: float,
               clock: Callable[[], float]) -> Plan[float]:
    """A watch or list dropped: wait before listing again (only after a failure, so an unreachable API server is
    not hammered), doubling from 0.25 s to 5 s; the next backoff."""
    stats.drops += 1
    backoff = min(max(backoff * 2, 0.25), 5.0)
    log.debug("watch or list dropped (%s); listing again in %.2fs", error, backoff)
    yield Sleep(min(backoff, max(0.0, deadline - clock())))
    return backoff


def wait_all_plan(names: list[str], labels: str, deadline: float, *, max_watch_seconds: float,
                  clock: Callable[[], float] = time.monotonic,
                  stats: WaitStats | None = None) -> Plan[dict[str, dict[str, Any]]]:
    """Many runs at once, over one list and one watch of the runs `labels` selects (every run named must be
    among them): {name: its last object seen}, each finished unless the deadline passed first. A harness's
    hundreds of runs cost the API server one watch, not one per run. RunNotFound names a run absent or deleted."""
    stats = stats if stats is not None else WaitStats()
    waiting, last = set(names), {}
    backoff = 0.0

    def seen(obj: Mapping[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if name in waiting:
            last[name] = dict(obj)
            if is_finished(obj):
                waiting.discard(name)

    while True:
        try:
            items, resource_version = yield FetchAll(labels)
            stats.lists += 1
            present = {(item.get("metadata") or {}).get("name") for item in items}
            missing = sorted(waiting - present)
            if missing:
                raise RunNotFound(f"CodeRun {missing[0]} is not among the runs selected by {labels} (deleted, "
                                  "expired after its TTL, or created by another client: wait for it with wait())",
                                  status=404)
            for item in items:
                seen(item)
            if not waiting or deadline - clock() <= 0:
                return last
            stats.watches += 1
            yield OpenWatch(f"{len(waiting)} runs", resource_version,
                            min(deadline - clock(), max_watch_seconds), labels=labels)
            while (event := (yield NextEvent())) is not None:
                event_type, event_obj = event
                stats.events += 1
                name = (event_obj.get("metadata") or {}).get("name")
                if event_type == "DELETED" and name in waiting:
                    raise RunNotFound(f"CodeRun {name} was deleted while waiting for it", status=404)
                if event_type in ("ADDED", "MODIFIED"):
                    seen(event_obj)
                    if not waiting:
                        return last
            backoff = 0.0
        except WatchDropped as e:
            backoff = yield from after_drop(e, backoff, stats, deadline, clock)
        if deadline - clock() <= 0:
            return last


def wait_all_outcome(names: list[str], namespace: str, waited_seconds: float,
                     last: Mapping[str, Mapping[str, Any]]) -> list[RunResult]:
    """The finished runs in the order named, or RunTimeout for the first one unfinished."""
    return [wait_outcome(name, namespace, waited_seconds, last.get(name), is_finished(last.get(name)))
            for name in names]


def settled_by(predicate: Callable[[RunResult], bool]) -> Callable[[Mapping[str, Any] | None], bool]:
    """wait_for's `until`: the caller's predicate over the run as a RunResult, or the run's end."""
    return lambda obj: is_finished(obj) or predicate(result_from_object(obj or {}))


def _upload_settled(result: RunResult) -> bool:
    """The run says where to upload its inputs (status.upload), or needs none: it left Pending."""
    return result.upload is not None or result.phase not in (None, "", "Pending")


upload_settled = settled_by(_upload_settled)


def listed_items(listed: Mapping[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """FetchAll's answer from a list: (its runs, its resourceVersion to watch from)."""
    return list(listed.get("items") or []), listed["metadata"]["resourceVersion"]


def fetched(listed: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """Fetch's answer from the list by name: (the run or None, the list's resourceVersion to watch from)."""
    items = listed.get("items") or []
    return (items[0] if items else None), listed["metadata"]["resourceVersion"]


def wait_outcome(name: str, namespace: str, waited_seconds: float, last: Mapping[str, Any] | None,
                 finished: bool) -> RunResult:
    """The finished run, or RunTimeout with the last state seen."""
    if not finished:
        raise RunTimeout(name, namespace, waited_seconds, result_from_object(last) if last else None)
    return result_from_object(last)


def is_transient(status: int | None) -> bool:
    """A watch/list failure worth listing again for: no answer, 410 Gone, throttled, server errors."""
    return status is None or status in (410, 429) or status >= 500


def refuse(what: str, status: int | None, detail: str) -> CodeRunError:
    """An API refusal as the SDK's error, with what to change when we know it."""
    if ADMISSION_DENIAL in detail:
        return PolicyDenied.at_admission(detail)
    if status == 403 and ADMISSION_POLICY_DENIAL in detail:
        return CodeRunError(f"{what} refused: {detail.split(ADMISSION_POLICY_DENIAL, 1)[1].strip()}", status=status)
    hint = {401: "check the kubeconfig credentials",
            403: "the identity lacks RBAC permission on coderuns.coderun.io in this namespace",
            404: "is the CodeRun CRD installed (kubectl get crd coderuns.coderun.io) and the name right?",
            422: "the API server refused the spec; the message names the field to change"}.get(status or 0, "")
    cls = RunNotFound if status == 404 else CodeRunError
    return cls(f"{what} failed: {status or 'no answer'} {detail}".rstrip() + (f" ({hint})" if hint else ""),
               status=status)


def failure(what: str, status: int | None, detail: str, *, waiting: bool = False) -> Exception:
    """A failed API call as the SDK sees it, from either client's exception: `status` None when no answer came.
    While waiting, a transient failure means list and watch again (WatchDropped); otherwise it is the caller's."""
    if waiting and is_transient(status):
        return WatchDropped(f"{what}: {status or 'connection lost'} {detail}")
    if status is None:
        return CodeRunError(f"{what} failed: the API server did not answer ({detail})")
    return refuse(what, status, detail)


def api_message(error: Any) -> str:
    """The API server's own message from an ApiException (it names the refused field), else the HTTP reason."""
    try:
        return json.loads(error.body).get("message") or error.reason
    except (TypeError, ValueError, AttributeError):
        return error.reason or ""


def watch_event(what: str, line: bytes | str) -> tuple[str, dict[str, Any]]:
    """(event type, object) from one line of a watch stream; an ERROR event (410 Gone, say) as the failure its
    Status names, so the wait lists and watches again."""
    event = json.loads(line)
    if event.get("type") == "ERROR":
        status = event.get("object") or {}
        raise failure(what, status.get("code"), status.get("message") or status.get("reason") or "", waiting=True)
    return event["type"], event["object"]


@contextmanager
def api_failures(what: str, api_exception: type[Exception], network_errors: tuple[type[Exception], ...], *,
                 waiting: bool = False) -> Iterator[None]:
    """A client's failures (its kubernetes package's ApiException, its transport's errors) as the SDK's."""
    try:
        yield
    except api_exception as e:
        raise failure(what, e.status, api_message(e), waiting=waiting) from e
    except network_errors as e:
        raise failure(what, None, str(e) or type(e).__name__, waiting=waiting) from e
