"""Name squatting on the real cluster: a child that exists under a run's deterministic name but is not the
run's own is refused, never adopted; the namespace deny-all is re-created when deleted and repaired when
opened up."""
from conftest import wait_for

from coderun.api.models import GROUP, PLURAL, VERSION

DENY_ALL = "coderun-sandbox-default-deny"


def test_a_squatted_input_configmap_is_refused_not_run(operator, namespace):
    name = "squatted"
    operator.core.create_namespaced_config_map(namespace, {
        "metadata": {"name": f"{name}-input"},
        "data": {"code": "print('the squatter ran')", "run.json": "{}"}})
    operator.create_run(namespace, {"language": "python", "code": "print('benign')"}, name=name)
    status = operator.wait_run(namespace, name)["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "NameConflict"), status
    assert f"ConfigMap named {name}-input already exists" in status["message"]
    assert "stdout" not in status
    assert not operator.core.list_namespaced_pod(namespace).items  # nothing ran


def test_a_foreign_namespace_deny_all_is_a_conflict(operator, namespace):
    operator.networking.create_namespaced_network_policy(namespace, {
        "metadata": {"name": DENY_ALL},  # not labelled managed-by coderun, and allowing everything
        "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}})
    status = operator.wait_run(namespace, operator.create_run(namespace, {"language": "python",
                                                                          "code": "print(1)"}))["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "NameConflict"), status
    assert DENY_ALL in status["message"]


def test_the_namespace_deny_all_is_recreated_and_repaired(operator, namespace):
    def run_once():
        status = operator.wait_run(namespace, operator.create_run(namespace, {"language": "python",
                                                                              "code": "print(1)"}))["status"]
        assert status["phase"] == "Succeeded", status

    run_once()
    operator.networking.delete_namespaced_network_policy(DENY_ALL, namespace)
    run_once()
    policy = operator.networking.read_namespaced_network_policy(DENY_ALL, namespace)
    assert not policy.spec.egress and not policy.spec.ingress  # back, and deny-all

    operator.networking.patch_namespaced_network_policy(DENY_ALL, namespace, {"spec": {"egress": [{}]}})
    run_once()
    wait_for(lambda: not operator.networking.read_namespaced_network_policy(DENY_ALL, namespace).spec.egress, 10,
             "the opened deny-all to be repaired")
    runs = operator.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
    assert len(runs) == 3
