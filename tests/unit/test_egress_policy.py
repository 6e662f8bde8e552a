"""spec.egress of a CodeRunPolicy: host rules beside CIDR rules, every malformed one refused naming the field (in
Python as the API server's CEL rules do), and the operator's side: host rules only with an egress proxy, and
then a run's one route is to the proxy's pods."""
import pytest

from coderun.api.coderunpolicy import EGRESS_TOO_LARGE
from coderun.api.crd import policy_crd
from coderun.api.models import HOST_IS_AN_ADDRESS, HOST_MALFORMED, HOST_OR_CIDR, HOST_PORTS_TCP, HOST_WILDCARD
from coderun.api.policy import InvalidPolicy, read_policy_object
from coderun.egress.rules import Rule
from coderun_operator.builders.egress import ProxyRoute
from coderun_operator.builders.objects import build_network_policy
from coderun_operator.policy.egress import cluster_egress_refusal
from coderun_operator.policy.load import policy_from_object

ISSUE_EXAMPLE = [{"host": "api.github.com", "ports": [{"port": 443}]}, {"host": "*.example.org"},
                 {"cidr": "10.20.0.0/24", "ports": [{"port": 5432}]}]


def read(egress):
    return read_policy_object({"metadata": {"name": "p"}, "spec": {"egress": egress}})


def test_the_issue_s_policy_reads_and_its_rules_are_what_the_proxy_applies():
    spec, policy = read(ISSUE_EXAMPLE)
    assert [r.as_rule() for r in policy.egress] == [Rule(host="api.github.com", ports=(443,)),
                                                    Rule(host="*.example.org"), Rule(cidr="10.20.0.0/24", ports=(5432,))]


@pytest.mark.parametrize("rule, field, says", [
    ({"host": "10.0.0.1"}, "spec.egress.0.host", HOST_IS_AN_ADDRESS),
    ({"host": "2001:db8::1"}, "spec.egress.0.host", HOST_IS_AN_ADDRESS),
    ({"host": "api.*.com"}, "spec.egress.0.host", HOST_WILDCARD),
    ({"host": "*api.github.com"}, "spec.egress.0.host", HOST_WILDCARD),
    ({"host": "*.*.github.com"}, "spec.egress.0.host", HOST_WILDCARD),
    ({"host": "*.com"}, "spec.egress.0.host", HOST_MALFORMED),
    ({"host": "localhost"}, "spec.egress.0.host", HOST_MALFORMED),
    ({"host": "API.github.com"}, "spec.egress.0.host", HOST_MALFORMED),
    ({"host": "api.github.com."}, "spec.egress.0.host", HOST_MALFORMED),
    ({"host": "api_x.github.com"}, "spec.egress.0.host", HOST_MALFORMED),
    ({"host": "-a.github.com"}, "spec.egress.0.host", HOST_MALFORMED),
    ({"host": "a" * 64 + ".com"}, "spec.egress.0.host", HOST_MALFORMED),
    ({"host": ("a" * 63 + ".") * 4 + "com"}, "spec.egress.0.host", "at most 253 characters"),
    ({"cidr": "10.0.0.0/33"}, "spec.egress.0.cidr", "must be a CIDR"),
    ({"host": "a.com", "cidr": "10.0.0.0/8"}, "spec.egress.0", HOST_OR_CIDR),
    ({"ports": [{"port": 443}]}, "spec.egress.0", HOST_OR_CIDR),
    ({"host": "a.com", "ports": [{"port": 0}]}, "spec.egress.0.ports.0.port", "greater than or equal to 1"),
    ({"host": "a.com", "ports": [{"port": 65536}]}, "spec.egress.0.ports.0.port", "less than or equal to 65535"),
    ({"host": "a.com", "ports": [{"port": 53, "protocol": "UDP"}]}, "spec.egress.0", HOST_PORTS_TCP),
    ({"host": "a.com", "ports": [{"port": 443, "protocol": "SCTP"}]}, "spec.egress.0.ports.0.protocol", "pattern"),
])
def test_a_malformed_rule_is_refused_naming_the_field(rule, field, says):
    with pytest.raises(InvalidPolicy) as refused:
        read([rule])
    assert str(refused.value).startswith(f"{field}: ") and says in str(refused.value), refused.value


def test_egress_rules_heavier_than_a_credential_holds_are_refused_naming_the_field():
    heavy = [{"host": f"h{i:02d}{'a' * 50}.example.com", "ports": [{"port": 443}]} for i in range(64)]
    with pytest.raises(InvalidPolicy) as refused:
        read(heavy)
    assert str(refused.value).startswith("spec.egress: Value error, " + EGRESS_TOO_LARGE)
    read(heavy[:50])  # 50 such rules fit
    rules = policy_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"]
    assert any(r["message"] == EGRESS_TOO_LARGE and "sum() <= 4096" in r["rule"] for r in rules)


def test_the_api_server_refuses_the_same_with_the_same_words():
    rule = policy_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "egress"]["items"]
    assert {v["message"] for v in rule["x-kubernetes-validations"]} == {HOST_OR_CIDR, HOST_PORTS_TCP}
    host = rule["properties"]["host"]
    assert {v["message"] for v in host["x-kubernetes-validations"]} == {HOST_IS_AN_ADDRESS, HOST_WILDCARD}
    assert host["pattern"].startswith("^(\\*\\.)?") and host["maxLength"] == 253 and "required" not in rule


def test_without_an_egress_proxy_host_rules_are_refused_naming_the_first():
    policy = {"metadata": {"name": "p"}, "spec": {"allowClusterEgress": True, "egress": [
        {"cidr": "203.0.113.0/24"}, *ISSUE_EXAMPLE]}}
    with pytest.raises(InvalidPolicy, match=r"^spec\.egress\[1\]\.host: egress by name goes through the egress "
                                            r"proxy, which is off in this installation \(the chart's egressProxy"):
        policy_from_object(policy, proxy_enabled=False)
    assert [r.host for r in policy_from_object(policy, proxy_enabled=True).egress][1:3] == ["api.github.com",
                                                                                          "*.example.org"]


def test_host_rules_route_only_to_the_proxy_s_pods_and_cidr_indexes_hold():
    _, policy = read([{"host": "a.example.org"}, {"cidr": "203.0.113.0/24", "ports": [{"port": 443}]}])
    run = {"metadata": {"name": "r", "namespace": "ns", "uid": "u"}}
    direct = {"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}], "ports": [{"protocol": "TCP", "port": 443}]}
    assert build_network_policy(run, policy.egress)["spec"]["egress"] == [direct]
    route = ProxyRoute("coderun-system", (("app.kubernetes.io/component", "egress-proxy"),), 3128)
    assert build_network_policy(run, policy.egress, route)["spec"]["egress"] == [direct, {
        "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "coderun-system"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/component": "egress-proxy"}}}],
        "ports": [{"protocol": "TCP", "port": 3128}]}]
    _, cidr_only = read([{"cidr": "203.0.113.0/24", "ports": [{"port": 443}]}])
    assert build_network_policy(run, cidr_only.egress, route)["spec"]["egress"] == [direct]  # no names: no proxy
    message = cluster_egress_refusal([None, "10.0.0.0/8"], False)
    assert message.startswith("spec.egress[1].cidr: 10.0.0.0/8 covers")
