"""An audit a flood cannot blind (issue 35, docs/audit.md): a cold run makes 90,000 open/close calls on its own /tmp,
then reads /etc/passwd, writes a marker in its work dir, connects to the API server's Service address and runs
`sh -c echo`. Before the agent folded points as they arrived, it kept a sandbox's first 8 MiB of raw points and
status.audit listed one process, no connect, no /etc/passwd and no marker. Python and JavaScript run at once; each
audit must list all of it, count the flood, and say complete unless a point was lost (then say so, from when)."""
from __future__ import annotations

import json
import textwrap

import pytest

from conftest import OPERATOR_MODE

pytestmark = [pytest.mark.skipif(OPERATOR_MODE != "chart", reason="the audit agents are installed by the chart: "
                                 "make test runs this module against it (CODERUN_E2E_OPERATOR=chart)")]

FLOOD = 90_000
PROGRAMS = {
    "python": textwrap.dedent("""\
        import os, socket, subprocess
        for _ in range({flood}):
            os.close(os.open("/tmp/flood", os.O_WRONLY | os.O_CREAT))
        open("/etc/passwd").read()
        open("marker.txt", "w").write("here")
        s = socket.socket()
        s.settimeout(1)
        try:
            s.connect(("{address}", {port}))
        except OSError:
            pass
        subprocess.run(["sh", "-c", "echo"], check=True)
        print("flooded")
        """),
    "javascript": textwrap.dedent("""\
        const fs = require("fs"), net = require("net"), cp = require("child_process");
        for (let i = 0; i < {flood}; i++) fs.closeSync(fs.openSync("/tmp/flood", "w"));
        fs.readFileSync("/etc/passwd");
        fs.writeFileSync("marker.txt", "here");
        cp.spawnSync("sh", ["-c", "echo"], {{stdio: "inherit"}});
        const s = net.connect({{host: "{address}", port: {port}}});
        const done = () => {{ s.destroy(); console.log("flooded"); }};
        s.setTimeout(1000, done);
        s.on("connect", done);
        s.on("error", done);
        """),
}
LIMITS = {"cpu": "500m", "memory": "256Mi", "timeoutSeconds": 90}


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
        assert_recorded_whole(operator.wait_run(namespace, name, timeout=240)["status"], address, port)


def assert_recorded_whole(status: dict, address: str, port: int) -> None:
    assert status["phase"] == "Succeeded" and status["stdout"].strip().endswith("flooded"), \
        json.dumps(status)[:3000]
    audit = status.get("audit") or {}
    shown = json.dumps(audit)[:6000]
    assert audit.get("source") == "gvisor-trace", shown
    # Complete exactly when no point was lost on the way (on this loaded 2-core node gVisor's sink once dropped 25
    # of a flood's 90,000 when the agent fell behind): a loss is stated, with the time it began.
    lost = audit["counts"]["pointsLost"]
    assert audit["complete"] is (lost == 0), shown
    assert lost == 0 or f"{lost} trace points were lost" in audit["message"], shown
    # The flood is one row with a count (the run's own /tmp), not a cap's worth of raw points.
    flood = [f for f in audit["filesWritten"] if f["path"] == "/tmp/flood"]
    assert flood and flood[0]["count"] + lost >= FLOOD, shown
    # And what came after it, each of them.
    assert "/etc/passwd" in audit["outsideWorkdir"]["examples"], shown
    assert any(f["path"] == "marker.txt" for f in audit["filesWritten"]), shown
    assert (address, port) in [(c["address"], c["port"]) for c in audit["connectAttempts"]], shown
    assert ["sh", "-c", "echo"] in [p["argv"] for p in audit["processes"]], shown
