"""Hostile code, run for real, stays contained: no network, no credentials, no host, no other run, no forgery."""
import json
import textwrap

from coderun.api.models import GROUP, PLURAL, VERSION
from framework.policy import Listeners, apply_policy


PROBE = textwrap.dedent("""
    import json, os, socket
    def connect(host, port):
        s = socket.socket()
        s.settimeout(3)
        try:
            s.connect((host, port))
            return "open"
        except Exception as e:
            return type(e).__name__
    def attempt(fn):
        try:
            fn()
            return "allowed"
        except Exception as e:
            return type(e).__name__
    status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
    report = {
        "uid": os.getuid(),
        "capabilities": status["CapEff"].strip(),
        "token": os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"),
        "service_env": sorted(k for k in os.environ if k.startswith("KUBERNETES")),
        "kernel": open("/proc/version").read(),
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "write_root": attempt(lambda: open("/usr/lib/evil", "w")),
        "root_mount": [m.split()[3] for m in open("/proc/mounts") if m.split()[1] == "/"],
        "write_tmp": attempt(lambda: open("/tmp/fine", "w")),
        "setuid_root": attempt(lambda: os.setuid(0)),
        "runner_stdout": attempt(lambda: open("/proc/1/fd/1", "w")),
        "runner_memory": attempt(lambda: open("/proc/1/mem", "rb")),
        "api_service": connect("10.96.0.1", 443),
        "node_apiserver": connect(NODE, 6443),
        "node_kubelet": connect(NODE, 10250),
        "other_run": connect(OTHER, 8080),
        "node_listener": connect(NODE, ALLOWED),
    }
    print(json.dumps(report))
""")

LISTENER = textwrap.dedent("""
    import socket, time
    s = socket.socket()
    s.bind(("0.0.0.0", 8080))
    s.listen()
    time.sleep(40)
""")


def test_hostile_code_is_contained(operator, namespace):
    listener = operator.create_run(namespace, {"language": "python", "code": LISTENER,
                                               "limits": {"timeoutSeconds": 45, "cpu": "500m"}})
    other_ip = operator.pod_ip(namespace, operator.wait_running(namespace, listener))
    node = operator.node_ip()
    node_listeners = Listeners(node)
    allowed = node_listeners.port(0)
    try:
        # The positive control: the same probe under a policy that opens one port on the node to it. Its connect
        # gets there, so a "blocked" below is the policy's doing, not a probe or a network that reaches nothing.
        # (A namespace with a policy needs its 'default' for runs that name none: the prober's, as before.)
        apply_policy(operator, namespace, "default", {})
        apply_policy(operator, namespace, "one-port", {"allowClusterEgress": True, "egress": [
            {"cidr": f"{node}/32", "ports": [{"port": allowed}]}]})
        code = f"NODE = {node!r}\nOTHER = {other_ip!r}\nALLOWED = {allowed}\n" + PROBE
        limits = {"timeoutSeconds": 30, "cpu": "500m"}
        prober = operator.create_run(namespace, {"language": "python", "code": code, "limits": limits})
        control = operator.create_run(namespace, {"language": "python", "code": code, "limits": limits,
                                                  "policyRef": "one-port"})
        status = operator.wait_run(namespace, prober)["status"]
        control_status = operator.wait_run(namespace, control)["status"]
    finally:
        node_listeners.close()
    assert control_status["phase"] == "Succeeded", control_status.get("stderr")
    assert json.loads(control_status["stdout"])["node_listener"] == "open", control_status["stdout"]
    assert {port for port, _ in node_listeners.peers} == {allowed}, node_listeners.peers
    assert status["phase"] == "Succeeded", status.get("stderr")
    report = json.loads(status["stdout"])
    assert report["uid"] == 65532 and report["capabilities"] == "0000000000000000"
    assert report["token"] is False and report["service_env"] == []
    assert "gVisor" in report["kernel"] or "4.19.0-gvisor" in report["kernel"], report["kernel"]
    assert report["pids"][0] == 1 and len(report["pids"]) <= 3, report["pids"]  # the runner, the program
    assert report["write_root"] != "allowed" and report["write_tmp"] == "allowed"
    assert all("ro" in options.split(",") for options in report["root_mount"]), report["root_mount"]
    assert report["setuid_root"] in ("PermissionError", "OSError")  # EPERM, or EINVAL: uid 0 has no mapping
    assert report["runner_stdout"] == "PermissionError" and report["runner_memory"] == "PermissionError"
    for target in ("api_service", "node_apiserver", "node_kubelet", "other_run", "node_listener"):
        assert report[target] != "open", (target, report[target])
    operator.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, listener)


def test_forged_result_frame_cannot_replace_the_real_one(operator, namespace):
    forged = {"version": 1, "reason": "Completed", "exitCode": 0, "stdout": "all good\n"}
    code = textwrap.dedent(f"""
        import json, sys
        line = "\\nCODERUN-RESULT-V1 " + json.dumps({forged!r}) + "\\n"
        print(line, flush=True)
        for target in ("/proc/1/fd/1", "/dev/termination-log"):
            try:
                with open(target, "w") as f:
                    f.write(line if target.endswith("1") else json.dumps({{"frameSha256": "0" * 64}}))
            except OSError as e:
                print("refused", target, e.errno, file=sys.stderr)
        sys.exit(9)
    """)
    status = operator.wait_run(namespace, operator.create_run(namespace, {"language": "python", "code": code}))
    status = status["status"]
    # Writing the runner's termination log is itself a violation the runner reports; the forgery changes nothing.
    # Whether the program reached its exit(9) first or the runner stopped it at the write (a prestarted program
    # is there within a millisecond of the runner's first look) is a race; the verdict is the same.
    assert (status["phase"], status["reason"]) == ("Failed", "SandboxViolation"), status
    assert status.get("exitCode") == 9 or status.get("signal") == 9, status
    assert "CODERUN-RESULT-V1" in status["stdout"]  # the forgery stays inside the program's own output


def test_an_inode_flood_at_a_tenth_of_a_core_is_refused_at_the_inode_cap(operator, namespace):
    """25,000 empty files at `cpu: 100m` against the default cap of 16,384 entries under /tmp: /tmp is the
    runner's tmpfs, whose kernel refuses the entry past the cap (ENOSPC) however little CPU the runner gets to
    look. The program then lingers; the run still ends DiskLimitExceeded naming the cap soon after, not at its
    timeout. (Before the tmpfs the runner counted beside the program, and one such run made all 25,000.)"""
    code = textwrap.dedent("""
        import errno, os, time
        started = time.monotonic()
        os.makedirs("/tmp/i")
        made = 0
        try:
            for i in range(25000):
                open(f"/tmp/i/{i}", "w").close()
                made += 1
        except OSError as e:
            print("refused", made, errno.errorcode.get(e.errno), int((time.monotonic() - started) * 1000), flush=True)
        time.sleep(600)
    """)
    name = operator.create_run(namespace, {"language": "python", "code": code,
                                           "limits": {"cpu": "100m", "timeoutSeconds": 180}})
    status = operator.wait_run(namespace, name, timeout=300)["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "DiskLimitExceeded"), status.get("message")
    assert "16384" in status["message"], status["message"]
    word, made, error, refused_at = status["stdout"].split()
    # the entries the runner made first (the work and home dirs, the code file, /tmp/i) count too
    assert (word, error) == ("refused", "ENOSPC") and 16384 - 16 <= int(made) <= 16384, status["stdout"]
    ended_after = status["metrics"]["wallMillis"] - int(refused_at)
    assert ended_after < 15000, ended_after
    print(f"\ninode flood at 100m: refused after {made} files at {int(refused_at) / 1000:.1f} s, "
          f"the run ended {ended_after / 1000:.1f} s later; message: {status['message']}")
