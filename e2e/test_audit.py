"""What the code touched (issue 20, docs/audit.md): gVisor records every run's opens, connects and processes on
the node, the audit agent keeps them, and the run's status says what the program did, beside a full record kept
in a ConfigMap the run owns. Each test runs a program that does things and reads them back from status.audit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from coderun.client import CodeRunClient
from conftest import KUBECONFIG, OPERATOR_MODE, apply_warm_pool, wait_for_pool

pytestmark = [pytest.mark.skipif(OPERATOR_MODE != "chart", reason="the audit agents are installed by the chart: "
                                 "make test runs this module against it (CODERUN_E2E_OPERATOR=chart)")]

TOUCHY = textwrap.dedent("""\
    import os, socket, subprocess
    open("data.csv").read()
    for secret in ("/etc/shadow", "/etc/passwd"):
        try:
            open(secret).read()
        except OSError:
            pass
    os.makedirs("/tmp/outputs", exist_ok=True)
    open("/tmp/outputs/result.txt", "w").write("42")
    s = socket.socket()
    s.settimeout(1)
    try:
        s.connect(("10.96.0.1", 443))
    except OSError:
        pass
    try:
        subprocess.run(["wget", "http://example.coderun.test"])
    except FileNotFoundError:
        pass
    print(subprocess.run(["sh", "-c", "curl http://example.coderun.test"], capture_output=True).returncode)
""")
FILES = [{"path": "data.csv", "content": "a,b\n1,2\n"}]
SMALL = {"cpu": "250m", "memory": "128Mi", "timeoutSeconds": 30}


def finished(operator, namespace: str, spec: dict, name: str) -> dict:
    operator.create_run(namespace, spec, name=name)
    return operator.wait_run(namespace, name, timeout=120)


def audit_of(run: dict) -> dict:
    audit = run["status"].get("audit")
    assert audit, f"no status.audit: {json.dumps(run['status'])[:2000]}"
    return audit


def assert_touched(audit: dict) -> None:
    """What TOUCHY did, as the audit must tell it."""
    assert audit["source"] == "gvisor-trace" and audit["complete"] is True, audit
    read = {f["path"]: f for f in audit["filesRead"]}
    assert read["data.csv"]["count"] >= 1, audit
    assert any(f["path"] == "/tmp/outputs/result.txt" for f in audit["filesWritten"]), audit
    outside = audit["outsideWorkdir"]
    assert "/etc/passwd" in outside["examples"] and "/etc/shadow" in outside["examples"], audit
    assert outside["denied"] >= 1 and audit["counts"]["syscallsDenied"] >= 1, audit  # /etc/shadow: EACCES
    connects = [(c["address"], c["port"]) for c in audit["connectAttempts"]]
    assert ("10.96.0.1", 443) in connects, audit
    argv = [p["argv"] for p in audit["processes"]]
    assert ["sh", "-c", "curl http://example.coderun.test"] in argv, audit
    shell = next(p for p in audit["processes"] if p["argv"][:1] == ["sh"])
    assert shell.get("exitCode") == 127, shell
    assert audit["counts"]["failedExecs"] >= 1, audit  # wget is not in the image: Python's execs fail
    assert any(a[0].startswith("python") for a in argv), argv  # the program itself


def record_lines(operator, namespace: str, run: dict) -> list[dict]:
    """The full record, from the ConfigMap the status names; it must be owned by the run."""
    name = run["status"]["audit"]["recordConfigMap"]
    config_map = operator.core.read_namespaced_config_map(name, namespace)
    owners = [(o.kind, o.uid) for o in config_map.metadata.owner_references or ()]
    assert ("CodeRun", run["metadata"]["uid"]) in owners, owners
    text = "".join(config_map.data.values())
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_a_cold_run_s_status_says_what_it_read_wrote_dialled_and_ran(operator, namespace):
    run = finished(operator, namespace, {"language": "python", "code": TOUCHY, "files": FILES, "limits": SMALL},
                   "touchy")
    assert run["status"]["phase"] == "Succeeded" and run["status"]["stdout"].strip() == "127", run["status"]
    assert_touched(audit_of(run))
    lines = record_lines(operator, namespace, run)
    # First, what no point can show: the syscalls the runner's filter refuses before gVisor traces anything.
    assert lines[0]["point"] == "coderun/untraced" and "io_uring_setup" in lines[0]["refusedBeforeTheTrace"]
    points = {line.get("point") for line in lines}
    assert {"execve", "connect"} <= points, sorted(points)
    assert not any("env" in line for line in lines), "an execve's environment is never kept"


def test_a_warm_run_s_audit_is_its_own_from_the_claim_on(operator, namespace):
    pool = {"size": 1, "languages": ["python"], "cpuRequest": "10m"}
    apply_warm_pool(operator, namespace, pool, ready=1, defaults={k: v for k, v in SMALL.items() if k != "timeoutSeconds"})
    first = finished(operator, namespace, {"language": "python", "code": TOUCHY, "files": FILES,
                                           "limits": {"timeoutSeconds": 30}}, "warm-touchy")
    assert first["status"]["startMode"] == "Warm", first["status"]
    assert_touched(audit_of(first))
    wait_for_pool(operator, namespace, pool, ready=1)
    quiet = finished(operator, namespace, {"language": "python", "code": "print(1)", "limits": {"timeoutSeconds": 30}},
                     "warm-quiet")
    audit = audit_of(quiet)
    assert quiet["status"]["startMode"] == "Warm" and audit["complete"] is True, quiet["status"]
    # Nothing of the first run's pod, nor of the pool pod's wait before the claim, is this run's.
    assert audit["connectAttempts"] == [] and not any(p["argv"][:1] == ["sh"] for p in audit["processes"]), audit
    assert all(f["path"] != "data.csv" for f in audit["filesRead"]), audit


def test_a_name_with_an_invalid_utf8_byte_cannot_hide_an_open(operator, namespace):
    """Go's protobuf refuses invalid UTF-8 in a string, and gVisor used to drop such a point uncounted; the
    project's runsc makes the string valid (U+FFFD), so the open is recorded."""
    code = textwrap.dedent("""\
        import os
        os.symlink("/etc/passwd", b"/tmp/\\xff-hidden")
        open(b"/tmp/\\xff-hidden").read()
        print("read")
    """)
    run = finished(operator, namespace, {"language": "python", "code": code, "limits": SMALL}, "utf8")
    audit = audit_of(run)
    assert run["status"]["phase"] == "Succeeded" and audit["complete"] is True, run["status"]
    assert "/tmp/\ufffd-hidden" in [f["path"] for f in audit["filesRead"]], audit
    assert audit["counts"]["pointsLost"] == 0, audit


def test_a_program_that_execs_over_its_interpreter_is_still_the_program(operator, namespace):
    """The interpreter replaced by another binary: the same process, now `true`, still on the program's side."""
    run = finished(operator, namespace, {"language": "python", "code": "import os\nos.execv('/bin/true', ['true'])\n",
                                         "limits": SMALL}, "exec")
    audit = audit_of(run)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert ["true"] in [p["argv"] for p in audit["processes"]], audit


def test_a_flood_of_opens_is_bounded_and_the_agent_serves_the_next_run(operator, namespace):
    """A program opening files as fast as it can: the agent keeps what fits its per-sandbox cap and counts the
    rest as lost, the run's audit says so, and the next run's audit is whole."""
    # Half a core: the flood and the agent taking its points must leave the 2-core node room for the tests running
    # beside this one (with a flood at a whole core beside it, an egress run's budget was once counted apart by
    # the two proxy replicas, as when a replica's readiness drops; that cause is not proven).
    flood = "for _ in range(60000):\n    open('/etc/hostname').close()\nprint('flooded')\n"
    run = finished(operator, namespace, {"language": "python", "code": flood,
                                         "limits": {**SMALL, "cpu": "500m", "timeoutSeconds": 90}}, "flood")
    audit = audit_of(run)
    assert run["status"]["phase"] == "Succeeded" and audit["source"] == "gvisor-trace", run["status"]
    assert audit["outsideWorkdir"]["reads"] + audit["counts"]["pointsLost"] >= 60000 or \
        audit["complete"] is False, audit
    after = finished(operator, namespace, {"language": "python", "code": TOUCHY, "files": FILES, "limits": SMALL},
                     "after-flood")
    assert_touched(audit_of(after))


def test_the_sdk_and_the_cli_say_what_a_run_touched(operator, namespace, tmp_path):
    """As users meet it: the SDK's typed result, and the CLI's line after the run (on stderr, beside stdout)."""
    result = CodeRunClient(namespace, kubeconfig=str(KUBECONFIG)).run(TOUCHY, files={"data.csv": FILES[0]["content"]})
    assert result.audit is not None and result.audit.source == "gvisor-trace", result.audit
    assert ("10.96.0.1", 443) in [(c.address, c.port) for c in result.audit.connect_attempts]
    assert "data.csv" in [f.path for f in result.audit.files_read]
    script, data = tmp_path / "touchy.py", tmp_path / "data.csv"
    script.write_text(TOUCHY)
    data.write_text(FILES[0]["content"])
    ran = subprocess.run([str(Path(sys.executable).parent / "coderun"), "run", str(script), "--file", f"data.csv={data}",
                          "-n", namespace], capture_output=True, text=True, timeout=180,
                         env={**os.environ, "KUBECONFIG": str(KUBECONFIG)})
    assert ran.stdout.strip() == "127", ran.stdout + ran.stderr
    touched = [line for line in ran.stderr.splitlines() if "touched:" in line]
    assert touched and "data.csv" in touched[0] and "10.96.0.1:443" in touched[0], ran.stderr


AWS = "AKIA" + "QWERTYUIOPASDFGH"  # the shape of an AWS key id: the default redaction knows it
PRELUDE = "import ctypes, os, socket, sys, threading, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
# Programs that try to make what they did invisible or misattributed, and what their audit must still say.
HIDING = {
    "nothing": ("pass\n", lambda a: a["connectAttempts"] == [] and a["filesWritten"] == []
                and a["socketsOpened"] == [] and a["counts"]["processes"] == 1 and a["counts"]["failedExecs"] == 0
                and [f["path"] for f in a["filesRead"]] == ["main.py"]),
    "openat2": ("class How(ctypes.Structure):\n    _fields_ = [('flags', ctypes.c_uint64), ('mode', ctypes.c_uint64),"
                " ('resolve', ctypes.c_uint64)]\nhow = How(0, 0, 0)\n"
                "libc.syscall(437, -100, b'/etc/passwd', ctypes.byref(how), ctypes.sizeof(how))\n",
                lambda a: a["counts"]["openat2"] >= 1),
    "memfd-execveat": ("fd = os.memfd_create('x')\nos.write(fd, open('/bin/true', 'rb').read())\n"
                       "pid = os.fork()\nif pid == 0:\n    os.execve(fd, ['hidden-true'], {})\nos.waitpid(pid, 0)\n",
                       lambda a: any(p.get("fromMemfd") and p["argv"] == ["hidden-true"] for p in a["processes"])),
    "udp-sendto": ("s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                   "s.sendto(b'x', ('10.96.0.10', 53))\n",
                   lambda a: a["counts"]["addressedSends"] >= 1 and any(
                       s["protocol"] == "udp" for s in a["socketsOpened"])),
    "raw-socket": ("try:\n    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)\nexcept OSError:\n"
                   "    pass\n",
                   lambda a: any(s["protocol"] not in ("tcp", "udp") and s["result"] != "created"
                                 for s in a["socketsOpened"])),
    "outlives-the-program": ("pid = os.fork()\nif pid == 0:\n    time.sleep(600)\nprint('parent leaves')\n",
                             lambda a: a["complete"] is True and sum(
                                 1 for p in a["processes"] if p.get("signal") == "SIGKILL") >= 1),
    "racing-the-exit": ("def spawn():\n    if os.fork() == 0:\n        open('/etc/hostname').read()\n        os._exit(0)\n"
                        "for _ in range(8):\n    threading.Thread(target=spawn).start()\nos._exit(0)\n",
                        lambda a: a["complete"] is True and a["counts"]["processes"] >= 1),
    "control-characters-and-secrets": (f"name = '/tmp/\\x1b[31mred-{AWS}'\nopen(name, 'w').close()\n",
                                       lambda a: any("\\x1b[31mred-" in f["path"] and AWS not in f["path"]
                                                     and "REDACTED" in f["path"] for f in a["filesWritten"])),
}


@pytest.mark.parametrize("program", sorted(HIDING))
def test_a_program_cannot_hide_what_it_did_from_its_audit(operator, namespace, program):
    code, holds = HIDING[program]
    run = finished(operator, namespace, {"language": "python", "code": PRELUDE + code, "limits": SMALL},
                   program.replace("_", "-"))
    audit = audit_of(run)
    assert audit["source"] == "gvisor-trace", run["status"]
    assert holds(audit), (program, json.dumps(audit)[:3000])
