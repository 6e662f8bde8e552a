"""CodeRunPolicy helpers: apply one and wait until the operator uses it; listeners on the node a policy may
open to a sandbox."""
from __future__ import annotations

import socket
import threading

from kubernetes.client.rest import ApiException

from coderun.api.coderunpolicy import POLICY_PLURAL
from coderun.api.models import GROUP, VERSION
from conftest import wait_for


def apply_policy(cluster, namespace: str, name: str, spec: dict) -> None:
    """Create the policy, or replace its spec; return once the operator applies that generation to new runs."""
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRunPolicy", "metadata": {"name": name}, "spec": spec}
    try:
        applied = cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, body)
    except ApiException as e:
        if e.status != 409:
            raise
        # a JSON patch of the spec alone: the operator writes the status meanwhile, so a whole-object replace
        # with the resourceVersion read a moment before can conflict
        applied = cluster.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, POLICY_PLURAL, name, [{"op": "replace", "path": "/spec", "value": spec}],
            _content_type="application/json-patch+json")
    generation = applied["metadata"]["generation"]
    wait_for(lambda: (cluster.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, name)
                      .get("status") or {}).get("observedGeneration", 0) >= generation,
             30, f"the operator to apply generation {generation} of policy {name}", interval=0.1)


def status_of(run: dict) -> dict:
    return run.get("status") or {}


class Listeners:
    """Two TCP listeners on the node: one a policy allows, one it does not."""

    def __init__(self, host: str):
        self.sockets = [socket.create_server((host, 0)) for _ in range(2)]
        self.peers: list[tuple[int, str]] = []
        for s in self.sockets:
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def port(self, i: int) -> int:
        return self.sockets[i].getsockname()[1]

    def _serve(self, s: socket.socket) -> None:
        while True:
            try:
                conn, peer = s.accept()
            except OSError:
                return
            self.peers.append((s.getsockname()[1], peer[0]))
            conn.sendall(b"hello")
            conn.close()

    def close(self) -> None:
        for s in self.sockets:
            s.close()
