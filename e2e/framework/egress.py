"""Egress destinations (a web pod, its Services and names) and the policies, programs and logs of runs
that reach them."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
import tempfile
import textwrap
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
import pytest
from coderun.api.coderunpolicy import POLICY_PLURAL
from coderun.api.models import GROUP, VERSION
from conftest import NAMESPACE_LABELS, wait_for
from framework.hostile import PRELUDE


PROXY_NAMESPACE, PROXY_SERVICE = "coderun-system", "coderun-egress-proxy"


DESTINATION_LABELS = {**NAMESPACE_LABELS, "coderun.io/egress-destination": "true"}  # e2e/install.sh's extraEgress


SMALL = {"timeoutSeconds": 20, "cpu": "250m", "memory": "128Mi", "disk": "16Mi"}


PYTHON_IMAGE = "coderun.local/sandbox-python:v2"


SERVER = r'''
import hashlib, http.server, ssl, threading
WHEEL = "coderun_egress_probe-1.0-py3-none-any.whl"
DATA = open("/index/wheel", "rb").read()
PAGES = {"/simple/": b'<a href="coderun-egress-probe/">coderun-egress-probe</a>',
         "/simple/coderun-egress-probe/": ('<a href="/files/%s#sha256=%s">%s</a>'
                                           % (WHEEL, hashlib.sha256(DATA).hexdigest(), WHEEL)).encode(),
         "/files/" + WHEEL: DATA}
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Head and body are two writes: with Nagle on, the body waits for the head's ACK, which a client on a kept-alive
    # connection (the proxy's) delays by 40 ms. Servers people run do not do that; nor does this one.
    disable_nagle_algorithm = True
    def do_GET(self):
        path = self.path.split("?")[0]
        if path.startswith("/bytes/"):
            body = b"x" * min(int(path[7:]), 64 << 20)
        else:
            body = PAGES.get(path) or ("hello from %s" % self.headers.get("Host", "?")).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if path.startswith("/simple/") else "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
tls = http.server.ThreadingHTTPServer(("0.0.0.0", 8443), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain("/certs/tls.crt", "/certs/tls.key")
tls.socket = context.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=tls.serve_forever, daemon=True).start()
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Handler).serve_forever()
'''


@dataclass
class Destinations:
    namespace: str
    ca: str                   # the web server's certificate (self-signed), PEM
    web_ip: str               # the Services' cluster IPs and the pod's own address
    pypi_ip: str
    pod_ip: str
    proxy_ip: str

    def name(self, service: str) -> str:
        return f"{service}.{self.namespace}.svc.cluster.local"


def probe_wheel() -> bytes:
    """A wheel pip accepts: a module, METADATA, WHEEL and a RECORD of both with their hashes."""
    files = {"coderun_egress_probe/__init__.py": b"VALUE = 42\n",
             "coderun_egress_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: coderun-egress-probe\n"
                                                             b"Version: 1.0\n",
             "coderun_egress_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: coderun-e2e\n"
                                                          b"Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()}"
                     f",{len(data)}\n" for path, data in files.items())
    record += "coderun_egress_probe-1.0.dist-info/RECORD,,\n"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as wheel:
        for path, data in {**files, "coderun_egress_probe-1.0.dist-info/RECORD": record.encode()}.items():
            wheel.writestr(path, data)
    return out.getvalue()


def certificate(names: list[str]) -> tuple[str, str]:
    with tempfile.TemporaryDirectory() as work:
        key, cert = Path(work) / "key.pem", Path(work) / "cert.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "2", "-subj", f"/CN={names[0]}", "-addext",
                        "subjectAltName=" + ",".join(f"DNS:{n}" for n in names)], check=True, capture_output=True)
        return cert.read_text(), key.read_text()


def create_destinations(cluster) -> Destinations:
    """The server pod, its Services and their names, in a namespace of their own (the caller deletes it)."""
    ns = f"e2e-egress-dest-{uuid.uuid4().hex[:5]}"
    cluster.core.create_namespace({"metadata": {"name": ns, "labels": DESTINATION_LABELS}})
    names = [f"{s}.{ns}.svc.cluster.local" for s in ("web", "pypi", "other")]
    cert, key = certificate(names)
    cluster.core.create_namespaced_secret(ns, {"metadata": {"name": "web-tls"}, "type": "kubernetes.io/tls",
                                               "stringData": {"tls.crt": cert, "tls.key": key}})
    cluster.core.create_namespaced_config_map(ns, {"metadata": {"name": "index"}, "binaryData": {
        "wheel": base64.b64encode(probe_wheel()).decode()}})
    cluster.core.create_namespaced_pod(ns, {"metadata": {"name": "web", "labels": {"app": "web"}}, "spec": {
        "automountServiceAccountToken": False, "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "web", "image": PYTHON_IMAGE, "imagePullPolicy": "Never",
                        "command": ["python3", "-c", SERVER], "ports": [{"containerPort": 8080},
                                                                       {"containerPort": 8443}],
                        "readinessProbe": {"tcpSocket": {"port": 8443}, "periodSeconds": 1},
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "certs", "mountPath": "/certs"},
                                         {"name": "index", "mountPath": "/index"}]}],
        "volumes": [{"name": "certs", "secret": {"secretName": "web-tls"}},
                    {"name": "index", "configMap": {"name": "index"}}]}})
    for service, ports in (("web", (8080, 8443)), ("pypi", (8080,)), ("other", (8080, 8443))):
        cluster.core.create_namespaced_service(ns, {"metadata": {"name": service}, "spec": {
            "selector": {"app": "web"}, "ports": [{"name": f"p{p}", "port": p, "targetPort": p} for p in ports]}})
    cluster.core.create_namespaced_service(ns, {"metadata": {"name": "rebind"}, "spec": {
        "type": "ExternalName", "externalName": "kubernetes.default.svc.cluster.local"}})
    wait_for(lambda: any(c.type == "Ready" and c.status == "True" for c in
                         cluster.core.read_namespaced_pod("web", ns).status.conditions or ()), 90, "the web pod")
    def address(service: str, namespace: str = ns) -> str:
        return cluster.core.read_namespaced_service(service, namespace).spec.cluster_ip

    return Destinations(ns, cert, address("web"), address("pypi"),
                        cluster.core.read_namespaced_pod("web", ns).status.pod_ip,
                        address(PROXY_SERVICE, PROXY_NAMESPACE))


@pytest.fixture(scope="module")
def destinations(operator) -> Destinations:
    dest = create_destinations(operator)
    yield dest
    operator.core.delete_namespace(dest.namespace, propagation_policy="Background")


def egress_policy(dest: Destinations, name: str = "default", **extra) -> dict:
    """The names the runs may reach, and the Service addresses they resolve to (the Service range is the
    cluster's own: a cidr rule must cover it, and allowClusterEgress allow that)."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRunPolicy", "metadata": {"name": name}, "spec": {
        "admission": "Record", "allowClusterEgress": True, "egress": [
            {"host": dest.name("web"), "ports": [{"port": 8080}, {"port": 8443}]},
            {"host": dest.name("pypi"), "ports": [{"port": 8080}]},
            {"host": dest.name("rebind"), "ports": [{"port": 443}]},
            {"host": "kubernetes.default.svc.cluster.local", "ports": [{"port": 443}]},
            {"cidr": f"{dest.web_ip}/32", "ports": [{"port": 8080}, {"port": 8443}]},
            {"cidr": f"{dest.pypi_ip}/32", "ports": [{"port": 8080}]}], **extra}}


def apply_policy(cluster, namespace: str, policy: dict) -> None:
    cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, policy)


def run(cluster, namespace: str, code: str, language: str = "python", timeout: float = 120, **spec) -> dict:
    """The run once it ended (the whole object: its name, its status)."""
    name = cluster.create_run(namespace, {"language": language, "code": code, "limits": SMALL, **spec})
    return cluster.wait_run(namespace, name, timeout)


def network_log(cluster, namespace: str, status: dict) -> list[dict]:
    configmap = cluster.core.read_namespaced_config_map(status["network"]["logConfigMap"], namespace)
    return [json.loads(line) for line in configmap.data["requests.jsonl"].splitlines()]


def python(*parts: str) -> str:
    """A program: the hostile suite's PRELUDE (report, attempt, tcp, udp), then each part dedented on its own."""
    return PRELUDE + "".join(textwrap.dedent(part) for part in parts)


FETCH = r'''
import urllib.error, urllib.request, ssl
def fetch(url, cafile="ca.pem"):
    """A GET as any Python program writes it: urllib reads HTTP_PROXY / HTTPS_PROXY itself."""
    try:
        context = ssl.create_default_context(cafile=cafile) if url.startswith("https:") else None
        with urllib.request.urlopen(url, timeout=15, context=context) as r:
            return r.status, r.read().decode(errors="replace")[:200], ""
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:400], e.headers.get("X-Coderun-Refused") or ""
    except Exception as e:
        return type(e).__name__, str(e)[:300], ""
'''


# Every request pipelined on its connection: one thread writes them, the main one counts the answers (a refusal
# is a 403 whose body names the policy). A connection squid closes is opened again for what was not answered.
FLOOD = r'''
import base64, os, socket, threading, urllib.parse
from concurrent.futures import ThreadPoolExecutor
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
login = "%s:%s" % (urllib.parse.unquote(proxy.username), urllib.parse.unquote(proxy.password))
REQUEST = ("GET http://{target}/flood HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic %s\r\n\r\n"
           % base64.b64encode(login.encode()).decode()).encode()
MARK = b"HTTP/1.1 403 "
def connection(count):
    answered, reconnects = 0, 0
    while answered < count:
        sock = socket.create_connection((proxy.hostname, proxy.port), timeout=60)
        wanted = count - answered
        threading.Thread(target=lambda: sock.sendall(REQUEST * wanted), daemon=True).start()
        seen, tail = 0, b""
        while seen < wanted:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            text = tail + chunk
            seen += text.count(MARK)
            tail = text[-(len(MARK) - 1):]
        sock.close()
        answered += seen
        reconnects += seen < wanted
    return answered, reconnects
with ThreadPoolExecutor({connections}) as pool:
    results = list(pool.map(connection, [{requests} // {connections}] * {connections}))
report(answered=sum(a for a, _ in results), reconnects=sum(r for _, r in results))
'''
