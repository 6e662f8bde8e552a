"""kopf wiring only: each handler hands the object to the controller. Run with `kopf run -m coderun_operator.handlers`.

Only low-level event handlers: kopf keeps no state on the objects (no progress or diff-base annotations, which
would have to hold the whole spec), adds no finalizers, and does not retry them; the controller's own tick
retries what a transient API failure left undone.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading

import kopf

from . import k8s, metrics, webhook, webhook_server
from coderun.api.coderunpolicy import POLICY_PLURAL
from coderun.api.models import GROUP, PLURAL, VERSION
from .builders import LABEL_MANAGED_BY, LABEL_SANDBOX
from .controller import Controller

TICK_SECONDS = float(os.environ.get("CODERUN_RESYNC_INTERVAL", "5"))
controller = Controller()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_) -> None:
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
    metrics.serve(controller.store.active_count)


@kopf.on.event(GROUP, VERSION, PLURAL)
def run_changed(event: kopf.RawEvent, body: kopf.Body, **_) -> None:
    controller.on_run(dict(body), deleted=event["type"] == "DELETED")


@kopf.on.event(GROUP, VERSION, POLICY_PLURAL)
def policy_changed(event: kopf.RawEvent, body: kopf.Body, **_) -> None:
    controller.on_policy(dict(body), deleted=event["type"] == "DELETED")


@kopf.on.event("", "v1", "pods", labels={LABEL_MANAGED_BY: "coderun", LABEL_SANDBOX: "true"})
def pod_changed(event: kopf.RawEvent, body: kopf.Body, **_) -> None:
    controller.on_pod(dict(body), deleted=event["type"] == "DELETED")


# The validating webhook (CODERUN_WEBHOOK_PORT set): failurePolicy Ignore by default, because the operator
# decides again when it admits a run; Fail makes the webhook's availability that of CodeRun creation. kopf
# registers it with the API server's maximum timeout (30 s): a hung operator delays a create that long.
WEBHOOK_PORT = os.environ.get("CODERUN_WEBHOOK_PORT")
IGNORE_WEBHOOK_FAILURES = os.environ.get("CODERUN_WEBHOOK_FAILURE_POLICY", "Ignore") != "Fail"
if WEBHOOK_PORT:
    # Explicit ids: kopf serves each at /<id>, which a webhook's service path allows only in RFC 1123 form.
    @kopf.on.validate(GROUP, VERSION, PLURAL, id="validate-run", operation="CREATE",
                      ignore_failures=IGNORE_WEBHOOK_FAILURES)
    def validate_run(body: kopf.Body, userinfo: kopf.UserInfo, **_) -> None:
        refusal = webhook.review_run(dict(body), controller, userinfo)
        if refusal:
            raise kopf.AdmissionError(refusal, code=403)

    @kopf.on.validate(GROUP, VERSION, POLICY_PLURAL, id="validate-policy", ignore_failures=IGNORE_WEBHOOK_FAILURES)
    def validate_policy(body: kopf.Body, **_) -> None:
        refusal = webhook.review_policy(dict(body))
        if refusal:
            raise kopf.AdmissionError(refusal, code=422)


# A plain background loop rather than @kopf.timer: kopf puts a finalizer on every object that has a timer,
# and a finalizer would keep CodeRuns (and their namespaces) from being deleted while the operator is down.
@kopf.on.startup()
async def start_ticking(memo: kopf.Memo, **_) -> None:
    async def tick_forever() -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            try:
                await asyncio.to_thread(controller.tick)
            except Exception as e:  # noqa: BLE001 - the loop must outlive any one pass
                logging.getLogger("coderun").error("tick failed: %s: %s", type(e).__name__, str(e)[:300])
    memo["tick"] = asyncio.create_task(tick_forever())
    memo["pools_stop"] = threading.Event()
    threading.Thread(target=controller.keep_pools, args=(TICK_SECONDS, memo["pools_stop"]), name="warm-pools",
                     daemon=True).start()


@kopf.on.cleanup()
async def stop_ticking(memo: kopf.Memo, **_) -> None:
    memo["tick"].cancel()
    memo["pools_stop"].set()
    if "certificate_stop" in memo:
        memo["certificate_stop"].set()
