"""The hostile suite: programs an attacker would write, run for real as CodeRuns, each checked for containment
AND for an accurate terminal reason. All runs of the table start together in one namespace; meanwhile a
canary run must keep succeeding in normal time and the operator's /healthz must answer within 1 s, and the
operator must log no traceback.
"""
from __future__ import annotations

import json
import textwrap
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
from kubernetes.client.rest import ApiException

from conftest import REPO, wait_for

OPERATOR_LOG = REPO / ".cluster" / "logs" / "operator.log"
HEALTHZ = "http://127.0.0.1:8080/healthz"
SMALL = {"timeoutSeconds": 8, "cpu": "100m", "memory": "128Mi", "disk": "16Mi"}
IN_FLIGHT = 8
PRELUDE = textwrap.dedent("""
    import ctypes, errno, json, os, socket, sys, time
    def report(**facts):
        print(json.dumps(facts))
    def attempt(fn):
        try:
            fn()
            return "allowed"
        except BaseException as e:
            return type(e).__name__
    def tcp(host, port, family=socket.AF_INET):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect((host, port) if family == socket.AF_INET else (host, port, 0, 0))
            return "open"
        except BaseException as e:
            return type(e).__name__
    def libc():
        return ctypes.CDLL(None, use_errno=True)
""")


@dataclass
class Hostile:
    id: str
    code: str
    reason: str | set[str]
    check: Callable[[dict, dict], Any] = lambda status, facts: True
    limits: dict = field(default_factory=dict)
    spec: dict = field(default_factory=dict)
    phase: str | None = None
    meta: dict = field(default_factory=dict)


def facts_of(status: dict) -> dict:
    """The program's own report: the last JSON object line it printed."""
    for line in reversed((status.get("stdout") or "").split("\n")):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return {}


def not_allowed(*keys):
    return lambda status, facts: all(facts[k] not in ("allowed", "open") for k in keys) and facts


def status_text(status: dict) -> str:
    return json.dumps(status, ensure_ascii=False)


AWS = "AKIA" + "QWERTYUIOPASDFGH"
GHP = "ghp_" + "a1B2c3D4" * 4 + "e5F6"

PROGRAMS: list[Hostile] = [
    # ---- credentials, identity, host
    Hostile("token-paths", "report(token=[p for p in ('/var/run/secrets/kubernetes.io/serviceaccount/token', "
            "'/run/secrets/kubernetes.io/serviceaccount/token') if os.path.exists(p)])", "Completed",
            lambda s, f: f["token"] == []),
    Hostile("environment", "report(env=sorted(os.environ))", "Completed",
            lambda s, f: not [k for k in f["env"] if k.startswith("KUBERNETES") or "TOKEN" in k or "SECRET" in k]),
    Hostile("other-processes", "report(pids=sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
            "Completed", lambda s, f: f["pids"][0] == 1 and len(f["pids"]) <= 3),
    Hostile("kernel-is-gvisor", "report(v=open('/proc/version').read())", "Completed",
            lambda s, f: "gvisor" in f["v"].lower()),
    Hostile("identity", "st=dict(l.split(':\\t',1) for l in open('/proc/self/status').read().splitlines() "
            "if ':\\t' in l)\nreport(uid=os.getuid(), caps=st['CapEff'].strip(), bnd=st['CapBnd'].strip())",
            "Completed", lambda s, f: f["uid"] == 65532 and f["caps"] == "0000000000000000"),
    Hostile("host-shadow", "report(r=attempt(lambda: open('/etc/shadow').read()))", "Completed",
            not_allowed("r")),
    Hostile("setuid-root", "report(r=attempt(lambda: os.setuid(0)), g=attempt(lambda: os.setgid(0)))",
            "Completed", not_allowed("r", "g")),
    Hostile("mount", "r=libc().mount(b'none', b'/tmp', b'tmpfs', 0, None)\nreport(r=r, e=ctypes.get_errno())",
            "Completed", lambda s, f: f["r"] == -1),
    Hostile("unshare-mount-ns", "r=libc().unshare(0x00020000)\nreport(r=r)", "Completed", lambda s, f: f["r"] == -1),
    Hostile("chroot", "report(r=attempt(lambda: os.chroot('/tmp')))", "Completed", not_allowed("r")),
    Hostile("ptrace-pid1", "r=libc().ptrace(16, 1, None, None)\nreport(r=r)", "Completed", lambda s, f: f["r"] == -1),
    Hostile("write-usr", "report(r=attempt(lambda: open('/usr/evil', 'w')))", "Completed", not_allowed("r")),
    Hostile("write-etc", "report(r=attempt(lambda: open('/etc/passwd', 'a')))", "Completed", not_allowed("r")),
    Hostile("dev-mem", "report(mem=os.path.exists('/dev/mem'), kmsg=attempt(lambda: open('/dev/kmsg').read(1)))",
            "Completed", lambda s, f: f["mem"] is False and f["kmsg"] != "allowed"),
    Hostile("block-devices", "report(b=[d for d in os.listdir('/dev') if d.startswith(('sd', 'vd', 'nvme', 'xvd'))])",
            "Completed", lambda s, f: f["b"] == []),
    Hostile("raw-socket", "report(r=attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)))",
            "Completed", not_allowed("r")),
    Hostile("packet-socket", "report(r=attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW)))",
            "Completed", not_allowed("r")),
    Hostile("runner-memory", "report(m=attempt(lambda: open('/proc/1/mem', 'rb').read(1)), "
            "o=attempt(lambda: open('/proc/1/fd/1', 'w')))", "Completed", not_allowed("m", "o")),
    Hostile("runner-environ", "report(e=attempt(lambda: open('/proc/1/environ', 'rb').read()))", "Completed",
            not_allowed("e")),
    # ---- network, both families
    Hostile("tcp-node-apiserver", "report(r=tcp(NODE, 6443))", "Completed", not_allowed("r")),
    Hostile("tcp-node-kubelet", "report(r=tcp(NODE, 10250))", "Completed", not_allowed("r")),
    Hostile("tcp-api-service", "report(r=tcp('10.96.0.1', 443))", "Completed", not_allowed("r")),
    Hostile("tcp-metadata", "report(r=tcp('169.254.169.254', 80))", "Completed", not_allowed("r")),
    Hostile("udp-node", textwrap.dedent("""
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
        def ask():
            s.sendto(b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x01\\x00\\x01', (NODE, 53))
            s.recvfrom(512)
        report(r=attempt(ask))"""), "Completed", not_allowed("r")),
    Hostile("icmp-ping-node", textwrap.dedent("""
        def ping():
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP); s.settimeout(2)
            s.sendto(b'\\x08\\x00\\x00\\x00\\x00\\x01\\x00\\x01coderun', (NODE, 0)); s.recvfrom(64)
        report(r=attempt(ping))"""), "Completed", not_allowed("r")),
    Hostile("icmpv6-all-nodes", textwrap.dedent("""
        def ping():
            s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM, socket.IPPROTO_ICMPV6); s.settimeout(2)
            s.sendto(b'\\x80\\x00\\x00\\x00\\x00\\x01\\x00\\x01coderun', ('ff02::1', 0, 0, socket.if_nametoindex('eth0')))
            s.recvfrom(64)
        report(r=attempt(ping))"""), "Completed", not_allowed("r")),
    Hostile("ipv6-link-local-tcp", textwrap.dedent("""
        def connect():
            s = socket.socket(socket.AF_INET6); s.settimeout(2)
            s.connect(('fe80::1', 6443, 0, socket.if_nametoindex('eth0')))
        report(r=attempt(connect))"""), "Completed", not_allowed("r")),
    Hostile("ipv6-addresses", "report(a=[l.split()[0] for l in open('/proc/net/if_inet6') if not l.startswith('0' * 31 + '1')])",
            "Completed", lambda s, f: f["a"] == []),
    Hostile("dns", "report(r=attempt(lambda: socket.getaddrinfo('kubernetes.default.svc.cluster.local', 443)))",
            "Completed", not_allowed("r")),
    # ---- resources
    # Processes that pile up (small shell children, so the cap is met before the memory limit): the cap ends it.
    Hostile("process-pile-up", "os.execl('/bin/sh', 'sh', '-c', 'while :; do sleep 1000 & done')",
            "ProcessLimitExceeded", lambda s, f: "processes" in s["message"] and s["metrics"]["wallMillis"] < 10000,
            limits={"memory": "512Mi", "cpu": "250m", "timeoutSeconds": 20}),
    # The classic bomb's processes live for an instant: RLIMIT_NPROC stops its forks ("Cannot fork"); whether
    # a check lands on its peak decides between the cap and the deadline. Either way: contained, terminal.
    Hostile("fork-bomb", "os.execl('/bin/sh', 'sh', '-c', 'f() { f | f & }; f; sleep 30')",
            {"ProcessLimitExceeded", "Timeout"}, lambda s, f: s["metrics"]["wallMillis"] < 22000,
            limits={"memory": "512Mi", "cpu": "250m", "timeoutSeconds": 20}),
    Hostile("memory-bomb", "x = []\nwhile True:\n    x.append(b'x' * 10_000_000)", "OOMKilled",
            limits={"memory": "64Mi"}),
    Hostile("tmp-fill", "f = open('/tmp/fill', 'wb')\nwhile True:\n    f.write(b'x' * 1048576); f.flush()",
            "DiskLimitExceeded", lambda s, f: s["metrics"]["wallMillis"] < 8000 and "16777216" in s["message"]),
    Hostile("inode-flood", "os.makedirs('/tmp/i', exist_ok=True)\nfor i in range(100000):\n    open(f'/tmp/i/{i}', 'w').close()",
            "DiskLimitExceeded", lambda s, f: "files and directories" in s["message"],
            limits={"timeoutSeconds": 30, "cpu": "500m"}),
    Hostile("termination-log-flood", "f = open('/dev/termination-log', 'wb')\nfor _ in range(128):\n    f.write(b'x' * 1048576)",
            "SandboxViolation", lambda s, f: "termination-log" in s["message"]),
    Hostile("cpu-burn", "while True:\n    pass", "Timeout", limits={"timeoutSeconds": 3}),
    Hostile("sleep-forever", "time.sleep(10**6)", "Timeout", limits={"timeoutSeconds": 3}),
    Hostile("stdout-flood", "while True:\n    sys.stdout.write('x' * 65536)", "OutputLimitExceeded"),
    Hostile("stderr-flood", "while True:\n    sys.stderr.write('y' * 65536)", "OutputLimitExceeded"),
    Hostile("huge-artifact", "open(os.path.join(os.environ['CODERUN_OUTPUT_DIR'], 'big.bin'), 'wb').write(b'x' * 3_000_000)",
            "Completed", lambda s, f: {"name": "big.bin", "why": "too-large"} in s["artifactsSkipped"]),
    Hostile("many-artifacts", "d = os.environ['CODERUN_OUTPUT_DIR']\nfor i in range(300):\n    open(f'{d}/a{i}', 'w').write('x')",
            "Completed", lambda s, f: len(s["artifacts"]) == 16 and s["artifactsSkippedUnlisted"] > 0),
    Hostile("symlink-out", "os.symlink('/etc/passwd', os.path.join(os.environ['CODERUN_OUTPUT_DIR'], 'passwd'))",
            "Completed", lambda s, f: {"name": "passwd", "why": "symlink"} in s["artifactsSkipped"]
            and not s.get("artifacts")),
    Hostile("kill-everything", "report(r=attempt(lambda: os.kill(-1, 9)))", "Completed",
            lambda s, f: f["r"] in ("ProcessLookupError", "PermissionError")),  # the runner (PID 1) is out of reach
    Hostile("signals-to-pid1", "import signal\nfor n in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):\n"
            "    os.kill(1, n)\nreport(alive=True)", "Completed", lambda s, f: f["alive"] is True),
    Hostile("forged-frame", textwrap.dedent("""
        line = '\\nCODERUN-RESULT-V1 {"version":1,"reason":"Completed","exitCode":0,"stdout":"forged"}\\n'
        for target in ('/proc/1/fd/1',):
            attempt(lambda: open(target, 'w').write(line))
        print(line)
        sys.exit(9)"""), "NonZeroExit", lambda s, f: s["exitCode"] == 9 and s["stdout"] != "forged"),
    Hostile("daemon-outlives", textwrap.dedent("""
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(1.5)
                print('late', flush=True)
                os._exit(0)
            os._exit(0)
        print('parent done')"""), "Completed", lambda s, f: "late" not in s["stdout"]),
    Hostile("non-utf8", "sys.stdout.buffer.write(b'\\xff\\xfe\\xfd ok\\n')", "Completed",
            lambda s, f: "ok" in s["stdout"]),
    Hostile("nul-bytes", "sys.stdout.buffer.write(b'a\\x00b\\x00c\\n')", "Completed", lambda s, f: "a" in s["stdout"]),
    Hostile("separators-stdout", "print('a\\u2028b\\u2029c\\x85d')\nprint('e\\u2028', file=sys.stderr)", "Completed",
            lambda s, f: s["stdout"] == "a\u2028b\u2029c\x85d\n" and "\u2028" in s["stderr"]),
    Hostile("separators-exception", "raise ValueError('x\\u2028y\\x85z')", "NonZeroExit",
            lambda s, f: s["error"]["message"] == "x\u2028y\x85z"),
    Hostile("separators-artifact-name", "open(os.path.join(os.environ['CODERUN_OUTPUT_DIR'], 'n\\u2028m'), 'w').write('x')",
            "Completed", lambda s, f: [a["name"] for a in s["artifacts"]] == ["n\u2028m"]),
    Hostile("long-exception-message", "raise ValueError('m' * 10000)", "NonZeroExit",
            lambda s, f: len(s["error"]["message"]) <= 4096 and s["error"]["type"] == "ValueError"),
    Hostile("long-exception-type", "raise type('E' * 1000, (Exception,), {})('boom')", "NonZeroExit",
            lambda s, f: len(s["error"]["type"]) <= 256),
    Hostile("long-artifact-path", "p = os.path.join(os.environ['CODERUN_OUTPUT_DIR'], *(['d' * 200] * 7), 'f')\n"
            "os.makedirs(os.path.dirname(p))\nopen(p, 'w').write('x')", "Completed",
            lambda s, f: all(len(a["name"]) <= 1024 for a in s.get("artifacts", []) + s.get("artifactsSkipped", []))),
    Hostile("huge-line-number", "sys.stderr.write('Traceback (most recent call last):\\n  File \"main.py\", line "
            "99999999999999999999999, in <module>\\nValueError: forged\\n')\nsys.exit(1)", "NonZeroExit",
            lambda s, f: s["error"].get("line") is None and s["error"]["message"] == "forged"),
    Hostile("exit-code-255", "sys.exit(255)", "NonZeroExit", lambda s, f: s["exitCode"] == 255),
    # ---- output against the operator: validation and redaction
    Hostile("schema-5000-digit-int", "print('9' * 5000)", "Completed",
            lambda s, f: s["validation"]["valid"] is False and s["validation"]["errors"],
            spec={"expect": {"stdoutJSONSchema": {"type": "integer"}}}),
    Hostile("schema-deep-nesting", "print('[' * 100000)", "Completed",
            lambda s, f: s["validation"]["valid"] is False,
            spec={"expect": {"stdoutJSONSchema": {"type": "array"}}}, limits={"outputBytes": 200000}),
    Hostile("schema-unresolvable-ref", "print(1)", "Completed",
            lambda s, f: "$ref" in s["validation"]["errors"][0],
            spec={"expect": {"stdoutJSONSchema": {"$ref": "http://169.254.169.254/schema.json"}}}),
    Hostile("schema-catastrophic-pattern", "print(json.dumps('a' * 40 + '!'))", "Completed",
            lambda s, f: s["validation"]["valid"] is False and "does not match" in s["validation"]["errors"][0],
            spec={"expect": {"stdoutJSONSchema": {"type": "string", "pattern": "^(a+)+$"}}}),
    Hostile("schema-unique-items", "print(json.dumps([[i] for i in range(20000)]))", "Completed",
            lambda s, f: s["validation"] is not None,
            spec={"expect": {"stdoutJSONSchema": {"type": "array", "uniqueItems": True}}},
            limits={"outputBytes": 256 * 1024}),
    Hostile("redaction-crafted-credential", "print('password=' + 'x' * 200000)", "Completed",
            lambda s, f: "xxxxxxxxxxxxxxxxxxxx" not in s["stdout"] and s["redactions"] >= 1,
            limits={"outputBytes": 256 * 1024}),
    Hostile("redaction-crafted-keys", "print('-----BEGIN RSA PRIVATE KEY-----\\n' * 5000)", "Completed",
            lambda s, f: "BEGIN RSA" not in s["stdout"], limits={"outputBytes": 256 * 1024}),
    Hostile("secret-stdout", f"print('key {AWS} and {GHP}')", "Completed",
            lambda s, f: s["redactions"] >= 2),
    Hostile("secret-exception", f"raise RuntimeError('leaked {AWS}')", "NonZeroExit",
            lambda s, f: s["redactions"] >= 1 and "[REDACTED" in s["error"]["message"]),
    Hostile("secret-artifact-name", f"open(os.path.join(os.environ['CODERUN_OUTPUT_DIR'], ' {AWS}.txt'), 'w').write('x')",
            "Completed", lambda s, f: s["redactions"] >= 1 and s["artifacts"]),
    Hostile("secret-cut-by-cap", f"print('x' * 1010 + ' {GHP}')", "Completed",
            lambda s, f: s["stdoutTruncated"] and "ghp_" not in s["stdout"] and "a1B2" not in s["stdout"],
            limits={"outputBytes": 1024}),
    Hostile("secret-in-validation-error", f"print(json.dumps('{AWS}'))", "Completed",
            lambda s, f: s["validation"]["valid"] is False,
            spec={"expect": {"stdoutJSONSchema": {"type": "integer"}}}),
    Hostile("control-characters", "sys.stdout.write('\\x01' * 200000)", "Completed",
            lambda s, f: len(s["stdout"]) > 10000, limits={"outputBytes": 256 * 1024}),
    # ---- what the caller writes
    Hostile("malformed-created-at", "print('ok')", "Completed", lambda s, f: s["stdout"] == "ok\n",
            meta={"annotations": {"coderun.io/created-at": "yesterday"}}),
    Hostile("big-spec", "print(sum(len(open(f'data/{i}.txt').read()) for i in range(3)))\n" + "#" * (120 * 1024),
            "Completed", lambda s, f: s["stdout"] == f"{3 * 200 * 1024}\n",
            spec={"files": [{"path": f"data/{i}.txt", "content": "z" * (200 * 1024)} for i in range(3)]}),
]
SECRET_IDS = {"secret-stdout", "secret-exception", "secret-artifact-name", "secret-cut-by-cap",
              "secret-in-validation-error"}


def _healthz_watch(stop: threading.Event, latencies: list[float]) -> None:
    while not stop.is_set():
        started = time.monotonic()
        try:
            urllib.request.urlopen(HEALTHZ, timeout=5).read()
        except OSError:
            latencies.append(99.0)
        else:
            latencies.append(time.monotonic() - started)
        stop.wait(0.5)


@pytest.fixture(scope="module")
def hostile(operator):
    """Every program of the table as a CodeRun, started together; a canary and /healthz watched meanwhile."""
    namespace = f"e2e-hostile-{uuid.uuid4().hex[:5]}"
    operator.core.create_namespace({"metadata": {"name": namespace, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted", "coderun.io/e2e": "true"}}})
    log_start = OPERATOR_LOG.stat().st_size if OPERATOR_LOG.exists() else 0
    stop, latencies, canaries = threading.Event(), [], []
    threading.Thread(target=_healthz_watch, args=(stop, latencies), daemon=True).start()
    node = operator.node_ip()
    names, refused = {}, {}
    bad_base64 = {"language": "python", "code": "print(1)", "files": [{"path": "b.bin", "contentBase64": "abc"}]}
    try:
        names["bad-base64"] = operator.create_run(namespace, bad_base64, name="bad-base64")
    except ApiException as e:
        refused["bad-base64"] = e

    def canary() -> None:
        while not stop.is_set():
            started = time.monotonic()
            name = operator.create_run(namespace, {"language": "python", "code": "print(6*7)",
                                                   "limits": {"cpu": "250m"}})
            status = operator.wait_run(namespace, name, timeout=120)["status"]
            canaries.append((status["phase"], status.get("stdout"), time.monotonic() - started))
            stop.wait(10)
    canary_thread = threading.Thread(target=canary, daemon=True)
    canary_thread.start()
    # A window of runs in flight: the node stays busy with hostile programs but keeps room for the canary,
    # so the canary measures the operator, not a full node's scheduling queue.
    statuses, pending = {}, list(PROGRAMS)
    deadline = time.monotonic() + 900
    while (pending or len(statuses) < len(names)) and time.monotonic() < deadline:
        while pending and len(names) - len(statuses) < IN_FLIGHT:
            h = pending.pop(0)
            spec = {"language": "python", "code": f"NODE = {node!r}\n" + PRELUDE + textwrap.dedent(h.code),
                    "limits": {**SMALL, **h.limits}, **h.spec}
            try:
                names[h.id] = operator.create_run(namespace, spec, name=h.id, **h.meta)
            except ApiException as e:
                refused[h.id] = e
        for h_id, name in names.items():
            if h_id not in statuses:
                status = operator.get_run(namespace, name).get("status") or {}
                if status.get("phase") in ("Succeeded", "Failed", "Rejected"):
                    statuses[h_id] = status
        stop.wait(0.5)
    stop.set()
    canary_thread.join(150)
    log = OPERATOR_LOG.read_bytes()[log_start:].decode("utf-8", "replace") if OPERATOR_LOG.exists() else ""
    yield {"statuses": statuses, "refused": refused, "latencies": latencies, "canaries": canaries, "log": log,
           "namespace": namespace}
    operator.core.delete_namespace(namespace, propagation_policy="Background")


@pytest.mark.parametrize("h", PROGRAMS, ids=[h.id for h in PROGRAMS])
def test_hostile_program_is_contained_with_an_accurate_reason(hostile, h):
    assert h.id not in hostile["refused"], hostile["refused"].get(h.id)
    status = hostile["statuses"][h.id]
    allowed = {h.reason} if isinstance(h.reason, str) else h.reason
    assert status["reason"] in allowed, (status["reason"], status.get("message"), status.get("stderr", "")[-500:])
    assert status["phase"] == (h.phase or ("Succeeded" if status["reason"] == "Completed" else "Failed"))
    facts = facts_of(status)
    assert h.check(status, facts), (facts, {k: str(status.get(k))[-600:] for k in (
        "message", "stdout", "stderr", "error", "validation", "artifactsSkipped", "metrics")})
    if h.id in SECRET_IDS:
        for secret in (AWS, GHP):
            assert secret not in status_text(status)


def test_the_suite_has_the_breadth_it_claims():
    assert len(PROGRAMS) >= 60 and len({h.id for h in PROGRAMS}) == len(PROGRAMS)


def test_contentbase64_that_does_not_decode_is_refused_with_the_field_named(hostile):
    if "bad-base64" in hostile["refused"]:
        assert "contentBase64" in hostile["refused"]["bad-base64"].body
        return
    status = hostile["statuses"]["bad-base64"]
    assert (status["phase"], status["reason"]) == ("Rejected", "InvalidSpec")
    assert "contentBase64" in status["message"] and "base64" in status["message"]


def test_a_canary_kept_succeeding_in_normal_time(hostile):
    assert hostile["canaries"], "no canary run finished"
    for phase, stdout, seconds in hostile["canaries"]:
        assert (phase, stdout) == ("Succeeded", "42\n") and seconds < 60, hostile["canaries"]


def test_the_operator_stayed_healthy_and_logged_no_traceback(hostile):
    assert hostile["latencies"] and max(hostile["latencies"]) < 1.0, max(hostile["latencies"])
    assert "Traceback (most recent call last)" not in hostile["log"]
    assert not [r for r in hostile["statuses"].values() if r["reason"] == "InternalError"]


def test_every_run_left_no_pod_behind(hostile, operator):
    wait_for(lambda: not [p for p in operator.core.list_namespaced_pod(hostile["namespace"]).items
                          if p.metadata.labels.get("coderun.io/sandbox") == "true"
                          and p.metadata.name.removesuffix("-sandbox") in hostile["statuses"]], 60,
             "every hostile run's pod to be deleted")
