"""kopf wiring only: each handler hands the object to the controller. Run with `kopf run -m coderun.handlers`."""
from __future__ import annotations

import asyncio
import os

import kopf

from . import controller, metrics
from .api.models import GROUP, PLURAL, VERSION
from .builders import LABEL_MANAGED_BY, LABEL_SANDBOX

RESYNC_INTERVAL_SECONDS = float(os.environ.get("CODERUN_RESYNC_INTERVAL", "5"))


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


# A plain background loop rather than @kopf.timer: kopf puts a finalizer on every object that has a timer,
# and a finalizer would keep CodeRuns (and their namespaces) from being deleted while the operator is down.
@kopf.on.startup()
async def start_resync(memo: kopf.Memo, logger: kopf.Logger, **_) -> None:
    async def resync_forever() -> None:
        while True:
            await asyncio.sleep(RESYNC_INTERVAL_SECONDS)
            try:
                await asyncio.to_thread(controller.resync)
            except Exception as e:  # the API server may be away for a moment; the next pass retries
                logger.warning(f"resync pass failed: {e}")
    memo["resync"] = asyncio.create_task(resync_forever())


@kopf.on.cleanup()
async def stop_resync(memo: kopf.Memo, **_) -> None:
    memo["resync"].cancel()
