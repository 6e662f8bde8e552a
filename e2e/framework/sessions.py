"""CodeRunSession helpers: a policy that allows sessions, a session created and waited for as a user
would, a run in it."""
from __future__ import annotations

import json
import uuid
from coderun.api.coderunsession import SESSION_PLURAL
from coderun.api.models import GROUP, VERSION
from framework.policy import apply_policy, status_of


SMALL = {"memory": "256Mi", "cpu": "250m", "disk": "64Mi", "timeoutSeconds": 20}


def allow_sessions(cluster, namespace: str, ttl: int | None = None, **sessions) -> None:
    apply_policy(cluster, namespace, "default", {"sessions": {"allowed": True, **sessions},
                                                 "defaults": {"cpu": "250m", "memory": "256Mi"},
                                                 **({"ttlSecondsAfterFinished": ttl} if ttl is not None else {})})


def create_session(cluster, namespace: str, user: str | None = None, **spec) -> str:
    """`kubectl create -f -` of a CodeRunSession (as `user` with --as) stating its creator, as the README writes
    it; its name."""
    name = f"s-{uuid.uuid4().hex[:8]}"
    spec = {k: v for k, v in {"language": "python", "limits": SMALL, **spec}.items() if v is not None}
    manifest = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRunSession",
                "metadata": {"name": name, "annotations": cluster.identity(user)}, "spec": spec}
    cluster.kubectl(*(("--as", user) if user else ()), "create", "-n", namespace, "-f", "-",
                    input=json.dumps(manifest))
    return name


def session_status(cluster, namespace: str, name: str) -> dict:
    return cluster.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, SESSION_PLURAL, name).get(
        "status") or {}


def wait_session(cluster, namespace: str, name: str, condition: str = "Ready", timeout: int = 90) -> dict:
    """`kubectl wait --for=condition=...`, as a user waits; the status once it holds."""
    waited = cluster.kubectl("wait", "-n", namespace, f"crsess/{name}", f"--for=condition={condition}",
                             f"--timeout={timeout}s", check=False)
    status = session_status(cluster, namespace, name)
    assert waited.returncode == 0, (f"{name} not {condition} after {timeout}s: {waited.stderr}", status,
                                    cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide").stdout)
    return status


def run_in(cluster, namespace: str, session: str, code: str, timeout: float = 60, **spec) -> dict:
    name = cluster.create_run(namespace, {"language": "python", "session": session, "code": code, **spec})
    return status_of(cluster.wait_run(namespace, name, timeout))
