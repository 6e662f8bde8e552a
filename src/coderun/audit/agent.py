"""The node audit agent (docs/audit.md, "The node agent"): gVisor's remote sink for every sandbox on the node,
and the HTTP question the operator asks about one run's container.

- The sink: a unix SOCK_SEQPACKET socket runsc (root, on the host) connects to once per pod sandbox; a thread
  per connection answers the handshake and hands each packet to the store (store.py).
- The question: `GET /v1/containers/<id>?since=<ns>&wait=<ms>` with the operator's bearer (bearer.py): the
  container's audit summary and record, as soon as the audit is complete or the wait is up."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from . import bearer, oom, tenant, trace_config, wire
from .store import MiB, Limits, Store, memory_limit

log = logging.getLogger("coderun.audit.agent")

DEFAULT_PORT = 9090
DEFAULT_KEY_FILE = "/etc/coderun/audit-key/key"
# A point is a few KiB at most; a longer packet (an exec's argv may be megabytes) is counted as a lost point, never
# silently cut (MSG_TRUNC), and the connection goes on.
MAX_PACKET_BYTES = 64 * 1024
# runsc sends its handshake as soon as it connects.
HANDSHAKE_TIMEOUT_S = 10.0
MAX_WAIT_MS = 10_000
CONTAINER_PATH = re.compile(r"/v1/containers/([^/]*)")
CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
NUMBER = re.compile(r"[0-9]{1,19}")
QUERY_PARAMETERS = {"since", "wait"}


# --- the sink

def peer_uid(sock: socket.socket) -> int:
    pid_uid_gid = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", pid_uid_gid)[1]


def receive(sock: socket.socket, buffer: bytearray) -> memoryview | None:
    """One packet, in `buffer` (empty when runsc closed the connection: the sandbox ended; None when it was longer
    than the buffer: SOCK_SEQPACKET has thrown its rest away, and the next packet comes whole). Into one buffer per
    connection: a flood of points is received at the agent's pace, and each packet allocated anew halved it."""
    size, _, flags, _ = sock.recvmsg_into([buffer])
    if flags & socket.MSG_TRUNC:
        return None
    return memoryview(buffer)[:size]


class Sink:
    def __init__(self, store: Store, path: str, allowed_uid: int = 0, cgroup_root: str | None = None):
        self.store, self.path, self.allowed_uid = store, path, allowed_uid
        self.cgroup_root = cgroup_root  # the host's /sys/fs/cgroup: the pod's OOM kill count (oom.py)
        self.listener: socket.socket | None = None
        self.live: set[socket.socket] = set()
        self.live_lock = threading.Lock()

    def listen(self) -> None:
        try:
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)  # a stale socket from an agent that is gone
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(self.path)
        os.chmod(self.path, 0o600)  # before listen(): no one connects until then
        listener.listen(64)
        self.listener = listener

    def serve_forever(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return  # closed
            uid = peer_uid(sock)
            if uid != self.allowed_uid:
                log.warning("refused a sink connection from uid %d (only uid %d may connect)", uid,
                            self.allowed_uid)
                sock.close()
                continue
            threading.Thread(target=self.serve_connection, args=(sock,), daemon=True,
                             name="audit-sink-connection").start()

    def serve_connection(self, sock: socket.socket) -> None:
        with self.live_lock:
            self.live.add(sock)
        connection = None
        error, dropped = None, False
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT_S)
            buffer = bytearray(MAX_PACKET_BYTES)
            handshake = receive(sock, buffer)
            if handshake is None:
                raise wire.WireError(f"a handshake longer than {MAX_PACKET_BYTES} bytes")
            wire.read_handshake(bytes(handshake))
            sock.send(wire.handshake_reply())
            sock.settimeout(None)
            connection = self.store.open()
            if connection is None:
                log.error("refused a sandbox: %d connections kept and none closed", self.store.limits.connections)
                return
            log.info("sandbox connection %d opened", connection.number)
            while (packet := receive(sock, buffer)) is None or packet:
                if packet is None:
                    self.store.lose(connection, 1)  # the point is lost, plainly, from its time on; the rest is not
                else:
                    self.store.add(connection, packet)
        except wire.WireError as failure:
            error, dropped = str(failure), True  # the agent ends the connection: the sandbox may run on
        except OSError as failure:
            error = f"socket: {failure}"
        finally:
            with self.live_lock:
                self.live.discard(sock)
            sock.close()
            if connection is None:
                if error:
                    log.warning("sandbox connection ended before it was kept: %s", error)
            else:
                # runsc closed it: the sandbox has ended, and the kernel's OOM count is read now, before the kubelet
                # removes the cgroup. Not when the agent dropped it: a later OOM kill would be missed.
                oom_killed = oom.pod_oom_killed(self.cgroup_root, connection.containers) \
                    if self.cgroup_root and not dropped else None
                self.store.close(connection, error, oom_killed)
                log.info("sandbox connection %d closed: %s", connection.number, connection.describe())

    def close(self) -> None:
        if self.listener is not None:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
            self.listener.close()
        with self.live_lock:
            for sock in self.live:
                sock.shutdown(socket.SHUT_RDWR)  # wakes recv() with the end of the connection


# --- the question

class KeyFile:
    """The key as mounted from its Secret, read again when the file changes (a rotated Secret swaps it)."""

    def __init__(self, path: str, secret: str = ""):
        self.path = path
        # where it comes from, for the readiness answer: the Secret's name when the chart gave it
        self.source = f"Secret {secret} (entry key, mounted at {path})" if secret else path
        self._stamp: tuple | None = None
        self._key = b""

    def key(self) -> bytes:
        try:
            status = os.stat(self.path)
            stamp = (status.st_ino, status.st_mtime_ns, status.st_size)
            if stamp != self._stamp:
                self._key, self._stamp = Path(self.path).read_bytes(), stamp
        except OSError:
            return b""
        return self._key


def parse_number(params: dict[str, list[str]], name: str, default: int) -> int | None:
    values = params.get(name)
    if values is None:
        return default
    if len(values) != 1 or not NUMBER.fullmatch(values[0]):
        return None
    return int(values[0])


def respond(target: str, authorization: str | None, has_body: bool, store: Store,
            key: bytes, key_source: str = "the key file") -> tuple[int, dict]:
    """(status, JSON body) for one GET."""
    url = urlsplit(target)
    if url.path == "/healthz":
        return 200, {"status": "ok"}
    if url.path == "/readyz":  # ready once it can tell the operator's bearer: the key has reached the pod
        if key:
            return 200, {"status": "ok"}
        return 503, {"message": f"no key yet from {key_source}: the operator creates it at its start (unless "
                                "audit.existingSecret names one of yours: it must exist), and the kubelet brings it "
                                "into this pod at its next sync"}
    match = CONTAINER_PATH.fullmatch(url.path)
    if match is None:
        return 404, {"message": f"no such path: {url.path[:200]}"}
    if not bearer.is_authorized(authorization, key):
        return 401, {"message": "the operator's bearer is required"}
    if has_body:
        return 400, {"message": "requests carry no body"}
    container_id = match.group(1)
    if not CONTAINER_ID.fullmatch(container_id):
        return 400, {"message": "a container id is 64 lowercase hex digits"}
    params = parse_qs(url.query, keep_blank_values=True)
    if set(params) - QUERY_PARAMETERS:
        return 400, {"message": f"unknown parameters; only {sorted(QUERY_PARAMETERS)}"}
    since, wait = parse_number(params, "since", 0), parse_number(params, "wait", 0)
    if since is None or wait is None:
        return 400, {"message": "since (ns) and wait (ms) are non-negative integers, each given once"}
    answer = store.answer(container_id, since, min(wait, MAX_WAIT_MS) / 1000)
    if answer is None:
        # Never an empty audit: a sandbox created before this agent started (a restart) was traced by none.
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(store.started))
        return 404, {"message": f"no trace of container {container_id} reached this node's audit agent, running "
                                f"since {started}: a sandbox created before then is not traced"}
    return 200, answer


class QueryHandler(BaseHTTPRequestHandler):
    server: "AgentServer"
    # Per read and write on the client's socket: a slow client cannot hold a thread longer.
    timeout = 15
    server_version = "coderun-audit-agent"

    def version_string(self) -> str:
        return self.server_version  # not the Python version

    def do_GET(self) -> None:
        has_body = self.headers.get("Content-Length", "0") != "0" or "Transfer-Encoding" in self.headers
        status, body = respond(self.path, self.headers.get("Authorization"), has_body, self.server.store,
                               self.server.keys.key(), self.server.keys.source)
        payload = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        if has_body:
            self.close_connection = True  # the body was not read
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class AgentServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: Store, keys: KeyFile):
        super().__init__(address, QueryHandler)
        self.store, self.keys = store, keys

    def service_actions(self) -> None:
        # serve_forever calls this between polls (every 0.5 s): closed connections past retention go here.
        self.store.expire()


# --- the command

def write_atomically(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    with tempfile.NamedTemporaryFile("w", dir=directory, prefix=".pod-init-", delete=False) as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.chmod(out.name, 0o644)
    os.replace(out.name, path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    limits = Limits()
    parser = argparse.ArgumentParser(prog="coderun-audit-agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", default=trace_config.DEFAULT_ENDPOINT, help="the sink's unix socket")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="the HTTP port")
    parser.add_argument("--key-file", default=DEFAULT_KEY_FILE, help="the bearer's key (a Secret's entry)")
    parser.add_argument("--key-secret", default="", help="that Secret's name (named when the key is missing)")
    parser.add_argument("--pod-init-config", metavar="PATH",
                        help="write runsc's --pod-init-config file here, pointing at --socket")
    parser.add_argument("--cgroup-root", default="",
                        help=f"the host's /sys/fs/cgroup, read-only (e.g. {oom.DEFAULT_CGROUP_ROOT}): a sandbox the "
                             "kernel's OOM killer ended is told apart from one that failed")
    parser.add_argument("--peer-uid", type=int, default=0, help="the only uid that may connect (runsc's)")
    parser.add_argument("--pods-log-root", default="",
                        help=f"the kubelet's pod log directory, read-only (e.g. {tenant.DEFAULT_PODS_LOG_ROOT}): with "
                             "--cgroup-root, a sandbox's namespace, whose share of the agent is bounded")
    parser.add_argument("--own-cgroup", default="/sys/fs/cgroup",
                        help="the agent's own cgroup, whose memory limit sizes its caps")
    parser.add_argument("--retention-seconds", type=float, default=limits.retention_s,
                        help="how long a closed sandbox's record is kept (less when room is short)")
    parser.add_argument("--connection-mib", type=float, default=0,
                        help="what one sandbox connection may hold (default: from the memory limit)")
    parser.add_argument("--total-mib", type=float, default=0,
                        help="what all of them may hold (default: from the memory limit)")
    parser.add_argument("--namespace-share", type=float, default=limits.namespace_share,
                        help="the share of that one namespace's sandboxes may hold")
    parser.add_argument("--max-connections", type=int, default=0,
                        help="sandbox connections kept, the oldest closed going first (default: from the memory "
                             "limit)")
    return parser.parse_args(argv)


def caps(args: argparse.Namespace) -> Limits:
    """The store's caps, from the container's memory limit unless given, logged: an operator can see them."""
    limit, source = memory_limit(args.own_cgroup)
    overrides = {"retention_s": args.retention_seconds, "namespace_share": args.namespace_share}
    if args.connection_mib:
        overrides["connection_bytes"] = int(args.connection_mib * MiB)
    if args.total_mib:
        overrides["total_bytes"] = int(args.total_mib * MiB)
    if args.max_connections:
        overrides["connections"] = args.max_connections
    limits = Limits.for_memory(limit, **overrides)
    memory = f"memory limit {limit / MiB:.0f} MiB ({source})" if limit else f"no memory limit found ({source})"
    tenants = "namespaces" if args.cgroup_root and args.pods_log_root else "sandboxes (no --pods-log-root)"
    log.info("caps: %s: %s; shares per %s", memory, limits.describe(), tenants)
    return limits


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # A sink thread that waits for the interpreter lock while runsc's socket fills makes the program wait, then
    # gVisor drop points: hand the lock over every 0.5 ms rather than Python's 5 ms.
    sys.setswitchinterval(0.0005)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.pod_init_config:
        write_atomically(args.pod_init_config,
                         json.dumps(trace_config.pod_init_config(endpoint=args.socket), indent=2) + "\n")
    store = Store(caps(args), tenant.resolver(args.cgroup_root, args.pods_log_root))
    sink = Sink(store, args.socket, args.peer_uid, args.cgroup_root or None)
    sink.listen()
    server = AgentServer(("", args.port), store, KeyFile(args.key_file, args.key_secret))
    threading.Thread(target=sink.serve_forever, daemon=True, name="audit-sink").start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log.info("listening on %s (uid %d) and HTTP port %d", args.socket, args.peer_uid, args.port)
    try:
        server.serve_forever()
    finally:
        sink.close()
        server.server_close()


if __name__ == "__main__":
    main()
