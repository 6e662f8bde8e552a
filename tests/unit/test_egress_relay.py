"""The tunnel relay's bounds (coderun/egress/relay.py) on loopback, with a stand-in for squid's TLS stage: what a
hostile program could drive it to hold. The budget cut and revocation through the real squid: tests/egress."""
from __future__ import annotations

import asyncio
import base64
import os
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time

import pytest

from coderun.egress import relay as relay_module
from coderun.egress.credential import Budget, Grant, mint
from coderun.egress.relay import Relay, relayed_bytes, with_relayed
from coderun.egress.run_logs import Usage
from support.egress import read_head

KEY = os.urandom(32)


class TlsStage(socketserver.BaseRequestHandler):
    """Answers a CONNECT with 200, then sends back whatever it is sent (an echo in place of the origin)."""
    heads: list[bytes] = []

    def handle(self):
        head = read_head(self.request)
        if b"\r\n\r\n" not in head:
            return
        TlsStage.heads.append(head)
        self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        while chunk := self.request.recv(65536):
            self.request.sendall(chunk)


@pytest.fixture()
def stage():
    TlsStage.heads = []
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), TlsStage)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address
    server.shutdown()
    server.server_close()


@pytest.fixture()
def revoked() -> set[str]:
    return set()


@pytest.fixture()
def start_relay(stage, revoked, tmp_path):
    """Relays started on loopback, each stopped (its loop and thread ended) when the test ends."""
    started = []

    def start(**options) -> Relay:
        relay = Relay(stage, lambda: {"k1": KEY}, lambda: revoked, str(tmp_path), pod="proxy-0", **options)
        started.append((relay, relay.start(("127.0.0.1", 0))))
        return relay

    yield start
    for relay, thread in started:
        relay.stop()
        thread.join(5)
        assert not thread.is_alive()


@pytest.fixture()
def relay(start_relay) -> Relay:
    return start_relay()


def head(uid: str, budget: int | None = None, expires_in: int = 600, namespace: str = "ns") -> bytes:
    token = mint("k1", KEY, Grant(namespace, uid, uid, "p", (), int(time.time()) + expires_in,
                                  Budget(bytes=budget) if budget else None, "proxy-0"))
    credentials = base64.b64encode(f"{uid}:{token}".encode()).decode()
    return (f"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\nProxy-Authorization: Basic "
            f"{credentials}\r\n\r\n").encode()


def opened(relay: Relay, request: bytes) -> tuple[socket.socket, bytes]:
    """A connection to the relay that sent `request`, and the head it was answered."""
    sock = socket.create_connection(relay.address, timeout=5)
    sock.sendall(request)
    return sock, read_head(sock)


def echoed(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def closed(sock: socket.socket) -> bool:
    """The relay closed the connection: an end of file, or a reset (a cut aborts every side but the last); a recv
    that times out is a connection still open."""
    try:
        return sock.recv(65536) == b""
    except TimeoutError:
        return False  # nothing yet: still open
    except OSError:
        return True


def wait_for(predicate, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_a_reset_reads_as_closed_and_a_quiet_connection_as_open():
    """The predicates above retry rather than error when the relay's cut resets the client's side."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        reset, quiet = (socket.create_connection(server.getsockname(), timeout=0.05) for _ in range(2))
        peer, _ = server.accept()
        other, _ = server.accept()
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()  # a reset, as transport.abort() sends
        assert closed(reset) and not closed(quiet)
        for s in (reset, quiet, other):
            s.close()


def test_a_connect_of_a_valid_credential_is_relayed_and_counted(relay):
    sock, answer = opened(relay, head("run-a"))
    assert answer.startswith(b"HTTP/1.1 200") and echoed(sock, b"x" * 1000) == b"x" * 1000
    assert wait_for(lambda: relay.runs["run-a"].relayed == 2000)  # both ways
    sock.close()


def test_a_head_beyond_its_bound_is_closed_before_the_tls_stage_sees_it(relay):
    sock, answer = opened(relay, b"CONNECT a:1 HTTP/1.1\r\nX: " + b"a" * (relay_module.MAX_HEAD_BYTES + 10))
    assert answer == b"" and TlsStage.heads == []
    sock.close()
    control, answer = opened(relay, head("run-a"))  # an ordinary head, on the same relay, reaches it
    assert answer.startswith(b"HTTP/1.1 200") and len(TlsStage.heads) == 1
    control.close()


def test_a_revoked_or_forged_credential_is_refused_by_the_relay(relay, revoked):
    revoked.add("run-r")
    for request in (head("run-r"), head("run-f").replace(b"Basic ", b"Basic eA")):
        sock, answer = opened(relay, request)
        assert answer.startswith(b"HTTP/1.1 403") and TlsStage.heads == []
        sock.close()


def test_one_run_holds_at_most_its_share_of_tunnels(relay, monkeypatch):
    monkeypatch.setattr(relay_module, "MAX_TUNNELS_PER_RUN", 2)
    held = [opened(relay, head("run-many"))[0] for _ in range(2)]
    sock, answer = opened(relay, head("run-many"))
    assert answer.startswith(b"HTTP/1.1 503") and b"has 2 tunnels open" in answer
    sock.close()
    other, answer = opened(relay, head("run-other"))  # another run is not held up
    assert answer.startswith(b"HTTP/1.1 200")
    for s in [*held, other]:
        s.close()


def test_one_namespace_holds_at_most_its_share_of_tunnels_whatever_its_runs(relay, monkeypatch):
    monkeypatch.setattr(relay_module, "MAX_TUNNELS_PER_NAMESPACE", 3)
    held = [opened(relay, head(f"run-a{i}", namespace="tenant-a"))[0] for i in range(3)]  # three runs, one each
    sock, answer = opened(relay, head("run-a9", namespace="tenant-a"))  # a fourth run of that namespace cannot
    assert answer.startswith(b"HTTP/1.1 503") and b"namespace tenant-a have 3 tunnels open" in answer
    sock.close()
    other, answer = opened(relay, head("run-b", namespace="tenant-b"))  # another namespace's run can
    assert answer.startswith(b"HTTP/1.1 200")
    held[0].close()  # a tunnel of the namespace closes: its share has room again
    assert wait_for(lambda: relay.by_namespace.get("tenant-a") == 2)
    again, answer = opened(relay, head("run-a9", namespace="tenant-a"))
    assert answer.startswith(b"HTTP/1.1 200")
    for s in [*held[1:], other, again]:
        s.close()


def test_a_tunnel_idle_both_ways_is_closed_and_an_active_one_kept(relay, monkeypatch):
    idle, _ = opened(relay, head("run-idle"))
    busy, _ = opened(relay, head("run-busy"))
    assert wait_for(lambda: len(relay.tunnels) == 2)
    for tunnel in relay.tunnels:
        if tunnel.run.uid == "run-idle":
            tunnel.active -= relay_module.IDLE_SECONDS + 1
    idle.settimeout(0.2)
    assert wait_for(lambda: closed(idle))  # the watcher closed it
    assert echoed(busy, b"still here") == b"still here"
    for s in (idle, busy):
        s.close()


def test_a_run_s_count_outlives_the_relay_and_a_spent_run_opens_no_tunnel(start_relay, tmp_path):
    first = start_relay()
    sock, _ = opened(first, head("run-b", budget=5000))
    sock.sendall(b"y" * 4000)
    assert wait_for(lambda: relayed_bytes(str(tmp_path), "run-b") > 5000)  # over: cut
    assert wait_for(lambda: closed(sock))
    sock.close()
    # A relay started again (the admin container restarted) starts from the count, not from zero.
    again = start_relay(usage=lambda uid: Usage(bytes_sent=100))
    sock, answer = opened(again, head("run-b", budget=5000))
    assert answer.startswith(b"HTTP/1.1 403") and b"spec.egressBudget.bytes: 5000" in answer
    sock.close()
    control, answer = opened(again, head("run-c", budget=5000))
    assert answer.startswith(b"HTTP/1.1 200")
    control.close()


def test_an_open_tunnel_s_bytes_and_plain_bytes_are_summed_against_the_budget(start_relay, tmp_path):
    """Tunnel bytes and plain bytes add up (not the more of the two): 20,000 bytes on an open tunnel beside 85,000
    of plain HTTP are past a budget of 100,000, for the relay and for the helpers' budget check alike."""
    plain = {"run-sum": 75_000, "run-under": 60_000}
    relay = start_relay(usage=lambda uid: Usage(bytes_received=plain[uid]))
    counted = with_relayed(lambda uid: Usage(bytes_received=plain[uid]), str(tmp_path))
    held = []
    for uid in plain:
        sock, answer = opened(relay, head(uid, budget=100_000))
        assert answer.startswith(b"HTTP/1.1 200") and echoed(sock, b"z" * 10_000) == b"z" * 10_000
        held.append(sock)
        assert wait_for(lambda: relay.runs[uid].open == 20_000)  # both ways, the tunnel still open
    plain["run-sum"] = 85_000  # a plain GET of 10,000 bytes logged: 105,000 with the open tunnel
    sock, answer = opened(relay, head("run-sum", budget=100_000))  # so a new tunnel cannot open
    assert answer.startswith(b"HTTP/1.1 403") and b"spec.egressBudget.bytes: 100000" in answer
    sock.close()
    sock, answer = opened(relay, head("run-under", budget=100_000))  # 80,000: it can
    assert answer.startswith(b"HTTP/1.1 200")
    assert counted("run-sum").bytes == 105_000 and counted("run-under").bytes == 80_000  # the helpers' check too
    for s in [sock, *held]:
        s.close()
    # Once a tunnel closes, its bytes count as closed until the log counts it, and never twice after that.
    assert wait_for(lambda: relay.runs["run-under"].tunnels == set())
    assert relay.runs["run-under"].closed == 20_000 and counted("run-under").bytes == 80_000
    logged = Usage(bytes_received=80_000, tunnel_bytes=20_000)
    assert with_relayed(lambda uid: logged, str(tmp_path))("run-under").bytes == 80_000


def test_when_one_direction_of_a_tunnel_raises_the_other_is_ended_not_left_running():
    """A cut raises in one direction; the other, still waiting to read, is cancelled and awaited with it (a plain
    gather left it running, its exception never retrieved)."""
    other_ran_to = []

    async def cut():
        raise relay_module._Cut()

    async def waiting():
        try:
            await asyncio.Event().wait()
        finally:
            other_ran_to.append("cancelled")

    async def tunnel():
        with pytest.raises(relay_module._Cut):
            await relay_module._both(waiting(), cut())
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    assert asyncio.run(tunnel()) == [] and other_ran_to == ["cancelled"]


def test_the_admin_container_s_command_serves_the_admin_endpoint_and_the_relay(tmp_path):
    """`coderun-egress-proxy admin`, as the chart runs it: both listen (the admin endpoint asks for its bearer)."""
    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    admin_port, relay_port = free_port(), free_port()
    (tmp_path / "keys").mkdir()
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.path.join(os.path.dirname(__file__), "../../src"),
           "CODERUN_EGRESS_STATE": str(tmp_path), "CODERUN_EGRESS_KEYS": str(tmp_path / "keys"),
           "CODERUN_EGRESS_REVOCATIONS": str(tmp_path / "revoked"),
           "CODERUN_EGRESS_ADMIN_LISTEN": f"127.0.0.1:{admin_port}", "CODERUN_EGRESS_RELAY_PORT": str(relay_port)}
    admin = subprocess.Popen([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                              "from coderun.egress.proxy import main; main(['admin'])", env["PYTHONPATH"]],
                             env=env, stderr=subprocess.PIPE)
    try:
        def answers() -> bytes:
            try:
                with socket.create_connection(("127.0.0.1", admin_port), timeout=2) as s:
                    s.sendall(b"GET /runs/x/log HTTP/1.1\r\nHost: x\r\n\r\n")
                    return s.recv(64)
            except OSError:
                return b""

        assert wait_for(lambda: answers().startswith(b"HTTP/1.1 401"), 20), admin.stderr.read1(4000)
        socket.create_connection(("127.0.0.1", relay_port), timeout=2).close()
    finally:
        admin.kill()
        admin.wait()
