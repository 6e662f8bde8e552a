"""kopf wiring only: each handler hands the object to the controller, or to the runtime (runtime.py).

Only low-level event handlers: kopf keeps no state on the objects (no progress or diff-base annotations, which
would have to hold the whole spec), adds no finalizers, and does not retry them; the controller's own tick
retries what a transient API failure left undone.
"""
from __future__ import annotations

import os
from typing import Any

import kopf

from . import audit, data_plane, k8s, proxy, runtime, webhook
from coderun.api.coderunpolicy import POLICY_PLURAL
from coderun.api.coderunsession import SESSION_PLURAL
from coderun.api.models import GROUP, PLURAL, VERSION
from .builders.names import LABEL_MANAGED_BY, LABEL_SANDBOX, MANAGER
from .controller import Controller

controller = Controller(proxy=proxy.from_environment(k8s, os.environ),
                        data=data_plane.from_environment(k8s, os.environ),
                        audit=audit.from_environment(k8s, os.environ),
                        own_namespace=os.environ.get("POD_NAMESPACE", "coderun-system"))


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    runtime.configure(settings, memo, controller)


@kopf.on.startup()
async def start(memo: kopf.Memo, **_: Any) -> None:
    await runtime.start(memo, controller)


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    await runtime.stop(memo)


@kopf.on.event(GROUP, VERSION, PLURAL)
def run_changed(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    controller.on_run(dict(body), deleted=event["type"] == "DELETED")


@kopf.on.event(GROUP, VERSION, POLICY_PLURAL)
def policy_changed(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    controller.on_policy(dict(body), deleted=event["type"] == "DELETED")
    # Written now rather than at the next tick: `kubectl wait --for=condition=Accepted` returns once it applies.
    # (The webhook's path loads policies too, but never waits on this write.)
    controller.policy_status.flush()


@kopf.on.event(GROUP, VERSION, SESSION_PLURAL)
def session_changed(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    controller.on_session(dict(body), deleted=event["type"] == "DELETED")


@kopf.on.event("", "v1", "pods", labels={LABEL_MANAGED_BY: MANAGER, LABEL_SANDBOX: "true"})
def pod_changed(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    controller.on_pod(dict(body), deleted=event["type"] == "DELETED")


# kopf registers the webhook with the API server's maximum timeout (30 s): a hung operator delays a create that
# long. Explicit ids: kopf serves each at /<id>, which a webhook's service path allows only in RFC 1123 form.
if runtime.WEBHOOK_PORT:
    @kopf.on.validate(GROUP, VERSION, PLURAL, id="validate-run", operation="CREATE",
                      ignore_failures=runtime.IGNORE_WEBHOOK_FAILURES)
    def validate_run(body: kopf.Body, userinfo: kopf.UserInfo, **_: Any) -> None:
        refusal = webhook.review_run(dict(body), controller, userinfo)
        if refusal:
            raise kopf.AdmissionError(refusal, code=403)

    @kopf.on.validate(GROUP, VERSION, POLICY_PLURAL, id="validate-policy",
                      ignore_failures=runtime.IGNORE_WEBHOOK_FAILURES)
    def validate_policy(body: kopf.Body, **_: Any) -> None:
        refusal = webhook.review_policy(dict(body))
        if refusal:
            raise kopf.AdmissionError(refusal, code=422)
