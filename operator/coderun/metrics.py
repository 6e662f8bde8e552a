"""Prometheus metrics: runs by outcome, latency histograms, active runs. Fed from the statuses we write."""
from __future__ import annotations

from typing import Any, Mapping

from prometheus_client import Counter, Gauge, Histogram, start_http_server

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 8, 13, 21, 34, 60, 120, 300)

RUNS = Counter("coderun_runs_total", "Finished runs by phase, reason and language", ["phase", "reason", "language"])
TOTAL_SECONDS = Histogram("coderun_run_total_seconds", "CodeRun created -> result written", ["language"],
                          buckets=_LATENCY_BUCKETS)
QUEUE_SECONDS = Histogram("coderun_run_queue_seconds", "CodeRun created -> sandbox pod created", ["language"],
                          buckets=_LATENCY_BUCKETS)
STARTUP_SECONDS = Histogram("coderun_run_startup_seconds", "Sandbox pod created -> program started", ["language"],
                            buckets=_LATENCY_BUCKETS)
CACHE_HITS = Counter("coderun_cache_hits_total", "Runs answered from an identical earlier result", ["language"])
_active: set[str] = set()
ACTIVE = Gauge("coderun_active_runs", "Runs accepted and not yet finished")
ACTIVE.set_function(lambda: len(_active))


def serve(port: int) -> None:
    start_http_server(port)


def track_active(uid: str, active: bool) -> None:
    (_active.add if active else _active.discard)(uid)


def observe_finished(uid: str, status: Mapping[str, Any], language: str) -> None:
    track_active(uid, False)
    RUNS.labels(status.get("phase", ""), status.get("reason", ""), language).inc()
    times: Mapping[str, Any] = status.get("metrics") or {}
    for histogram, field in ((TOTAL_SECONDS, "totalMillis"), (QUEUE_SECONDS, "queueMillis"),
                             (STARTUP_SECONDS, "startupMillis")):
        if times.get(field) is not None:
            histogram.labels(language).observe(times[field] / 1000)
