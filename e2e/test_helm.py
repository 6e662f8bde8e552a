"""coderun installed with its Helm chart on the real cluster, the way users install it: the operator image, two
replicas with one leading, a CodeRun and the webhook through the in-cluster operator, the webhook's own
certificate and its rotation, a sandbox with pod-network egress kept off the operator, `helm upgrade` with runs
in flight (and JSON logs after it), the leader deleted during a burst of 20 runs, uninstall keeping the CRDs,
and the rendered manifest (`make manifest`) installed with kubectl instead, as docs/operations.md writes it.

The rest of the e2e suite runs the operator as a host process (`make up-host`, the code under test without an
image build) unless CODERUN_E2E_OPERATOR=chart; this module installs the chart itself and gives the suite its
operator back at the end.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
import threading
import time
import urllib.request

import pytest
from kubernetes.client.rest import ApiException

import coderun
from coderun.api.coderunpolicy import POLICY_PLURAL
from coderun.api.models import GROUP, PLURAL, VERSION
from conftest import OPERATOR_MODE, REPO, ChartOperator, PodCensus, wait_for

NAMESPACE, RELEASE = "coderun-system", "coderun"
SELECTOR = ChartOperator.selector  # the operator replicas, not the egress proxy's pods
SMALL = {"cpu": "250m", "memory": "128Mi", "timeoutSeconds": 60}


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), cwd=REPO, check=check, capture_output=True, text=True)


def install(*helm_args: str) -> None:
    result = _sh("bash", "e2e/install.sh", "install", *helm_args, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    binary = _sh("bash", "-c", "source e2e/cluster/versions.sh && echo $CODERUN_CACHE/bin/helm-$HELM_VERSION/helm")
    return _sh(binary.stdout.strip(), *args, "--kubeconfig", str(REPO / ".cluster" / "kubeconfig"), check=check)


AGENTS = "coderun-e2e-agents"  # a run namespace the chart creates, with its default policy
RUN_NAMESPACE_VALUES = ("--set", "runNamespaces.create=true", "--set", f"runNamespaces.names={{{AGENTS}}}",
                        "--set", "defaultPolicy.enabled=true")


@pytest.fixture(scope="module")
def chart(cluster):
    install(*RUN_NAMESPACE_VALUES, "--set", "defaultPolicy.spec.defaults.timeoutSeconds=9")
    yield cluster
    if os.environ.get("CODERUN_E2E_KEEP_CHART"):  # for a look at what the tests left
        return
    _sh("bash", "e2e/install.sh", "uninstall", check=False)
    cluster.kubectl("delete", "namespace", AGENTS, "--wait=false", check=False)
    # The operator the other modules use: the host process, or (CODERUN_E2E_OPERATOR=chart) the chart again.
    restored = _sh("make", "up" if OPERATOR_MODE == "chart" else "up-host", check=False)
    assert restored.returncode == 0, restored.stdout[-3000:] + restored.stderr[-3000:]


def operator_pods(cluster) -> list:
    return [p for p in cluster.core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items
            if not p.metadata.deletion_timestamp]


def leader_pod(cluster):
    """The one leading replica (waits for it): what the rest of the suite uses in chart mode."""
    return ChartOperator(cluster).leader()


def lease_holder(cluster) -> str | None:
    from kubernetes import client
    try:
        lease = client.CoordinationV1Api(cluster.api).read_namespaced_lease("coderun-operator", NAMESPACE)
    except ApiException:
        return None
    return lease.spec.holder_identity


def metrics_of(pod) -> str:
    with urllib.request.urlopen(f"http://{pod.status.pod_ip}:9108/metrics", timeout=5) as reply:
        return reply.read().decode()


def run_all(cluster, namespace: str, codes: dict[str, str]) -> dict[str, str]:
    """Create one run per expected stdout; returns run name -> expected stdout."""
    return {cluster.create_run(namespace, {"language": "python", "limits": SMALL, "code": code}): out
            for out, code in codes.items()}


def assert_all_true(cluster, namespace: str, expected: dict[str, str], census: PodCensus, timeout: float = 180):
    for name, stdout in expected.items():
        status = cluster.wait_run(namespace, name, timeout=timeout)["status"]
        assert (status["phase"], status.get("stdout")) == ("Succeeded", stdout), (
            name, status.get("reason"), status.get("message"), status.get("stderr"), status.get("conditions"))
    census.stop()
    for name in expected:
        assert len(census.pods_by_run[name]) == 1, (name, census.pods_by_run[name])


def test_install_gives_two_ready_hardened_replicas_and_one_leader(chart):
    pods = operator_pods(chart)
    assert len(pods) == 2 and all(p.status.phase == "Running" for p in pods), [p.status.phase for p in pods]
    assert all(all(c.ready for c in p.status.container_statuses) for p in pods), "a replica is not ready"
    leader = leader_pod(chart)
    assert lease_holder(chart) == leader.metadata.name
    container = leader.spec.containers[0]
    assert container.security_context.read_only_root_filesystem and not leader.spec.host_network
    assert leader.spec.security_context.run_as_non_root and leader.spec.security_context.run_as_user == 65532
    assert "@sha256:" in container.image  # the chart runs the image imported by digest
    standby = next(p for p in pods if p.metadata.name != leader.metadata.name)
    assert "coderun_leader 1.0" in metrics_of(leader) and "coderun_leader 0.0" in metrics_of(standby)


def test_make_dist_image_ships_the_image_the_chart_runs(chart):
    """The release's operator image (`make dist-image`, an OCI archive for `docker load` or `skopeo copy`) is whole
    (every blob's sha256 is its name) and is the very image both replicas run: its manifest's digest is theirs."""
    made = _sh("make", "--no-print-directory", "dist-image", check=False)
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    archive = REPO / "dist" / f"coderun-operator-{coderun.__version__}.oci.tar"
    with tarfile.open(archive) as tar:
        assert json.load(tar.extractfile("oci-layout")) == {"imageLayoutVersion": "1.0.0"}
        index = json.load(tar.extractfile("index.json"))
        blobs = [m for m in tar.getmembers() if m.isfile() and m.name.startswith("blobs/sha256/")]
        for blob in blobs:
            digest = hashlib.sha256()
            with tar.extractfile(blob) as content:
                for chunk in iter(lambda: content.read(1 << 20), b""):
                    digest.update(chunk)
            assert digest.hexdigest() == blob.name.rsplit("/", 1)[1], blob.name
        manifest_digest = index["manifests"][0]["digest"]
        manifest = json.load(tar.extractfile(f"blobs/sha256/{manifest_digest.split(':')[1]}"))
        config = json.load(tar.extractfile(f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"))
    assert {layer["digest"] for layer in manifest["layers"]} <= {f"sha256:{b.name.rsplit('/', 1)[1]}" for b in blobs}
    assert config["config"]["User"] and config["os"] == "linux"
    running = {p.status.container_statuses[0].image_id.rpartition("@")[2] for p in operator_pods(chart)}
    assert running == {manifest_digest}, (running, manifest_digest)


def test_a_coderun_runs_through_the_in_cluster_operator(chart, namespace):
    run = chart.wait_run(namespace, chart.create_run(namespace, {"language": "python", "code": "print(6 * 7)"}))
    status = run["status"]
    assert (status["phase"], status["stdout"], status["exitCode"]) == ("Succeeded", "42\n", 0), status

    def counted() -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in metrics_of(leader_pod(chart)).splitlines()
                   if line.startswith("coderun_runs_total{") and 'phase="Succeeded"' in line
                   and 'language="python"' in line)
    wait_for(lambda: counted() >= 1, 10, "the leader's metrics to count the run")


def test_the_chart_made_a_restricted_run_namespace_with_its_default_policy(chart):
    labels = chart.core.read_namespace(AGENTS).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    run = chart.wait_run(AGENTS, chart.create_run(AGENTS, {"language": "python", "code": "print('agents')"}))
    status = run["status"]
    assert (status["phase"], status["stdout"], status["policy"]) == ("Succeeded", "agents\n", "default"), status
    assert status["effectiveLimits"]["timeoutSeconds"] == 9  # the chart's defaultPolicy.spec


def test_an_upgrade_changes_the_default_policy_in_place(chart):
    """The chart's `default` policy is one of the release's objects, not a hook: an upgrade patches it (same uid,
    so nothing is deleted under the runs that name it) and runs get the new spec."""
    def policy() -> dict:
        return chart.custom.get_namespaced_custom_object(GROUP, VERSION, AGENTS, POLICY_PLURAL, "default")
    before = policy()
    assert "helm.sh/hook" not in before["metadata"].get("annotations", {})  # adopted, or made with the release
    install(*RUN_NAMESPACE_VALUES, "--set", "defaultPolicy.spec.defaults.timeoutSeconds=8")
    after = policy()
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["spec"]["defaults"]["timeoutSeconds"] == 8
    run = chart.wait_run(AGENTS, chart.create_run(AGENTS, {"language": "python", "code": "print('again')"}))
    assert run["status"]["effectiveLimits"]["timeoutSeconds"] == 8, run["status"]


def test_kubernetes_view_and_edit_roles_take_in_the_charts_coderun_roles(chart, namespace):
    """Bound to Kubernetes' own `edit` a person runs code, bound to `view` reads runs and policies; neither
    approves, writes policies or a run's status (docs/operations.md, Client RBAC)."""
    for role in ("edit", "view"):
        chart.kubectl("create", "rolebinding", f"e2e-{role}", f"--clusterrole={role}", f"--user=e2e-{role}",
                      "-n", namespace)

    def may(user: str, verb: str, resource: str, *more: str) -> bool:
        answer = chart.kubectl("auth", "can-i", verb, resource, *more, "-n", namespace, "--as", user, check=False)
        return answer.stdout.strip() == "yes"
    # The aggregation controller folds the chart's roles in within moments of the install.
    wait_for(lambda: may("e2e-edit", "create", "coderuns.coderun.io"), 30, "edit to take in coderun-edit")
    wait_for(lambda: may("e2e-view", "list", "coderunpolicies.coderun.io"), 30, "view to take in coderun-view")
    assert may("e2e-edit", "delete", "coderuns.coderun.io") and may("e2e-view", "watch", "coderuns.coderun.io")
    assert not may("e2e-view", "create", "coderuns.coderun.io")
    for user in ("e2e-edit", "e2e-view"):
        assert not may(user, "approve", "coderuns.coderun.io")
        assert not may(user, "create", "coderunpolicies.coderun.io")
        assert not may(user, "patch", "coderuns.coderun.io", "--subresource=status")


def test_the_in_cluster_webhook_refuses_what_an_enforcing_policy_denies(chart, namespace):
    policy = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRunPolicy", "metadata": {"name": "default"},
              "spec": {"codeRules": {"deniedPythonImports": ["socket"]}, "admission": "Enforce"}}
    chart.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, policy)

    def refused():
        try:
            name = chart.create_run(namespace, {"language": "python", "code": "import socket\n"})
        except ApiException as e:
            return e
        chart.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return None  # the leader has not seen the policy yet
    error = wait_for(refused, 20, "the webhook to refuse the run")
    assert error.status == 403 and "imports 'socket'" in error.body, error.body
    bad = {**policy, "metadata": {"name": "bad"}, "spec": {"redactionPatterns": ["(?<=x)y"]}}
    with pytest.raises(ApiException) as malformed:
        chart.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, bad)
    assert "redactionPatterns" in malformed.value.body


ENFORCING = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRunPolicy", "metadata": {"name": "default"},
             "spec": {"codeRules": {"deniedPythonImports": ["socket"]}, "admission": "Enforce"}}
DENIED_RUN = """apiVersion: coderun.io/v1alpha1
kind: CodeRun
metadata: {generateName: denied-}
spec: {language: python, code: "import socket\\n"}
"""


def refused_by_kubectl(cluster, namespace: str, timeout: float) -> str:
    """kubectl create of a run the namespace's enforcing policy denies, until the webhook refuses it (the leader
    may not have seen the policy, or be serving a new certificate, yet); returns kubectl's message."""
    try:
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, ENFORCING)
    except ApiException as e:
        assert e.status == 409, e.body  # made by an earlier call

    def refused():
        result = cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "name", input=DENIED_RUN, check=False)
        if result.returncode == 0:  # got through (failurePolicy Ignore): not refused yet
            cluster.kubectl("delete", "-n", namespace, result.stdout.strip(), "--wait=false", check=False)
            return None
        return result.stderr
    message = wait_for(refused, timeout, "kubectl create of a denied run to be refused by the webhook", interval=1)
    assert "imports 'socket'" in message, message
    return message


def webhook_certificate(cluster) -> tuple[dict | None, set[str]]:
    """The operator's Secret (or None) and the caBundles of the chart's ValidatingWebhookConfiguration, both as
    the API server serves them (base64 strings)."""
    found = cluster.kubectl("get", "secret", "coderun-webhook-tls", "-n", NAMESPACE, "-o", "json", check=False)
    assert found.returncode == 0 or "NotFound" in found.stderr, found.stderr
    secret = json.loads(found.stdout) if found.returncode == 0 else None
    config = json.loads(cluster.kubectl("get", "validatingwebhookconfiguration", RELEASE, "-o", "json").stdout)
    return secret, {h["clientConfig"].get("caBundle") for h in config["webhooks"]}


def test_the_operator_makes_its_webhook_certificate_and_picks_up_a_rotation(chart, namespace):
    def matched():
        secret, bundles = webhook_certificate(chart)
        return secret is not None and bundles == {secret["data"]["ca.crt"]} and secret
    secret = wait_for(matched, 60, "the operator's Secret and a caBundle equal to its ca.crt")
    assert secret["type"] == "kubernetes.io/tls", secret["type"]
    assert secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "coderun"  # the operator's, not Helm's
    refused_by_kubectl(chart, namespace, 30)
    # Rotation: the Secret deleted, the leader issues a new CA and certificate, serves it without a restart and
    # points the caBundle at it; the webhook keeps refusing.
    restarts = {p.metadata.name: sum(c.restart_count for c in p.status.container_statuses) for p in operator_pods(chart)}
    chart.core.delete_namespaced_secret("coderun-webhook-tls", NAMESPACE)

    def rotated():
        fresh, bundles = webhook_certificate(chart)
        return fresh is not None and fresh["data"]["ca.crt"] != secret["data"]["ca.crt"] and \
            bundles == {fresh["data"]["ca.crt"]} and fresh
    wait_for(rotated, 90, "a new Secret and the caBundle following it (the refresh runs every 30 s)")
    refused_by_kubectl(chart, namespace, 30)  # kopf reloads the files within 5 s
    assert {p.metadata.name: sum(c.restart_count for c in p.status.container_statuses)
            for p in operator_pods(chart)} == restarts, "an operator restarted to serve the new certificate"


SNOOP = """
import json, socket, ssl, urllib.request
def tcp(host, port):
    try:
        with socket.create_connection((host, port), timeout=3):
            return "open"
    except OSError as e:
        return type(e).__name__
def fetch(url, body=None):
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        request = urllib.request.Request(url, data=body, headers={{"Content-Type": "application/json"}})
        with urllib.request.urlopen(request, timeout=3, context=context) as reply:
            return "answered-" + str(reply.status)
    except Exception as e:
        return type(getattr(e, "reason", e)).__name__
review = json.dumps({{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {{
    "uid": "1", "kind": {{"group": "coderun.io", "version": "v1alpha1", "kind": "CodeRun"}},
    "resource": {{"group": "coderun.io", "version": "v1alpha1", "resource": "coderuns"}}, "operation": "CREATE",
    "namespace": "kube-system", "object": {{"metadata": {{"name": "x", "namespace": "kube-system"}},
    "spec": {{"language": "python", "code": "import socket", "policyRef": "guess"}}}}}}}}).encode()
print(tcp("{server}", 8080), fetch("https://{leader}:9443/validate-run", review),
      fetch("http://{leader}:9108/metrics"), tcp("{leader}", 8081))
"""


def test_a_sandbox_with_pod_network_egress_cannot_reach_the_operator(chart, namespace):
    """Issue 17: a policy that explicitly allows the pod network still gives its sandboxes no way to the
    operator's webhook (hand-made AdmissionReviews), metrics or health ports; the API server's calls still work."""
    serve = ["sh", "-c", "echo ok > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"]
    chart.create_pod(namespace, "server", serve, runtime_class=None, labels={"role": "server"})
    server = chart.pod_ip(namespace, "server")
    wait_for(lambda: chart.pod_phase(namespace, "server") == "Running", 60, "the control server running")
    leader = leader_pod(chart).status.pod_ip
    policy = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRunPolicy", "metadata": {"name": "podnet"},
              "spec": {"allowClusterEgress": True, "egress": [{"cidr": "10.88.0.0/16"}]}}
    chart.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, policy)
    code = SNOOP.format(server=server, leader=leader)

    def snooped():
        name = chart.create_run(namespace, {"language": "python", "code": code, "policyRef": "podnet",
                                            "limits": {"timeoutSeconds": 30}})
        status = chart.wait_run(namespace, name, timeout=120)["status"]
        return status.get("policy") == "podnet" and status  # else the leader had not seen the policy yet
    status = wait_for(snooped, 180, "a run of the podnet policy", interval=1)
    assert status["phase"] == "Succeeded", status
    control, review, metrics, health = status["stdout"].split()
    assert control == "open", status  # the sandbox does reach the pod network
    blocked = {"TimeoutError", "ConnectionRefusedError"}  # dropped (3 s) or refused, never an answer
    assert {review, metrics, health} <= blocked, status
    refused_by_kubectl(chart, namespace, 30)  # the API server still reaches the webhook


def test_helm_upgrade_with_runs_in_flight_loses_none(chart, namespace):
    census = PodCensus(chart, namespace)
    expected = run_all(chart, namespace, {f"{i * 3}\n": f"import time\ntime.sleep(2)\nprint({i} * 3)"
                                          for i in range(6)})
    more: dict[str, str] = {}

    def create_during_upgrade():  # runs that arrive while the replicas roll
        for i in range(6, 10):
            time.sleep(1.5)
            more.update(run_all(chart, namespace, {f"{i * 3}\n": f"print({i} * 3)"}))
    creator = threading.Thread(target=create_during_upgrade)
    creator.start()
    before = {p.metadata.name for p in operator_pods(chart)}
    # A new pod template: every replica is replaced, and now logs JSON (what a log pipeline asks for).
    install("--set", "operator.workers=6", "--set", "operator.logFormat=json")
    creator.join()
    after = {p.metadata.name for p in operator_pods(chart)}
    assert not before & after, "helm upgrade did not replace the replicas"
    assert_all_true(chart, namespace, {**expected, **more}, census)
    for pod in operator_pods(chart):  # every line of every replica, the standby's too, is one JSON object
        lines = [line for line in chart.kubectl("logs", "-n", NAMESPACE, pod.metadata.name).stdout.splitlines()
                 if line.strip()]
        assert lines and all(line.startswith("{") and isinstance(json.loads(line), dict) for line in lines), \
            (pod.metadata.name, [line for line in lines if not line.startswith("{")][:5])


@pytest.mark.parametrize("how", ["deleted", "killed"])
def test_the_leader_lost_during_a_burst_of_20_runs_loses_none(chart, namespace, how):
    census = PodCensus(chart, namespace)
    old = leader_pod(chart)

    def burst(numbers: range) -> dict[str, str]:
        return run_all(chart, namespace, {f"{i * i}\n": f"import time\ntime.sleep(1)\nprint({i} * {i})"
                                          for i in numbers})
    expected = burst(range(10))  # in flight when the leader goes
    old_log = subprocess.Popen([chart.kubectl_bin, "--kubeconfig", str(REPO / ".cluster" / "kubeconfig"), "logs",
                                "-f", "-n", NAMESPACE, old.metadata.name], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    lost_at = time.monotonic()
    if how == "killed":  # SIGKILL, then the pod gone: nothing releases the Lease, a standby waits for it to expire
        ChartOperator(chart).control("kill")
    else:  # kubectl delete pod: SIGTERM, kopf stops, the Lease is handed over
        chart.kubectl("delete", "pod", "-n", NAMESPACE, old.metadata.name, "--wait=false")
    expected.update(burst(range(10, 20)))  # created while the leader is gone or handing over
    new = wait_for(lambda: (h := lease_holder(chart)) and h != old.metadata.name and h, 60, "another leader")
    took = time.monotonic() - lost_at
    print(f"\nleader {how}: {new} took the Lease {took:.1f} s later")
    old_log.terminate()
    old_lines = old_log.communicate(timeout=10)[0].splitlines()
    # Told to stop, the leader hands the Lease over once kopf has stopped (usually within 2 s; kopf's shutdown
    # has taken up to ~11 s under CI's load, and waits for handlers still talking to the API server, so the
    # terminating pod must keep its network). Vanished without a word: the Lease's expiry, 13-16 s. Either way
    # a standby leads within the Lease's duration plus its renewal and polling periods.
    if took >= 25:
        print("the old leader's last lines:", *old_lines[-20:], sep="\n")
    assert took < 25, f"{took:.1f} s, the old leader's log above"
    assert_all_true(chart, namespace, expected, census)


def test_uninstall_keeps_the_crds_and_the_runs(chart, namespace):
    name = chart.create_run(namespace, {"language": "python", "code": "print('kept')"})
    assert chart.wait_run(namespace, name)["status"]["stdout"] == "kept\n"
    assert json.loads(chart.kubectl("get", "crd", "coderuns.coderun.io", "-o", "json").stdout)[
        "metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    _sh("bash", "e2e/install.sh", "uninstall")
    assert helm("status", RELEASE, "-n", NAMESPACE, check=False).returncode != 0
    wait_for(lambda: not operator_pods(chart), 60, "the operator pods to be gone")
    assert chart.kubectl("get", "crd", "coderuns.coderun.io", "coderunpolicies.coderun.io", check=False).returncode == 0
    assert chart.get_run(namespace, name)["status"]["stdout"] == "kept\n"



MANIFEST_NAMESPACE = "coderun-manifest"  # not the chart's: `kubectl create namespace` as the doc has it


def _this_clusters_values(cluster) -> dict:
    """What e2e/install.sh passes helm for this cluster (its images by digest, its CIDRs), as a values file has it."""
    images = dict(line.split()[:2] for line in _sh("bash", "e2e/cluster/cluster.sh", "images").stdout.splitlines()
                  if len(line.split()) >= 2)
    node_ip = cluster.node_ip()
    return {"image": {"digest": images["coderun.local/operator:v1"]},
            "egressProxy": {"image": {"digest": images["coderun.local/egress-proxy:v1"]},
                            "extraEgress": [{"to": [{"namespaceSelector": {"matchLabels": {
                                "coderun.io/egress-destination": "true"}}}]}],
                            "resources": {"requests": {"cpu": "20m"}}, "adminResources": {"requests": {"cpu": "5m"}}},
            "clusterNetwork": {"podCIDRs": ["10.88.0.0/16"], "serviceCIDRs": ["10.96.0.0/16"],
                               "nodeCIDRs": [f"{node_ip}/32"]}}


def test_the_rendered_manifest_installs_with_kubectl_as_the_operations_doc_writes_it(chart, namespace, tmp_path):
    """docs/operations.md's install without Helm, command for command: `make manifest`, `kubectl create
    namespace`, the Pod Security label, `kubectl apply --server-side` (again while the API server starts serving the
    CRDs' kinds, as the doc says); then a leader, a run through it, and everything but the CRDs deleted again."""
    import yaml
    _sh("bash", "e2e/install.sh", "uninstall")  # one operator at a time
    wait_for(lambda: not operator_pods(chart), 60, "the chart's operator pods to be gone")
    values, manifest = tmp_path / "my-values.yaml", tmp_path / "coderun.yaml"
    values.write_text(yaml.safe_dump(_this_clusters_values(chart)))
    made = _sh("make", "-s", "manifest", f"VALUES={values}", f"NAMESPACE={MANIFEST_NAMESPACE}", f"MANIFEST={manifest}")
    assert f"wrote {manifest}" in made.stdout
    objects = [o for o in yaml.safe_load_all(manifest.read_text()) if o]
    try:
        chart.kubectl("create", "namespace", MANIFEST_NAMESPACE)
        chart.kubectl("label", "namespace", MANIFEST_NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
        wait_for(lambda: chart.kubectl("apply", "--server-side", "-f", str(manifest), check=False).returncode == 0,
                 60, "kubectl apply --server-side of the manifest to succeed")
        deployments = {o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"}

        def available() -> bool:
            got = json.loads(chart.kubectl("get", "deployments", "-n", MANIFEST_NAMESPACE, "-o", "json").stdout)
            return {d["metadata"]["name"] for d in got["items"]
                    if d["status"].get("availableReplicas") == d["spec"]["replicas"]} == deployments
        wait_for(available, 180, f"the manifest's Deployments {sorted(deployments)} to be available")

        def leader_labelled() -> bool:
            holder = chart.kubectl("get", "lease", "coderun-operator", "-n", MANIFEST_NAMESPACE, "-o",
                                   "jsonpath={.spec.holderIdentity}", check=False).stdout
            return bool(holder) and chart.kubectl("get", "pod", holder, "-n", MANIFEST_NAMESPACE, "-o",
                                                  "jsonpath={.metadata.labels.coderun\\.io/leader}",
                                                  check=False).stdout == "true"
        wait_for(leader_labelled, 60, "a leader of the manifest's operator")
        run = chart.wait_run(namespace, chart.create_run(namespace, {"language": "python", "code": "print(6 * 7)"}))
        assert (run["status"]["phase"], run["status"]["stdout"]) == ("Succeeded", "42\n"), run["status"]
    finally:
        # Everything but the CRDs (the runs of the other tests live in them), so that the chart installs again.
        rest = tmp_path / "without-crds.yaml"
        rest.write_text(yaml.safe_dump_all([o for o in objects if o["kind"] != "CustomResourceDefinition"]))
        # (kubectl's own timeout below the harness's 120 s for one kubectl call)
        chart.kubectl("delete", "--ignore-not-found", "--timeout=90s", "-f", str(rest), check=False)
        chart.kubectl("delete", "namespace", MANIFEST_NAMESPACE, "--ignore-not-found", "--timeout=90s", check=False)
