"""What a warm and a cold run of the same program must share (the equality tests of test_warm and
test_session), and the pool's pods."""
from __future__ import annotations

import copy


# Programs whose statuses must not depend on where they ran: (name, spec).
CASES = [
    ("oom", {"code": "chunks = []\nwhile True: chunks.append(bytearray(32 * 1024 * 1024))"}),
    ("success", {"code": "import sys; print('out'); print('err', file=sys.stderr)"}),
    ("exception", {"code": "def f():\n    raise ValueError('bad value')\nf()\n"}),
    ("exit-code", {"code": "import sys; sys.exit(3)"}),
    ("stdin-and-files", {"code": "import sys; print(sys.stdin.read(), open('data/in.txt').read())",
                         "stdin": "from stdin", "files": [{"path": "data/in.txt", "content": "from a file"}]}),
    ("timeout", {"code": "while True: pass", "limits": {"timeoutSeconds": 2}}),
    ("output-flood", {"code": "import sys\nwhile True: sys.stdout.write('x' * 65536)"}),
    ("disk", {"code": "open('/tmp/big', 'wb').write(b'0' * 100 * 1024 * 1024)"}),
    ("artifacts", {"code": "import os\nopen(os.path.join(os.environ['CODERUN_OUTPUT_DIR'], 'a.txt'), 'w')"
                           ".write('artifact')\nprint('done')"}),
    ("secret-redacted", {"code": "print('key AKIAABCDEFGHIJKLMNOP')"}),
    ("javascript", {"language": "javascript", "code": "console.log(6 * 7); null.x;"}),
    # What a Node program sees of how it was started (a warm one in a process started before its code came).
    ("javascript-view", {"language": "javascript",
                         "code": "console.log(JSON.stringify({argv: process.argv, execArgv: process.execArgv,\n"
                                 "  env: process.env, cwd: process.cwd(), cache: Object.keys(require.cache),\n"
                                 "  main: require.main === module}));\nprocess.exitCode = 4;\n"}),
    # What the program can see of where it runs: its scratch and work dirs, its environment, its rlimits, and the
    # raw input dir (hidden: an empty read-only directory, warm or cold).
    ("program-view", {"code": "import json, os, resource\n"
                              "def tried(fn):\n"
                              "    try:\n"
                              "        return fn()\n"
                              "    except OSError as e:\n"
                              "        return type(e).__name__\n"
                              "print(json.dumps({'tmp': sorted(os.listdir('/tmp')), 'work': sorted(os.listdir('.')),\n"
                              "    'cwd': os.getcwd(), 'env': dict(os.environ),\n"
                              "    'rlimits': {n: resource.getrlimit(getattr(resource, n))\n"
                              "                for n in dir(resource) if n.startswith('RLIMIT_')},\n"
                              "    'input': tried(lambda: os.listdir('/coderun/input')),\n"
                              "    'input_write': tried(lambda: open('/coderun/input/x', 'w') and 'written')}))",
                      "files": [{"path": "data/in.txt", "content": "from a file"}]}),
]


# What the program must see, beyond seeing the same warm and cold.
SEEN = {"program-view": lambda view: view["input"] == [] and view["input_write"] == "OSError"
        and view["tmp"] == ["home", "outputs", "work"] and view["work"] == ["data", "main.py"],
        "javascript-view": lambda view: view["argv"][1:] == ["/tmp/work/main.js"] and view["execArgv"] == []
        and view["cache"] == ["/tmp/work/main.js"] and view["main"] and "CODERUN_PRESTART_FD" not in view["env"]}


# What may differ between a warm and a cold run of the same program: when, where, how long.
# The cache key covers the whole decision, the policy's digest with it, and the twins' policies differ by the pool.
WHERE_AND_WHEN = ("startMode", "podName", "startTime", "completionTime", "metrics", "policyDigest", "message",
                  "cacheKey")


# A write past the disk limit meets two enforcers, RLIMIT_FSIZE (EFBIG, the program's own error) and the runner's
# disk walk (SIGKILL), and which comes first is a race on either path; the reason and the limit are the same.
# Past the memory limit the node's OOM killer takes the program's process (the runner survives to report it, with
# its empty output) or the whole sandbox (nothing left to report), whichever it picks; seen: cold runs the first,
# warm ones the second, on the same node. Reason, signal, exit code and message are the same either way.
# A flood is killed once the runner has read past its flood cap; what it reads after (the pipe's content at the
# kill: nothing, or one more of the program's 64 KiB writes) is timing. Both views must still be past the cap, with
# the same kept head, reason and record.
FLOOD_CAP = 1048576


KILL_TIMED = {"output-flood": ("stdoutBytes", "stdoutSha256")}


RACING = {"disk": ("exitCode", "signal", "error", "stderr", "stderrBytes", "stderrSha256", "conditions"),
          "oom": tuple(f"{stream}{part}" for stream in ("stdout", "stderr")
                       for part in ("", "Bytes", "Sha256", "Truncated"))
                 + ("artifacts", "artifactsSkipped", "redactions")}


def comparable(status: dict, case: str = "") -> dict:
    status = copy.deepcopy(status)
    for field in WHERE_AND_WHEN + RACING.get(case, ()):
        status.pop(field, None)
    audit = status.get("audit") or {}
    # The runner's own share differs by transport: a warm runner read its code and wrote its setup before the
    # claim, which is not the run's. What the program did must be the same.
    audit.pop("runner", None)
    without_interpreter_start(audit)
    if case in RACING:  # which enforcer won decides what the program did next (a traceback re-reads main.py,
        status.pop("audit", None)  # a sandbox killed whole leaves no end in the record): the race above
    if case in KILL_TIMED and status.get("stdoutBytes", 0) > FLOOD_CAP:
        status.update({field: "past the cap" for field in KILL_TIMED[case]})
    status.get("decision", {}).pop("policyDigest", None)
    for condition in status.get("conditions") or ():
        condition.pop("lastTransitionTime", None)
        if condition.get("type") == "Accepted":
            condition.pop("message", None)
    for artifact in status.get("artifacts") or ():
        artifact.pop("configMap", None)
    return status


def differences(a, b, path: str = "") -> dict:
    """Where two statuses differ, leaf by leaf (a readable failure message)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = {}
        for key in set(a) | set(b):
            out.update(differences(a.get(key), b.get(key), f"{path}.{key}"))
        return out
    return {} if a == b else {path: (a, b)}


def without_interpreter_start(audit: dict) -> None:
    """What the interpreter's own start did, which a prestarted run's did before the run came (the record says so:
    its first process is the prestarted interpreter, `startedBeforeRun`): the libraries it read outside the work
    dir, its reads of the code file (a cold Python start opens it twice), and how that first process was started.
    What the program did after (its files, connections, later processes, exit) is compared whole."""
    if not audit:
        return
    audit.get("outsideWorkdir", {}).pop("reads", None)
    audit["filesRead"] = [row for row in audit.get("filesRead", ()) if row.get("path") != "main.py"]
    processes = audit.get("processes") or []
    if processes:
        processes[0] = {k: v for k, v in processes[0].items() if k not in ("argv", "startedBeforeRun")}


def pool_pod_names(cluster, namespace: str) -> set[str]:
    return {p.metadata.name for p in cluster.core.list_namespaced_pod(namespace, label_selector="coderun.io/pool").items}
