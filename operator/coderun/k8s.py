"""The only module that talks to the API server. Everything returns plain dicts; 404/409 have meanings here."""
from __future__ import annotations

import base64
import functools
import json
import time
from typing import Any

import kopf
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from .api.models import GROUP, PLURAL, VERSION

SANDBOX_SELECTOR = "app.kubernetes.io/managed-by=coderun,coderun.io/sandbox=true"
# A transient API failure is retried by kopf after this delay instead of surfacing as a failed run.
RETRY_DELAY_SECONDS = 2


@functools.cache
def _clients() -> tuple[client.CoreV1Api, client.NetworkingV1Api, client.CustomObjectsApi]:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    api_client = client.ApiClient()
    return client.CoreV1Api(api_client), client.NetworkingV1Api(api_client), client.CustomObjectsApi(api_client)


def _plain(obj: Any) -> dict[str, Any]:
    return client.ApiClient().sanitize_for_serialization(obj)


class Refused(kopf.PermanentError):
    """The API server will not create this object as it is (quota, admission policy): retrying cannot help."""


def _api_message(e: ApiException) -> str:
    try:
        return json.loads(e.body)["message"]
    except (ValueError, KeyError, TypeError):
        return f"{e.status} {e.reason}"


def _transient(e: ApiException) -> kopf.TemporaryError:
    return kopf.TemporaryError(f"API server answered {e.status} {e.reason}", delay=RETRY_DELAY_SECONDS)


def _call(call, *args, **kwargs):
    """The call's result; an API failure becomes a TemporaryError that kopf retries after a delay."""
    try:
        return call(*args, **kwargs)
    except ApiException as e:
        raise _transient(e) from e


def _or_none(call, *args, **kwargs):
    """The call's result, None when the object does not exist; other failures are transient."""
    try:
        return call(*args, **kwargs)
    except ApiException as e:
        if e.status == 404:
            return None
        raise _transient(e) from e


def create_if_absent(obj: dict[str, Any]) -> bool:
    """Create a child; AlreadyExists is success (deterministic names make creation idempotent)."""
    core, networking, _ = _clients()
    ns, kind = obj["metadata"]["namespace"], obj["kind"]
    create = {"Pod": core.create_namespaced_pod, "ConfigMap": core.create_namespaced_config_map,
              "NetworkPolicy": networking.create_namespaced_network_policy}[kind]
    try:
        create(ns, obj)
        return True
    except ApiException as e:
        if e.status == 409:
            return False
        if e.status in (400, 403, 422):
            raise Refused(f"the API server refused {kind} {obj['metadata']['name']}: {_api_message(e)}") from e
        raise _transient(e) from e


def get_pod(namespace: str, name: str) -> dict[str, Any] | None:
    core, _, _ = _clients()
    pod = _or_none(core.read_namespaced_pod, name, namespace)
    return _plain(pod) if pod is not None else None


def read_log(namespace: str, pod: str, container: str, limit_bytes: int) -> tuple[str, bool]:
    """The container log from the start, at most limit_bytes; says whether the whole log was read."""
    core, _, _ = _clients()
    raw = _call(core.read_namespaced_pod_log, pod, namespace, container=container, limit_bytes=limit_bytes + 1,
                _preload_content=False).data
    return raw[:limit_bytes].decode("utf-8", "replace"), len(raw) <= limit_bytes


def delete_pod(namespace: str, name: str) -> None:
    core, _, _ = _clients()
    _or_none(core.delete_namespaced_pod, name, namespace, grace_period_seconds=0)


def get_run(namespace: str, name: str) -> dict[str, Any] | None:
    _, _, custom = _clients()
    return _or_none(custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)


def patch_run_status(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
    """One merge patch of /status. None values are sent as null, which removes stale fields."""
    _, _, custom = _clients()
    try:
        return custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name,
                                                            {"status": status})
    except ApiException as e:
        if e.status == 404:
            return None
        if e.status == 422:
            raise kopf.PermanentError(f"status of {namespace}/{name} refused by the API server: {e.body}") from e
        raise _transient(e) from e


@functools.lru_cache(maxsize=1)
def _node_allocatable(ttl_bucket: int) -> tuple[dict[str, str], ...]:
    core, _, _ = _clients()
    return tuple(dict(node.status.allocatable or {}) for node in core.list_node().items)


def node_allocatable() -> tuple[dict[str, str], ...]:
    """Allocatable resources of every node, cached for half a minute (nodes change rarely)."""
    return _call(_node_allocatable, int(time.monotonic() // 30))


def label_run(namespace: str, name: str, labels: dict[str, str]) -> None:
    _, _, custom = _clients()
    _or_none(custom.patch_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name,
             {"metadata": {"labels": labels}})


def read_configmap_bytes(namespace: str, name: str) -> dict[str, bytes] | None:
    """binaryData of a ConfigMap, decoded; None when it is gone."""
    core, _, _ = _clients()
    cm = _or_none(core.read_namespaced_config_map, name, namespace)
    if cm is None:
        return None
    return {key: base64.b64decode(value) for key, value in (cm.binary_data or {}).items()}


def delete_run(namespace: str, name: str) -> None:
    _, _, custom = _clients()
    _or_none(custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)


def list_all_runs() -> list[dict[str, Any]]:
    _, _, custom = _clients()
    return _call(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)["items"]


def list_sandbox_pods() -> list[dict[str, Any]]:
    core, _, _ = _clients()
    return [_plain(p) for p in _call(core.list_pod_for_all_namespaces, label_selector=SANDBOX_SELECTOR).items]


def list_runs(namespace: str, label_selector: str = "") -> list[dict[str, Any]]:
    _, _, custom = _clients()
    return _call(custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                 label_selector=label_selector)["items"]
