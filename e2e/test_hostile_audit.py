"""An audit a flood cannot blind (issue 35, docs/audit.md): a cold run makes 90,000 open/close calls on its own /tmp,
then reads /etc/passwd, writes a marker in its work dir, connects to the API server's Service address and runs
`sh -c echo`. Before the agent folded points as they arrived, it kept a sandbox's first 8 MiB of raw points and
status.audit listed one process, no connect, no /etc/passwd and no marker. Python and JavaScript run at once; each
audit must list all of it, count the flood, and say complete unless a point was lost (then say so, from when).

On a loaded node gVisor's sink may drop points when the agent falls behind (25 of a flood's 90,000 once, on this
2-core node, before the sink's retries): the audit then says how many and from when. Only what came at or after that
time may then be missing; what came before must be there. The program prints, after each thing it does, the time on
the sandbox's realtime clock (the clock gVisor stamps its points with, seccheck's `TimeNs`), to the millisecond."""
from __future__ import annotations

import json
import re
import textwrap
from datetime import datetime

import pytest

from conftest import OPERATOR_MODE

pytestmark = [pytest.mark.skipif(OPERATOR_MODE != "chart", reason="the audit agents are installed by the chart: "
                                 "make test runs this module against it (CODERUN_E2E_OPERATOR=chart)")]

FLOOD = 90_000
PROGRAMS = {
    "python": textwrap.dedent("""\
        import json, os, socket, subprocess, time
        done = {{}}
        for _ in range({flood}):
            os.close(os.open("/tmp/flood", os.O_WRONLY | os.O_CREAT))
        open("/etc/passwd").read()
        done["passwd"] = time.time_ns() // 1_000_000
        open("marker.txt", "w").write("here")
        done["marker"] = time.time_ns() // 1_000_000
        s = socket.socket()
        s.settimeout(1)
        try:
            s.connect(("{address}", {port}))
        except OSError:
            pass
        done["connect"] = time.time_ns() // 1_000_000
        subprocess.run(["sh", "-c", "echo"], check=True)
        done["sh"] = time.time_ns() // 1_000_000
        print("done", json.dumps(done))
        print("flooded")
        """),
    "javascript": textwrap.dedent("""\
        const fs = require("fs"), net = require("net"), cp = require("child_process");
        const when = {{}};
        for (let i = 0; i < {flood}; i++) fs.closeSync(fs.openSync("/tmp/flood", "w"));
        fs.readFileSync("/etc/passwd");
        when.passwd = Date.now();
        fs.writeFileSync("marker.txt", "here");
        when.marker = Date.now();
        cp.spawnSync("sh", ["-c", "echo"], {{stdio: "inherit"}});
        when.sh = Date.now();
        const s = net.connect({{host: "{address}", port: {port}}});
        const done = () => {{
            s.destroy(); when.connect = Date.now();
            console.log("done " + JSON.stringify(when)); console.log("flooded");
        }};
        s.setTimeout(1000, done);
        s.on("connect", done);
        s.on("error", done);
        """),
}
# 90,000 traced opens at half a CPU, two runs at once beside the agent: the timeout is twice what it needs loaded.
LIMITS = {"cpu": "500m", "memory": "256Mi", "timeoutSeconds": 180}
LOST_FROM = re.compile(r"trace points were lost on the way to the node's audit agent, (?:from (\S+) on|from the "
                       r"sandbox's start)")


def test_a_flood_of_opens_first_hides_nothing_that_came_after_it(operator, namespace):
    """Both languages' runs, created together (cold); each audit checked once both have finished."""
    service = operator.core.read_namespaced_service("kubernetes", "default")
    address, port = service.spec.cluster_ip, service.spec.ports[0].port
    names = {}
    for language, program in PROGRAMS.items():
        code = program.format(flood=FLOOD, address=address, port=port)
        names[language] = operator.create_run(namespace, {"language": language, "code": code, "limits": LIMITS},
                                              name=f"flood-{language}")
    for language, name in names.items():
        assert_recorded_whole(operator.wait_run(namespace, name, timeout=420)["status"], address, port)


def assert_recorded_whole(status: dict, address: str, port: int) -> None:
    assert status["phase"] == "Succeeded" and status["stdout"].strip().endswith("flooded"), \
        json.dumps(status)[:3000]
    audit = status.get("audit") or {}
    shown = json.dumps(audit)[:6000]
    assert audit.get("source") == "gvisor-trace", shown
    # Complete exactly when no point was lost on the way: a loss is stated, with the time it began.
    lost = audit["counts"]["pointsLost"]
    assert audit["complete"] is (lost == 0), shown
    lost_from_ms = None
    if lost:
        said = LOST_FROM.search(audit.get("message", ""))
        assert said and f"{lost} trace points were lost" in audit["message"], shown
        lost_from_ms = _ms(said.group(1)) if said.group(1) else 0
    # The flood is one row with a count (the run's own /tmp), not a cap's worth of raw points.
    flood = [f for f in audit["filesWritten"] if f["path"] == "/tmp/flood"]
    assert flood and flood[0]["count"] + lost >= FLOOD, shown
    # And what came after it, each of them: all, without a loss; with one, each that was done before it began.
    done = json.loads(next(line for line in status["stdout"].splitlines() if line.startswith("done "))[5:])
    recorded = {
        "passwd": "/etc/passwd" in audit["outsideWorkdir"]["examples"],
        "marker": any(f["path"] == "marker.txt" for f in audit["filesWritten"]),
        "connect": (address, port) in [(c["address"], c["port"]) for c in audit["connectAttempts"]],
        "sh": ["sh", "-c", "echo"] in [p["argv"] for p in audit["processes"]],
    }
    # A point's time is at most its step's printed time + 1 ms (printed floored); the loss's start is floored too.
    may_be_lost = {step for step in recorded if lost_from_ms is not None and lost_from_ms <= done[step] + 1}
    missing = {step for step, seen in recorded.items() if not seen}
    assert not missing - may_be_lost, (sorted(missing - may_be_lost), done, shown)


def _ms(iso: str) -> int:
    """The audit message's sandbox time (RFC 3339, to the millisecond, UTC) in ms since the epoch."""
    return round(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)
