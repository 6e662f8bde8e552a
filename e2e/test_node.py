"""JavaScript on the real cluster: the same runner contract as Python, on Node.js under gVisor."""
import json

JS = "javascript"


def run(operator, namespace, code: str, **limits) -> dict:
    spec = {"language": JS, "code": code, **({"limits": limits} if limits else {})}
    return operator.wait_run(namespace, operator.create_run(namespace, spec))["status"]


def test_a_javascript_program_prints_and_succeeds(operator, namespace):
    status = run(operator, namespace, "const xs = [1, 2, 3];\nconsole.log(xs.reduce((a, b) => a + b));\n")
    assert (status["phase"], status["reason"], status["stdout"], status["exitCode"]) == \
        ("Succeeded", "Completed", "6\n", 0), status
    assert status["image"].startswith("coderun.local/sandbox-node") and status["runtimeClass"] == "gvisor"


def test_an_uncaught_error_has_its_type_message_and_line(operator, namespace):
    status = run(operator, namespace, "function f(x) {\n  return x.y.z;\n}\nconsole.log('before');\nf({});\n")
    assert (status["phase"], status["reason"], status["exitCode"]) == ("Failed", "NonZeroExit", 1), status
    assert status["error"]["type"] == "TypeError" and status["error"]["line"] == 2, status["error"]
    assert "reading 'z'" in status["error"]["message"] and status["stdout"] == "before\n"
    assert "TypeError at line 2" in status["message"]


def test_a_syntax_error_at_the_end_of_the_input_has_its_line(operator, namespace):
    """Code cut short, as generated code can be: Node prints no source line and no caret for it."""
    status = run(operator, namespace, "const total = [1, 2, 3].reduce((a, b) => {\n  return a + b;\n")
    assert (status["phase"], status["reason"], status["exitCode"]) == ("Failed", "NonZeroExit", 1), status
    assert status["error"] == {"type": "SyntaxError", "message": "Unexpected end of input", "line": 3}, status


def test_an_endless_loop_times_out(operator, namespace):
    status = run(operator, namespace, "while (true) {}\n", timeoutSeconds=2)
    assert (status["phase"], status["reason"]) == ("Failed", "Timeout"), status
    assert status["metrics"]["wallMillis"] < 4000


HOSTILE = """
const net = require('net');
const fs = require('fs');
const { execSync } = require('child_process');
const facts = {};
facts.id = execSync('id -u').toString().trim();
try { fs.writeFileSync('/etc/owned', 'x'); facts.root = 'allowed'; } catch (e) { facts.root = e.code; }
try { facts.token = fs.existsSync('/var/run/secrets/kubernetes.io/serviceaccount/token'); } catch (e) {}
try { process.kill(1, 'SIGTERM'); facts.kill = 'sent'; } catch (e) { facts.kill = e.code; }
const s = net.connect({host: NODE, port: 6443, timeout: 2000});
const done = (what) => { facts.apiserver = what; console.log(JSON.stringify(facts)); s.destroy(); process.exit(0); };
s.on('connect', () => done('connected'));
s.on('timeout', () => done('timeout'));
s.on('error', (e) => done(e.code));
"""


def test_hostile_javascript_is_contained(operator, namespace):
    status = run(operator, namespace, f"const NODE = {operator.node_ip()!r};\n" + HOSTILE, timeoutSeconds=15)
    assert status["phase"] == "Succeeded", status
    facts = json.loads(status["stdout"])
    assert facts["id"] == "65532" and facts["root"] in ("EROFS", "EACCES") and facts["token"] is False, facts
    assert facts["apiserver"] != "connected", facts
    assert facts["kill"] in ("sent", "EPERM"), facts  # PID 1 there is the runner's init: it ignores SIGTERM
    # SIGKILL to that init ends the program's own namespace: the program's doing, reported as such.
    status = run(operator, namespace,
                 "console.log('before');\nprocess.kill(1, 'SIGKILL');\nsetTimeout(() => {}, 5000);\n")
    assert (status["reason"], status["signal"], status["stdout"]) == ("Signaled", 9, "before\n"), status
