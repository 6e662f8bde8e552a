"""The Helm chart, rendered by the real helm (built into the cache like the cluster's binaries): lint, the
hardening of what it renders, RBAC that is exactly what the code calls, a values schema that refuses typos."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from coderun.api import crd

REPO = Path(__file__).parents[2]
CHART = REPO / "charts" / "coderun"


def template(helm: str, *args: str, check: bool = True) -> list[dict] | subprocess.CompletedProcess:
    result = subprocess.run([helm, "template", "coderun", str(CHART), "-n", "coderun-system", *args],
                            capture_output=True, text=True)
    if not check:
        return result
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def of_component(objects: list[dict], kind: str, component: str = "operator") -> list[dict]:
    """The objects of one kind that belong to the operator (or the egress proxy)."""
    return [o for o in by_kind(objects, kind)
            if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == component]


EVERYTHING = ["--set", "runtimeClass.create=true", "--set", "runNamespaces.create=true",
              "--set", "runNamespaces.names={agents,batch}", "--set", "defaultPolicy.enabled=true",
              "--set", "metrics.serviceMonitor.enabled=true"]


@pytest.mark.parametrize("values", [[], EVERYTHING], ids=["defaults", "everything-on"])
def test_helm_lint_passes(helm, values):
    result = subprocess.run([helm, "lint", "--strict", str(CHART), *values], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_operator_deployment_is_hardened(helm):
    deployment, = of_component(template(helm), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container, = pod["containers"]
    assert deployment["spec"]["replicas"] == 2
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"] == {"drop": ["ALL"]} and not security["privileged"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["limits"]["memory"] and container["resources"]["requests"]["cpu"]
    assert {p["name"] for p in container["ports"]} == {"health", "metrics", "webhook"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CODERUN_LEADER_ELECTION"] == "true" and env["CODERUN_WEBHOOK_MANAGED"] == "false"
    assert {"/tmp"} == {m["mountPath"] for m in container["volumeMounts"]}  # the webhook's certificate: at runtime


def test_an_image_digest_wins_over_the_tag(helm):
    digest = "sha256:" + "ab" * 32
    deployment, = of_component(template(helm, "--set", f"image.digest={digest}"), "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == f"coderun.local/operator@{digest}"
    deployment, = of_component(template(helm), "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "coderun.local/operator:0.1.0"


# What each Kubernetes client method that k8s.py calls needs, as (apiGroup, resource, verb).
# A WebSocket attach (connect_get) is authorized as `get` on pods/attach, and since 1.31 as `create` too.
_VERBS = {"read": "get", "get": "get", "list": "list", "create": "create", "delete": "delete", "patch": "patch",
          "replace": "update", "connect": "get"}
_RESOURCES = {"namespaced_pod": ("", "pods"), "namespaced_service": ("", "services"), "namespaced_pod_log": ("", "pods/log"), "node": ("", "nodes"),
              "get_namespaced_pod_attach": ("", "pods/attach"),
              "namespaced_event": ("", "events"), "namespaced_config_map": ("", "configmaps"),
              "namespaced_network_policy": ("networking.k8s.io", "networkpolicies"),
              "namespaced_lease": ("coordination.k8s.io", "leases"),
              "namespaced_custom_object": ("coderun.io", "coderuns"),
              "namespaced_custom_object_status": ("coderun.io", "coderuns/status"),
              "cluster_custom_object": ("coderun.io", "coderunpolicies"),
              "validating_admission_policy": ("admissionregistration.k8s.io", "validatingadmissionpolicies"),
              "validating_admission_policy_binding": ("admissionregistration.k8s.io",
                                                      "validatingadmissionpolicybindings"),
              "subject_access_review": ("authorization.k8s.io", "subjectaccessreviews"),
              "namespaced_secret": ("", "secrets"),
              "validating_webhook_configuration": ("admissionregistration.k8s.io", "validatingwebhookconfigurations")}
# What kopf's watches need, and the ownerReference's blockOwnerDeletion (templates/rbac.yaml says why).
_KOPF_AND_OWNERS = {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")} | {
    (group, resource, v) for group, resource in [("coderun.io", "coderuns"), ("coderun.io", "coderunpolicies"),
                                                ("", "pods")] for v in ("list", "watch")} | {
    ("coderun.io", "coderuns/finalizers", "update")}
# Granted only in the operator's own namespace (a Role): the leader election.
_OWN_NAMESPACE = {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")} | {("", "pods", "patch")} | {
    ("", "secrets", v) for v in ("get", "create", "update")} | {("", "services", "get")}


def _calls_in_k8s_py() -> set[tuple[str, str, str]]:
    source = (REPO / "operator" / "coderun_operator" / "k8s.py").read_text()
    needed = set()
    for verb, rest in re.findall(r"(?:_(?:core|networking|custom|coordination|admissionregistration|authorization)\(\)|\bcore)\.([a-z]+)_([a-z_]+)", source):
        assert rest in _RESOURCES, f"k8s.py calls {verb}_{rest}: add it to this test's table and the chart's RBAC"
        needed.add((*_RESOURCES[rest], _VERBS[verb]))
        if verb == "connect":
            needed.add((*_RESOURCES[rest], "create"))
    return needed


def _granted(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def test_rbac_grants_exactly_what_the_code_calls(helm):
    objects = template(helm)
    # The operator's own roles (the chart's approver ClusterRole is for people, bound by the platform team).
    cluster_rules = [r for role in by_kind(objects, "ClusterRole") if not role["metadata"]["name"].endswith("-approver")
                     for r in role["rules"]]
    namespace_rules = [r for role in by_kind(objects, "Role") for r in role["rules"]]
    needed = _calls_in_k8s_py()
    assert {("", "pods", "create"), ("coderun.io", "coderuns/status", "patch"), ("", "pods/attach", "create")} <= needed
    granted = _granted(cluster_rules) | _granted(namespace_rules)
    assert granted == needed | _KOPF_AND_OWNERS, (
        f"missing: {sorted(needed | _KOPF_AND_OWNERS - granted)}; unused: {sorted(granted - needed - _KOPF_AND_OWNERS)}")
    assert _granted(namespace_rules) == _OWN_NAMESPACE  # cluster-wide, the operator cannot write leases
    assert not any("*" in rule["verbs"] + rule["resources"] for rule in cluster_rules + namespace_rules)
    assert not any("secrets" in rule["resources"] for rule in cluster_rules)
    # Secrets, Services and the webhook configuration only by name, apart from create (which has no name to check).
    for rule in cluster_rules + namespace_rules:
        if {"secrets", "services", "validatingwebhookconfigurations"} & set(rule["resources"]) and \
                rule["verbs"] != ["create"]:
            assert rule["resourceNames"] in (["coderun-webhook-tls"], ["coderun"], ["coderun-egress-proxy-keys"],
                                             ["coderun-egress-proxy"]), rule
    cert_manager = template(helm, "--set", "webhook.certManager.enabled=true", "--set", "egressProxy.enabled=false")
    assert not any({"secrets", "validatingwebhookconfigurations"} & set(r["resources"])
                   for role in by_kind(cert_manager, "ClusterRole") + by_kind(cert_manager, "Role")
                   for r in role["rules"])
    # A Secret of the platform's own: read by name, never created.
    given = template(helm, "--set", "egressProxy.existingSecret=mine", "--set", "webhook.certManager.enabled=true")
    secret_rules = [r for role in by_kind(given, "Role") for r in role["rules"] if "secrets" in r["resources"]]
    assert secret_rules == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["mine"], "verbs": ["get"]}]


@pytest.mark.parametrize("typo, says", [
    (["--set", "replicaCont=3"], "replicaCont"),
    (["--set", "webhook.failurePolicy=Maybe"], "failurePolicy"),
    (["--set", "image.digest=latest"], "digest"),
    (["--set", "crds.keeep=false"], "keeep"),
    (["--set", "replicaCount=0"], "replicaCount"),
])
def test_the_values_schema_refuses_a_typo_naming_it(helm, typo, says):
    result = template(helm, *typo, check=False)
    assert result.returncode != 0 and says in result.stderr, result.stderr


def test_crds_follow_enabled_and_keep(helm):
    crds = by_kind(template(helm), "CustomResourceDefinition")
    assert {c["metadata"]["name"] for c in crds} == {"coderuns.coderun.io", "coderunpolicies.coderun.io"}
    assert all(c["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for c in crds)
    assert all(not c["metadata"].get("annotations") for c in
               by_kind(template(helm, "--set", "crds.keep=false"), "CustomResourceDefinition"))
    assert not by_kind(template(helm, "--set", "crds.enabled=false"), "CustomResourceDefinition")
    committed = {yaml.safe_load((REPO / "crds" / name).read_text())["metadata"]["name"]: yaml.safe_load(
        (REPO / "crds" / name).read_text()) for name in crd.CRDS}
    for rendered in crds:  # the chart's CRDs are the committed ones, apart from the keep annotation
        rendered["metadata"].pop("annotations")
        assert rendered == committed[rendered["metadata"]["name"]]


def test_the_chart_crds_match_the_models():
    assert (CHART / crd.CHART_TEMPLATE).read_text() == crd.render_chart(), "run `make crds` and commit the chart"


def test_the_webhook_is_rendered_the_same_every_time_with_no_private_key(helm):
    for values in ([], ["--set", "webhook.certManager.enabled=true"], ["--set", "webhook.existingSecret=mine"]):
        first, second = (template(helm, *values, check=False) for _ in range(2))
        assert first.returncode == 0 and first.stdout == second.stdout, values
        assert "PRIVATE KEY" not in first.stdout and "caBundle:" not in first.stdout, values
    objects = template(helm)
    assert not by_kind(objects, "Secret")
    config, = by_kind(objects, "ValidatingWebhookConfiguration")
    handlers = (REPO / "operator" / "coderun_operator" / "handlers.py").read_text()
    for hook in config["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        assert f'id="{path.lstrip("/")}"' in handlers, f"{path} is not a kopf handler id in handlers.py"
        assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] <= 30
    deployment, = of_component(objects, "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CODERUN_WEBHOOK_SECRET"] == "coderun-webhook-tls" and "CODERUN_WEBHOOK_CERT" not in env
    assert env["CODERUN_WEBHOOK_CONFIGURATION"] == config["metadata"]["name"]
    assert env["CODERUN_WEBHOOK_HOST"] == "coderun-webhook.coderun-system.svc"
    assert env["CODERUN_WEBHOOK_TLS_DIR"].startswith("/tmp/")  # the only writable path
    service = next(s for s in by_kind(objects, "Service") if s["metadata"]["name"] == "coderun-webhook")
    assert service["spec"]["selector"]["coderun.io/leader"] == "true"  # only the leader runs kopf
    failing = by_kind(template(helm, "--set", "webhook.failurePolicy=Fail"), "ValidatingWebhookConfiguration")
    assert {h["failurePolicy"] for h in failing[0]["webhooks"]} == {"Fail"}
    assert not by_kind(template(helm, "--set", "webhook.enabled=false"), "ValidatingWebhookConfiguration")


def test_cert_manager_issues_the_certificate_the_operator_mounts(helm):
    objects = template(helm, "--set", "webhook.certManager.enabled=true")
    config, = by_kind(objects, "ValidatingWebhookConfiguration")
    certificates = {c["metadata"]["name"]: c for c in by_kind(objects, "Certificate")}
    issuers = {i["metadata"]["name"]: i for i in by_kind(objects, "Issuer")}
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "coderun-system/coderun-webhook"
    serving, ca = certificates["coderun-webhook"], certificates["coderun-webhook-ca"]
    assert ca["spec"]["isCA"] and issuers[ca["spec"]["issuerRef"]["name"]]["spec"] == {"selfSigned": {}}
    assert issuers[serving["spec"]["issuerRef"]["name"]]["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    assert "coderun-webhook.coderun-system.svc" in serving["spec"]["dnsNames"]
    deployment, = of_component(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["CODERUN_WEBHOOK_CERT"] == "/etc/coderun/webhook/tls.crt" and "CODERUN_WEBHOOK_SECRET" not in env
    assert "CODERUN_WEBHOOK_CONFIGURATION" not in env  # cert-manager's cainjector owns the caBundle
    volume, = [v for v in pod["volumes"] if v["name"] == "webhook-tls"]
    assert volume["secret"]["secretName"] == serving["spec"]["secretName"]


def test_the_operator_network_policy_keeps_pods_off_the_webhook_and_metrics(helm):
    policy, = of_component(template(helm), "NetworkPolicy")
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    rules = {p["port"]: rule for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    # No cluster ranges known: no rule admits the webhook (only the node itself, i.e. an API server on it), and
    # no rule the health port (the kubelet's probes come from the node, which NetworkPolicy does not police).
    assert set(rules) == {"metrics"}
    assert rules["metrics"]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    egress_ports = {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]}
    assert egress_ports == {53, 443, 6443, 3130}  # DNS, the API server, the egress proxy's admin port
    policy, = of_component(template(helm, "--set", "egressProxy.enabled=false"), "NetworkPolicy")
    assert {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]} == {53, 443, 6443}
    policy, = of_component(template(helm, "--set", "clusterNetwork.podCIDRs={10.88.0.0/16,fd00:10:88::/64}"),
                           "NetworkPolicy")
    webhook, = [rule for rule in policy["spec"]["ingress"] if rule["ports"][0]["port"] == "webhook"]
    assert webhook["from"] == [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.88.0.0/16"]}},
                               {"ipBlock": {"cidr": "::/0", "except": ["fd00:10:88::/64"]}}]
    peers = [{"ipBlock": {"cidr": "172.16.0.0/28"}}]
    policy, = of_component(template(helm, "--set-json", f"networkPolicy.webhookFrom={json.dumps(peers)}"),
                           "NetworkPolicy")
    webhook, = [rule for rule in policy["spec"]["ingress"] if rule["ports"][0]["port"] == "webhook"]
    assert webhook["from"] == peers


def test_the_cluster_ranges_reach_the_operator_and_the_egress_proxy(helm):
    objects = template(helm, "--set", "clusterNetwork.podCIDRs={10.88.0.0/16}",
                       "--set", "clusterNetwork.serviceCIDRs={10.96.0.0/16}")
    for component in ("operator", "egress-proxy"):
        deployment, = of_component(objects, "Deployment", component)
        env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["CODERUN_POD_CIDRS"] == "10.88.0.0/16" and env["CODERUN_SERVICE_CIDRS"] == "10.96.0.0/16"
        assert "CODERUN_NODE_CIDRS" not in env
    assert "clusterNetwork" in template(helm, "--set", "clusterNetwork.podCIDRs={not-a-cidr}", check=False).stderr


def test_optional_objects_render_when_asked(helm):
    objects = template(helm, *EVERYTHING)
    assert by_kind(objects, "RuntimeClass")[0]["handler"] == "runsc"
    namespaces = by_kind(objects, "Namespace")
    assert {n["metadata"]["name"] for n in namespaces} == {"agents", "batch"}
    assert all(n["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted" for n in namespaces)
    assert all(n["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for n in namespaces)
    policies = by_kind(objects, "CodeRunPolicy")
    assert {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in policies} == {("agents", "default"),
                                                                                       ("batch", "default")}
    assert policies[0]["spec"]["admission"] == "Enforce"
    assert by_kind(objects, "ServiceMonitor")[0]["spec"]["endpoints"][0]["port"] == "metrics"
    assert of_component(objects, "PodDisruptionBudget")[0]["spec"]["minAvailable"] == 1
    assert not of_component(template(helm, "--set", "replicaCount=1"), "PodDisruptionBudget")


def test_every_value_is_commented():
    """Each key in values.yaml has a comment right above it, or sits under a key that has one."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    documented_at: list[int] = []  # indents of the documented keys enclosing the current line
    for i, line in enumerate(lines):
        key = re.match(r"^( *)([A-Za-z][\w.]*):", line)
        if not key:
            continue
        indent = len(key.group(1))
        while documented_at and documented_at[-1] >= indent:
            documented_at.pop()
        above = lines[i - 1].strip() if i else ""
        if above.startswith("#") or "#" in line.split(":", 1)[1]:
            documented_at.append(indent)
        else:
            assert documented_at, f"values.yaml line {i + 1}: `{key.group(2)}` has no comment"



def test_the_chart_installs_the_identity_policies_and_an_approver_role(helm):
    from coderun.api.identity import admission_policies
    objects = template(helm)
    for wanted in admission_policies():
        rendered, = [o for o in by_kind(objects, wanted["kind"]) if o["metadata"]["name"] == wanted["metadata"]["name"]]
        assert rendered["spec"] == wanted["spec"] and rendered["metadata"]["labels"]["app.kubernetes.io/part-of"]
    approver, = [r for r in by_kind(objects, "ClusterRole") if r["metadata"]["name"] == "coderun-approver"]
    assert _granted(approver["rules"]) >= {("coderun.io", "coderuns", "approve"), ("coderun.io", "coderuns", "patch")}
    assert not any(v in ("create", "delete", "*") for rule in approver["rules"] for v in rule["verbs"])


def test_the_readme_installs_with_its_own_values_file(helm, tmp_path):
    """The values file the README has a newcomer write: it lints, renders the run namespace and its `default`
    policy, and that policy loads as the operator loads it (the digests stand in for what was pushed)."""
    from coderun_operator.policy.load import policy_from_object
    readme = (REPO / "README.md").read_text()
    block = re.search(r"write `my-values.yaml`.*?```yaml\n(.*?)```", readme, re.S)
    assert block, "the README's my-values.yaml block"
    values = tmp_path / "my-values.yaml"
    values.write_text(block.group(1).replace("sha256:...", "sha256:" + "0" * 64))
    linted = subprocess.run([helm, "lint", "--strict", str(CHART), "-f", str(values)], capture_output=True, text=True)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    objects = template(helm, "-f", str(values))
    assert [n["metadata"]["name"] for n in by_kind(objects, "Namespace")] == ["agents"]
    policy, = by_kind(objects, "CodeRunPolicy")
    assert policy["metadata"]["namespace"] == "agents"
    assert policy_from_object(policy).runtimes["python"].image.endswith("@sha256:" + "0" * 64)
    deployment, = of_component(objects, "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].endswith("@sha256:" + "0" * 64)
    proxy, = of_component(objects, "Deployment", "egress-proxy")  # the proxy image the README has them push
    assert {c["image"] for c in proxy["spec"]["template"]["spec"]["containers"]} == {
        "registry.example.com/coderun/egress-proxy@sha256:" + "0" * 64}


def test_the_egress_proxy_is_hardened_and_holds_no_api_token(helm):
    objects = template(helm)
    deployment, = of_component(objects, "Deployment", "egress-proxy")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2 and pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["affinity"]["podAntiAffinity"]  # spread like the operator's
    squid, admin = pod["containers"]
    for container in (squid, admin):
        assert container["securityContext"] == {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                                "privileged": False, "capabilities": {"drop": ["ALL"]}}
        assert container["resources"]["limits"]["memory"]
    assert squid["readinessProbe"]["exec"]["command"][-1] == "ready" and admin["command"][-1] == "admin"
    mounts = {m["mountPath"]: m for m in squid["volumeMounts"]}
    assert mounts["/etc/coderun-egress/keys"]["readOnly"] and "/run/coderun-egress" in mounts and "/dev/shm" in mounts
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shm"]["emptyDir"]["medium"] == "Memory" and volumes["state"]["emptyDir"]["sizeLimit"] == "1Gi"
    assert volumes["keys"]["secret"]["secretName"] == "coderun-egress-proxy-keys"
    assert not by_kind(objects, "Secret")  # the operator makes the key at start: nothing secret in the render
    operator, = of_component(objects, "Deployment")
    env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CODERUN_EGRESS_PROXY"] == "coderun-system/coderun-egress-proxy"
    assert (env["CODERUN_EGRESS_KEYS_SECRET"], env["CODERUN_EGRESS_KEY_ID"], env["CODERUN_EGRESS_KEYS_CREATE"]) == (
        "coderun-egress-proxy-keys", "k1", "true")
    service, = of_component(objects, "Service", "egress-proxy")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"proxy": 3128, "admin": 3130}
    assert service["spec"]["sessionAffinity"] == "ClientIP" and service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_egress_proxy_takes_runs_from_sandboxes_orders_from_the_operator_and_reaches_no_cluster_range(helm):
    objects = template(helm, "--set", "clusterNetwork.podCIDRs={10.88.0.0/16}",
                       "--set", "clusterNetwork.nodeCIDRs={192.168.5.0/24,fd00:5::/64}")
    policy, = of_component(objects, "NetworkPolicy", "egress-proxy")
    ingress = {rule["ports"][0]["port"]: rule["from"] for rule in policy["spec"]["ingress"]}
    assert ingress["proxy"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"coderun.io/sandbox": "true"}}}]
    operator, = of_component(objects, "Deployment")
    assert ingress["admin"] == [{"podSelector": {"matchLabels": operator["spec"]["selector"]["matchLabels"]}}]
    dns, out = policy["spec"]["egress"]
    assert {p["port"] for p in dns["ports"]} == {53} and "to" not in dns
    assert out["to"] == [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.88.0.0/16", "192.168.5.0/24", "127.0.0.0/8",
                                                     "169.254.0.0/16", "0.0.0.0/8"]}},
        {"ipBlock": {"cidr": "::/0", "except": ["fd00:5::/64", "fe80::/10", "::1/128"]}}]
    unset, = of_component(template(helm), "NetworkPolicy", "egress-proxy")  # no ranges known: every private one
    assert "10.0.0.0/8" in unset["spec"]["egress"][1]["to"][0]["ipBlock"]["except"]
    mirror = [{"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mirror"}}}],
               "ports": [{"port": 443, "protocol": "TCP"}]}]
    extra, = of_component(template(helm, "--set-json", f"egressProxy.extraEgress={json.dumps(mirror)}"),
                          "NetworkPolicy", "egress-proxy")
    assert extra["spec"]["egress"][2:] == mirror


def test_without_the_egress_proxy_nothing_of_it_renders_and_the_operator_is_told(helm):
    objects = template(helm, "--set", "egressProxy.enabled=false")
    assert not [o for o in objects if "egress-proxy" in o["metadata"]["name"]]
    operator, = of_component(objects, "Deployment")
    assert not [e for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]
                if e["name"].startswith("CODERUN_EGRESS")]
