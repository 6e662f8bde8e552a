"""The Helm chart, rendered by the real helm (built into the cache like the cluster's binaries): lint, the
hardening of what it renders, RBAC that is exactly what the code calls, a values schema that refuses typos."""
from __future__ import annotations

import base64
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
              "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true"]


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
              "get_namespaced_pod_attach": ("", "pods/attach"), "namespaced_pod_resize": ("", "pods/resize"),
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
                                                ("coderun.io", "coderunsessions"), ("", "pods")]
    for v in ("list", "watch")} | {
    ("coderun.io", "coderuns/finalizers", "update"), ("coderun.io", "coderunsessions/finalizers", "update")}
# Granted only in the operator's own namespace (a Role): the leader election.
_OWN_NAMESPACE = {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")} | {("", "pods", "patch")} | {
    ("", "secrets", v) for v in ("get", "create", "update")} | {("", "services", "get")}


def _calls_in_k8s_py() -> set[tuple[str, str, str]]:
    source = (REPO / "operator" / "coderun_operator" / "k8s.py").read_text()
    needed = set()
    for verb, rest, plural in re.findall(r"(?:_(?:core|networking|custom|coordination|admissionregistration|authorization)\(\)|\bcore)\.([a-z]+)_([a-z_]+)(?:,\s+GROUP,\s+VERSION,\s+\w+,\s+(POLICY_PLURAL|SESSION_PLURAL)\b)?", source):
        assert rest in _RESOURCES, f"k8s.py calls {verb}_{rest}: add it to this test's table and the chart's RBAC"
        group, resource = _RESOURCES[rest]
        if plural:  # a namespaced custom object call on CodeRunPolicies or CodeRunSessions rather than CodeRuns
            resource = resource.replace("coderuns", {"POLICY_PLURAL": "coderunpolicies",
                                                     "SESSION_PLURAL": "coderunsessions"}[plural])
        needed.add((group, resource, _VERBS[verb]))
        if verb == "connect":
            needed.add((*_RESOURCES[rest], "create"))
    return needed


def _granted(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def _bound_to_the_operator(objects: list[dict], kind: str) -> list[dict]:
    """The rules of the roles of `kind` that the chart binds to the operator's ServiceAccount (the chart's other
    roles are for people and agents, bound by the platform team)."""
    bound = {b["roleRef"]["name"] for b in by_kind(objects, kind + "Binding")
             if any(s["kind"] == "ServiceAccount" and s["name"] == "coderun" for s in b["subjects"])}
    return [rule for role in by_kind(objects, kind) if role["metadata"]["name"] in bound for rule in role["rules"]]


# The sessions' key (controller/session), always: read by name, created once if absent.
SESSION_KEY_RULES = [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["coderun-session-key"],
                      "verbs": ["get"]}, {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]


def test_rbac_grants_exactly_what_the_code_calls(helm):
    objects = template(helm)
    cluster_rules = _bound_to_the_operator(objects, "ClusterRole")
    namespace_rules = _bound_to_the_operator(objects, "Role")
    needed = _calls_in_k8s_py()
    assert {("", "pods", "create"), ("coderun.io", "coderuns/status", "patch"), ("", "pods/attach", "create")} <= needed
    granted = _granted(cluster_rules) | _granted(namespace_rules)
    assert granted == needed | _KOPF_AND_OWNERS, (
        f"missing: {sorted((needed | _KOPF_AND_OWNERS) - granted)}; unused: {sorted(granted - needed - _KOPF_AND_OWNERS)}")
    assert _granted(namespace_rules) == _OWN_NAMESPACE  # cluster-wide, the operator cannot write leases
    assert not any("*" in rule["verbs"] + rule["resources"] for rule in cluster_rules + namespace_rules)
    assert not any("secrets" in rule["resources"] for rule in cluster_rules)
    # Secrets, Services and the webhook configuration only by name, apart from create (which has no name to check).
    for rule in cluster_rules + namespace_rules:
        if {"secrets", "services", "validatingwebhookconfigurations"} & set(rule["resources"]) and \
                rule["verbs"] != ["create"]:
            assert rule["resourceNames"] in (["coderun-webhook-tls"], ["coderun"], ["coderun-egress-proxy-keys"],
                                             ["coderun-egress-proxy"], ["coderun-audit-key"],
                                             ["coderun-session-key"], ["coderun-data-keys"], ["coderun-store"],
                                             ["coderun-data"]), rule
    cert_manager = template(helm, "--set", "webhook.certManager.enabled=true", "--set", "egressProxy.enabled=false",
                            "--set", "audit.enabled=false", "--set", "data.enabled=false")
    assert not any({"secrets", "validatingwebhookconfigurations"} & set(r["resources"])
                   and r.get("resourceNames") != ["coderun-session-key"] and r["verbs"] != ["create"]
                   for r in _bound_to_the_operator(cert_manager, "ClusterRole") +
                   _bound_to_the_operator(cert_manager, "Role"))
    # A Secret of the platform's own: read by name, never created.
    given = template(helm, "--set", "egressProxy.existingSecret=mine", "--set", "webhook.certManager.enabled=true",
                     "--set", "audit.enabled=false", "--set", "data.enabled=false")
    secret_rules = [r for role in by_kind(given, "Role") for r in role["rules"] if "secrets" in r["resources"]]
    assert sorted(map(str, secret_rules)) == sorted(map(str, [*SESSION_KEY_RULES, {
        "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["mine"], "verbs": ["get"]}]))
    given = template(helm, "--set", "audit.existingSecret=theirs", "--set", "egressProxy.enabled=false",
                     "--set", "webhook.certManager.enabled=true", "--set", "data.enabled=false")
    secret_rules = [r for role in by_kind(given, "Role") for r in role["rules"] if "secrets" in r["resources"]]
    assert sorted(map(str, secret_rules)) == sorted(map(str, [*SESSION_KEY_RULES, {
        "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["theirs"], "verbs": ["get"]}]))


def test_the_operator_asks_the_audit_agents_unless_the_audit_is_off(helm):
    deployment, = of_component(template(helm), "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert (env["CODERUN_AUDIT_AGENT"], env["CODERUN_AUDIT_KEY_SECRET"], env["CODERUN_AUDIT_KEY_CREATE"]) == (
        "coderun-system-audit/audit-agent", "coderun-audit-key", "true")
    assert (env["CODERUN_AUDIT_DEADLINE_SECONDS"], env["CODERUN_AUDIT_WAIT_MILLIS"]) == ("3", "1000")
    deployment, = of_component(template(helm, "--set", "audit.enabled=false"), "Deployment")
    assert not any(e["name"].startswith("CODERUN_AUDIT_")
                   for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"])


def test_the_audit_agent_reads_the_hosts_cgroups_read_only_and_writes_only_its_socket_directory(helm):
    """A pod's OOM kill count (coderun/audit/oom.py): the one other host path, and read-only."""
    agent, = of_component(template(helm), "DaemonSet", "audit-agent")
    spec = agent["spec"]["template"]["spec"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths == {"socket-dir": "/run/coderun/audit", "cgroup": "/sys/fs/cgroup", "pod-logs": "/var/log/pods"}
    container, = spec["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["cgroup"] == {"name": "cgroup", "mountPath": "/host/sys/fs/cgroup", "readOnly": True,
                                "recursiveReadOnly": "IfPossible"}
    assert "--cgroup-root=/host/sys/fs/cgroup" in container["args"]
    assert not spec.get("hostPID") and container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_both_egress_proxy_containers_know_their_pod_s_name(helm):
    """Squid's helpers and the tunnel relay (the admin container's) each refuse a credential pinned to another pod."""
    proxy, = of_component(template(helm), "Deployment", "egress-proxy")
    containers = proxy["spec"]["template"]["spec"]["containers"]
    assert {c["name"] for c in containers} == {"squid", "admin"}
    for container in containers:
        env = {e["name"]: e for e in container.get("env", [])}
        assert env.get("CODERUN_EGRESS_POD_NAME", {}).get("valueFrom") == {
            "fieldRef": {"fieldPath": "metadata.name"}}, container["name"]


@pytest.mark.parametrize("typo, says", [
    (["--set", "replicaCont=3"], "replicaCont"),
    (["--set", "webhook.failurePolicy=Maybe"], "failurePolicy"),
    (["--set", "image.digest=latest"], "digest"),
    (["--set", "crds.keeep=false"], "keeep"),
    (["--set", "replicaCount=0"], "replicaCount"),
    (["--set", "podLabel.team=a"], "podLabel"),
    (["--set", "resources.limits.memory=512MB"], "512MB"),
    (["--set", "resources.requests.ephemeral_storage=1Gi"], "ephemeral_storage"),
    (["--set", "operator.logFormat=yaml"], "logFormat"),
    (["--set", "fullnameOverride=Coderun_1"], "fullnameOverride"),
    (["--set-json", 'topologySpreadConstraints=[{"maxSkew": 1, "topologyKy": "zone", "whenUnsatisfiable": "ScheduleAnyway"}]'],
     "topologyKy"),
    (["--set-json", 'egressProxy.topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "zone"}]'], "whenUnsatisfiable"),
    (["--set-string", "podLabels.app\\.kubernetes\\.io/instance=mine"], "app.kubernetes.io/instance is the chart's own"),
    (["--set-string", "egressProxy.podLabels.coderun\\.io/sandbox=true"], "egressProxy.podLabels: the label coderun.io/sandbox"),
    (["--set-string", "commonLabels.app\\.kubernetes\\.io/version=9"], "commonLabels: the label app.kubernetes.io/version"),
    (["--set-string", "commonLabels.coderun\\.io/run=x"], "commonLabels: the label coderun.io/run"),
    (["--set-string", "commonLabels.team=not a label value"], "commonLabels"),
    (["--set-string", "commonLabels.-team=x"], "'-team' does not match"),  # helm names a wrong path for this one
    (["--set-json", 'sandboxScheduling.tolerations=[{"key": "k", "operator": "Exists", "effect": "NoRun"}]'], "effect"),
    (["--set-json", 'sandboxScheduling.affinity={"nodeAfinity": {}}'], "nodeAfinity"),
    (["--set", "sandboxScheduling.priorityClassName=system-node-critical"], "priorityClassName"),
    (["--set-json", 'runtimeClass.scheduling.tolerations=[{"key": "k", "operatr": "Exists"}]'], "operatr"),
])
def test_the_values_schema_refuses_a_typo_naming_it(helm, typo, says):
    result = template(helm, *typo, check=False)
    assert result.returncode != 0 and says in result.stderr, result.stderr


def test_crds_follow_enabled_and_keep(helm):
    crds = by_kind(template(helm), "CustomResourceDefinition")
    assert {c["metadata"]["name"] for c in crds} == {"coderuns.coderun.io", "coderunpolicies.coderun.io",
                                                     "coderunsessions.coderun.io"}
    assert all(c["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for c in crds)
    assert all(not c["metadata"].get("annotations") for c in
               by_kind(template(helm, "--set", "crds.keep=false"), "CustomResourceDefinition"))
    assert not by_kind(template(helm, "--set", "crds.enabled=false"), "CustomResourceDefinition")
    committed = {yaml.safe_load((REPO / "crds" / name).read_text())["metadata"]["name"]: yaml.safe_load(
        (REPO / "crds" / name).read_text()) for name in crd.CRDS}
    for rendered in crds:  # the chart's CRDs are the committed ones, apart from the keep annotation and the labels
        rendered["metadata"].pop("annotations")
        labels, own = rendered["metadata"].pop("labels"), committed[rendered["metadata"]["name"]]
        assert labels.items() >= own["metadata"]["labels"].items() and labels["app.kubernetes.io/managed-by"] == "Helm"
        assert rendered == {**own, "metadata": {k: v for k, v in own["metadata"].items() if k != "labels"}}


def test_the_chart_crds_match_the_models():
    assert (CHART / crd.CHART_TEMPLATE).read_text() == crd.render_chart(), "run `make crds` and commit the chart"


def test_the_webhook_is_rendered_the_same_every_time_with_no_private_key(helm):
    # The embedded store's keys are generated at install (templates/store.yaml): the one Secret the chart renders.
    no_store = ["--set", "store.embedded.enabled=false", "--set", "data.enabled=false"]
    for values in ([], ["--set", "webhook.certManager.enabled=true"], ["--set", "webhook.existingSecret=mine"]):
        first, second = (template(helm, *no_store, *values, check=False) for _ in range(2))
        assert first.returncode == 0 and first.stdout == second.stdout, values
        assert "PRIVATE KEY" not in first.stdout and "caBundle:" not in first.stdout, values
    objects = template(helm)
    assert [s["metadata"]["name"] for s in by_kind(objects, "Secret")] == ["coderun-store"]
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
    # DNS, the API server, the proxy's admin, the audit agents, the store, the data service.
    assert egress_ports == {53, 443, 6443, 3130, 9090, 7070, 8080}
    policy, = of_component(template(helm, "--set", "egressProxy.enabled=false", "--set", "audit.enabled=false",
                                    "--set", "data.enabled=false"), "NetworkPolicy")
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
    # The audit agents' namespace (Pod Security privileged: a hostPath) besides the run namespaces.
    assert {n["metadata"]["name"] for n in namespaces} == {"agents", "batch", "coderun-system-audit"}
    assert {n["metadata"]["name"]: n["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] for n in namespaces} == {
        "agents": "restricted", "batch": "restricted", "coderun-system-audit": "privileged"}
    # Run namespaces hold the agents' runs and stay when the release goes; the audit agents' goes with it.
    assert {n["metadata"]["name"] for n in namespaces
            if (n["metadata"].get("annotations") or {}).get("helm.sh/resource-policy") == "keep"} == {"agents", "batch"}
    policies = by_kind(objects, "CodeRunPolicy")
    assert {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in policies} == {("agents", "default"),
                                                                                       ("batch", "default")}
    assert policies[0]["spec"]["admission"] == "Enforce"
    assert by_kind(objects, "ServiceMonitor")[0]["spec"]["endpoints"][0]["port"] == "metrics"
    assert of_component(objects, "PodDisruptionBudget")[0]["spec"]["minAvailable"] == 1
    assert not of_component(template(helm, "--set", "replicaCount=1"), "PodDisruptionBudget")


def test_run_namespaces_get_a_coderun_count_quota_by_default_and_a_limit_range_when_asked(helm):
    names = ["--set", "runNamespaces.names={agents,batch}"]
    quotas = by_kind(template(helm, *names), "ResourceQuota")
    assert {(q["metadata"]["namespace"], q["metadata"]["name"]) for q in quotas} == {("agents", "coderun"),
                                                                                     ("batch", "coderun")}
    assert quotas[0]["spec"]["hard"] == {"count/coderuns.coderun.io": "5000"}
    assert not by_kind(template(helm, *names), "LimitRange")  # off by default
    assert not by_kind(template(helm), "ResourceQuota")  # no run namespaces, no quota
    # Any hard map, merged with the default (null drops a key); off removes it.
    hard = {"pods": "200", "requests.memory": "200Gi", "count/coderuns.coderun.io": None}
    quota = by_kind(template(helm, *names, "--set-json", f"runNamespaces.resourceQuota.hard={json.dumps(hard)}"),
                    "ResourceQuota")[0]
    assert quota["spec"]["hard"] == {"pods": "200", "requests.memory": "200Gi"}
    assert not by_kind(template(helm, *names, "--set", "runNamespaces.resourceQuota.enabled=false"), "ResourceQuota")
    limits = [{"type": "Container", "max": {"cpu": "4", "memory": "8Gi"}, "defaultRequest": {"cpu": "100m"}}]
    ranged = by_kind(template(helm, *names, "--set", "runNamespaces.limitRange.enabled=true",
                              "--set-json", f"runNamespaces.limitRange.limits={json.dumps(limits)}"), "LimitRange")
    assert [r["metadata"]["namespace"] for r in ranged] == ["agents", "batch"] and ranged[0]["spec"]["limits"] == limits
    empty = template(helm, *names, "--set", "runNamespaces.limitRange.enabled=true", check=False)
    assert empty.returncode != 0 and "runNamespaces.limitRange.limits" in empty.stderr
    bad = [{"type": "Container", "max": {"memory": "8GB"}}]
    refused = template(helm, *names, "--set-json", f"runNamespaces.limitRange.limits={json.dumps(bad)}", check=False)
    assert refused.returncode != 0 and "limitRange" in refused.stderr


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
    assert [n["metadata"]["name"] for n in by_kind(objects, "Namespace")] == ["coderun-system-audit", "agents"]
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
    # The operator makes the key at start: nothing of the proxy's is secret in the render.
    assert not [s for s in by_kind(objects, "Secret") if "egress" in s["metadata"]["name"]]
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


def test_an_upstream_proxy_reaches_squid_with_its_login_mounted_and_is_the_proxys_only_way_out(helm):
    def proxy_parts(*values: str) -> tuple[dict, dict, dict]:
        objects = template(helm, *values)
        deployment, = of_component(objects, "Deployment", "egress-proxy")
        policy, = of_component(objects, "NetworkPolicy", "egress-proxy")
        containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
        return deployment, containers, policy
    _, containers, policy = proxy_parts()  # the control: no upstream, squid connects itself
    assert not any(e["name"].startswith("CODERUN_EGRESS_UPSTREAM") for e in containers["squid"]["env"])
    assert any("ipBlock" in to for rule in policy["spec"]["egress"] for to in rule.get("to", []))
    deployment, containers, policy = proxy_parts("--set", "egressProxy.upstream.host=10.20.0.5",
                                                 "--set", "egressProxy.upstream.port=8080",
                                                 "--set", "egressProxy.upstream.existingSecret=corp-proxy")
    env = {e["name"]: e.get("value") for e in containers["squid"]["env"]}
    assert (env["CODERUN_EGRESS_UPSTREAM_HOST"], env["CODERUN_EGRESS_UPSTREAM_PORT"]) == ("10.20.0.5", "8080")
    assert env["CODERUN_EGRESS_UPSTREAM_LOGIN"] == "/etc/coderun-egress/upstream"
    # The login is a file in squid's container alone, never an environment variable's value.
    assert not any("secretKeyRef" in str(e.get("valueFrom")) for c in containers.values() for e in c.get("env", []))
    assert {"name": "upstream-login", "mountPath": "/etc/coderun-egress/upstream", "readOnly": True} in containers[
        "squid"]["volumeMounts"]
    assert not any(m["name"] == "upstream-login" for m in containers["admin"]["volumeMounts"])
    volume, = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "upstream-login"]
    assert volume["secret"]["secretName"] == "corp-proxy" and "optional" not in volume["secret"]
    # Out: DNS and the upstream alone (the every-address rule is gone).
    dns, upstream = policy["spec"]["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert upstream == {"ports": [{"port": 8080, "protocol": "TCP"}], "to": [{"ipBlock": {"cidr": "10.20.0.5/32"}}]}
    # A name: the port at any address (a NetworkPolicy cannot name a host); no login, nothing mounted.
    _, containers, policy = proxy_parts("--set", "egressProxy.upstream.host=proxy.corp.example")
    assert policy["spec"]["egress"][1] == {"ports": [{"port": 3128, "protocol": "TCP"}]}
    assert "CODERUN_EGRESS_UPSTREAM_LOGIN" not in {e["name"] for e in containers["squid"]["env"]}
    bad = template(helm, "--set", "egressProxy.upstream.host=proxy corp", check=False)
    assert bad.returncode != 0 and "upstream" in bad.stderr


def test_without_the_egress_proxy_nothing_of_it_renders_and_the_operator_is_told(helm):
    objects = template(helm, "--set", "egressProxy.enabled=false")
    assert not [o for o in objects if "egress-proxy" in o["metadata"]["name"]]
    operator, = of_component(objects, "Deployment")
    assert not [e for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]
                if e["name"].startswith("CODERUN_EGRESS")]


PLATFORM = {
    "fullnameOverride": "sandboxes",
    "podAnnotations": {"fluentbit.io/parser": "json"}, "podLabels": {"team": "platform"},
    "operator": {"logFormat": "json", "extraArgs": ["--log-refkey", "k8s"]},
    "resources": {"requests": {"ephemeral-storage": "100Mi"}, "limits": {"ephemeral-storage": "1Gi"}},
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "ScheduleAnyway"}],
    "egressProxy": {"podAnnotations": {"a": "b"}, "podLabels": {"team": "network"},
                    "resources": {"limits": {"ephemeral-storage": "2Gi"}},
                    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                   "whenUnsatisfiable": "DoNotSchedule",
                                                   "labelSelector": {"matchLabels": {"tier": "proxy"}}}]},
}


def test_a_platforms_common_values_reach_the_pods(helm, tmp_path):
    values = tmp_path / "platform.yaml"
    values.write_text(yaml.safe_dump(PLATFORM))
    linted = subprocess.run([helm, "lint", "--strict", str(CHART), "-f", str(values)], capture_output=True, text=True)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    objects = template(helm, "-f", str(values))
    operator, = of_component(objects, "Deployment")
    pod = operator["spec"]["template"]
    assert pod["metadata"]["annotations"] == {"fluentbit.io/parser": "json"}
    assert pod["metadata"]["labels"] == {**operator["spec"]["selector"]["matchLabels"], "team": "platform"}
    container, = pod["spec"]["containers"]
    assert container["args"] == ["--log-format=json", "--log-refkey", "k8s"]
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "512Mi", "ephemeral-storage": "1Gi"}
    assert container["resources"]["requests"]["ephemeral-storage"] == "100Mi"
    # A constraint without a labelSelector spreads the component's own pods; one with it keeps its own.
    spread, = pod["spec"]["topologySpreadConstraints"]
    assert spread["labelSelector"] == {"matchLabels": operator["spec"]["selector"]["matchLabels"]}
    proxy, = of_component(objects, "Deployment", "egress-proxy")
    assert proxy["spec"]["template"]["metadata"]["labels"]["team"] == "network"
    assert proxy["spec"]["template"]["metadata"]["annotations"] == {"a": "b"}
    assert proxy["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["labelSelector"] == {
        "matchLabels": {"tier": "proxy"}}
    assert proxy["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] == "2Gi"


def _pod_templates(objects: list[dict]) -> list[dict]:
    return [o["spec"]["template"] for o in objects if o["kind"] in ("Deployment", "DaemonSet")]


def _selectors(objects: list[dict]) -> list[dict]:
    """Every label selector the chart renders of its own pods: workloads', Services', PDBs', NetworkPolicies'."""
    found = []
    for o in objects:
        spec = o.get("spec") or {}
        if o["kind"] in ("Deployment", "DaemonSet", "PodDisruptionBudget", "ServiceMonitor"):
            found.append(spec["selector"].get("matchLabels", spec["selector"]))
        elif o["kind"] == "Service":
            found.append(spec["selector"])
        elif o["kind"] == "NetworkPolicy":
            found.append(spec["podSelector"].get("matchLabels", {}))
    return found


def test_common_labels_reach_every_object_and_pod_template_but_no_selector(helm):
    common = {"team": "platform", "example.com/cost-center": "ml-42"}
    sets = [a for k, v in common.items() for a in ("--set-string", f"commonLabels.{k.replace('.', chr(92) + '.')}={v}")]
    everything = [*EVERYTHING, "--set", "webhook.certManager.enabled=true", "--set", "audit.enabled=true"]
    objects = template(helm, *everything, *sets)
    unlabelled = [(o["kind"], o["metadata"]["name"]) for o in objects
                  if not common.items() <= (o["metadata"].get("labels") or {}).items()]
    assert not unlabelled
    # The chart's own standard labels stay beside them, on the CRDs too (generated by `make crds`).
    crd = by_kind(objects, "CustomResourceDefinition")[0]["metadata"]["labels"]
    assert crd["app.kubernetes.io/part-of"] == "coderun" and crd["app.kubernetes.io/managed-by"] == "Helm"
    templates = _pod_templates(objects)
    assert len(templates) >= 5 and all(common.items() <= t["metadata"]["labels"].items() for t in templates)
    # Selectors are immutable across upgrades: a label added later must not reach them.
    selectors = _selectors(objects)
    assert selectors and not any(set(common) & set(s) for s in selectors)
    assert selectors == _selectors(template(helm, *everything))
    # A component's podLabels win over a common label of the same key on its pods, once (no duplicate key).
    podded = template(helm, *sets, "--set-string", "podLabels.team=operator")
    operator, = of_component(podded, "Deployment")
    assert operator["spec"]["template"]["metadata"]["labels"]["team"] == "operator"
    assert operator["metadata"]["labels"]["team"] == "platform"
    # An object's own labels of the same key win over the common ones (each key once).
    monitored = template(helm, *sets, "--set", "metrics.serviceMonitor.enabled=true",
                         "--set-string", "metrics.serviceMonitor.labels.team=prometheus")
    assert by_kind(monitored, "ServiceMonitor")[0]["metadata"]["labels"]["team"] == "prometheus"
    # Positive control: without commonLabels, no object has them.
    assert not any("team" in (o["metadata"].get("labels") or {}) for o in template(helm, *everything))


def test_fullname_override_names_every_object_and_what_the_operator_is_told(helm):
    objects = template(helm, "--set", "fullnameOverride=sandboxes")
    # The audit agents' namespace is named after the release's namespace, not the release.
    names = {o["metadata"]["name"] for o in objects if o["kind"] not in ("CustomResourceDefinition", "Namespace")}
    assert all(name.startswith("sandboxes") or name.endswith(".coderun.io") for name in names), names
    operator, = of_component(objects, "Deployment")
    env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    config, = by_kind(objects, "ValidatingWebhookConfiguration")
    services = {s["metadata"]["name"] for s in by_kind(objects, "Service")}
    assert env["CODERUN_WEBHOOK_CONFIGURATION"] == config["metadata"]["name"] == "sandboxes"
    assert env["CODERUN_WEBHOOK_HOST"].split(".")[0] in services
    assert env["CODERUN_EGRESS_PROXY"] == "coderun-system/sandboxes-egress-proxy" and "sandboxes-egress-proxy" in services
    named = {name for role in by_kind(objects, "ClusterRole") + by_kind(objects, "Role")
             for rule in role["rules"] for name in rule.get("resourceNames", [])}
    assert {env["CODERUN_WEBHOOK_SECRET"], env["CODERUN_EGRESS_KEYS_SECRET"], "sandboxes"} <= named
    renamed, = of_component(template(helm, "--set", "nameOverride=sandbox"), "Deployment")
    assert renamed["metadata"]["name"] == "coderun-sandbox"
    assert renamed["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "sandbox"


def test_user_roles_aggregate_into_view_and_edit_but_never_approve_or_write_policies(helm):
    roles = {r["metadata"]["name"]: r for r in by_kind(template(helm), "ClusterRole")}
    view, edit = roles["coderun-view"], roles["coderun-edit"]
    aggregated = {name: {k.rsplit("-", 1)[1] for k, v in r["metadata"]["labels"].items()
                         if k.startswith("rbac.authorization.k8s.io/aggregate-to-") and v == "true"}
                  for name, r in roles.items()}
    assert aggregated["coderun-view"] == {"view", "edit", "admin"} and aggregated["coderun-edit"] == {"edit", "admin"}
    assert not aggregated["coderun"] and not aggregated["coderun-approver"]  # the operator's own, the approvers'
    assert _granted(view["rules"]) == {("coderun.io", plural, verb)
                                       for plural in ("coderuns", "coderunpolicies", "coderunsessions")
                                       for verb in ("get", "list", "watch")}
    edits = _granted(edit["rules"])
    assert ("coderun.io", "coderuns", "create") in edits and ("coderun.io", "coderuns", "delete") in edits
    granted = _granted(view["rules"]) | edits
    assert not {verb for _, _, verb in granted} & {"approve", "use", "*"}  # approving, naming another policy
    assert {resource for _, resource, verb in granted if verb not in ("get", "list", "watch")} == {
        "coderuns", "coderunsessions"}  # never policies
    off = {r["metadata"]["name"]: r for r in by_kind(template(helm, "--set", "rbac.aggregateClusterRoles=false"),
                                                       "ClusterRole")}
    assert not any("aggregate" in key for r in off.values() for key in r["metadata"]["labels"])
    assert {"coderun-view", "coderun-edit"} <= set(off)  # still there, to bind by name


def _sdk_calls() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of every namespaced Kubernetes call in the SDK (src/coderun/client, both
    clients): the method name gives the verb (a list through watch.stream, or with watch=True, gives watch),
    PLURAL, POLICY_PLURAL or SESSION_PLURAL in its arguments the resource."""
    import ast
    from coderun.api.coderunpolicy import POLICY_PLURAL
    from coderun.api.coderunsession import SESSION_PLURAL
    from coderun.api.models import PLURAL
    plurals = {"PLURAL": PLURAL, "POLICY_PLURAL": POLICY_PLURAL, "SESSION_PLURAL": SESSION_PLURAL}
    verbs = {"create": "create", "get": "get", "read": "get", "list": "list", "delete": "delete", "patch": "patch",
             "replace": "update"}
    calls = set()
    for source in (REPO / "src" / "coderun" / "client").glob("*.py"):
        tree = ast.parse(source.read_text())
        # An approver's calls (decide: approve or reject), not an agent's: the -approver ClusterRole grants them.
        deciding = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and f.name == "decide" for n in ast.walk(f)}
        for node in ast.walk(tree):
            if id(node) in deciding:
                continue
            if not isinstance(node, ast.Call):
                continue
            for method in [node.func, *node.args]:
                found = isinstance(method, ast.Attribute) and re.fullmatch(
                    r"(\w+?)_(namespaced|cluster)_(custom_object|config_map)(_without_preload_content)?", method.attr)
                if not found or found.group(2) == "cluster":  # every namespace at once: a ClusterRole's matter
                    continue
                watching = (isinstance(node.func, ast.Attribute) and node.func.attr == "stream") or any(
                    k.arg == "watch" and isinstance(k.value, ast.Constant) and k.value.value for k in node.keywords)
                verb = "watch" if watching else verbs[found.group(1)]
                if found.group(3) == "config_map":
                    calls.add(("", "configmaps", verb))
                else:
                    plural, = {plurals[a.id] for a in node.args if isinstance(a, ast.Name) and a.id in plurals}
                    calls.add(("coderun.io", plural, verb))
    return calls


def test_the_agent_role_example_grants_exactly_what_the_sdk_calls():
    documents = list(yaml.safe_load_all((REPO / "examples" / "agent-rbac.yaml").read_text()))
    account, = [d for d in documents if d["kind"] == "ServiceAccount"]
    role, = [d for d in documents if d["kind"] == "Role"]
    binding, = [d for d in documents if d["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"]}]
    needed = _sdk_calls()
    assert {("coderun.io", "coderuns", "watch"), ("", "configmaps", "get"),
            ("coderun.io", "coderunpolicies", "get")} <= needed
    granted = _granted(role["rules"])
    assert granted == needed, f"missing: {sorted(needed - granted)}; unused: {sorted(granted - needed)}"


def test_the_alerts_name_only_metrics_and_labels_the_operator_exports(helm):
    """Each alert's expression is checked against the metrics the operator declares (their names as Prometheus
    sees them, their labels) and the platform-failure reasons against the reasons the operator deems the
    platform's: a renamed metric or a new reason fails here, not silently in a cluster's Prometheus."""
    from prometheus_client.metrics import MetricWrapperBase

    from coderun.api.reasons import INFRASTRUCTURE_REASONS
    from coderun_operator import metrics
    declared = {}
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            family, = metric.describe()
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
            declared.update({family.name + suffix: set(metric._labelnames) for suffix in suffixes})
    assert not by_kind(template(helm), "PrometheusRule")
    rule, = by_kind(template(helm, "--set", "metrics.prometheusRule.enabled=true",
                             "--set", "metrics.prometheusRule.labels.release=kps"), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert set(alerts) == {"CodeRunLeaderCount", "CodeRunPlatformFailures", "CodeRunWarmPoolEmpty"}
    target_labels = {"namespace"}  # what the scrape adds (the ServiceMonitor's target)
    for name, alert in alerts.items():
        expr = alert["expr"]
        used = re.findall(r"\b(coderun_[a-z_]+)(?:\{([^}]*)\})?", expr)
        assert used, name
        for metric, selector in used:
            assert metric in declared, f"{name} uses {metric}, which metrics.py does not export"
            labels = set(re.findall(r"(\w+)\s*=~?", selector)) | set(
                re.findall(r"(?:by|on) \((\w+)\)", expr))
            assert labels <= declared[metric] | target_labels, f"{name}: {metric} has no label {labels - declared[metric] - target_labels}"
            assert 'namespace="coderun-system"' in selector, f"{name}: {metric} of another release counts too"
        assert alert["labels"]["severity"] in ("critical", "warning") and alert["annotations"]["summary"]
    reasons, = re.findall(r'reason=~"([^"]+)"', alerts["CodeRunPlatformFailures"]["expr"])
    assert set(reasons.split("|")) == set(INFRASTRUCTURE_REASONS)
    assert alerts["CodeRunPlatformFailures"]["expr"].rstrip().endswith("> 0.05")
    assert 'why="empty"' in alerts["CodeRunWarmPoolEmpty"]["expr"]


def test_the_default_policy_is_the_releases_own_and_a_hook_only_before_its_kind_is_served(helm):
    """An upgrade changes the `default` policies in place (no hook deletes and recreates them, and a GitOps tool
    sees plain objects); only on the first install, whose CRDs arrive with it, can helm not create them with the
    rest, so they are a post-install hook carrying the release's ownership, which the next upgrade adopts."""
    values = ["--set", "runNamespaces.names={agents}", "--set", "defaultPolicy.enabled=true"]
    served = ["--api-versions", "coderun.io/v1alpha1/CodeRunPolicy"]
    policy, = by_kind(template(helm, *values, *served), "CodeRunPolicy")
    assert policy["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    first, = by_kind(template(helm, *values), "CodeRunPolicy")
    annotations = first["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "post-install" and "helm.sh/hook-delete-policy" not in annotations
    assert (annotations["meta.helm.sh/release-name"], annotations["meta.helm.sh/release-namespace"]) == (
        "coderun", "coderun-system")
    assert first["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"  # helm's adoption checks both
    assert first["spec"] == policy["spec"]
    unkept, = by_kind(template(helm, *values, *served, "--set", "defaultPolicy.keep=false"), "CodeRunPolicy")
    assert not unkept["metadata"].get("annotations")


def test_make_manifest_renders_everything_to_install_without_helm(helm, tmp_path):
    """`make manifest` (what docs/operations.md has a kubectl user apply): the CRDs, the operator's RBAC bound
    to its ServiceAccount, both Deployments and the webhook, every namespaced object in the asked namespace, and
    no Helm hook (kubectl would apply a hook as a plain object, but nothing would run it)."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"runNamespaces": {"names": ["agents"]}, "defaultPolicy": {"enabled": True}}))
    manifest = tmp_path / "out" / "coderun.yaml"
    made = subprocess.run(["make", "-s", "manifest", f"MANIFEST={manifest}", "NAMESPACE=sandboxing",
                           f"VALUES={values}"], cwd=REPO, capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr
    objects = [o for o in yaml.safe_load_all(manifest.read_text()) if o]
    assert {c["metadata"]["name"] for c in by_kind(objects, "CustomResourceDefinition")} == set(
        yaml.safe_load((REPO / "crds" / name).read_text())["metadata"]["name"] for name in crd.CRDS)
    assert {d["metadata"]["name"] for d in by_kind(objects, "Deployment")} == {
        "coderun", "coderun-egress-proxy", "coderun-data", "coderun-store"}
    account, = by_kind(objects, "ServiceAccount")
    binding, = [b for b in by_kind(objects, "ClusterRoleBinding") if b["roleRef"]["name"] == "coderun"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "sandboxing"}]
    assert by_kind(objects, "ValidatingWebhookConfiguration") and by_kind(objects, "ClusterRole")
    namespaced = [o for o in objects if "namespace" in o["metadata"]]
    in_run_namespaces = ("CodeRunPolicy", "ResourceQuota")
    assert {o["metadata"]["namespace"] for o in namespaced if o["kind"] not in in_run_namespaces} == {
        "sandboxing", "sandboxing-audit"}  # the audit agents' own
    policy, = by_kind(objects, "CodeRunPolicy")
    quota, = by_kind(objects, "ResourceQuota")
    assert policy["metadata"]["namespace"] == quota["metadata"]["namespace"] == "agents"
    assert not [o for o in objects if "helm.sh/hook" in (o["metadata"].get("annotations") or {})]


def test_the_chart_readme_lists_every_value_as_values_yaml_comments_it():
    import runpy
    readme = runpy.run_path(str(REPO / "charts" / "readme.py"))
    text = (CHART / "README.md").read_text()
    values = (CHART / "values.yaml").read_text()
    assert text == readme["render"](text, values), "run `make chart-readme` and commit charts/coderun/README.md"
    table = readme["values_table"](values)
    assert "| `operator.logFormat` | `\"full\"` | How the operator logs:" in table
    assert "| `resources` | `{\"requests\": {\"cpu\": \"100m\"" in table  # uncommented keys: one row, whole default
    assert "| **`egressProxy`** | |" in table and "`egressProxy.image.repository`" in table


def test_chart_yaml_tells_artifact_hub_the_crds_and_examples_that_validate():
    from coderun.api.coderunsession import CodeRunSessionSpec
    from coderun.api.models import CodeRunSpec
    from coderun_operator.policy.load import policy_from_object
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    annotations = chart["annotations"]
    assert annotations["artifacthub.io/license"] == "Apache-2.0" and "Apache License" in (REPO / "LICENSE").read_text()
    assert annotations["artifacthub.io/operatorCapabilities"] in (
        "Basic Install", "Seamless Upgrades", "Full Lifecycle", "Deep Insights", "Auto Pilot")
    committed = [yaml.safe_load((REPO / "crds" / name).read_text()) for name in crd.CRDS]
    assert {(c["kind"], c["version"], c["name"]) for c in yaml.safe_load(annotations["artifacthub.io/crds"])} == {
        (c["spec"]["names"]["kind"], c["spec"]["versions"][0]["name"], c["metadata"]["name"]) for c in committed}
    examples = {e["kind"]: e for e in yaml.safe_load(annotations["artifacthub.io/crdsExamples"])}
    assert set(examples) == {"CodeRun", "CodeRunPolicy", "CodeRunSession"}
    CodeRunSpec.model_validate(examples["CodeRun"]["spec"])
    CodeRunSessionSpec.model_validate(examples["CodeRunSession"]["spec"])
    assert policy_from_object({**examples["CodeRunPolicy"], "metadata": {"name": "default", "namespace": "a"}})
    assert all(link["url"].startswith("https://") for link in yaml.safe_load(annotations["artifacthub.io/links"]))


@pytest.fixture
def values_schema(monkeypatch):
    """charts/values_schema.py, the generator (it imports readme.py beside it, as `make values-schema` runs it)."""
    import importlib
    monkeypatch.syspath_prepend(str(REPO / "charts"))
    return importlib.import_module("values_schema")


def test_the_values_schema_is_generated_from_the_annotated_values_file(values_schema):
    values = (CHART / "values.yaml").read_text()
    committed = (CHART / "values.schema.json").read_text()
    assert committed == values_schema.render(values), "run `make values-schema` and commit values.schema.json"
    schema = json.loads(committed)["properties"]
    # types from the defaults, descriptions from the comments, constraints from the `@schema` lines
    assert schema["replicaCount"]["type"] == "integer" and schema["replicaCount"]["minimum"] == 1
    assert schema["operator"]["properties"]["logFormat"]["description"].startswith("How the operator logs:")
    assert "@schema" not in committed
    assert schema["resources"] == {"description": schema["resources"]["description"],
                                   "$ref": "#/definitions/resources"}
    assert schema["defaultPolicy"]["properties"]["spec"]["type"] == "object"  # uncommented keys: one value
    assert "properties" not in schema["defaultPolicy"]["properties"]["spec"]


def test_the_schema_follows_a_new_value_and_refuses_a_bad_annotation(values_schema):
    """A stale schema fails the test above: a value added to values.yaml changes what is generated."""
    values = (CHART / "values.yaml").read_text()
    added = values + "\n# A new knob.\n# @schema {minimum: 2}\nnewKnob: 3\n"
    knob = values_schema.values_schema(added)["properties"]["newKnob"]
    assert knob == {"type": "integer", "description": "A new knob.", "minimum": 2}
    assert values_schema.render(added) != values_schema.render(values)
    with pytest.raises(ValueError, match="newKnob"):
        values_schema.values_schema(values + "\n# A new knob.\n# @schema minimum 2\nnewKnob: 3\n")


# --- the data plane: the embedded store and the data service (docs/data.md) ---

RESTRICTED_CONTAINER = {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False, "privileged": False,
                        "capabilities": {"drop": ["ALL"]}}


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def _restricted_without_token(deployment: dict) -> dict:
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False, deployment["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container, = pod["containers"]
    assert container["securityContext"] == RESTRICTED_CONTAINER, deployment["metadata"]["name"]
    assert container["resources"]["limits"]["memory"] and container["resources"]["requests"]["cpu"]
    return pod


def test_the_embedded_store_serves_s3_on_its_volume_with_keys_made_at_install(helm):
    objects = template(helm, "--set", "store.embedded.image.digest=sha256:" + "cd" * 32)
    store, = of_component(objects, "Deployment", "store")
    assert store["metadata"]["name"] == "coderun-store" and store["spec"]["replicas"] == 1
    assert store["spec"]["strategy"]["type"] == "Recreate"  # one pod holds the volume
    pod = _restricted_without_token(store)
    container, = pod["containers"]
    assert container["image"] == "coderun.local/store@sha256:" + "cd" * 32
    assert [*container["command"], *container["args"]] == ["/usr/local/bin/versitygw", "--port", ":7070", "posix",
                                                           "/data"]
    env = _env(container)
    assert {name: e["valueFrom"]["secretKeyRef"] for name, e in env.items()} == {
        "ROOT_ACCESS_KEY": {"name": "coderun-store", "key": "access-key-id"},
        "ROOT_SECRET_KEY": {"name": "coderun-store", "key": "secret-access-key"}}
    assert container["readinessProbe"]["tcpSocket"] == {"port": "s3"}
    assert container["ports"] == [{"name": "s3", "containerPort": 7070}]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/data", "/tmp"}
    service, = of_component(objects, "Service", "store")
    assert service["spec"]["ports"] == [{"name": "s3", "port": 7070, "targetPort": "s3", "protocol": "TCP"}]
    assert service["spec"]["selector"] == store["spec"]["selector"]["matchLabels"]
    secret, = of_component(objects, "Secret", "store")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data["endpoint"] == "http://coderun-store.coderun-system.svc:7070" and data["region"] == "us-east-1"
    assert len(data["access-key-id"]) == 20 and len(data["secret-access-key"]) == 40
    # Random at install (helm template has no cluster to look the kept ones up in): two renders, two pairs.
    again, = of_component(template(helm), "Secret", "store")
    assert again["data"]["secret-access-key"] != secret["data"]["secret-access-key"]
    claim = {"persistentVolumeClaim": {"claimName": "coderun-store"}}
    store, = of_component(template(helm, "--set-json", f"store.embedded.volume={json.dumps(claim)}"),
                          "Deployment", "store")
    assert {"name": "data", **claim} in store["spec"]["template"]["spec"]["volumes"]
    two = {"emptyDir": {}, "hostPath": {"path": "/srv"}}
    assert "store/embedded/volume" in template(helm, "--set-json", f"store.embedded.volume={json.dumps(two)}",
                                               check=False).stderr


def test_the_store_keeps_its_keys_across_upgrades():
    """helm's lookup finds the Secret of the release's last install: the template reuses its keys rather than
    making new ones (which would lock the data service out until its pods saw them)."""
    text = (CHART / "templates" / "store.yaml").read_text()
    assert re.search(r'lookup "v1" "Secret" \.Release\.Namespace \$name', text)
    assert 'index $existing "access-key-id" | default' in text and 'index $existing "secret-access-key" | default' in text


def test_the_data_service_checks_grants_with_mounted_keys_and_holds_no_api_token(helm):
    objects = template(helm, "--set", "image.digest=sha256:" + "ab" * 32)
    data, = of_component(objects, "Deployment", "data")
    assert data["metadata"]["name"] == "coderun-data" and data["spec"]["replicas"] == 2
    pod = _restricted_without_token(data)
    container, = pod["containers"]
    operator, = of_component(objects, "Deployment")
    assert container["image"] == operator["spec"]["template"]["spec"]["containers"][0]["image"]  # the operator's
    assert container["command"] == ["python", "-m", "coderun_operator.data"]
    assert container["ports"] == [{"name": "data", "containerPort": 8080}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "data"}
    env = {name: e["value"] for name, e in _env(container).items()}
    assert env == {"CODERUN_DATA_PORT": "8080", "CODERUN_DATA_KEYS_DIR": "/etc/coderun/data-keys",
                   "CODERUN_STORE_DIR": "/etc/coderun/store", "CODERUN_STORE_BUCKET": "coderun",
                   "CODERUN_DATA_MAX_TRANSFERS": "16"}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    keys, store = mounts["/etc/coderun/data-keys"], mounts["/etc/coderun/store"]
    assert keys["readOnly"] and store["readOnly"]
    # The operator makes the keys at its start: optional until then; the store's Secret is there at install.
    assert volumes[keys["name"]]["secret"] == {"secretName": "coderun-data-keys", "defaultMode": 0o440, "optional": True}
    assert volumes[store["name"]]["secret"] == {"secretName": "coderun-store", "defaultMode": 0o440}
    service, = of_component(objects, "Service", "data")
    assert service["spec"]["ports"] == [{"name": "data", "port": 8080, "targetPort": "data", "protocol": "TCP"}]
    assert service["spec"]["selector"] == data["spec"]["selector"]["matchLabels"]
    tuned, = of_component(template(helm, "--set", "data.maxTransfers=4", "--set", "store.bucket=runs-data"),
                          "Deployment", "data")
    env = {e["name"]: e["value"] for e in tuned["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CODERUN_DATA_MAX_TRANSFERS"] == "4" and env["CODERUN_STORE_BUCKET"] == "runs-data"


def _operator_env(objects: list[dict]) -> dict[str, str]:
    operator, = of_component(objects, "Deployment")
    return {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_the_operator_is_told_the_data_service_the_keys_and_the_store(helm):
    env = _operator_env(template(helm))
    assert {k: v for k, v in env.items() if k.startswith(("CODERUN_DATA", "CODERUN_STORE"))} == {
        "CODERUN_DATA_SERVICE": "coderun-system/coderun-data", "CODERUN_DATA_KEYS_SECRET": "coderun-data-keys",
        "CODERUN_DATA_KEY_ID": "k1", "CODERUN_DATA_KEYS_CREATE": "true",
        "CODERUN_STORE_SECRET": "coderun-system/coderun-store", "CODERUN_STORE_BUCKET": "coderun"}
    env = _operator_env(template(helm, "--set", "data.externalURL=https://data.example.com"))
    assert env["CODERUN_DATA_URL"] == "https://data.example.com"
    assert "externalURL" in template(helm, "--set", "data.externalURL=data.example.com", check=False).stderr
    env = _operator_env(template(helm, "--set", "store.existingSecret=platform-s3"))
    assert env["CODERUN_STORE_SECRET"] == "coderun-system/platform-s3"


def test_without_the_data_service_nothing_of_the_data_plane_renders(helm):
    objects = template(helm, "--set", "data.enabled=false")
    assert not [o for o in objects if o["metadata"]["name"].startswith(("coderun-data", "coderun-store"))]
    assert not [k for k in _operator_env(objects) if k.startswith(("CODERUN_DATA", "CODERUN_STORE"))]
    policy, = of_component(objects, "NetworkPolicy")
    assert {p["port"] for rule in policy["spec"]["egress"] for p in rule.get("ports", [])} == {
        53, 443, 6443, 3130, 9090}
    # The embedded store off, the data service on and no store of the platform's: refused, naming what to set.
    refused = template(helm, "--set", "store.embedded.enabled=false", check=False)
    assert refused.returncode != 0 and "store.existingSecret" in refused.stderr
    objects = template(helm, "--set", "store.embedded.enabled=false", "--set", "data.enabled=false")
    assert not of_component(objects, "Deployment", "store") and not of_component(objects, "Deployment", "data")


def test_a_platforms_store_replaces_the_embedded_one(helm):
    objects = template(helm, "--set", "store.existingSecret=platform-s3")
    assert not [o for o in objects if o["metadata"]["name"] == "coderun-store"]
    assert not of_component(objects, "Deployment", "store") and not by_kind(objects, "Secret")
    data, = of_component(objects, "Deployment", "data")
    volumes = {v["name"]: v for v in data["spec"]["template"]["spec"]["volumes"]}
    assert volumes["store"]["secret"]["secretName"] == "platform-s3"
    role, = [r for r in by_kind(objects, "Role") if r["metadata"]["name"] == "coderun-data-operator"]
    assert {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["platform-s3"], "verbs": ["get"]} in role["rules"]
    # The store's address is not the chart's to know: the data pods and the operator may reach any.
    policy, = of_component(objects, "NetworkPolicy", "data")
    assert policy["spec"]["egress"] == [{}]
    operator_policy, = of_component(objects, "NetworkPolicy")
    assert {} in operator_policy["spec"]["egress"]
    # The same with the embedded store switched off explicitly (the documented way).
    objects = template(helm, "--set", "store.existingSecret=platform-s3", "--set", "store.embedded.enabled=false")
    assert of_component(objects, "Deployment", "data") and not of_component(objects, "Deployment", "store")


def test_only_the_data_service_and_the_operator_reach_the_store_and_anyone_reaches_the_data_port(helm):
    objects = template(helm)
    operator, = of_component(objects, "Deployment")
    data, = of_component(objects, "Deployment", "data")
    store, = of_component(objects, "Deployment", "store")
    selector = {name: d["spec"]["selector"]["matchLabels"] for name, d in
                (("operator", operator), ("data", data), ("store", store))}
    policy, = of_component(objects, "NetworkPolicy", "store")
    assert policy["spec"]["podSelector"]["matchLabels"] == selector["store"]
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"} and policy["spec"]["egress"] == []
    rule, = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "s3", "protocol": "TCP"}]
    assert rule["from"] == [{"podSelector": {"matchLabels": selector["data"]}},
                            {"podSelector": {"matchLabels": selector["operator"]}}]
    assert not any("namespaceSelector" in peer or "ipBlock" in peer for peer in rule["from"])  # sandboxes: never
    policy, = of_component(objects, "NetworkPolicy", "data")
    assert policy["spec"]["podSelector"]["matchLabels"] == selector["data"]
    rule, = policy["spec"]["ingress"]
    assert rule == {"ports": [{"port": "data", "protocol": "TCP"}]}  # no `from`: every caller holds a grant
    dns, to_store = policy["spec"]["egress"]
    assert {p["port"] for p in dns["ports"]} == {53} and "to" not in dns
    assert to_store == {"ports": [{"port": 7070, "protocol": "TCP"}],
                        "to": [{"podSelector": {"matchLabels": selector["store"]}}]}
    # The operator's own policy lets it reach both, and nothing else new.
    policy, = of_component(objects, "NetworkPolicy")
    reach = {p["port"]: rule.get("to") for rule in policy["spec"]["egress"] for p in rule["ports"]}
    assert reach[7070] == [{"podSelector": {"matchLabels": selector["store"]}}]
    assert reach[8080] == [{"podSelector": {"matchLabels": selector["data"]}}]
    assert {} not in policy["spec"]["egress"]
    assert not of_component(template(helm, "--set", "networkPolicy.enabled=false"), "NetworkPolicy", "store")


def test_the_operator_reads_the_data_secrets_by_name_and_the_data_service_by_name(helm):
    objects = template(helm)
    role, = [r for r in by_kind(objects, "Role") if r["metadata"]["name"] == "coderun-data-operator"]
    binding, = [b for b in by_kind(objects, "RoleBinding") if b["roleRef"]["name"] == "coderun-data-operator"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "coderun", "namespace": "coderun-system"}]
    assert sorted(map(str, role["rules"])) == sorted(map(str, [
        {"apiGroups": [""], "resources": ["services"], "resourceNames": ["coderun-data"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["coderun-data-keys"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["coderun-store"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]))
    # The ready data pods' addresses: the ClusterRole's list on pods covers the release namespace.
    cluster_rules = _bound_to_the_operator(objects, "ClusterRole")
    assert ("", "pods", "list") in _granted(cluster_rules)


SANDBOX_SCHEDULING = {"nodeSelector": {"sandbox.example.com/pool": "sandboxes"},
                      "tolerations": [{"key": "sandbox.example.com/dedicated", "operator": "Exists",
                                       "effect": "NoSchedule"}],
                      "priorityClassName": "sandboxes", "imagePullSecrets": ["registry-mirror"]}


def test_sandbox_scheduling_reaches_the_operator_as_its_model_reads_it(helm):
    from coderun_operator.builders.scheduling import SCHEDULING_VARIABLE, chart_defaults, pod_scheduling
    from coderun.api.scheduling import Scheduling
    env_of = lambda objects: {e["name"]: e.get("value") for e in of_component(objects, "Deployment")[0][
        "spec"]["template"]["spec"]["containers"][0]["env"]}
    assert pod_scheduling(chart_defaults(env_of(template(helm)))) == {}  # the defaults: nothing chosen
    given = env_of(template(helm, "--set-json", f"sandboxScheduling={json.dumps(SANDBOX_SCHEDULING)}"))
    assert json.loads(given[SCHEDULING_VARIABLE])["tolerations"] == SANDBOX_SCHEDULING["tolerations"]
    assert pod_scheduling(chart_defaults(given)) == pod_scheduling(Scheduling.model_validate(SANDBOX_SCHEDULING))


def test_the_runtime_class_carries_its_scheduling_only_when_given(helm):
    plain, = by_kind(template(helm, "--set", "runtimeClass.create=true"), "RuntimeClass")
    assert "scheduling" not in plain and plain["handler"] == "runsc"
    given = {"nodeSelector": {"sandbox.example.com/gvisor": "true"},
             "tolerations": SANDBOX_SCHEDULING["tolerations"]}
    placed, = by_kind(template(helm, "--set", "runtimeClass.create=true",
                               "--set-json", f"runtimeClass.scheduling={json.dumps(given)}"), "RuntimeClass")
    assert placed["scheduling"] == given and placed["overhead"] == plain["overhead"]
    assert not by_kind(template(helm, "--set-json", f"runtimeClass.scheduling={json.dumps(given)}"), "RuntimeClass")
