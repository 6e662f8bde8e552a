"""Where sandboxes run is the platform's choice (CodeRunPolicy spec.scheduling), on the real cluster: the single
node is made a dedicated sandbox node for the module (a test-only label and NoSchedule taint, both removed at the
end, failed or not). A policy that selects the label and tolerates the taint runs cold, warm and in a session,
every pod carrying both; a policy without the toleration, or selecting a label no node has, fails its run
Unschedulable in the scheduler's words once its startDeadlineSeconds has passed.

The taint keeps every pod that does not tolerate it off the node while the module runs (the suite's other runs,
the chart's own pods if they restart), so this module runs alone: the Makefile's ALONE list.
"""
from __future__ import annotations

import pytest

from conftest import pool_ready, wait_for
from framework.policy import apply_policy, status_of
from framework.sessions import SMALL, create_session, wait_session

pytestmark = pytest.mark.cold_only  # the test makes its own pool, under its own policy

LABEL = "coderun.test/sandbox-pool"
TAINT_KEY = "coderun.test/sandbox-dedicated"
TOLERATION = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
# Short, so a run that can never be scheduled fails within the test (the default is 300 s).
DEADLINE = 15
SLEEPS = "import time\ntime.sleep(3)\nprint('placed')\n"  # long enough to read the pod while it runs


def _node_name(cluster) -> str:
    nodes = cluster.core.list_node().items
    assert len(nodes) == 1, f"this test taints the only node; found {len(nodes)}"
    return nodes[0].metadata.name


def _taints(cluster, node: str) -> list:
    return [t for t in cluster.core.read_node(node).spec.taints or () if t.key == TAINT_KEY]


@pytest.fixture(scope="module")
def dedicated_node(cluster):
    """The node labelled LABEL=yes and tainted TAINT_KEY=yes:NoSchedule for the module; both removed after."""
    node = _node_name(cluster)
    try:
        cluster.kubectl("label", "node", node, f"{LABEL}=yes", "--overwrite")
        cluster.kubectl("taint", "node", node, f"{TAINT_KEY}=yes:NoSchedule", "--overwrite")
        assert _taints(cluster, node), "the taint was not set"
        yield node
    finally:
        cluster.kubectl("taint", "node", node, f"{TAINT_KEY}:NoSchedule-", check=False)
        cluster.kubectl("label", "node", node, f"{LABEL}-", check=False)
        assert not _taints(cluster, node), f"the test's taint {TAINT_KEY} is still on node {node}: remove it"
        assert LABEL not in (cluster.core.read_node(node).metadata.labels or {})


DEDICATED = {"nodeSelector": {LABEL: "yes"}, "tolerations": [TOLERATION]}


def _assert_placed(cluster, namespace: str, pod_name: str, node: str) -> None:
    pod = cluster.core.read_namespaced_pod(pod_name, namespace)
    assert pod.spec.node_selector.get(LABEL) == "yes", pod.spec.node_selector
    assert any(t.key == TAINT_KEY and t.operator == "Exists" and t.effect == "NoSchedule"
               for t in pod.spec.tolerations or ()), pod.spec.tolerations
    assert pod.spec.node_name == node
    # scheduling adds to the pod; its hardening stays
    assert pod.spec.runtime_class_name == "gvisor" and pod.spec.automount_service_account_token is False


def _run_placed(cluster, namespace: str, node: str, spec: dict) -> dict:
    name = cluster.create_run(namespace, {"language": "python", "code": SLEEPS, **spec})

    def its_pod() -> str | None:  # the run's sandbox pod once it is bound to a node (a warm claim may skip Running)
        pod = (cluster.get_run(namespace, name).get("status") or {}).get("podName")
        return pod if pod and any(p.metadata.name == pod and p.spec.node_name
                                  for p in cluster.core.list_namespaced_pod(namespace).items) else None
    _assert_placed(cluster, namespace, wait_for(its_pod, 120, f"run {name}'s pod on a node"), node)
    status = status_of(cluster.wait_run(namespace, name, timeout=120))
    assert (status["phase"], status["stdout"]) == ("Succeeded", "placed\n"), (
        status.get("reason"), status.get("message"), status.get("startMode"), status.get("stderr"))
    assert status["decision"]["scheduling"]["tolerations"] == [TOLERATION]
    return status


def test_a_dedicated_nodes_policy_runs_cold_warm_and_in_a_session_there(operator, namespace, dedicated_node):
    apply_policy(operator, namespace, "default", {
        "admission": "Record", "scheduling": DEDICATED, "startDeadlineSeconds": DEADLINE,
        "defaults": {"cpu": SMALL["cpu"], "memory": SMALL["memory"], "timeoutSeconds": 20},
        "warmPool": {"size": 1, "languages": ["python"], "cpuRequest": "10m"},
        "sessions": {"allowed": True}})
    wait_for(lambda: pool_ready(operator, namespace, "python") >= 1, 120, "a ready warm pod on the dedicated node")
    pool_pod, = [p.metadata.name for p in operator.core.list_namespaced_pod(
        namespace, label_selector="coderun.io/pool-language=python").items]
    _assert_placed(operator, namespace, pool_pod, dedicated_node)
    # warm: the policy's default limits take the pool's pod
    warm = _run_placed(operator, namespace, dedicated_node, {})
    assert warm["startMode"] == "Warm", warm
    # cold: other limits than the pool's
    cold = _run_placed(operator, namespace, dedicated_node, {"limits": {"memory": "320Mi"}})
    assert cold["startMode"] == "Cold", cold
    session = create_session(operator, namespace)
    ready = wait_session(operator, namespace, session, timeout=120)
    _assert_placed(operator, namespace, ready["podName"], dedicated_node)
    name = operator.create_run(namespace, {"language": "python", "session": session, "code": "print('placed')"})
    status = status_of(operator.wait_run(namespace, name, timeout=60))
    assert (status["phase"], status["stdout"]) == ("Succeeded", "placed\n"), status


@pytest.mark.parametrize("policy, scheduler_says", [
    # tolerates nothing: the taint keeps it off the only node that has the label
    ({"nodeSelector": {LABEL: "yes"}}, "untolerated taint"),
    # tolerates the taint, but no node has the label
    ({"nodeSelector": {"coderun.test/no-such-pool": "yes"}, "tolerations": [TOLERATION]}, "affinity/selector"),
], ids=["untolerated", "no-such-label"])
def test_a_run_no_node_may_take_fails_unschedulable_in_the_schedulers_words(operator, namespace, dedicated_node,
                                                                             policy, scheduler_says):
    apply_policy(operator, namespace, "elsewhere", {"admission": "Record", "scheduling": policy,
                                                     "startDeadlineSeconds": DEADLINE})
    name = operator.create_run(namespace, {"language": "python", "code": "print(1)", "policyRef": "elsewhere"})
    status = status_of(operator.wait_run(namespace, name, timeout=DEADLINE + 60))
    assert (status["phase"], status["reason"]) == ("Failed", "Unschedulable"), status
    assert scheduler_says in status["message"] and f"within {DEADLINE}s" in status["message"], status["message"]
    assert "spec.scheduling" in status["message"], status["message"]  # it says what to change
    wait_for(lambda: not operator.run_pods(namespace), 30, "the unscheduled pod to be deleted")
