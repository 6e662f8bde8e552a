"""Wait for a CodeRun to finish with a watch, not a sleep loop, and survive a watch that drops.

The loop: list the one object (field selector on its name) to get its state and a resourceVersion; if it is
not finished, watch from that resourceVersion; when the watch ends for any reason (server-side timeout,
410 Gone, a dropped connection) list again and watch again, all under one overall deadline. Listing after
every watch means an event missed while no watch was open can never be lost.

I/O is injected (`fetch`, `watch`), so the loop is tested without a cluster.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from .errors import ADMISSION_DENIAL, CodeRunError, PolicyDenied, RunNotFound
from .result import is_finished

log = logging.getLogger("coderun.client")

# (object or None when absent, the list's resourceVersion)
Fetch = Callable[[], tuple[dict[str, Any] | None, str]]
# (resourceVersion, seconds) -> (event type, object) until the server ends the watch
Watch = Callable[[str, float], Iterable[tuple[str, Mapping[str, Any]]]]


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


def wait_until_finished(fetch: Fetch, watch: Watch, deadline: float, *, max_watch_seconds: float,
                        clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                        on_update: Callable[[Mapping[str, Any]], None] | None = None,
                        stats: WaitStats | None = None) -> tuple[dict[str, Any] | None, bool]:
    """(last object seen, finished?). Returns unfinished when the deadline passed; raises RunNotFound when the
    object is absent or deleted, CodeRunError for API refusals (fetch and watch raise those themselves)."""
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
            obj, resource_version = fetch()
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
            for event_type, event_obj in watch(resource_version, min(remaining, max_watch_seconds)):
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
            stats.drops += 1
            # Back off only after a failure, so an unreachable API server is not hammered.
            backoff = min(max(backoff * 2, 0.25), 5.0)
            log.debug("watch or list dropped (%s); listing again in %.2fs", e, backoff)
            sleep(min(backoff, max(0.0, deadline - clock())))
        if deadline - clock() <= 0:
            return last, False


def is_transient(status: int | None) -> bool:
    """A watch/list failure worth listing again for: no answer, 410 Gone, throttled, server errors."""
    return status is None or status in (410, 429) or status >= 500


def refuse(what: str, status: int | None, detail: str) -> CodeRunError:
    """An API refusal as the SDK's error, with what to change when we know it."""
    if ADMISSION_DENIAL in detail:
        return PolicyDenied.at_admission(detail)
    hint = {401: "check the kubeconfig credentials",
            403: "the identity lacks RBAC permission on coderuns.coderun.io in this namespace",
            404: "is the CodeRun CRD installed (kubectl get crd coderuns.coderun.io) and the name right?",
            422: "the API server refused the spec; the message names the field to change"}.get(status or 0, "")
    cls = RunNotFound if status == 404 else CodeRunError
    return cls(f"{what} failed: {status or 'no answer'} {detail}".rstrip() + (f" ({hint})" if hint else ""),
               status=status)
