"""Prometheus metrics: runs by outcome, latency histograms, active runs. Fed from the statuses we write."""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from .policy import DEFAULT_POLICY

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 8, 13, 21, 34, 60, 120, 300)

RUNS = Counter("coderun_runs_total", "Finished runs by phase, reason and language", ["phase", "reason", "language"])
TOTAL_SECONDS = Histogram("coderun_run_total_seconds", "CodeRun created -> result written", ["language"],
                          buckets=_LATENCY_BUCKETS)
QUEUE_SECONDS = Histogram("coderun_run_queue_seconds", "CodeRun created -> sandbox pod created", ["language"],
                          buckets=_LATENCY_BUCKETS)
STARTUP_SECONDS = Histogram("coderun_run_startup_seconds", "Sandbox pod created -> program started", ["language"],
                            buckets=_LATENCY_BUCKETS)
CACHE_HITS = Counter("coderun_cache_hits_total", "Runs answered from an identical earlier result", ["language"])
API_REQUESTS = Counter("coderun_api_requests_total", "Requests the operator sent to the API server (watches not "
                       "included: kopf keeps one per resource)", ["call"])
ACTIVE = Gauge("coderun_active_runs", "Runs accepted and not yet finished")
LEADER = Gauge("coderun_leader", "1 on the replica that holds the Lease and processes runs, 0 on a standby")
POOL_READY = Gauge("coderun_pool_ready_pods", "Warm pool pods ready to be claimed", ["namespace", "policy", "language"])
POOL_CLAIMS = Counter("coderun_pool_claims_total", "Runs started on a warm pool pod", ["language"])
POOL_MISSES = Counter("coderun_pool_misses_total", "Runs of a policy with a warm pool that started cold: no ready "
                      "pod (empty) or limits other than the pool's (limits)", ["language", "why"])
POOL_ATTACH_FAILURES = Counter("coderun_pool_attach_failures_total", "Claimed warm pods that could not be attached "
                               "(each run then started cold)")
POOL_REFILL_SECONDS = Histogram("coderun_pool_refill_seconds", "Warm pool pod created -> its runner running",
                                buckets=_LATENCY_BUCKETS)
OTHER_LANGUAGE = "other"


def language_label(language: object) -> str:
    """A caller writes spec.language: only languages a policy offers become label values, so no caller can
    create new time series."""
    return language if isinstance(language, str) and language in DEFAULT_POLICY.runtimes else OTHER_LANGUAGE


PORT = int(os.environ.get("CODERUN_METRICS_PORT", "9108"))
_serving: set[int] = set()


def serve(active_runs: Callable[[], int], port: int = PORT) -> None:
    """Once per port: a replicated operator starts it before the election, kopf's startup asks again."""
    ACTIVE.set_function(active_runs)
    if port not in _serving:
        start_http_server(port)
        _serving.add(port)


def observe_finished(status: Mapping[str, Any], language: str) -> None:
    RUNS.labels(status.get("phase", ""), status.get("reason", ""), language).inc()
    times: Mapping[str, Any] = status.get("metrics") or {}
    for histogram, field in ((TOTAL_SECONDS, "totalMillis"), (QUEUE_SECONDS, "queueMillis"),
                             (STARTUP_SECONDS, "startupMillis")):
        if times.get(field) is not None:
            histogram.labels(language).observe(times[field] / 1000)
