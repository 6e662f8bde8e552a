"""What runs beside kopf's handlers: kopf's settings, the webhook's serving certificate, the metrics endpoint,
the tick and the warm pool's refill loop; started once kopf starts and stopped when it stops."""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading

import kopf

from . import k8s, metrics, webhook_server
from .controller import Controller

# Seconds between ticks: runs with work due (pod start deadlines, retries, warm pods) and due expiries; every
# 12th tick looks at every run in flight. Queued runs move when a slot frees, not on the tick.
TICK_SECONDS = 5.0
# The validating webhook (CODERUN_WEBHOOK_PORT set): failurePolicy Ignore by default, because the operator
# decides again when it admits a run; Fail makes the webhook's availability that of CodeRun creation.
WEBHOOK_PORT = os.environ.get("CODERUN_WEBHOOK_PORT")
IGNORE_WEBHOOK_FAILURES = os.environ.get("CODERUN_WEBHOOK_FAILURE_POLICY", "Ignore") != "Fail"


def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, controller: Controller) -> None:
    settings.posting.enabled = False  # the controller posts its own Events
    if logging.getLogger().level > logging.DEBUG:  # without --verbose: no line per event or webhook call
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # Few worker threads and a short GIL switch interval: the event loop (watches, /healthz) stays responsive
    # while handlers parse and redact large outputs.
    settings.execution.max_workers = int(os.environ.get("CODERUN_WORKERS", "8"))
    sys.setswitchinterval(0.001)
    settings.watching.server_timeout = 300
    # A restarted leader lists every CodeRun (finished ones hold up to ~1 MiB each): in pages, never all at once.
    settings.watching.chunk_size = 100
    settings.networking.error_backoffs = [1, 2, 5]
    if WEBHOOK_PORT:  # first: kopf retries this handler when the API server is away, and the rest runs once
        certificate = webhook_server.ServingCertificate(os.environ, k8s)
        settings.admission.server = certificate.server()
        # The Helm chart writes the ValidatingWebhookConfiguration (the operator keeps only its caBundle current);
        # the host-process mode lets kopf register it.
        if os.environ.get("CODERUN_WEBHOOK_MANAGED", "true").lower() == "true":
            settings.admission.managed = "validate.coderun.io"
        memo["certificate_stop"] = threading.Event()
        threading.Thread(target=certificate.keep_fresh, args=(memo["certificate_stop"],), name="webhook-certificate",
                         daemon=True).start()
    metrics.serve(controller.store.active_by_namespace)


async def start(memo: kopf.Memo, controller: Controller) -> None:
    """The tick (a plain background loop rather than @kopf.timer: kopf puts a finalizer on every object that has
    a timer, and a finalizer would keep CodeRuns and their namespaces from being deleted while the operator is
    down), the warm pool's refill loop, and the egress proxy's signing key, the data service's grant key and the
    audit agent's key (their pods wait for them)."""
    # Made at start, and again at each tick until made (the API server away, RBAC not yet bound): the proxy's and
    # the agents' pods wait for them, and a run's end would otherwise be the next to try.
    missing = {name: ensure for name, ensure in (
        ("egress proxy signing key", controller.proxy and controller.proxy.ensure_keys),
        ("data service grant key", controller.data and controller.data.ensure_keys),
        ("audit agent key", controller.audit and controller.audit.ensure_key)) if ensure}

    async def ensure_secrets() -> None:
        for name, ensure in list(missing.items()):
            try:
                await asyncio.to_thread(ensure)
                del missing[name]
            except (k8s.Transient, k8s.Refused) as e:
                logging.getLogger("coderun").error("%s: %s", name, e)
    await ensure_secrets()

    async def tick_forever() -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            if missing:
                await ensure_secrets()
            try:
                await asyncio.to_thread(controller.tick)
            except Exception as e:  # noqa: BLE001 - the loop must outlive any one pass
                logging.getLogger("coderun").error("tick failed: %s: %s", type(e).__name__, str(e)[:300])
    memo["tick"] = asyncio.create_task(tick_forever())
    memo["pools_stop"] = threading.Event()
    threading.Thread(target=controller.pool.keep, args=(TICK_SECONDS, memo["pools_stop"]), name="warm-pools",
                     daemon=True).start()


async def stop(memo: kopf.Memo) -> None:
    memo["tick"].cancel()
    memo["pools_stop"].set()
    if "certificate_stop" in memo:
        memo["certificate_stop"].set()
