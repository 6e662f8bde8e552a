"""kopf wiring only: each handler hands the object to the controller. Run with `kopf run -m coderun.handlers`."""
from __future__ import annotations

import os

import kopf

from . import controller, metrics
from .api.models import GROUP, PLURAL, VERSION
from .builders import LABEL_MANAGED_BY, LABEL_SANDBOX

RECONCILE_INTERVAL_SECONDS = float(os.environ.get("CODERUN_RECONCILE_INTERVAL", "5"))


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_) -> None:
    # Progress in annotations, never in status: the CRD declares every status field, kopf's would be pruned.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="coderun.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="coderun.io", key="last-handled-configuration")
    settings.posting.level = 20  # INFO and above become Events
    settings.execution.max_workers = int(os.environ.get("CODERUN_WORKERS", "16"))
    settings.watching.server_timeout = 300
    settings.networking.error_backoffs = [1, 2, 5]
    metrics.serve(int(os.environ.get("CODERUN_METRICS_PORT", "9108")))


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL, retries=5, backoff=2)
def admit(body: kopf.Body, **_) -> None:
    controller.admit(body)


@kopf.on.event("", "v1", "pods", labels={LABEL_MANAGED_BY: "coderun", LABEL_SANDBOX: "true"})
def pod_changed(event: kopf.RawEvent, body: kopf.Body, **_) -> None:
    controller.on_pod(body, deleted=event["type"] == "DELETED")


@kopf.timer(GROUP, VERSION, PLURAL, interval=RECONCILE_INTERVAL_SECONDS)
def reconcile(body: kopf.Body, **_) -> None:
    controller.reconcile(body)
