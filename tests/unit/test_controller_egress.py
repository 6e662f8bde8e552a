"""The controller with the egress proxy (a real proxy.EgressProxy over the fake API and a fake admin transport):
a run of a policy with host rules gets its credential and its one route, finds its own input again after a crash,
and when it ends its credential is revoked at every ready proxy pod before its requests go into its status and
its log ConfigMap."""
import base64
import json
import threading
import time

import pytest

from coderun.egress.credential import admin_bearer, verify
from coderun.egress.rules import Rule
from coderun.sandbox.runner.inputs import parse_run_spec
from coderun.sandbox.runner.prestart import fits
from coderun_operator.builders.egress import EgressAccess, ProxyRoute, pinned
from coderun_operator.controller import Controller
from coderun_operator import proxy
from coderun_operator.proxy import EgressProxy, ProxySettings
from fake_k8s import FakeK8s
from support.controller import NS, T0, Clock, frame_log, make_run, policy_object, submit, terminate
from support.warm import runner_answer, start_pool, submit_and_wait
from support.sessions import POD, make_session, runner, session_run, start_session
from support.controller import settle

KEY = b"s" * 32
PROXY_IPS = {"proxy-a": "10.88.0.21", "proxy-b": "10.88.0.22"}
PROXY_NS = "coderun-system"
SELECTOR = {"app.kubernetes.io/component": "egress-proxy"}
SETTINGS = ProxySettings(PROXY_NS, "coderun-egress-proxy", "coderun-egress-proxy-keys", "k1")
POLICY = {"egress": [{"host": "pypi.pkgs.svc.cluster.local", "ports": [{"port": 443}]},
                     {"cidr": "10.96.7.0/24", "ports": [{"port": 443}]}],
          "allowClusterEgress": True, "egressBudget": {"requests": 10}}


class Admin:
    """The proxy pods' admin endpoints: what was asked, in order, and what each pod answers."""

    def __init__(self):
        self.asked: list[tuple[str, str]] = []
        self.logs: dict[str, list[dict]] = {}  # pod address -> records
        self.down: set[str] = set()
        self.admitted: dict[str, int] = {}  # pod address -> what its acl helper counted (default: what it logged)
        self.before = lambda method, address: None  # a test's hold on a call (it may ignore the deadline)

    def __call__(self, method, url, bearer, body, deadline):
        assert bearer == admin_bearer(KEY)
        address = url.split("//")[1].split(":")[0]
        self.asked.append((method, url))
        self.before(method, address)
        if address in self.down:
            raise ConnectionRefusedError("connection refused")
        if method == "POST":
            assert json.loads(body)["expires"] > T0.timestamp()
            return 204, b"", {}
        records = self.logs.get(address, [])
        return 200, "".join(json.dumps(r) + "\n" for r in records).encode(), {
            "X-Coderun-Requests": str(len(records)), "X-Coderun-Dropped": "0",
            "X-Coderun-Admitted": str(self.admitted.get(address, len(records)))}


def proxy_pod(name, ip, ready=True):
    return {"kind": "Pod", "metadata": {"name": name, "namespace": PROXY_NS, "labels": dict(SELECTOR)},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


@pytest.fixture
def env():
    api, clock, admin = FakeK8s(), Clock(), Admin()
    api.objects[("Service", PROXY_NS, "coderun-egress-proxy")] = {"spec": {
        "clusterIP": "10.96.0.50", "selector": dict(SELECTOR),
        "ports": [{"name": "proxy", "port": 3128, "targetPort": 3128}, {"name": "admin", "port": 3130,
                                                                         "targetPort": 3130}]}}
    api.objects[("Secret", PROXY_NS, "coderun-egress-proxy-keys")] = {"data": {"k1": base64.b64encode(KEY).decode()}}
    for name, ip in PROXY_IPS.items():
        api.objects[("Pod", PROXY_NS, name)] = proxy_pod(name, ip)
    ctl = Controller(api=api, clock=clock, proxy=EgressProxy(api, SETTINGS, transport=admin))
    ctl.on_policy(policy_object(**POLICY), deleted=False)
    return api, clock, ctl, admin


def started(env):
    api, clock, ctl, _ = env
    return submit((api, clock, ctl), make_run())


def program_env(api) -> dict:
    return json.loads(api.objects[("ConfigMap", NS, "demo-input")]["data"]["run.json"])["env"]


def dialled(url: str) -> str:
    return url.rpartition("@")[2]


def test_the_program_gets_its_credential_and_its_network_policy_the_route_to_the_proxy(env):
    api = env[0]
    assert started(env)["status"]["phase"] == "Pending"
    variables = program_env(api)
    url = variables["HTTPS_PROXY"]
    assert url == variables["HTTP_PROXY"] == variables["https_proxy"] and url.startswith("http://uid-1:v1.k1.")
    assert variables["NO_PROXY"] == "localhost,127.0.0.1,::1"
    grant = verify(url.split(":", 2)[2].rsplit("@", 1)[0], {"k1": KEY}, T0.timestamp(), user="uid-1")
    assert (grant.run, grant.policy, grant.budget.requests) == (f"{NS}/demo", "default", 10)
    assert grant.rules == (Rule(host="pypi.pkgs.svc.cluster.local", ports=(443,)),
                           Rule(cidr="10.96.7.0/24", ports=(443,)))
    assert grant.expires == T0.timestamp() + 300 + 5 + 60  # start deadline, timeout, the pod's margin
    routes = api.objects[("NetworkPolicy", NS, "demo-deny")]["spec"]["egress"]
    assert routes[-1] == {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": PROXY_NS}},
                                  "podSelector": {"matchLabels": SELECTOR}}],
                          "ports": [{"protocol": "TCP", "port": 3128}]}


def test_only_node_gets_node_s_proxy_switch_so_a_python_run_can_use_a_prestarted_interpreter(env):
    """NODE_USE_ENV_PROXY is a variable Node reads as it starts: in a Python run's environment it made the runner
    refuse the prestarted interpreter (warm, session) and every keepState run (issue 35, item 6)."""
    api, clock, ctl, _ = env
    submit((api, clock, ctl), make_run())
    submit((api, clock, ctl), make_run("js", "uid-js", language="javascript", code="console.log(1)"))
    runs = {name: parse_run_spec(json.loads(api.objects[("ConfigMap", NS, f"{name}-input")]["data"]["run.json"]))
            for name in ("demo", "js")}
    assert "HTTPS_PROXY" in runs["demo"]["env"] and "NODE_USE_ENV_PROXY" not in runs["demo"]["env"]
    assert runs["js"]["env"]["NODE_USE_ENV_PROXY"] == "1" and "HTTPS_PROXY" in runs["js"]["env"]
    # The runner's own test: a process prestarted with these settings stands in for the Python run, not the Node one.
    assert fits(runs["demo"], runs["demo"]) and not fits(runs["js"], runs["js"])


def test_a_cold_run_dials_one_ready_proxy_pod_never_the_service_and_its_status_names_it(env):
    api = env[0]
    status = started(env)["status"]
    pod = status["network"]["proxyPod"]
    assert dialled(program_env(api)["HTTPS_PROXY"]) == f"{PROXY_IPS[pod]}:3128"  # the pod's own proxy port
    assert all(dialled(program_env(api)[v]) == f"{PROXY_IPS[pod]}:3128" for v in ("HTTP_PROXY", "http_proxy"))
    # The run's NetworkPolicy routes it to the proxy's pods by their labels: a pod's own address is what it allows.
    route = api.objects[("NetworkPolicy", NS, "demo-deny")]["spec"]["egress"][-1]
    assert route["to"][0]["podSelector"]["matchLabels"].items() <= api.objects[("Pod", PROXY_NS, pod)]["metadata"][
        "labels"].items() and route["ports"] == [{"protocol": "TCP", "port": 3128}]
    assert terminate(env[:3])["status"]["network"]["proxyPod"] == pod  # still named once the run has ended


def test_a_not_ready_proxy_pod_is_never_chosen(env):
    api, clock, ctl, _ = env
    api.objects[("Pod", PROXY_NS, "proxy-a")] = proxy_pod("proxy-a", PROXY_IPS["proxy-a"], ready=False)
    for i in range(8):
        run = submit((api, clock, ctl), make_run(f"r{i}", f"uid-{i}"))
        assert run["status"]["network"]["proxyPod"] == "proxy-b"
        env_ = json.loads(api.objects[("ConfigMap", NS, f"r{i}-input")]["data"]["run.json"])["env"]
        assert dialled(env_["HTTPS_PROXY"]) == "10.88.0.22:3128"


def test_without_a_ready_proxy_pod_a_run_with_host_rules_cannot_start_and_says_why(env):
    api = env[0]
    api.objects[("Pod", PROXY_NS, "proxy-a")] = proxy_pod("proxy-a", PROXY_IPS["proxy-a"], ready=False)
    api.objects.pop(("Pod", PROXY_NS, "proxy-b"))
    status = started(env)["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "StartFailed")
    assert status["message"].startswith(f"no pod of the egress proxy (the pods behind Service {PROXY_NS}/"
                                        "coderun-egress-proxy) is ready")
    assert "the platform team must repair the egress proxy" in status["message"]
    assert ("Pod", NS, "demo-sandbox") not in api.objects and ("ConfigMap", NS, "demo-input") not in api.objects


def proxy_pods(*states):
    pods = []
    for i, state in enumerate(states):
        pod = proxy_pod(f"proxy-{i}", f"10.88.1.{i}", ready=state != "not ready")
        if state == "deleting":
            pod["metadata"]["deletionTimestamp"] = "2026-11-22T10:00:00Z"
        if state == "no address":
            del pod["status"]["podIP"]
        pods.append(pod)
    return pods


ACCESS = EgressAccess("k1", KEY, ProxyRoute(PROXY_NS, tuple(SELECTOR.items()), 3128))


def test_the_choice_is_a_ready_pod_stable_for_a_run_and_spread_over_runs():
    pods = proxy_pods("ready", "not ready", "deleting", "no address", "ready", "ready")
    chosen = {uid: pinned(ACCESS, pods, uid).pod for uid in (f"uid-{i}" for i in range(300))}
    assert set(chosen.values()) == {"proxy-0", "proxy-4", "proxy-5"}  # only ready pods, each given some runs
    assert min(list(chosen.values()).count(p) for p in ("proxy-0", "proxy-4", "proxy-5")) > 60
    for uid, pod in chosen.items():
        assert pinned(ACCESS, list(reversed(pods)), uid).pod == pod  # whatever order the API lists them in
        gone = "proxy-5" if pod == "proxy-0" else "proxy-0"
        assert pinned(ACCESS, [p for p in pods if p["metadata"]["name"] != gone], uid).pod == pod  # another pod leaving moves no run pinned elsewhere
    access = pinned(ACCESS, pods, "uid-1")
    assert access.address == f"10.88.1.{access.pod.rsplit('-', 1)[1]}:3128" and access.key == KEY
    assert pinned(ACCESS, proxy_pods("not ready", "deleting", "no address"), "uid-1") is None


def test_a_start_retried_after_a_crash_mints_the_same_credential_and_finds_its_own_input(env):
    api, clock, ctl, _ = env
    started(env)
    before = program_env(api)
    api.objects.pop(("Pod", NS, "demo-sandbox"))
    api.patch_run_status(NS, "demo", {"podName": None, "phase": None})  # as if the pod and status were lost
    clock.now = T0.replace(minute=7)
    ctl.on_run(api.get_run(NS, "demo"), deleted=False)
    assert api.run(NS, "demo")["status"]["podName"] == "demo-sandbox" and program_env(api) == before


def test_a_start_retried_after_its_proxy_pod_stopped_being_ready_keeps_its_input(env):
    api, clock, ctl, _ = env
    pod = started(env)["status"]["network"]["proxyPod"]
    before = program_env(api)
    api.objects[("Pod", PROXY_NS, pod)] = proxy_pod(pod, PROXY_IPS[pod], ready=False)
    api.objects.pop(("Pod", NS, "demo-sandbox"))
    api.patch_run_status(NS, "demo", {"podName": None, "phase": None, "network": None})
    ctl.on_run(api.get_run(NS, "demo"), deleted=False)
    status = api.run(NS, "demo")["status"]
    # Its own input, not a conflict: the run dials the pod it was given, the only one its credential opens (its
    # requests fail closed if it is gone), and the status names that pod.
    assert status["podName"] == "demo-sandbox" and program_env(api) == before
    assert status["network"]["proxyPod"] == pod


def test_an_input_holding_another_credential_is_a_conflict(env):
    api = env[0]
    owner = {"apiVersion": "coderun.io/v1alpha1", "kind": "CodeRun", "name": "demo", "uid": "uid-1", "controller": True}
    forged = json.dumps({"env": {"HTTPS_PROXY": "http://uid-1:v1.k1.e30.AAAA@10.96.0.50:3128"}})
    api.objects[("ConfigMap", NS, "demo-input")] = {"kind": "ConfigMap", "metadata": {
        "name": "demo-input", "namespace": NS, "ownerReferences": [owner]}, "data": {"run.json": forged}}
    assert started(env)["status"]["reason"] == "NameConflict"


def test_at_the_end_each_ready_pod_revokes_then_hands_over_the_run_s_requests(env):
    api, _, _, admin = env
    api.objects[("Pod", PROXY_NS, "proxy-c")] = proxy_pod("proxy-c", "10.88.0.23", ready=False)
    api.objects[("Pod", PROXY_NS, "proxy-c")]["status"]["phase"] = "Pending"  # starting: it served nobody
    admin.logs["10.88.0.21"] = [{"time": "2026-11-22T10:00:02Z", "host": "pypi.pkgs.svc.cluster.local", "port": 443,
                                 "verdict": "allowed", "bytes_sent": 10, "bytes_received": 5000}]
    admin.logs["10.88.0.22"] = [{"time": "2026-11-22T10:00:01Z", "host": "evil.example", "port": 443,
                                 "verdict": "denied", "reason": "NotAllowed", "bytes_sent": 0, "bytes_received": 0}]
    started(env)
    status = terminate(env[:3])["status"]
    for address in ("10.88.0.21", "10.88.0.22"):  # the pods are asked at once, each revoking first
        assert [(m, url) for m, url in admin.asked if address in url] == [
            ("POST", f"http://{address}:3130/runs/uid-1/revoke"), ("GET", f"http://{address}:3130/runs/uid-1/log")]
    assert (status["phase"], status["reason"]) == ("Succeeded", "Completed")
    assert status["message"].endswith("the egress proxy refused 1 request: evil.example:443 (NotAllowed); see "
                                      "status.network")
    network = status["network"]
    assert (network["requests"], network["allowed"], network["denied"], network["complete"]) == (2, 1, 1, True)
    log = api.objects[("ConfigMap", NS, network["logConfigMap"])]
    assert [json.loads(line)["host"] for line in log["data"]["requests.jsonl"].splitlines()] == [
        "evil.example", "pypi.pkgs.svc.cluster.local"]
    assert log["metadata"]["ownerReferences"][0]["uid"] == "uid-1" and log["immutable"]


def test_a_proxy_pod_that_cannot_be_asked_makes_the_log_incomplete_not_the_run(env):
    api, _, _, admin = env
    admin.down.add("10.88.0.22")
    started(env)
    status = terminate(env[:3])["status"]
    assert status["reason"] == "Completed" and status["network"]["complete"] is False
    assert "logConfigMap" not in status["network"]  # nothing was logged


def test_a_pod_whose_log_is_short_of_what_it_admitted_makes_the_log_incomplete_saying_both(env):
    api, _, _, admin = env
    admin.logs["10.88.0.21"] = [{"time": "2026-11-22T10:00:02Z", "host": "evil.example", "port": 443,
                                 "verdict": "denied", "reason": "NotAllowed", "bytes_sent": 0, "bytes_received": 0}]
    admin.admitted["10.88.0.21"] = 3  # two of its requests never reached its log
    started(env)
    network = terminate(env[:3])["status"]["network"]
    assert (network["requests"], network["admitted"], network["complete"]) == (1, 3, False)


def test_the_proxy_pods_are_asked_at_once(env):
    api, _, _, admin = env
    both = threading.Barrier(2, timeout=5)  # passes only while both pods are being asked

    def together(method, address):
        if method == "POST":
            try:
                both.wait()
            except threading.BrokenBarrierError:
                raise TimeoutError("asked one after the other") from None
    admin.before = together
    started(env)
    assert terminate(env[:3])["status"]["network"]["complete"] is True


def test_a_pod_that_never_answers_delays_the_run_s_end_by_the_deadline_at_most(env, monkeypatch):
    api, _, _, admin = env
    monkeypatch.setattr(proxy, "END_RUN_SECONDS", 0.5)
    monkeypatch.setattr(proxy, "LATE_SECONDS", 0.2)
    admin.logs["10.88.0.21"] = [{"time": "2026-11-22T10:00:02Z", "host": "pypi.pkgs.svc.cluster.local", "port": 443,
                                 "verdict": "allowed", "bytes_sent": 1, "bytes_received": 1}]
    released = threading.Event()
    admin.before = lambda method, address: address == "10.88.0.22" and released.wait(10)  # deaf to the deadline
    started(env)
    began = time.monotonic()
    try:
        status = terminate(env[:3])["status"]
    finally:
        released.set()
    assert time.monotonic() - began < 0.5 + 0.2 + 0.5
    assert status["reason"] == "Completed" and status["network"]["complete"] is False
    assert status["network"]["requests"] == 1  # the pod that answered, in time


def test_while_one_call_reads_the_proxy_s_service_again_the_others_get_the_last_good_one(env):
    api, admin = env[0], env[3]
    now = [0.0]
    egress = EgressProxy(api, SETTINGS, transport=admin, clock=lambda: now[0])
    last_good = egress.access()
    now[0] += proxy.CACHE_SECONDS + 1
    reading, released = threading.Event(), threading.Event()

    def slow(namespace, name):  # the API server taking its time over the refresh
        reading.set()
        released.wait(10)
    api.fail["read_service"] = slow
    refresh = threading.Thread(target=egress.access)
    refresh.start()
    try:
        assert reading.wait(5)
        began = time.monotonic()
        assert egress.access() == last_good and egress.end_run("uid-1", int(T0.timestamp()) + 60)[1] is True
        assert time.monotonic() - began < 1
    finally:
        released.set()
        refresh.join(5)
    assert api.calls.count("read_service") == 2  # the first read and the one refresh


def test_a_run_over_its_budget_ends_egress_budget_exceeded(env):
    api, _, _, admin = env
    admin.logs["10.88.0.21"] = [{"time": f"2026-11-22T10:00:{i:02d}Z", "host": "pypi.pkgs.svc.cluster.local",
                                 "port": 443, "verdict": "allowed", "bytes_sent": 1, "bytes_received": 1}
                                for i in range(10)] + [
        {"time": "2026-11-22T10:00:30Z", "host": "pypi.pkgs.svc.cluster.local", "port": 443, "verdict": "denied",
         "reason": "BudgetExceeded", "bytes_sent": 0, "bytes_received": 0}]
    started(env)
    log, termination = frame_log(reason="NonZeroExit", exitCode=1)
    status = terminate(env[:3], log=log, termination=termination)["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "EgressBudgetExceeded")
    assert "11 requests, its budget being 10 (spec.egressBudget.requests)" in status["message"]


def test_the_credential_is_redacted_from_what_the_program_prints(env):
    api = env[0]
    started(env)
    printed = f"my proxy is {program_env(api)['HTTPS_PROXY']}\n"
    log, termination = frame_log(stdout=printed)
    status = terminate(env[:3], log=log, termination=termination)["status"]
    assert "[REDACTED:coderun-egress-token]" in status["stdout"] and "v1.k1." not in status["stdout"]


def test_without_the_proxy_s_key_a_run_with_host_rules_cannot_start_and_says_why(env):
    api = env[0]
    api.objects.pop(("Secret", PROXY_NS, "coderun-egress-proxy-keys"))
    status = started(env)["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "StartFailed")
    assert status["message"].startswith(f"the egress proxy's Secret {PROXY_NS}/coderun-egress-proxy-keys has no key")
    assert ("Pod", NS, "demo-sandbox") not in api.objects


def test_a_controller_without_a_proxy_refuses_a_policy_with_host_rules():
    api, clock = FakeK8s(), Clock()
    ctl = Controller(api=api, clock=clock)
    ctl.on_policy(policy_object(**POLICY), deleted=False)
    status = submit((api, clock, ctl), make_run())["status"]
    assert status["reason"] == "PolicyDenied" and "egress proxy, which is off" in status["message"]


def test_the_signing_key_is_made_once_at_start_when_the_chart_asked_and_never_overwritten():
    api = FakeK8s()
    settings = ProxySettings.from_env({"CODERUN_EGRESS_PROXY": f"{PROXY_NS}/coderun-egress-proxy",
                                       "CODERUN_EGRESS_KEYS_SECRET": "keys", "CODERUN_EGRESS_KEYS_CREATE": "true"})
    assert (settings.keys_secret, settings.key_id, settings.create_keys) == ("keys", "k1", True)
    proxy = EgressProxy(api, settings)
    proxy.ensure_keys()
    made = api.objects[("Secret", PROXY_NS, "keys")]
    assert len(base64.b64decode(made["data"]["k1"])) == 32 and made["metadata"]["labels"]
    proxy.ensure_keys()
    assert api.objects[("Secret", PROXY_NS, "keys")] == made
    given = EgressProxy(FakeK8s(), ProxySettings(PROXY_NS, "p", "theirs", "k1"))
    given.ensure_keys()
    assert not given.api.objects  # a Secret of the platform's own is never created
    assert ProxySettings.from_env({}) is None


def test_a_log_the_api_server_refuses_leaves_the_run_s_end_as_it_was(env):
    api, _, _, admin = env
    admin.logs["10.88.0.21"] = [{"time": "2026-11-22T10:00:02Z", "host": "pypi.pkgs.svc.cluster.local", "port": 443,
                                 "verdict": "allowed", "bytes_sent": 1, "bytes_received": 1}]

    def quota(obj):
        if obj["metadata"]["name"].endswith("-egress-log"):
            raise api.Refused("configmaps is forbidden: exceeded quota", 403)
    api.fail["create_or_get"] = quota
    started(env)
    status = terminate(env[:3])["status"]
    assert status["reason"] == "Completed" and status["network"]["requests"] == 1
    assert "logConfigMap" not in status["network"]


def pool_routes(api) -> dict:
    return api.objects[("NetworkPolicy", NS, "coderun-pool-default")]


def test_a_warm_pool_with_egress_routes_its_pods_from_their_start_and_its_run_gets_its_credential_with_the_input(env):
    api, clock, ctl, admin = env
    ctl.on_policy(policy_object(**POLICY, warmPool={"size": 1, "languages": ["python"]}), deleted=False)
    (name,) = start_pool((api, clock, ctl))
    # The pool's NetworkPolicy was there before its pod, selects it by the pool's label (which a claim keeps),
    # and routes it exactly as a cold run of the policy is routed.
    routes = pool_routes(api)
    assert int(routes["metadata"]["resourceVersion"]) < int(api.objects[("Pod", NS, name)]["metadata"]["resourceVersion"])
    selector = routes["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= api.objects[("Pod", NS, name)]["metadata"]["labels"].items()
    api.attach_answers[name] = runner_answer()
    status = submit_and_wait((api, clock, ctl), make_run())["status"]
    assert (status["startMode"], status["phase"], status["podName"]) == ("Warm", "Succeeded", name)
    cold = submit((api, clock, ctl), make_run("cold", "uid-2"))  # the pool is empty now: this one starts cold
    assert cold["status"]["startMode"] == "Cold"
    assert routes["spec"]["egress"] == api.objects[("NetworkPolicy", NS, "cold-deny")]["spec"]["egress"]
    # Once its input was sent the warm run got its own NetworkPolicy too, owned by it, as the cold one has: its
    # routes outlive whatever becomes of the pool's (the policy deleted, replaced or edited).
    own = api.objects[("NetworkPolicy", NS, "demo-deny")]
    assert own["spec"]["egress"] == routes["spec"]["egress"] and own["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    # The credential came with the input on the pod's stdin, for this run only, and was revoked at its end.
    document = json.loads(api.sent[name].split(b"\n", 1)[1])
    url = json.loads(document["data"]["run.json"])["env"]["HTTPS_PROXY"]
    assert dialled(url) == f"{PROXY_IPS[status['network']['proxyPod']]}:3128"  # pinned at the claim, as a cold run
    grant = verify(url.split(":", 2)[2].rsplit("@", 1)[0], {"k1": KEY}, T0.timestamp(), user="uid-1")
    assert grant.run == f"{NS}/demo" and grant.rules[0] == Rule(host="pypi.pkgs.svc.cluster.local", ports=(443,))
    assert ("POST", "http://10.88.0.21:3130/runs/uid-1/revoke") in admin.asked


def test_a_pool_whose_network_policy_name_is_taken_starts_no_pods(env):
    api, clock, ctl, _ = env
    api.objects[("NetworkPolicy", NS, "coderun-pool-default")] = {
        "kind": "NetworkPolicy", "metadata": {"name": "coderun-pool-default", "namespace": NS},
        "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}}  # someone's allow-all
    ctl.on_policy(policy_object(**POLICY, warmPool={"size": 1}), deleted=False)
    assert start_pool((api, clock, ctl)) == []


def test_without_the_proxy_a_pool_for_host_rules_starts_no_pods():
    api, clock = FakeK8s(), Clock()
    ctl = Controller(api=api, clock=clock, proxy=EgressProxy(api, SETTINGS, transport=Admin()))  # no keys, no Service
    ctl.on_policy(policy_object(**POLICY, warmPool={"size": 1}), deleted=False)
    assert start_pool((api, clock, ctl)) == [] and ("NetworkPolicy", NS, "coderun-pool-default") not in api.objects


def test_a_session_of_a_policy_with_egress_gets_its_routes_and_each_run_its_own_credential_revoked_at_its_end(env):
    """The session's pod is routed as a run of its policy is (its NetworkPolicy, owned by the session, before the
    pod); each run's document carries a credential for that run alone, pinned to one proxy pod, revoked and its
    requests collected when the run ends, as for a cold run."""
    api, _, ctl, admin = env
    ctl.on_policy(policy_object(**POLICY, sessions={"allowed": True}), deleted=False)
    start_session(env[:3])
    routes = api.objects[("NetworkPolicy", NS, POD)]
    assert int(routes["metadata"]["resourceVersion"]) < int(api.objects[("Pod", NS, POD)]["metadata"]["resourceVersion"])
    assert routes["metadata"]["ownerReferences"][0]["kind"] == "CodeRunSession"
    assert routes["spec"]["podSelector"]["matchLabels"] == {"coderun.io/session-uid": "sess-uid-1"}
    assert routes["spec"]["egress"] == [
        {"to": [{"ipBlock": {"cidr": "10.96.7.0/24"}}], "ports": [{"protocol": "TCP", "port": 443}]},
        {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": PROXY_NS}},
                 "podSelector": {"matchLabels": SELECTOR}}], "ports": [{"protocol": "TCP", "port": 3128}]}]
    _, answer = runner(api)
    environments = []

    def answer_and_keep(document: bytes) -> bytes:
        body = json.loads(document.split(b"\n", 1)[1])
        environments.append(json.loads(body["data"]["run.json"])["env"])
        return answer(document)
    api.attach_answers[POD] = answer_and_keep
    admin.logs[PROXY_IPS["proxy-a"]] = [{"run": "uid-1", "host": "pypi.pkgs.svc.cluster.local", "port": 443,
                                         "verdict": "allowed", "bytes_sent": 10, "bytes_received": 20}]
    for name, uid in (("first", "uid-1"), ("second", "uid-2")):
        ctl.on_run(api.add_run(session_run(name, uid)), deleted=False)
        settle(ctl)
    for variables, uid, name in zip(environments, ("uid-1", "uid-2"), ("first", "second")):
        token = variables["HTTPS_PROXY"].split(":", 2)[2].rsplit("@", 1)[0]
        assert verify(token, {"k1": KEY}, T0.timestamp(), user=uid).run == f"{NS}/{name}"
    first = api.run(NS, "first")["status"]
    assert first["phase"] == "Succeeded" and first["network"]["proxyPod"] in PROXY_IPS
    assert first["network"]["requests"] == 1, first["network"]
    assert dialled(environments[0]["HTTPS_PROXY"]) == f"{PROXY_IPS[first['network']['proxyPod']]}:3128"
    revoked = [url for method, url in admin.asked if method == "POST"]
    assert len(revoked) == 2 * len(PROXY_IPS)  # each run's credential, at every ready proxy pod


def test_a_session_s_routes_follow_its_policy_and_a_run_cannot_start_without_a_proxy_pod(env):
    """A policy tightened while a session lives reaches it at its next run; with no proxy pod ready a run ends
    StartFailed saying so, and the session takes the next one."""
    api, _, ctl, _ = env
    ctl.on_policy(policy_object(**POLICY, sessions={"allowed": True}), deleted=False)
    start_session(env[:3])
    _, answer = runner(api)
    api.attach_answers[POD] = answer
    only_names = {**POLICY, "egress": POLICY["egress"][:1]}  # the cidr rule goes
    ctl.on_policy(policy_object(**only_names, sessions={"allowed": True}), deleted=False)
    ctl.on_run(api.add_run(session_run("first", "uid-1")), deleted=False)
    settle(ctl)
    assert api.run(NS, "first")["status"]["phase"] == "Succeeded"
    egress = api.objects[("NetworkPolicy", NS, POD)]["spec"]["egress"]
    assert [rule["to"][0].get("ipBlock") for rule in egress] == [None], egress  # the proxy's pods only
    for name in PROXY_IPS:
        api.objects[("Pod", PROXY_NS, name)] = proxy_pod(name, PROXY_IPS[name], ready=False)
    ctl.on_run(api.add_run(session_run("second", "uid-2", created="2026-11-22T10:00:02Z")), deleted=False)
    settle(ctl)
    second = api.run(NS, "second")["status"]
    assert (second["phase"], second["reason"]) == ("Failed", "StartFailed") and "egress proxy" in second["message"]
    assert api.objects[("CodeRunSession", NS, "s1")]["status"]["phase"] == "Ready"


def test_a_session_whose_network_policy_name_is_taken_by_another_object_does_not_start(env):
    api, _, ctl, _ = env
    ctl.on_policy(policy_object(**POLICY, sessions={"allowed": True}), deleted=False)
    api.objects[("NetworkPolicy", NS, POD)] = {"kind": "NetworkPolicy", "metadata": {
        "name": POD, "namespace": NS, "resourceVersion": "1"}, "spec": {"podSelector": {}, "egress": [{}]}}
    ctl.on_session(api.add_session(make_session()), deleted=False)
    status = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (status["phase"], status["reason"]) == ("Ended", "StartFailed") and "not this session's" in status["message"]
    assert ("Pod", NS, POD) not in api.objects


