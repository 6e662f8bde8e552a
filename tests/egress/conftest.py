"""The egress tier: the real squid of Debian's squid-openssl, on loopback, with the squid.conf, helpers and
launchers the proxy image has (rendered by the same code, run by the system's python3 with nothing but the
egress package), in front of origin servers of the test's own on 127.0.0.1 that squid finds by names in its
hosts_file. No cluster and no internet: `make test-egress`.

squid and openssl come from Debian (install-squid.sh, as root); without them, and without root to install them,
the tier fails saying so. As root, squid runs as uid 65532, as in the pod."""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import http.client
import http.server
import itertools
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

from coderun.egress import admin
from coderun.egress import proxy as proxy_start
from coderun.egress import squid_config
from coderun.egress.credential import Budget, Grant, admin_bearer, mint, proxy_url
from coderun.egress.rules import Rule

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"
PROXY_UID = 65532
NAMES = ("allowed.test", "other.test", "a.wild.test", "b.a.wild.test", "wild.test")
KEY_ID, KEY = "tier", os.urandom(32)
POLICY = "tier-policy"
POD_NAME = "coderun-egress-proxy-tier"  # the proxy pod's name, as the downward API gives it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def squid_installed() -> None:
    if os.geteuid() == 0:
        installed = subprocess.run(["bash", str(HERE / "install-squid.sh")], capture_output=True, text=True,
                                   timeout=900)
        assert installed.returncode == 0, f"installing squid-openssl failed:\n{installed.stderr[-3000:]}"
    missing = [tool for tool in ("squid", "openssl") if not shutil.which(tool, path="/usr/sbin:/usr/bin:/bin")]
    if missing:
        pytest.fail(f"the egress tier needs {missing} (Debian: apt-get install squid-openssl openssl; as root the "
                    "tier installs them itself)", pytrace=False)
    version = subprocess.run(["squid", "-v"], capture_output=True, text=True, env={"PATH": "/usr/sbin:/usr/bin"})
    if "--with-openssl" not in version.stdout:
        pytest.fail("this squid is built without OpenSSL: install squid-openssl, not squid", pytrace=False)


@dataclass
class Origin:
    """Plain HTTP and HTTPS servers on 127.0.0.1; each request's path and headers are kept."""
    plain_port: int
    tls_port: int
    ca: str
    seen: list[dict] = field(default_factory=list)


def _origin_handler(seen: list[dict]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append({"path": self.path, "headers": dict(self.headers)})
            body = json.dumps({"path": self.path, "size": 0}).encode()
            if self.path.startswith("/bytes/"):
                body = b"x" * int(self.path.rsplit("/", 1)[1])
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Handler


@pytest.fixture(scope="session")
def origin(squid_installed, tmp_path_factory) -> Origin:
    certs = tmp_path_factory.mktemp("origin")
    key, cert = certs / "key.pem", certs / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=allowed.test", "-addext",
                    "subjectAltName=" + ",".join(f"DNS:{n}" for n in NAMES)], check=True, capture_output=True)
    seen: list[dict] = []
    plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _origin_handler(seen))
    tls = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _origin_handler(seen))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    tls.socket = context.wrap_socket(tls.socket, server_side=True)
    for server in (plain, tls):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Origin(plain.server_address[1], tls.server_address[1], str(cert), seen)
    for server in (plain, tls):
        server.shutdown()
        server.server_close()


@dataclass
class Proxy:
    """The running squid and what the operator would give a run."""
    address: str
    root: Path
    settings: squid_config.Settings
    policy: str = POLICY
    _uids: itertools.count = field(default_factory=lambda: itertools.count(1))

    admin: str = ""  # host:port of the admin endpoint

    def run(self, rules: tuple[Rule, ...], expires_in: int = 600, uid: str | None = None,
            budget: Budget | None = None, pod: str | None = None) -> tuple[str, str]:
        """(uid, proxy URL) of a new run allowed `rules`: what the operator would put in HTTP(S)_PROXY (its
        credential naming this proxy pod, or `pod`)."""
        uid = uid or f"run-{next(self._uids)}"
        token = mint(KEY_ID, KEY, Grant("tier", uid, uid, POLICY, rules, int(time.time()) + expires_in, budget,
                                        pod or POD_NAME))
        return uid, proxy_url(self.address, token, uid)

    def ask_admin(self, method: str, path: str, body: dict | None = None,
                  bearer: str = admin_bearer(KEY)) -> tuple[int, bytes, dict]:
        """What the operator asks of the pod's admin endpoint when a run ends."""
        conn = http.client.HTTPConnection(*self.admin.rsplit(":", 1), timeout=10)
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Authorization": f"Bearer {bearer}"})
        answer = conn.getresponse()
        return answer.status, answer.read(), dict(answer.getheaders())

    def revoke(self, uid: str) -> None:
        assert self.ask_admin("POST", f"/runs/{uid}/revoke", {"expires": int(time.time()) + 600})[0] == 204

    def records(self, until: Callable[[list[dict]], bool], deadline: float = 10.0) -> list[dict]:
        """The access log's records once `until` holds for them (polled; the log daemon writes as squid logs)."""
        stop = time.monotonic() + deadline
        while True:
            lines = Path(self.settings.access_log).read_text().splitlines() if Path(
                self.settings.access_log).exists() else []
            found = [json.loads(line) for line in lines]
            if until(found) or time.monotonic() > stop:
                return found
            time.sleep(0.05)

    def cache_log(self) -> str:
        path = self.root / "cache.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def _package_copy(root: Path) -> Path:
    """coderun/__init__.py and coderun/egress alone, as the image has them: what the helpers import is only this."""
    package = root / "package"
    (package / "coderun").mkdir(parents=True)
    shutil.copy(REPO / "src/coderun/__init__.py", package / "coderun/__init__.py")
    shutil.copytree(REPO / "src/coderun/egress", package / "coderun/egress",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return package


@contextlib.contextmanager
def running_proxy(upstream: squid_config.Upstream | None = None) -> Iterator[Proxy]:
    """squid with coderun's squid.conf and helpers, and the admin endpoint and relay beside it, as the pod runs them
    (through `upstream` when given)."""
    root = Path(tempfile.mkdtemp(prefix="coderun-egress-tier-"))
    os.chmod(root, 0o755)
    keys, state = root / "keys", root / "state"
    keys.mkdir()
    state.mkdir()
    (state / "runs").mkdir()
    (keys / KEY_ID).write_bytes(KEY)
    (root / "revoked").write_text("")
    (root / "hosts").write_text("".join(f"127.0.0.1 {name}\n" for name in NAMES))
    package = _package_copy(root)
    listen = f"127.0.0.1:{free_port()}"
    settings = squid_config.Settings(
        listen=listen, tls_stage_port=free_port(), state_dir=str(state), launchers=str(root / "bin"),
        keys_dir=str(keys), revocations=str(root / "revoked"), error_dir=str(root / "errors"),
        hosts_file=str(root / "hosts"), cache_log=str(root / "cache.log"), env={}, pod_name=POD_NAME,
        relay_port=free_port(), upstream=upstream)
    # The proxy's own ports on its loopback, which no run's CIDR rule opens (the pod refuses its whole loopback:
    # squid_config.PROXY_ITSELF; the tier's origins share this one).
    settings = dataclasses.replace(settings, proxy_itself_ports=(int(listen.rsplit(":", 1)[1]),
                                                                 settings.tls_stage_port))
    squid_config.write_error_pages(settings.error_dir)
    squid_config.write_launchers(settings.launchers, SYSTEM_PYTHON, str(package))
    config = proxy_start.prepare(settings)
    as_proxy: list[str] = []
    if os.geteuid() == 0:  # as in the pod: squid and its helpers as 65532, owning only their state
        for path in [root, *root.rglob("*")]:
            os.chown(path, PROXY_UID, PROXY_UID)
        as_proxy = ["setpriv", f"--reuid={PROXY_UID}", f"--regid={PROXY_UID}", "--clear-groups"]
    with open(root / "squid.stderr", "wb") as stderr:
        squid = subprocess.Popen([*as_proxy, "squid", "-N", "-f", config], stdout=subprocess.DEVNULL,
                                 stderr=stderr, env={"PATH": "/usr/sbin:/usr/bin:/bin"})
    # The admin endpoint and the tunnel relay as the pod's second container runs them, in this process (the test
    # reads and revokes).
    relay = proxy_start.start_relay(settings, lambda: {KEY_ID: KEY})
    endpoint = admin.make_server("127.0.0.1:0", lambda: {KEY_ID: KEY}, settings.revocations, settings.runs_dir,
                                 relay.revoke)
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    started = Proxy(listen, root, settings, admin="%s:%d" % endpoint.server_address)
    try:
        if not proxy_start.wait_ready(listen):
            pytest.fail(f"squid did not come up:\n{started.cache_log()}", pytrace=False)
        yield started
    finally:
        endpoint.shutdown()
        endpoint.server_close()
        squid.terminate()
        try:
            squid.wait(timeout=15)
        except subprocess.TimeoutExpired:
            squid.kill()
            squid.wait()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def proxy(squid_installed, origin) -> Iterator[Proxy]:
    with running_proxy() as started:
        yield started


@dataclass
class Upstream:
    """A stand-in for a corporate proxy on 127.0.0.1: CONNECT tunnels and absolute-URI GETs, to the tier's names
    (all on 127.0.0.1), asking for a Basic login; it keeps the method, target and Proxy-Authorization of each."""
    port: int
    username: str
    password: str
    seen: list[dict] = field(default_factory=list)


def _upstream_handler(up: Upstream) -> type[http.server.BaseHTTPRequestHandler]:
    expected = "Basic " + base64.b64encode(f"{up.username}:{up.password}".encode()).decode()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _admitted(self) -> tuple[str, int] | None:
            up.seen.append({"method": self.command, "target": self.path,
                            "authorization": self.headers.get("Proxy-Authorization")})
            if self.headers.get("Proxy-Authorization") != expected:
                self.send_response(407)
                self.send_header("Proxy-Authenticate", 'Basic realm="corp"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            target = self.path if self.command == "CONNECT" else urllib.parse.urlsplit(self.path).netloc
            host, _, port = target.rpartition(":")
            if host not in NAMES:  # the tier's names only: never a packet off the machine
                self.send_error(502)
                return None
            return "127.0.0.1", int(port)

        def do_CONNECT(self):  # noqa: N802 - http.server's name
            address = self._admitted()
            if address is None:
                return
            with socket.create_connection(address, timeout=10) as server:
                self.send_response(200, "Connection established")
                self.end_headers()
                _pipe(self.connection, server)
            self.close_connection = True

        def do_GET(self):  # noqa: N802 - http.server's name
            address = self._admitted()
            if address is None:
                return
            parts = urllib.parse.urlsplit(self.path)
            conn = http.client.HTTPConnection(*address, timeout=10)
            conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""),
                         headers={"Host": parts.netloc})
            answer = conn.getresponse()
            body = answer.read()
            self.send_response(answer.status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Handler


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Bytes both ways until either side closes."""
    def one_way(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
    back = threading.Thread(target=one_way, args=(b, a), daemon=True)
    back.start()
    one_way(a, b)
    back.join(timeout=10)


@pytest.fixture(scope="session")
def upstream(squid_installed) -> Iterator[Upstream]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), None)  # handler set below, once `up` exists
    up = Upstream(server.server_address[1], "svc-coderun", "p a%ss:w\"#rd")
    server.RequestHandlerClass = _upstream_handler(up)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield up
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def proxy_via_upstream(squid_installed, origin, upstream) -> Iterator[Proxy]:
    """A second squid, configured as egressProxy.upstream configures the pod's: everything through `upstream`."""
    with running_proxy(squid_config.Upstream("127.0.0.1", upstream.port, upstream.username,
                                             upstream.password)) as started:
        yield started


@pytest.fixture(autouse=True)
def no_proxy_settings_of_the_host(monkeypatch):
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "all_proxy",
                 "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
