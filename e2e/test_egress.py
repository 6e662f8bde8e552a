"""Egress by name on the real cluster (docs/egress.md): runs reach the names their policy lists through the chart's
egress proxy, and nothing else; every request is in the run's status.network and its log ConfigMap.

The destinations are inside the cluster, never the internet: one server pod in a namespace of its own (labelled as
an egress destination, which install.sh lets the proxy reach) behind several Services, so several names: `web`
(HTTP 8080, HTTPS 8443 with a certificate the test makes), `pypi` (a package index of one wheel), `other` (the same
pod, a name no policy lists) and `rebind` (an ExternalName alias of kubernetes.default.svc.cluster.local: a name
resolving to the API server's address). Names are written in full (the proxy uses no search domains).

Runs only against the chart's operator (CODERUN_E2E_OPERATOR=chart, `make test`): the host-process mode installs
no proxy. Synchronisation is always a polled predicate with a deadline.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from coderun.api.models import GROUP, VERSION
from conftest import OPERATOR_MODE, wait_for, wait_for_pool
from framework.hostile import BREACH, facts_of
from framework.sessions import create_session, run_in, wait_session
from framework.standins import INTERNET_V4, INTERNET_V6
from framework.egress import (FETCH, PROXY_NAMESPACE, SMALL, Destinations, apply_policy,  # noqa: F401 - a fixture
                             destinations, egress_policy, network_log, python, run)

pytestmark = [pytest.mark.skipif(OPERATOR_MODE != "chart", reason="the egress proxy is installed by the chart: "
                                 "CODERUN_E2E_OPERATOR=chart (make test)"),
              pytest.mark.cold_only,  # each test makes its own policies (one with a warm pool of its own)
              pytest.mark.timeout(900)]

WHEEL = "coderun_egress_probe-1.0-py3-none-any.whl"


@pytest.fixture
def egress_namespace(operator, destinations, namespace) -> str:
    apply_policy(operator, namespace, egress_policy(destinations))
    return namespace


def test_python_reaches_an_allowed_name_over_http_and_https_and_is_refused_another_saying_why(operator, destinations,
                                                                                               egress_namespace):
    dest = destinations
    ended = run(operator, egress_namespace, python(FETCH, f'''
        plain, tls, refused = (fetch("http://{dest.name('web')}:8080/hello"),
                               fetch("https://{dest.name('web')}:8443/hello"),
                               fetch("http://{dest.name('other')}:8080/"))
        print("proxy:", os.environ["HTTPS_PROXY"])
        report(plain=plain, tls=tls, refused=refused)'''), files=[{"path": "ca.pem", "content": dest.ca}])
    status = ended["status"]
    facts = facts_of(status)
    assert (status["phase"], status["reason"]) == ("Succeeded", "Completed"), status
    assert facts["plain"][:2] == [200, f"hello from {dest.name('web')}:8080"]
    assert facts["tls"][:2] == [200, f"hello from {dest.name('web')}:8443"]
    says = f"egress to {dest.name('other')}:8080 is not allowed by CodeRunPolicy default"
    assert facts["refused"][0] == 403 and says in facts["refused"][1] and facts["refused"][2].startswith(says)
    assert "[REDACTED:coderun-egress-token]" in status["stdout"]  # the credential never reaches the status
    assert status["message"].endswith(f"the egress proxy refused 1 request: {dest.name('other')}:8080 (NotAllowed); "
                                      "see status.network")
    network = status["network"]
    assert (network["requests"], network["allowed"], network["denied"], network["complete"]) == (3, 2, 1, True)
    hosts = {(h["host"], h["port"]): h for h in network["hosts"]}
    assert hosts[(dest.name("other"), 8080)]["reason"] == "NotAllowed"
    assert hosts[(dest.name("web"), 8443)]["allowed"] == 1 and hosts[(dest.name("web"), 8443)]["bytesReceived"] > 0
    records = network_log(operator, egress_namespace, status)
    assert [(r["method"], r["host"], r["port"], r["verdict"]) for r in records] == [
        ("GET", dest.name("web"), 8080, "allowed"), ("CONNECT", dest.name("web"), 8443, "allowed"),
        ("GET", dest.name("other"), 8080, "denied")]
    assert records[0]["path"] == "/hello" and records[1]["sni"] == dest.name("web") and records[1]["tls"] == "splice"
    assert all(r["run"] == f"{egress_namespace}/{ended['metadata']['name']}" for r in records)


def test_pip_downloads_from_a_package_index_through_the_proxy(operator, destinations, egress_namespace):
    index = destinations.name("pypi")
    status = run(operator, egress_namespace, python(f'''
        import subprocess
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
                               "--no-deps", "--no-cache-dir", "-d",
                               "/tmp/dl", "--index-url", "http://{index}:8080/simple/", "--trusted-host", "{index}",
                               "coderun-egress-probe"], capture_output=True, text=True, timeout=60)
        report(code=done.returncode, files=attempt_list("/tmp/dl"), err=done.stderr[-500:])'''),
                 limits={**SMALL, "timeoutSeconds": 90, "memory": "256Mi"}, timeout=180)["status"]
    facts = facts_of(status)
    assert facts["code"] == 0 and facts["files"] == [WHEEL], facts
    records = network_log(operator, egress_namespace, status)
    assert {(r["host"], r["path"]) for r in records} >= {(index, "/simple/coderun-egress-probe/"),
                                                         (index, f"/files/{WHEEL}")}
    assert all(r["verdict"] == "allowed" for r in records)


# Node 18's fetch ignores HTTP_PROXY (docs/egress.md): a program sets undici's ProxyAgent itself, with the
# credential as Basic proxy authorization.
NODE = r'''
const fs = require("fs");
const { ProxyAgent, setGlobalDispatcher } = require("undici");
const proxy = new URL(process.env.HTTPS_PROXY);
const basic = Buffer.from(decodeURIComponent(proxy.username) + ":" + decodeURIComponent(proxy.password));
setGlobalDispatcher(new ProxyAgent({uri: proxy.origin, token: "Basic " + basic.toString("base64"),
                                    requestTls: {ca: fs.readFileSync("ca.pem")}}));
(async () => {
  const facts = {};
  try { const r = await fetch(process.argv[2] || "URL"); facts.tls = [r.status, await r.text()]; }
  catch (e) { facts.tls = ["error", String(e.cause || e)]; }
  try { const r = await fetch("REFUSED"); facts.refused = [r.status]; }
  catch (e) { facts.refused = ["error", String(e.cause || e)]; }
  console.log(JSON.stringify(facts));
})();
'''


def test_node_reaches_an_allowed_name_with_undici_s_proxy_agent(operator, destinations, egress_namespace):
    dest = destinations
    code = NODE.replace('process.argv[2] || "URL"', json.dumps(f"https://{dest.name('web')}:8443/node")).replace(
        '"REFUSED"', json.dumps(f"https://{dest.name('other')}:8443/"))
    status = run(operator, egress_namespace, code, language="javascript",
                 files=[{"path": "ca.pem", "content": dest.ca}])["status"]
    facts = facts_of(status)
    assert facts["tls"] == [200, f"hello from {dest.name('web')}:8443"], status
    assert facts["refused"][0] == "error"  # undici reports a refused CONNECT as an error; the log says why
    # undici may open both tunnels at once: the log is in the order the proxy saw them
    assert sorted((r["host"], r["verdict"], r["reason"]) for r in network_log(operator, egress_namespace, status)) \
        == sorted([(dest.name("web"), "allowed", "Allowed"), (dest.name("other"), "denied", "NotAllowed")])


def test_a_run_over_its_request_budget_ends_egress_budget_exceeded(operator, destinations, namespace):
    apply_policy(operator, namespace, egress_policy(destinations, egressBudget={"requests": 3}))
    status = run(operator, namespace, python(FETCH, f'''
        report(codes=[fetch("http://{destinations.name('web')}:8080/n%d" % i)[0] for i in range(12)])'''))["status"]
    # Exactly the budget, back to back: the proxy counts a request as it admits it (not when it is logged).
    assert facts_of(status)["codes"] == [200] * 3 + [403] * 9, status
    assert (status["phase"], status["reason"]) == ("Failed", "EgressBudgetExceeded"), status
    assert "(spec.egressBudget.requests)" in status["message"]
    # The budget holds because every request of the run goes to the one proxy pod it was pinned to, named here.
    proxies = {p.metadata.name for p in operator.core.list_namespaced_pod(
        PROXY_NAMESPACE, label_selector="app.kubernetes.io/component=egress-proxy").items}
    assert len(proxies) >= 2 and status["network"]["proxyPod"] in proxies, (proxies, status["network"])


def test_a_warm_pool_serves_a_policy_with_egress_and_routes_only_that_policy_s_pods(operator, destinations, namespace):
    """Pool pods wait with their policy's routes already in force (the pool's own NetworkPolicy); the credential
    arrives with the input. A second policy's pool in the same namespace has no routes at all."""
    dest, pool = destinations, {"size": 1, "languages": ["python"], "cpuRequest": "10m"}
    defaults = {key: SMALL[key] for key in ("cpu", "memory", "disk")}  # a run fits the pool with the defaults
    opened_policy = egress_policy(dest, defaults=defaults, warmPool=pool)
    opened_policy["spec"]["egress"].append({"cidr": f"{dest.pod_ip}/32", "ports": [{"port": 8080}]})  # direct
    apply_policy(operator, namespace, opened_policy)
    apply_policy(operator, namespace, {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRunPolicy",
                                       "metadata": {"name": "closed"},
                                       "spec": {"admission": "Record", "defaults": defaults, "warmPool": pool}})
    wait_for_pool(operator, namespace, pool, ready=2)
    timeout = {"timeoutSeconds": 20}
    opened = run(operator, namespace, python(FETCH, f'''
        report(tls=fetch("https://{dest.name('web')}:8443/warm"), refused=fetch("http://{dest.name('other')}:8080/"),
               direct=tcp("{dest.pod_ip}", 8080), elsewhere=tcp("{dest.pod_ip}", 8443))'''),
                 files=[{"path": "ca.pem", "content": dest.ca}], limits=timeout)["status"]
    facts = facts_of(opened)
    assert opened["startMode"] == "Warm", opened
    # Its proxy settings are not a start-up variable of Python's: the pool's prestarted interpreter ran it.
    assert opened["metrics"].get("interpreterPrestarted") is True, opened["metrics"]
    assert facts["tls"][:2] == [200, f"hello from {dest.name('web')}:8443"] and facts["refused"][0] == 403, facts
    # The policy's cidr rule: a route of its own, in force from the pod's start; only to the port it names.
    assert facts["direct"] == "open" and facts["elsewhere"] not in BREACH, facts
    assert [(r["host"], r["verdict"]) for r in network_log(operator, namespace, opened)] == [
        (dest.name("web"), "allowed"), (dest.name("other"), "denied")]
    closed = run(operator, namespace, python(f'''
        report(env=sorted(k for k in os.environ if "proxy" in k.lower()), proxy=tcp("{dest.proxy_ip}", 3128),
               web=tcp("{dest.pod_ip}", 8080))'''), policyRef="closed", limits=timeout)["status"]
    facts = facts_of(closed)
    assert closed["startMode"] == "Warm" and closed["policy"] == "closed", closed
    assert facts["env"] == [] and facts["proxy"] not in BREACH and facts["web"] not in BREACH, facts


def test_a_session_s_runs_reach_the_allowed_names_each_with_a_credential_that_ends_with_it(operator, destinations,
                                                                                             namespace):
    """A CodeRunSession under a policy with egress: its runs reach the policy's names through the proxy and are
    refused others, each recorded in its own status.network; a credential a run left in the session's files is
    revoked once that run ended, so the next run (same sandbox, same files) gets nothing with it but a refusal."""
    dest = destinations
    apply_policy(operator, namespace, egress_policy(dest, sessions={"allowed": True},
                                                    defaults={"cpu": "250m", "memory": "256Mi"}))
    session = create_session(operator, namespace)
    wait_session(operator, namespace, session)
    first = run_in(operator, namespace, session, python(FETCH, f'''
        open("credential.txt", "w").write(os.environ["HTTPS_PROXY"])  # kept in the session's files
        report(plain=fetch("http://{dest.name('web')}:8080/one"), refused=fetch("http://{dest.name('other')}:8080/"))
        '''), files=[{"path": "ca.pem", "content": dest.ca}])
    facts = facts_of(first)
    assert (first["phase"], first["startMode"]) == ("Succeeded", "Session"), first
    assert facts["plain"][:2] == [200, f"hello from {dest.name('web')}:8080"] and facts["refused"][0] == 403, facts
    assert {(h["host"], h["allowed"], h["denied"]) for h in first["network"]["hosts"]} == {
        (dest.name("web"), 1, 0), (dest.name("other"), 0, 1)}, first["network"]
    second = run_in(operator, namespace, session, python(FETCH, f'''
        import urllib.request
        old = urllib.request.build_opener(urllib.request.ProxyHandler({{"http": open("credential.txt").read()}}))
        try:
            stale = old.open("http://{dest.name('web')}:8080/stale", timeout=15).status
        except urllib.error.HTTPError as e:
            stale = e.code
        report(stale=stale, mine=fetch("https://{dest.name('web')}:8443/two")[:2])
        '''))
    facts = facts_of(second)
    assert second["phase"] == "Succeeded" and second["podName"] == first["podName"], second
    assert [r["metrics"].get("interpreterPrestarted") for r in (first, second)] == [True, True], (first, second)
    # Refused on its first use after the run that held it ended: 403 from the check squid asks every request, or
    # 407 once squid's 5 s memory of the credential has gone (the egress tier pins down the first).
    assert facts["stale"] in (403, 407) and facts["mine"] == [200, f"hello from {dest.name('web')}:8443"], facts
    # Its own status holds its own request only: the stale credential's was no one's.
    assert second["network"]["requests"] == 1 and second["network"]["proxyPod"], second["network"]


def test_a_keep_state_session_under_egress_keeps_its_variables_runs_prestarted_and_each_run_has_its_credential(
        operator, destinations, namespace):
    """keepState under a policy with egress (issue 35, item 6: every such run ended InvalidSpec, the proxy settings
    holding Node's start-up switch): one interpreter for both runs, each with its own credential in os.environ."""
    dest = destinations
    apply_policy(operator, namespace, egress_policy(dest, sessions={"allowed": True},
                                                    defaults={"cpu": "250m", "memory": "256Mi"}))
    session = create_session(operator, namespace, keepState=True)
    wait_session(operator, namespace, session)
    # An opener built per request: urlopen's default one keeps the proxy settings of the run that first used it.
    get = f'''
        import os, urllib.request
        def get(path):
            opener = urllib.request.build_opener(urllib.request.ProxyHandler())
            with opener.open("http://{dest.name('web')}:8080" + path, timeout=15) as response:
                return response.status
        '''
    first = run_in(operator, namespace, session, python(get, '''
        kept = {"credential": os.environ["HTTPS_PROXY"], "status": get("/one")}
        report(status=kept["status"])
        '''))
    second = run_in(operator, namespace, session, python(get, '''
        report(kept=kept["status"], status=get("/two"), fresh=kept["credential"] != os.environ["HTTPS_PROXY"])
        '''))
    for ran in (first, second):
        assert (ran["phase"], ran["startMode"], ran["metrics"].get("interpreterPrestarted")) == (
            "Succeeded", "Session", True), ran
    assert facts_of(first) == {"status": 200} and facts_of(second) == {"kept": 200, "status": 200, "fresh": True}
    assert second["network"]["requests"] == 1, second["network"]


def test_a_run_without_egress_has_no_proxy_and_no_route_to_it(operator, destinations, namespace):
    status = run(operator, namespace, python(f'''
        report(env=sorted(k for k in os.environ if "proxy" in k.lower()), proxy=tcp("{destinations.proxy_ip}", 3128),
               web=tcp("{destinations.web_ip}", 8080))'''))["status"]
    facts = facts_of(status)
    assert facts["env"] == [] and facts["proxy"] not in BREACH and facts["web"] not in BREACH, facts
    assert "network" not in status


# ------------------------------------------------------------------ hostile programs, with a canary alongside
RAW = r'''
import base64, socket, ssl, urllib.parse
PROXY = urllib.parse.urlsplit(os.environ.get("HTTPS_PROXY", "http://x:y@127.0.0.1:1"))
def ask(request, credentials=None, tls_name=None):
    """One raw request to the proxy (what a program ignoring the conventions can send): its status line, the
    refusal header, and with tls_name what a TLS handshake naming it got through the tunnel."""
    user, password = credentials or (PROXY.username, urllib.parse.unquote(PROXY.password or ""))
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    s = socket.create_connection((PROXY.hostname, PROXY.port), timeout=15)
    s.sendall(request.replace("AUTH", f"Proxy-Authorization: Basic {auth}").encode())
    lines = []  # the answer's head, read byte by byte: what follows a CONNECT's head is the tunnel's
    while not lines or lines[-1]:
        line = b""
        while not line.endswith(b"\n") and len(line) < 65536:
            byte = s.recv(1)
            if not byte:
                break
            line += byte
        lines.append(line.decode(errors="replace").rstrip("\r\n"))
        if not line:
            break
    refused = next((l.split(": ", 1)[1] for l in lines if l.lower().startswith("x-coderun-refused")), "")
    tunnel = None
    if tls_name and " 200 " in lines[0]:
        try:
            context = ssl.create_default_context(cafile="ca.pem")
            context.check_hostname = False
            with context.wrap_socket(s, server_hostname=tls_name) as t:
                t.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                tunnel = "reply:" + t.recv(200).decode(errors="replace")
        except Exception as e:
            tunnel = type(e).__name__
    s.close()
    return lines[0], refused, tunnel
def connect(target, **kw):
    return ask(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nAUTH\r\n\r\n", **kw)
'''


@dataclass
class EgressAttack:
    id: str
    code: str
    check: Callable[[dict, dict], Any]
    stdin: Callable[[Any], str] | None = None  # what the test hands the program (another run's credential)


def blocked(*keys: str) -> Callable[[dict, dict], bool]:
    return lambda s, f: bool(f) and all(k in f and f[k] not in BREACH for k in keys)


def attacks(dest: Destinations, node: str) -> list[EgressAttack]:
    web, other, rebind = dest.name("web"), dest.name("other"), dest.name("rebind")
    return [
        EgressAttack("direct-connections", f'''
            report(web_service_other_port=tcp("{dest.web_ip}", 9999), web_service=tcp("{dest.web_ip}", 8080),
                   web_pod=tcp("{dest.pod_ip}", 8443), any_ip=tcp("{INTERNET_V4}", 443), node=tcp("{node}", 6443),
                   api=tcp("10.96.0.1", 443))''',
                     blocked("web_service_other_port", "web_service", "web_pod", "any_ip", "node", "api")),
        EgressAttack("udp-quic-ipv6", f'''
            report(quic=udp("{dest.web_ip}", 8443), quic_public=udp("{INTERNET_V4}", 443),
                   v6=tcp("{INTERNET_V6}", 443), v6_link_local=tcp(scoped("fe80::1"), 3128))''',
                     blocked("quic", "quic_public", "v6", "v6_link_local")),
        EgressAttack("dns-from-the-sandbox", f'''
            query = b"\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x03web\\x00\\x00\\x01\\x00\\x01"
            report(lookup=attempt(lambda: socket.getaddrinfo("{web}", 8080)), kube_dns=udp("10.96.0.10", 53, query),
                   node_dns=udp("{node}", 53, query))''',
                     blocked("lookup", "kube_dns", "node_dns")),
        EgressAttack("sni-other-than-the-connect-host", f'''
            report(fronted=connect("{web}:8443", tls_name="{other}"), honest=connect("{web}:8443", tls_name="{web}"))''',
                     lambda s, f: f["fronted"][0].endswith("200 Connection established")
                     and not str(f["fronted"][2]).startswith("reply:") and str(f["honest"][2]).startswith("reply:")
                     and _reasons(s).get(web) == "SNIMismatch"),
        EgressAttack("a-name-resolving-to-the-api-server", f'''
            report(rebind=connect("{rebind}:443"), kubernetes=connect("kubernetes.default.svc.cluster.local:443"),
                   short=connect("kubernetes.default.svc:443"), address=connect("10.96.0.1:443"))''',
                     lambda s, f: all(f[k][0].startswith("HTTP/1.1 403") for k in ("rebind", "kubernetes", "short",
                                                                                   "address"))
                     and "inside 10.96.0.0/16" in f["rebind"][1] and "inside 10.96.0.0/16" in f["kubernetes"][1]
                     and "not allowed by CodeRunPolicy" in f["short"][1] and "names only" in f["address"][1]
                     and _reasons(s).get(rebind) == "ProtectedAddress"),
        EgressAttack("another-run-s-name-with-this-run-s-token", f'''
            other_uid = sys.stdin.read().strip()
            report(as_other=connect("{web}:8443", credentials=(other_uid, urllib.parse.unquote(PROXY.password))),
                   forged=connect("{web}:8443", credentials=(PROXY.username, "v1.k1.e30.AAAA")))''',
                     lambda s, f: f["as_other"][0].startswith("HTTP/1.1 407") and f["forged"][0].startswith("HTTP/1.1 407"),
                     stdin=lambda earlier: earlier["metadata"]["uid"]),
        EgressAttack("a-finished-run-s-credential", f'''
            user, _, token = sys.stdin.read().strip().partition(":")
            report(reused=connect("{web}:8443", credentials=(user, token)))''',
                     lambda s, f: f["reused"][0].startswith("HTTP/1.1 407"),
                     stdin=lambda earlier: _credential_of(earlier)),
        EgressAttack("absurd-and-injected-headers", f'''
            big = ask("GET http://{web}:8080/ HTTP/1.1\\r\\nHost: x\\r\\nX-Big: " + "a" * 70000 + "\\r\\nAUTH\\r\\n\\r\\n")
            crlf = ask("GET http://{web}%0d%0aX-Evil:%201:8080/ HTTP/1.1\\r\\nHost: x\\r\\nAUTH\\r\\n\\r\\n")
            after = ask("GET http://{web}:8080/after HTTP/1.1\\r\\nHost: x\\r\\nAUTH\\r\\nConnection: close\\r\\n\\r\\n")
            report(big=big[0], crlf=crlf[0], after=after[0])''',
                     lambda s, f: " 200 " not in f["big"] and " 200 " not in f["crlf"] and " 200 " in f["after"]),
        EgressAttack("a-flood-of-connections", f'''
            held = []
            for _ in range(100):
                try:
                    held.append(socket.create_connection((PROXY.hostname, PROXY.port), timeout=5))
                except OSError:
                    break
            report(held=len(held), more=connect("{web}:8443")[0])''',
                     lambda s, f: f["held"] >= 64 and f["more"].startswith("HTTP/1.1 403")),
    ]


def _reasons(status: dict) -> dict[str, str]:
    return {h["host"]: h.get("reason") for h in (status.get("network") or {}).get("hosts") or ()}


def _credential_of(run: dict) -> str:
    """user:token of a run's proxy URL, as its input holds it (read with the test's rights, not a sandbox's)."""
    return _INPUTS[run["metadata"]["uid"]]


_INPUTS: dict[str, str] = {}


def test_hostile_programs_are_contained_each_with_its_reason_while_a_canary_reaches_its_name(
        operator, destinations, egress_namespace, standin_hits):
    cluster, dest = operator, destinations
    # A run whose credential the attackers are handed: it ends (revoked) before they use it.
    earlier_name = cluster.create_run(egress_namespace, {"language": "python", "code": "print(1)", "limits": SMALL})
    pod_input = wait_for(lambda: cluster.core.read_namespaced_config_map(f"{earlier_name}-input", egress_namespace),
                         60, "the earlier run's input")
    proxy_url = json.loads(pod_input.data["run.json"])["env"]["HTTPS_PROXY"]
    earlier = cluster.wait_run(egress_namespace, earlier_name)
    _INPUTS[earlier["metadata"]["uid"]] = proxy_url.split("//", 1)[1].rsplit("@", 1)[0]
    canary_code = python(FETCH, f'''
        report(canary=fetch("https://{dest.name('web')}:8443/canary")[:2])''')
    started: list[tuple[EgressAttack, str]] = []
    canaries: list[str] = []
    for attack in attacks(dest, cluster.node_ip()):
        spec = {"language": "python", "code": python(RAW, attack.code), "limits": SMALL,
                "files": [{"path": "ca.pem", "content": dest.ca}]}
        if attack.stdin:
            spec["stdin"] = attack.stdin(earlier)
        started.append((attack, cluster.create_run(egress_namespace, spec)))
        if len(started) % 3 == 0:  # a canary beside every few attacks; the node fits about six small runs
            canaries.append(cluster.create_run(egress_namespace, {"language": "python", "code": canary_code,
                                                                  "limits": SMALL,
                                                                  "files": [{"path": "ca.pem", "content": dest.ca}]}))
            for _, name in started[-3:]:
                cluster.wait_run(egress_namespace, name, 240)
    failures = []
    for attack, name in started:
        status = cluster.wait_run(egress_namespace, name, 240)["status"]
        facts = facts_of(status)
        try:
            ok = status["reason"] == "Completed" and attack.check(status, facts)
        except (KeyError, IndexError, TypeError) as e:
            ok = f"{type(e).__name__}: {e}"
        if ok is not True:
            failures.append(f"{attack.id}: {status.get('reason')} {facts} {status.get('message', '')[:300]}")
    assert not failures, "\n".join(failures)
    for name in canaries:
        status = cluster.wait_run(egress_namespace, name, 240)["status"]
        assert facts_of(status)["canary"] == [200, f"hello from {dest.name('web')}:8443"], status
    # "blocked" above is the program's word: the stand-ins say whether a packet got there (the node's get there).
    standin_hits.assert_no_pod_reached_them()
