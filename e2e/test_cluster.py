"""The local cluster is real: gVisor isolation, enforced NetworkPolicy, Pod Security admission, garbage collection."""
import json

import pytest
from kubernetes.client.rest import ApiException

from conftest import wait_for

PROBE_TARGETS = "for t in $TARGETS; do if nc -w 3 ${t%:*} ${t#*:} </dev/null 2>/dev/null; then echo \"$t open\"; " \
                "else echo \"$t blocked\"; fi; done"


def test_gvisor_pod_runs_under_gvisor_and_plain_pod_under_runc(cluster, namespace):
    show_kernel = ["sh", "-c", "cat /proc/version; dmesg 2>&1 | head -2"]
    cluster.create_pod(namespace, "sandboxed", show_kernel, runtime_class="gvisor")
    cluster.create_pod(namespace, "plain", show_kernel, runtime_class=None)
    assert cluster.wait_pod_done(namespace, "sandboxed") == "Succeeded"
    assert cluster.wait_pod_done(namespace, "plain") == "Succeeded"
    sandboxed, plain = cluster.logs(namespace, "sandboxed"), cluster.logs(namespace, "plain")
    assert "gVisor" in sandboxed, sandboxed
    assert "gvisor" not in plain.lower(), plain


def _probe(cluster, namespace, name, targets):
    command = ["sh", "-c", f"TARGETS='{' '.join(targets)}'; {PROBE_TARGETS}"]
    cluster.create_pod(namespace, name, command, runtime_class="gvisor", labels={"role": "client"})
    cluster.wait_pod_done(namespace, name, timeout=120)
    return dict(line.rsplit(" ", 1) for line in cluster.logs(namespace, name).splitlines() if " " in line)


def test_networkpolicy_default_deny_is_enforced(cluster, namespace):
    serve = ["sh", "-c", "echo ok > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"]
    cluster.create_pod(namespace, "server", serve, runtime_class=None, labels={"role": "server"})
    server = f"{cluster.pod_ip(namespace, 'server')}:8080"
    wait_for(lambda: cluster.pod_phase(namespace, "server") == "Running", 60, "server running")
    targets = [server, "10.96.0.1:443", f"{cluster.node_ip()}:6443"]

    before = _probe(cluster, namespace, "probe-open", targets)
    assert before == {t: "open" for t in targets}, before

    deny_clients = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                    "metadata": {"name": "deny-all"},
                    "spec": {"podSelector": {"matchLabels": {"role": "client"}},
                             "policyTypes": ["Ingress", "Egress"]}}
    cluster.networking.create_namespaced_network_policy(namespace, deny_clients)
    after = _probe(cluster, namespace, "probe-denied", targets)
    assert after == {t: "blocked" for t in targets}, after


def test_pod_security_restricted_refuses_a_privileged_pod(cluster, namespace):
    privileged = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "privileged"},
                  "spec": {"containers": [{"name": "main", "image": "coderun.local/busybox:1.36",
                                           "securityContext": {"privileged": True}}]}}
    with pytest.raises(ApiException) as refused:
        cluster.core.create_namespaced_pod(namespace, privileged)
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert 'violates PodSecurity "restricted:latest": privileged' in message, message


def test_garbage_collector_deletes_owned_pods(cluster, namespace):
    owner = cluster.core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    cluster.create_pod(namespace, "owned", ["sleep", "300"], runtime_class=None, owner=ref)
    cluster.core.delete_namespaced_config_map("owner", namespace)

    def pod_gone():
        try:
            cluster.core.read_namespaced_pod("owned", namespace)
            return False
        except ApiException as e:
            return e.status == 404
    wait_for(pod_gone, 60, "the garbage collector to delete the owned pod")
