"""Prometheus metrics: runs by outcome, latency histograms, active runs by namespace. Fed from the statuses we
write, and the active runs from the store at each scrape."""
from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Mapping

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

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


class ActiveRuns:
    """coderun_active_runs{namespace}: read from the store at each scrape, so a namespace's series is exactly its
    own runs (one total would move with any other namespace's). Only namespaces with active runs are listed, so
    the series are bounded by what runs now, and a namespace whose runs all ended disappears."""

    def __init__(self) -> None:
        self.by_namespace: Callable[[], Mapping[str, int]] = dict

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("coderun_active_runs", "Runs accepted and not yet finished, by namespace",
                                   labels=["namespace"])
        for namespace, count in sorted(self.by_namespace().items()):
            family.add_metric([namespace], count)
        yield family


ACTIVE = ActiveRuns()
REGISTRY.register(ACTIVE)


def language_label(language: object) -> str:
    """A caller writes spec.language: only languages a policy offers become label values, so no caller can
    create new time series."""
    return language if isinstance(language, str) and language in DEFAULT_POLICY.runtimes else OTHER_LANGUAGE


PORT = int(os.environ.get("CODERUN_METRICS_PORT", "9108"))
_serving: set[int] = set()


def serve(active_by_namespace: Callable[[], Mapping[str, int]], port: int = PORT) -> None:
    """Once per port: a replicated operator starts it before the election, kopf's startup asks again."""
    ACTIVE.by_namespace = active_by_namespace
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
