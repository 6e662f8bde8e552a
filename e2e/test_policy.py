"""CodeRunPolicy on the real cluster: selection, code rules, maximums, the concurrency queue, approval, egress."""
from __future__ import annotations

import json
import time

import pytest
from kubernetes.client.rest import ApiException

from coderun.api.coderunpolicy import POLICY_PLURAL, spec_digest
from coderun.api.models import GROUP, VERSION, CodeRunSpec
from coderun.client import CodeRunClient, PolicyDenied
from framework.policy import Listeners, apply_policy, status_of
from framework.standins import INTERNET_V6, METADATA_V4
from conftest import (APPROVER_VERBS, CREATOR_VERBS, KUBECONFIG, RunWriteCensus, create_as, grant, parse_timestamp,
                      wait_for)

# A run's writes after its creation: admitted (queued), started, running, finished, the cache's label, and room
# for a kopf annotation or a retried patch; never one per run ahead of it.
MAX_WRITES_PER_RUN = 8


def test_a_namespace_default_policy_applies_and_is_recorded(operator, namespace):
    apply_policy(operator, namespace, "default", {"defaults": {"timeoutSeconds": 7, "memory": "200Mi"}})
    run = operator.wait_run(namespace, operator.create_run(namespace, {"language": "python", "code": "print(1)"}))
    status = status_of(run)
    assert status["phase"] == "Succeeded", status
    assert status["policy"] == "default" and status["policyDigest"].startswith("sha256:")
    assert status["effectiveLimits"]["timeoutSeconds"] == 7 and status["effectiveLimits"]["memory"] == "200Mi"
    assert status["decision"]["policy"] == "default" and status["decision"]["runtime"]["language"] == "python"


def test_a_denied_import_is_rejected_naming_the_rule_and_the_line(operator, namespace):
    apply_policy(operator, namespace, "strict", {"admission": "Record",  # created, then Rejected in its status
                                                 "codeRules": {"deniedPythonImports": ["socket", "subprocess"],
                                                               "deniedPythonCalls": ["eval"]}})
    code = "import json\n# import socket is fine in a comment\nfrom subprocess import run as r\n"
    run = operator.wait_run(namespace, operator.create_run(namespace, {"language": "python", "code": code,
                                                                       "policyRef": "strict"}))
    status = status_of(run)
    assert (status["phase"], status["reason"]) == ("Rejected", "PolicyDenied"), status
    assert status["policyRule"] == "codeRules.deniedPythonImports"
    assert "line 3" in status["message"] and "'subprocess'" in status["message"] and "strict" in status["message"]
    assert "podName" not in status
    call = operator.wait_run(namespace, operator.create_run(namespace, {
        "language": "python", "code": "x = 1\nprint(eval('x'))\n", "policyRef": "strict"}))
    assert status_of(call)["policyRule"] == "codeRules.deniedPythonCalls" and "line 2" in status_of(call)["message"]


def test_limits_over_the_policy_maximum_are_refused_naming_field_value_and_maximum(operator, namespace):
    apply_policy(operator, namespace, "small", {"defaults": {"memory": "64Mi"}, "admission": "Record",
                                                "maximums": {"memory": "128Mi", "timeoutSeconds": 10}})
    run = operator.wait_run(namespace, operator.create_run(namespace, {
        "language": "python", "code": "print(1)", "policyRef": "small", "limits": {"memory": "512Mi"}}))
    status = status_of(run)
    assert (status["phase"], status["reason"], status["policyRule"]) == ("Rejected", "PolicyDenied",
                                                                         "maximums.memory"), status
    assert "spec.limits.memory=512Mi" in status["message"] and "128Mi" in status["message"]
    # An audit tells which version of which policy said no.
    policy = operator.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, "small")
    assert (status["policy"], status["policyDigest"]) == ("small", spec_digest(policy["spec"])), status


def test_a_run_asking_to_be_kept_longer_than_its_policy_allows_is_refused(operator, namespace):
    apply_policy(operator, namespace, "brief", {"admission": "Record", "maxTtlSecondsAfterFinished": 600})
    status = status_of(operator.wait_run(namespace, operator.create_run(namespace, {
        "language": "python", "code": "print(1)", "policyRef": "brief", "ttlSecondsAfterFinished": 86400})))
    assert (status["phase"], status["policyRule"], status["policy"]) == ("Rejected", "maxTtlSecondsAfterFinished",
                                                                         "brief"), status
    assert "spec.ttlSecondsAfterFinished=86400 is above the maximum 600" in status["message"]


def test_the_policys_ttl_deletes_a_finished_run_on_time(operator, namespace):
    apply_policy(operator, namespace, "short-lived", {"ttlSecondsAfterFinished": 5})
    name = operator.create_run(namespace, {"language": "python", "code": "print(1)", "policyRef": "short-lived"})
    status = status_of(operator.wait_run(namespace, name))
    assert status["phase"] == "Succeeded" and status["decision"]["ttlSecondsAfterFinished"] == 5, status
    finished = parse_timestamp(status["completionTime"]).timestamp()

    def gone():
        try:
            operator.get_run(namespace, name)
        except ApiException as e:
            if e.status == 404:
                return time.time()
            raise
        return None
    deleted_at = wait_for(gone, 60, f"CodeRun {name} to be deleted after its policy's 5 s")
    # Due 5 s after it finished; the operator's tick (5 s) may add up to one interval. Before the fix it was 3600 s.
    assert 4 <= deleted_at - finished <= 20, deleted_at - finished


def run_manifest(name: str, spec: dict) -> str:
    return json.dumps({"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRun", "metadata": {"name": name},
                       "spec": spec})


def test_in_enforce_mode_kubectl_apply_itself_fails_with_the_policys_message(operator, namespace):
    apply_policy(operator, namespace, "strict", {"codeRules": {"deniedPythonImports": ["socket"]},
                                                 "maximums": {"memory": "512Mi"}})
    cases = [({"code": "import json\nimport socket\n"}, "line 2: the code imports 'socket'"),
             ({"code": "print(1)", "limits": {"memory": "1Gi"}}, "spec.limits.memory=1Gi is above the maximum 512Mi"),
             ({"code": "print(1)", "policyRef": "nope"}, "'nope' does not exist")]
    for i, (fields, says) in enumerate(cases):
        spec = {"language": "python", "policyRef": "strict", **fields}
        result = operator.kubectl("apply", "-n", namespace, "-f", "-", input=run_manifest(f"refused-{i}", spec),
                                  check=False)
        assert result.returncode != 0 and "denied the request" in result.stderr and says in result.stderr, \
            result.stderr
    assert not operator.run_names(namespace)  # nothing was created
    client = CodeRunClient(namespace, kubeconfig=str(KUBECONFIG))
    with pytest.raises(PolicyDenied) as denied:  # the SDK says the same, typed
        client.create(CodeRunSpec(language="python", code="import socket\n", policy_ref="strict"))
    assert denied.value.rule == "codeRules.deniedPythonImports" and denied.value.result is None
    assert client.runtimes(policy="strict")[0].policy == "strict"


def test_kubectl_apply_refuses_a_malformed_policy_naming_the_field(operator, namespace):
    result = operator.kubectl("apply", "-n", namespace, "-f", "-", check=False, input=(
        "apiVersion: coderun.io/v1alpha1\nkind: CodeRunPolicy\nmetadata: {name: bad}\n"
        "spec: {redactionPatterns: ['(?<=secret)x']}\n"))  # look-behind: not RE2, which only the webhook knows
    assert result.returncode != 0 and "spec.redactionPatterns[0]" in result.stderr, result.stderr
    manifest = ("apiVersion: coderun.io/v1alpha1\nkind: CodeRunPolicy\nmetadata: {name: bad}\n"
                "spec:\n  runtimes:\n  - {language: python, image: x, command: [python3], codeFile: main.py,"
                " runtimeClassName: runc}\n")
    result = operator.kubectl("apply", "-n", namespace, "-f", "-", input=manifest, check=False)
    assert result.returncode != 0 and "allowUnsandboxedRuntime" in result.stderr, result.stderr
    result = operator.kubectl("apply", "-n", namespace, "-f", "-", check=False, input=(
        "apiVersion: coderun.io/v1alpha1\nkind: CodeRunPolicy\nmetadata: {name: bad}\n"
        "spec: {maxConcurrentRuns: 0, egress: [{cidr: 'not-a-cidr'}]}\n"))
    assert result.returncode != 0 and "maxConcurrentRuns" in result.stderr and "cidr" in result.stderr, result.stderr


def test_kubectl_apply_refuses_a_costly_pattern_and_cluster_egress_naming_the_field(operator, namespace):
    """Issue 17: a policy's author cannot make the operator compile a huge regex, nor grant a sandbox the
    cluster's own addresses without saying so."""
    def apply(spec: str):
        return operator.kubectl("apply", "-n", namespace, "-f", "-", check=False, input=(
            f"apiVersion: coderun.io/v1alpha1\nkind: CodeRunPolicy\nmetadata: {{name: costly}}\nspec: {spec}\n"))
    result = apply(r"{redactionPatterns: ['ok', '\pL{300}']}")
    assert result.returncode != 0 and "spec.redactionPatterns[1]" in result.stderr and "too large" in result.stderr, \
        result.stderr
    result = apply("{egress: [{cidr: 169.254.169.254/32}]}")
    assert result.returncode != 0 and "spec.egress[0].cidr" in result.stderr and "allowClusterEgress" in result.stderr, \
        result.stderr
    result = apply("{allowClusterEgress: true, egress: [{cidr: 169.254.169.254/32}]}")
    assert result.returncode == 0, result.stderr


def test_max_concurrent_runs_holds_exactly_and_runs_start_in_creation_order(operator, namespace):
    # a quarter of a core each, so three sandboxes fit the node at once and the cap (not the node) is what holds
    apply_policy(operator, namespace, "default", {"maxConcurrentRuns": 3, "defaults": {"cpu": "250m"}})
    names = [f"q-{i:02d}" for i in range(20)]
    census = RunWriteCensus(operator, namespace)
    for name in names:  # one by one: the creation order is the names' order
        operator.create_run(namespace, {"language": "python", "code": "import time\ntime.sleep(1.5)\nprint('ok')"},
                            name=name)
    # A policy changed while runs wait does not change what they were admitted with.
    apply_policy(operator, namespace, "default",
                 {"maxConcurrentRuns": 3, "defaults": {"cpu": "250m", "memory": "300Mi"}})
    try:
        runs = [operator.wait_run(namespace, name, timeout=240) for name in names]
    finally:
        census.stop()
    # The writes a run gets do not grow with the queue ahead of it (the third attack: 30 runs behind a cap of 1
    # took 525 status writes, each waiting run rewritten at every finish): the last runs, 17 ahead of each, are
    # written no more often than the first, which never waited.
    writes = [census.writes[name] for name in names]
    assert max(writes[-5:]) <= max(writes[:3]) + 2 and max(writes) <= MAX_WRITES_PER_RUN, dict(zip(names, writes))
    statuses = [status_of(r) for r in runs]
    assert all(s["phase"] == "Succeeded" for s in statuses), [(s.get("reason"), s.get("message")) for s in statuses]
    started = [parse_timestamp(s["startTime"]) for s in statuses]
    finished = [parse_timestamp(s["completionTime"]) for s in statuses]
    for moment in started:
        overlapping = [n for n, a, b in zip(names, started, finished) if a <= moment < b]
        assert len(overlapping) <= 3, (f"{overlapping} had a sandbox at once",
                                       [(n, s["startTime"], s["completionTime"]) for n, s in zip(names, statuses)])
    # Runs that waited start in creation order as slots free up (the first few may take their slots in the
    # order the burst's events reached the operator).
    first_free = min(finished)
    from_queue = [(n, a) for n, a in zip(names, started) if a >= first_free]
    assert len(from_queue) >= 10 and [a for _, a in from_queue] == sorted(a for _, a in from_queue), from_queue
    queued = [s for s in statuses if (s.get("metrics") or {}).get("queueMillis", 0) > 1000]
    assert len(queued) >= 10, "the burst never queued"
    assert len({s["policyDigest"] for s in statuses[:3]}) == 1
    early = statuses[5]  # queued before the change: its recorded decision stands
    assert early["effectiveLimits"]["memory"] == "256Mi", early["effectiveLimits"]


@pytest.mark.parametrize("verdict", ["approved-by", "rejected-by"])
def test_a_run_that_needs_approval_waits_then_follows_an_approvers_annotation(operator, namespace, verdict):
    apply_policy(operator, namespace, "supervised", {"approval": {"required": "Always"}})
    grant(operator, namespace, "bob", APPROVER_VERBS)
    name = operator.create_run(namespace, {"language": "python", "code": "print('approved')",
                                           "policyRef": "supervised"})
    wait_for(lambda: status_of(operator.get_run(namespace, name)).get("reason") == "AwaitingApproval", 30,
             "the run to wait for approval")
    assert status_of(operator.get_run(namespace, name)).get("podName") is None  # nothing ran meanwhile
    operator.kubectl("--as", "bob", "annotate", "crun", name, "-n", namespace, f"coderun.io/{verdict}=bob")
    status = status_of(operator.wait_run(namespace, name))
    if verdict == "approved-by":
        assert (status["phase"], status["stdout"]) == ("Succeeded", "approved\n"), status
        assert status["approval"]["approvedBy"] == "bob", status
    else:
        assert (status["phase"], status["reason"]) == ("Rejected", "RejectedByApprover"), status
        assert "bob" in status["message"] and not status.get("podName")


def refusal(cluster, namespace: str, spec: dict, rule: str) -> str:
    """Why a run alice creates is refused: by the webhook at creation, or (webhook away, or a policy that
    records) in its status as Rejected by `rule`."""
    result = create_as(cluster, "alice", namespace, spec, check=False)
    if result.returncode != 0:
        assert "denied the request" in result.stderr and f"[{rule}]" in result.stderr, result.stderr
        return result.stderr
    status = status_of(cluster.wait_run(namespace, result.stdout.split()[0].split("/")[-1]))
    assert (status["phase"], status["policyRule"]) == ("Rejected", rule), status
    return status["message"]


def test_naming_a_policy_takes_the_use_verb_and_the_baseline_cannot_be_named(operator, namespace):
    apply_policy(operator, namespace, "default", {
        "approval": {"required": "Always"}, "codeRules": {"deniedPythonImports": ["socket"]},
        "defaults": {"memory": "64Mi"}, "maximums": {"memory": "128Mi"}})
    apply_policy(operator, namespace, "open", {"admission": "Record"})
    apply_policy(operator, namespace, "hidden-gpu", {})
    grant(operator, namespace, "alice", CREATOR_VERBS)
    escape = {"language": "python", "code": "import socket\nprint(len(bytearray(600 << 20)))",
              "limits": {"memory": "1Gi"}}
    says = refusal(operator, namespace, {**escape, "policyRef": "builtin-default"}, "policyRef")
    assert "cannot be named" in says, says
    says = refusal(operator, namespace, {"language": "python", "code": "print(1)", "policyRef": "open"}, "policyRef")
    assert "alice may not use CodeRunPolicy 'open'" in says and "hidden-gpu" not in says, says
    grant(operator, namespace, "alice", ["use"], rules=[{"apiGroups": [GROUP],
                                                         "resources": [POLICY_PLURAL]}], names=["open"])
    name = create_as(operator, "alice", namespace, {"language": "python", "code": "print(1)", "policyRef": "open"})
    status = status_of(operator.wait_run(namespace, name))
    assert (status["phase"], status["policy"]) == ("Succeeded", "open"), status
    # Without policyRef the namespace's default holds: its memory cap (then no socket, and an approval first).
    assert "above the maximum 128Mi" in refusal(operator, namespace, escape, "maximums.memory")


EGRESS_PROBE = """
import socket
def tcp(host, port):
    try:
        with socket.create_connection((host, port), timeout=2) as c:
            return c.recv(5).decode()
    except OSError as e:
        return type(e).__name__
print(tcp({node!r}, {allowed}), tcp({node!r}, {other}), tcp({metadata!r}, 80), tcp({internet_v6!r}, {allowed}))
"""


def test_egress_reaches_exactly_what_the_policy_allows(operator, namespace, standin_hits):
    node = operator.node_ip()
    listeners = Listeners(node)
    try:
        apply_policy(operator, namespace, "egress", {"allowClusterEgress": True, "egress": [  # the node is the cluster's
            {"cidr": f"{node}/32", "ports": [{"port": listeners.port(0)}]}, {"cidr": f"{INTERNET_V6}/128"}]})
        code = EGRESS_PROBE.format(node=node, allowed=listeners.port(0), other=listeners.port(1), metadata=METADATA_V4,
                                   internet_v6=INTERNET_V6)
        run = operator.wait_run(namespace, operator.create_run(namespace, {
            "language": "python", "code": code, "policyRef": "egress", "limits": {"timeoutSeconds": 20}}))
        status = status_of(run)
        reached, other, metadata, ipv6 = status["stdout"].split()
        assert reached == "hello", status
        assert other != "hello" and metadata != "hello" and ipv6 != "hello", status
        assert {port for port, _ in listeners.peers} == {listeners.port(0)}, listeners.peers
    finally:
        listeners.close()
    # Under the namespace's default policy, without egress, the same program reaches nothing.
    apply_policy(operator, namespace, "default", {})
    run = operator.wait_run(namespace, operator.create_run(namespace, {
        "language": "python", "code": code, "limits": {"timeoutSeconds": 20}}))
    assert "hello" not in status_of(run)["stdout"], status_of(run)
    # The stand-ins answer too ("stand", not "hello"): that no pod's packet reached them is theirs to say.
    standin_hits.assert_no_pod_reached_them()
