"""The hostile suite: programs an attacker (or a confused model) would write, each run for real as a CodeRun,
each checked for containment AND for an accurate terminal phase/reason.

How it runs: the table is cut into batches that fit the node's free room beside one canary (limits are requests:
on the 2-core node beside the operator's replicas, five 250m sandboxes plus the canary); all runs of a batch are
created, then the suite waits for all of them, then for their pods to be gone, then starts the next batch.
Meanwhile:
- a benign canary (print(6*7)) is created again and again and must succeed, each time, within CANARY_WITHIN;
- a process of its own polls the operator's /healthz, which must answer every time within HEALTH_WITHIN;
- TCP and UDP listeners on the node's own addresses record anything a sandbox manages to send to the node;
and at the end the operator's log written during the suite must hold no Python traceback.

A program reports what it could and could not do as one JSON line on stdout ("facts"). A fact of "allowed",
"open" or "reply" means an attempt got through. Synchronisation is always a polled predicate with a deadline.
"""
from __future__ import annotations

import json
import re
import select
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
from kubernetes.client.rest import ApiException

from coderun.api.models import GROUP, PLURAL, VERSION
from coderun.sandbox.runner.protocol import FRAME_PREFIX
from framework.standins import METADATA_V4, StandinHits
from conftest import (NAMESPACE_LABELS, TERMINAL, WARM_MODE, apply_warm_pool, count_start_modes, millicpu,
                      parse_timestamp, wait_for)
from framework.hostile import BREACH, PRELUDE, facts_of

SMALL = {"timeoutSeconds": 8, "cpu": "250m", "memory": "128Mi", "disk": "16Mi"}
DISK_LIMIT = 16 * 1024 * 1024
OVERHEAD_MILLICPU = 50          # the gvisor RuntimeClass's podFixed cpu, counted by the scheduler
# Warm mode (CODERUN_E2E_WARM=1): the suite's pool, each waiting pod reserving its cpuRequest plus the overhead.
WARM_POOL = {"size": 4, "cpuRequest": "10m", "languages": ["python"]}
WARM_POOL_MILLICPU = WARM_POOL["size"] * (10 + OVERHEAD_MILLICPU) if WARM_MODE else 0
# Requests of one batch at most; the fixture takes less where the node has less room beside what runs there
# already (the operator's replicas), the canary and, in warm mode, the pool.
BATCH_MILLICPU = 1500 - WARM_POOL_MILLICPU
CANARY_MILLICPU = 250 + OVERHEAD_MILLICPU
BATCH_GRACE = 60                # seconds past a batch's longest timeout before its stragglers count as stuck
# seconds from create to Succeeded, each canary: the operator admits it within a second, but a cold sandbox started
# beside a batch's pods and the pool's refill on the 2-core node took up to 26 s (containerd's RunPodSandbox 16 s)
CANARY_WITHIN = 30.0
CANARY_ADMITTED_WITHIN = 5.0    # seconds from create to its sandbox pod created (startTime): the operator's own share
CANARY_PAUSE = 2.0              # between two canaries
MIN_CANARIES = 5
HEALTH_WITHIN = 1.0
PROMPT_MS = 10_000              # program end -> status written (validation, redaction, write) in normal time
PROGRAM_REASONS = {"Completed", "NonZeroExit", "Timeout", "OOMKilled", "OutputLimitExceeded", "Signaled",
                   "DiskLimitExceeded", "ProcessLimitExceeded", "SandboxViolation"}

AWS = "AKIA" + "QWERTYUIOPASDFGH"                       # AKIA + 16 uppercase letters
GHP = "ghp_" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa"   # ghp_ + 36 alphanumerics
SECRETS = (AWS, GHP)
FORGED_STDOUT = "FORGED-STDOUT"
FORGED = json.dumps({"version": 1, "reason": "Completed", "exitCode": 0, "stdout": FORGED_STDOUT, "stderr": "",
                     "redactions": 0, "artifacts": [], "metrics": {"wallMillis": 1}})

# The module's fixture runs the whole table (5-6 minutes on 2 cores, 10-12 on a loaded machine) before its first test.
pytestmark = pytest.mark.timeout(1500)


# The JavaScript programs' report() and attempt(), as the Python PRELUDE's: an error's code (EPERM) or name.
JS_PRELUDE = r'''
const fs = require("fs"), cp = require("child_process");
function report(facts) { fs.writeSync(1, JSON.stringify(facts) + "\n"); }
function attempt(fn) { try { fn(); return "allowed"; } catch (e) { return (e && (e.code || e.name)) || String(e); } }
function sleep(ms) { Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms); }
'''


@dataclass
class Hostile:
    id: str
    code: str
    reason: str | set[str]
    check: Callable[[dict, dict], Any] = lambda s, f: True
    limits: dict = field(default_factory=dict)
    spec: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    raw: bool = False            # the code as is: no header, no prelude (line numbers, source bytes matter)
    secret: bool = False         # the program shows SECRETS: never visible in the status, redactions > 0
    refusable: str = ""          # a 422 at create whose body names this is as good as the expected reason
    pad_code_to: int = 0         # pad the code with a comment up to this many characters
    slow: bool = False           # runs to a deadline: batched with its kind so quick batches stay quick
    language: str = "python"     # javascript: JS_PRELUDE before the code, no Python header


def refused(*keys: str) -> Callable[[dict, dict], bool]:
    """Every attempt the program reported was refused: an exception name, never allowed/open/reply."""
    return lambda s, f: bool(f) and all(k in f and f[k] not in BREACH for k in keys)


def all_refused(key: str) -> Callable[[dict, dict], bool]:
    """A dict of attempts under `key`, none of which got through."""
    return lambda s, f: bool(f.get(key)) and all(v not in BREACH for v in f[key].values())


def failed(*keys: str) -> Callable[[dict, dict], bool]:
    """Every libc/syscall the program reported returned -1."""
    return lambda s, f: bool(f) and all(f.get(k) == -1 for k in keys)


def status_text(status: dict) -> str:
    return json.dumps(status, ensure_ascii=False)


def leaked(status: dict) -> list[str]:
    """Any 8 consecutive characters of a secret anywhere in the status."""
    text = status_text(status)
    return sorted({s[i:i + 8] for s in SECRETS for i in range(len(s) - 7) if s[i:i + 8] in text})


def metric(status: dict, key: str) -> int:
    return int((status.get("metrics") or {}).get(key) or 0)


def finish_ms(status: dict) -> int:
    """Program end -> status written: the operator's own time on the result."""
    return (metric(status, "totalMillis") - metric(status, "queueMillis") - metric(status, "startupMillis")
            - metric(status, "wallMillis"))


def errors(status: dict) -> str:
    return " | ".join((status.get("validation") or {}).get("errors") or [])


def skipped(status: dict) -> dict[str, str]:
    return {a["name"]: a["why"] for a in status.get("artifactsSkipped") or []}


def artifact_names(status: dict) -> list[str]:
    return [a["name"] for a in status.get("artifacts") or []]


def passwd_leaked(status: dict) -> bool:
    return "root:x:0:0" in status_text(status)


def prompt_disk(s: dict, f: dict) -> bool:
    """Ended by the runner's own check (it measured the program), long before a kubelet eviction would."""
    return (0 < metric(s, "wallMillis") < 20_000 and metric(s, "totalMillis") - metric(s, "queueMillis") < 20_000
            and "written" not in f)


CONTROL = "".join(chr(c) for c in range(1, 32))
HOST_KERNEL = open("/proc/version").read()
LONG_DIRS = "os.path.join(OUT, *(['d' * 200] * 6))"   # 6 x 201 characters: any file below is over 1024

PROGRAMS: list[Hostile] = [
    # ------------------------------------------------------------------ credentials, identity, the host
    Hostile("sa-token-paths", r'''
        found = []
        for top in ("/var/run/secrets", "/run/secrets", "/var/run/secrets/kubernetes.io/serviceaccount",
                    "/var/run/secrets/tokens", "/var/run/secrets/eks.amazonaws.com"):
            for root, dirs, files in os.walk(top):
                found += [os.path.join(root, x) for x in files]
        report(found=sorted(set(found)),
               token=os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"))''',
            "Completed", lambda s, f: f["found"] == [] and f["token"] is False),
    Hostile("sa-env", r'''
        report(keys=sorted(os.environ), values=" ".join(os.environ.values()))''',
            "Completed", lambda s, f: not [k for k in f["keys"] if k.startswith("KUBERNETES")
                                           or k.endswith(("_SERVICE_HOST", "_SERVICE_PORT", "_PORT", "_TCP"))
                                           or re.search("TOKEN|SECRET|PASSW|CREDENTIAL", k)]
            and "10.96.0.1" not in f["values"]),
    Hostile("proc-only-runner-and-program", r'''
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        names = {}
        for p in pids:
            try:
                names[p] = open(f"/proc/{p}/comm").read().strip()
            except OSError as e:
                names[p] = type(e).__name__
        report(me=os.getpid(), pids=pids, names=names)''',
            "Completed", lambda s, f: f["me"] in f["pids"] and len(f["pids"]) <= 2
            and not [n for n in f["names"].values() if re.search("kube|containerd|etcd|runsc|sh$", n)]),
    Hostile("host-shadow", r'''
        report(shadow=attempt(lambda: open("/etc/shadow").read()),
               via_pid1=attempt(lambda: open("/proc/1/root/etc/shadow").read()),
               host=attempt(lambda: open("/host/etc/shadow").read()),
               gshadow=attempt(lambda: open("/etc/gshadow").read()))''',
            "Completed", refused("shadow", "via_pid1", "host", "gshadow")),
    Hostile("proc-version-gvisor", r'''
        report(v=open("/proc/version").read())''',
            "Completed", lambda s, f: "gvisor" in f["v"].lower() and f["v"] != HOST_KERNEL),
    Hostile("identity", r'''
        st = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
        report(uid=os.getuid(), euid=os.geteuid(), gid=os.getgid(), groups=os.getgroups(),
               eff=st["CapEff"].strip(), prm=st["CapPrm"].strip(), amb=st.get("CapAmb", "0").strip())''',
            "Completed", lambda s, f: f["uid"] == f["euid"] == 65532 and f["gid"] != 0 and 0 not in f["groups"]
            and int(f["eff"], 16) == int(f["prm"], 16) == int(f["amb"], 16) == 0),
    Hostile("mounts", r'''
        mounts = [l.split()[1:4] for l in open("/proc/self/mounts")]
        root = [m[2].split(",") for m in mounts if m[0] == "/"]
        report(root_ro=bool(root) and all("ro" in o for o in root), points=[m[0] for m in mounts],
               tmp=attempt(lambda: open("/tmp/fine", "w").write("x")))''',
            "Completed", lambda s, f: f["root_ro"] and f["tmp"] == "allowed" and not [
                p for p in f["points"] if re.search("kubelet|docker|containerd|^/host|/var/run/secrets|/etc/kubernetes", p)]),
    Hostile("runtime-sockets-absent", r'''
        paths = ["/run/containerd/containerd.sock", "/var/run/docker.sock", "/run/crio/crio.sock", "/var/lib/kubelet",
                 "/etc/kubernetes", "/run/containerd", "/var/run/cri-dockerd.sock"]
        report(present=[p for p in paths if os.path.exists(p)])''',
            "Completed", lambda s, f: f["present"] == []),
    Hostile("metadata-address", rf'''
        import urllib.request
        report(http=tcp("{METADATA_V4}", 80), https=tcp("{METADATA_V4}", 443),
               get=attempt(lambda: urllib.request.urlopen("http://{METADATA_V4}/latest/meta-data/", timeout=3).read()))''',
            "Completed", refused("http", "https", "get"), limits={"timeoutSeconds": 15}),
    # ------------------------------------------------------------------ privilege
    Hostile("setuid-root", r'''
        report(uid=attempt(lambda: os.setuid(0)), gid=attempt(lambda: os.setgid(0)),
               euid=attempt(lambda: os.seteuid(0)), groups=attempt(lambda: os.setgroups([0])),
               resuid=attempt(lambda: os.setresuid(0, 0, 0)), now=os.getuid())''',
            "Completed", lambda s, f: refused("uid", "gid", "euid", "groups", "resuid")(s, f) and f["now"] == 65532),
    Hostile("setuid-binaries", r'''
        import subprocess
        found = []
        for d in ("/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin"):
            for n in (os.listdir(d) if os.path.isdir(d) else []):
                try:
                    if os.stat(os.path.join(d, n)).st_mode & (stat.S_ISUID | stat.S_ISGID):
                        found.append(os.path.join(d, n))
                except OSError:
                    pass
        su = subprocess.run(["su", "root", "-c", "id -u"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=5) if os.path.exists("/bin/su") else None
        report(setuid=found, su_stdout=su.stdout.split() if su else [], su_code=su.returncode if su else None)''',
            "Completed", lambda s, f: "0" not in f["su_stdout"] and f["su_code"] != 0),
    Hostile("mount", r'''
        os.makedirs("/tmp/m", exist_ok=True)
        t = LIBC.mount(b"none", b"/tmp/m", b"tmpfs", 0, None)
        b = LIBC.mount(b"/", b"/tmp/m", None, 4096, None)
        p = LIBC.mount(b"proc", b"/tmp/m", b"proc", 0, None)
        r = LIBC.mount(None, b"/", None, 32 | 4096 | 2 ** 14, None)
        report(tmpfs=t, bind=b, proc=p, remount=r)''',
            "Completed", failed("tmpfs", "bind", "proc", "remount")),
    Hostile("unshare-mount-net-pid", r'''
        report(mnt=LIBC.unshare(0x00020000), net=LIBC.unshare(0x40000000), pid=LIBC.unshare(0x20000000),
               uts=LIBC.unshare(0x04000000), ipc=LIBC.unshare(0x08000000), cgroup=LIBC.unshare(0x02000000))''',
            "Completed", failed("mnt", "net", "pid", "uts", "ipc", "cgroup")),
    Hostile("unshare-user-ns", r'''
        report(user=LIBC.unshare(0x10000000))''',
            "Completed", failed("user")),
    Hostile("unshare-user-then-mount", r'''
        u = LIBC.unshare(0x10000000 | 0x00020000)
        m = LIBC.mount(b"none", b"/tmp", b"tmpfs", 0, None) if u == 0 else -1
        report(user_mnt=u, mount=m)''',
            "Completed", failed("user_mnt", "mount")),
    Hostile("chroot", r'''
        report(os_chroot=attempt(lambda: os.chroot("/tmp")), libc=LIBC.chroot(b"/tmp"))''',
            "Completed", lambda s, f: refused("os_chroot")(s, f) and f["libc"] == -1),
    Hostile("ptrace-pid1", r'''
        attach = LIBC.ptrace(16, 1, None, None)
        seize = LIBC.ptrace(0x4206, 1, None, None)
        report(attach=attach, seize=seize, mem=attempt(lambda: open("/proc/1/mem", "rb").read(1)))''',
            "Completed", lambda s, f: failed("attach", "seize")(s, f) and f["mem"] not in BREACH),
    Hostile("capabilities-ambient", r'''
        raise_ambient = LIBC.prctl(47, 2, 21, 0, 0)
        keep = LIBC.prctl(8, 1, 0, 0, 0)
        nnp = LIBC.prctl(39, 0, 0, 0, 0)
        report(ambient=raise_ambient, nnp=nnp, keep=keep)''',
            "Completed", lambda s, f: f["ambient"] == -1 and f["nnp"] == 1),
    Hostile("kernel-syscalls", r'''
        fd = os.open("/dev/null", os.O_RDONLY)
        report(finit_module=sysc(313, fd, b"", 0), delete_module=sysc(176, b"ext4", 0),
               kexec_load=sysc(246, 0, 0, None, 0), reboot=sysc(169, 0xfee1dead, 672274793, 0, None),
               swapon=sysc(167, b"/tmp/swap", 0), acct=sysc(163, b"/tmp/acct"))''',
            "Completed", failed("finit_module", "delete_module", "kexec_load", "reboot", "swapon", "acct")),
    Hostile("bpf-perf-iouring", r'''
        attr = (ctypes.c_uint8 * 128)()
        struct.pack_into("<IIII", attr, 0, 2, 4, 4, 1)
        bpf = sysc(321, 0, attr, 48)
        pattr = (ctypes.c_uint8 * 128)()
        struct.pack_into("<IIQ", pattr, 0, 1, 112, 0)
        perf = sysc(298, pattr, 0, -1, -1, 0)
        params = (ctypes.c_uint8 * 120)()
        uring = sysc(425, 4, params)
        report(bpf=bpf, perf=perf, io_uring=uring)''',
            "Completed", failed("bpf", "perf", "io_uring")),
    Hostile("open-by-handle-shocker", r'''
        handle = (ctypes.c_uint8 * 136)()
        struct.pack_into("<Ii", handle, 0, 8, 1)
        struct.pack_into("<Q", handle, 8, 2)
        mount_fd = os.open("/", os.O_RDONLY)
        report(open_by_handle=sysc(304, mount_fd, handle, 0))''',
            "Completed", failed("open_by_handle")),
    Hostile("set-clock", r'''
        class TS(ctypes.Structure):
            _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]
        report(clock=LIBC.clock_settime(0, ctypes.byref(TS(1, 0))),
               tod=LIBC.settimeofday(ctypes.byref(TS(1, 0)), None),
               hostname=attempt(lambda: socket.sethostname("evil")))''',
            "Completed", lambda s, f: failed("clock", "tod")(s, f) and f["hostname"] not in BREACH),
    Hostile("mknod-devices", r'''
        report(block=attempt(lambda: os.mknod("/tmp/sda", stat.S_IFBLK | 0o600, os.makedev(8, 0))),
               char=attempt(lambda: os.mknod("/tmp/mem", stat.S_IFCHR | 0o600, os.makedev(1, 1))))''',
            "Completed", refused("block", "char")),
    Hostile("raise-rlimits", r'''
        out = {}
        for name in ("RLIMIT_NPROC", "RLIMIT_FSIZE"):
            which = getattr(resource, name)
            soft, hard = resource.getrlimit(which)
            out[name] = attempt(lambda: resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)))
            out[name + "_hard"] = hard
        report(**out)''',
            "Completed", lambda s, f: refused("RLIMIT_NPROC", "RLIMIT_FSIZE")(s, f)
            and 0 < f["RLIMIT_FSIZE_hard"] <= DISK_LIMIT and 0 < f["RLIMIT_NPROC_hard"] <= 1024),
    Hostile("setns-pid1", r'''
        out = {}
        for ns in ("mnt", "net", "pid", "user"):
            try:
                fd = os.open(f"/proc/1/ns/{ns}", os.O_RDONLY)
                out[ns] = "allowed" if LIBC.setns(fd, 0) == 0 else "refused"
            except OSError as e:
                out[ns] = type(e).__name__
        report(ns=out)''',
            "Completed", all_refused("ns")),
    # ------------------------------------------------------------------ read-only root, devices, the runner's files
    Hostile("write-usr", r'''
        report(new=attempt(lambda: open("/usr/evil", "w")), python=attempt(lambda: open("/usr/bin/python3", "ab")),
               stdlib=attempt(lambda: open("/usr/lib/python3.11/os.py", "a")),
               sitecustomize=attempt(lambda: open("/usr/lib/python3.11/sitecustomize.py", "w")))''',
            "Completed", refused("new", "python", "stdlib", "sitecustomize")),
    Hostile("write-etc", r'''
        report(passwd=attempt(lambda: open("/etc/passwd", "a")), new=attempt(lambda: open("/etc/evil", "w")),
               preload=attempt(lambda: open("/etc/ld.so.preload", "w")),
               hosts=attempt(lambda: open("/etc/hosts", "a").write("198.51.100.1 evil\n")))''',
            "Completed", refused("passwd", "new", "preload", "hosts")),
    Hostile("overwrite-runner", r'''
        runner = "/opt/coderun/coderun/sandbox/runner/"
        report(runner=attempt(lambda: open(runner + "main.py", "a")),
               entry=attempt(lambda: open("/opt/coderun/__main__.py", "a")),
               bytecode=attempt(lambda: open(runner + "__pycache__/main.cpython-311.pyc", "r+b")),
               new=attempt(lambda: open("/opt/coderun/evil.py", "w")),
               rename=attempt(lambda: os.rename(runner + "main.py", "/tmp/r.py")))''',
            "Completed", refused("runner", "entry", "bytecode", "new", "rename")),
    Hostile("write-input", r'''
        names = os.listdir("/coderun/input") if os.path.isdir("/coderun/input") else []
        report(names=names, new=attempt(lambda: open("/coderun/input/evil", "w")),
               existing=attempt(lambda: open(os.path.join("/coderun/input", names[0]), "a")) if names else "none")''',
            # the runner hides the raw input under an empty read-only tmpfs: the program has its files in its work dir
            "Completed", lambda s, f: refused("new", "existing")(s, f) and f["names"] == []),
    Hostile("write-proc-sys", r'''
        report(hostname=attempt(lambda: open("/proc/sys/kernel/hostname", "w").write("x")),
               sysrq=attempt(lambda: open("/proc/sysrq-trigger", "w").write("b")),
               drop=attempt(lambda: open("/proc/sys/vm/drop_caches", "w").write("3")),
               core=attempt(lambda: open("/proc/sys/kernel/core_pattern", "w").write("|/tmp/x")),
               cgroup=attempt(lambda: open("/sys/fs/cgroup/cgroup.procs", "w").write("1")))''',
            "Completed", refused("hostname", "sysrq", "drop", "core", "cgroup")),
    Hostile("dev-mem-kmsg", r'''
        report(present=[d for d in ("/dev/mem", "/dev/kmem", "/dev/port", "/dev/kvm") if os.path.exists(d)],
               kmsg=attempt(lambda: open("/dev/kmsg", "rb").read(1)))''',
            "Completed", lambda s, f: f["present"] == [] and f["kmsg"] not in BREACH),
    Hostile("dev-no-block-devices", r'''
        block = []
        for root, dirs, files in os.walk("/dev"):
            for n in dirs + files:
                try:
                    if stat.S_ISBLK(os.lstat(os.path.join(root, n)).st_mode):
                        block.append(os.path.join(root, n))
                except OSError:
                    pass
        report(block=block, names=[n for n in os.listdir("/dev") if re.match(r"(sd|vd|xvd|nvme|loop|dm-|md)", n)])''',
            "Completed", lambda s, f: f["block"] == [] and f["names"] == []),
    Hostile("runner-proc-files", r'''
        report(environ=attempt(lambda: open("/proc/1/environ", "rb").read()),
               root=attempt(lambda: os.listdir("/proc/1/root")), cwd=attempt(lambda: os.listdir("/proc/1/cwd")),
               fds=attempt(lambda: os.listdir("/proc/1/fd")), fd_count=len(attempt_list("/proc/1/fd")),
               stdout=attempt(lambda: open("/proc/1/fd/1", "w")),
               maps=attempt(lambda: open("/proc/1/maps").read()))''',
            # /proc/1 is the namespace's init (the runner's, not dumpable); gVisor lets the same uid list its few
            # descriptors, not open them
            "Completed", lambda s, f: refused("environ", "root", "cwd", "stdout", "maps")(s, f)
            and (f["fds"] != "allowed" or f.get("fd_count", 0) <= 4)),
    # ------------------------------------------------------------------ the network, both families
    Hostile("dns", r'''
        resolv = open("/etc/resolv.conf").read() if os.path.exists("/etc/resolv.conf") else ""
        query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x07coderun\x04test\x00\x00\x01\x00\x01"
        report(cluster=attempt(lambda: socket.getaddrinfo("kubernetes.default.svc.cluster.local", 443)),
               public=attempt(lambda: socket.getaddrinfo("example.coderun.test", 443)),
               kube_dns=udp("10.96.0.10", 53, query), node_dns=udp(NODE, 53, query),
               nameservers=[l.split()[1] for l in resolv.splitlines() if l.startswith("nameserver")])''',
            "Completed", refused("cluster", "public", "kube_dns", "node_dns")),
    Hostile("tcp-node-apiserver-kubelet", r'''
        report(apiserver=tcp(NODE, 6443), kubelet=tcp(NODE, 10250), kubelet_ro=tcp(NODE, 10255))''',
            "Completed", refused("apiserver", "kubelet", "kubelet_ro")),
    Hostile("tcp-api-service", r'''
        report(service=tcp("10.96.0.1", 443), service_http=tcp("10.96.0.1", 80))''',
            "Completed", refused("service", "service_http")),
    Hostile("tcp-node-control-plane", r'''
        report(ports={str(p): tcp(NODE, p, 1) for p in (2379, 2380, 10257, 10259, 10249, 10256, 22, 8080)})''',
            "Completed", all_refused("ports"), limits={"timeoutSeconds": 15}),
    Hostile("tcp-bridge-gateway", r'''
        report(ports={str(p): tcp("10.88.0.1", p, 1) for p in (6443, 10250, 2379, TRAP)})''',
            "Completed", all_refused("ports")),
    Hostile("tcp-node-trap", r'''
        report(trap=tcp(NODE, TRAP), trap_udp=udp(NODE, TRAP))''',
            "Completed", refused("trap", "trap_udp")),
    Hostile("udp-node", r'''
        report(dns=udp(NODE, 53), kubelet=udp(NODE, 10250), trap=udp(NODE, TRAP), ntp=udp(NODE, 123))''',
            "Completed", refused("dns", "kubelet", "trap", "ntp"), limits={"timeoutSeconds": 15}),
    Hostile("raw-sockets", r'''
        report(icmp=attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
               raw=attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)),
               tcp=attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)),
               icmp6=attempt(lambda: socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)))''',
            "Completed", refused("icmp", "raw", "tcp", "icmp6")),
    Hostile("packet-sockets", r'''
        report(raw=attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))),
               dgram=attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(3))),
               vsock=attempt(lambda: socket.socket(40, socket.SOCK_STREAM).connect((2, 1234))))''',
            "Completed", refused("raw", "dgram", "vsock")),
    Hostile("icmp-ping-node", r'''
        def ping(host):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
            s.settimeout(2)
            s.sendto(b"\x08\x00\x00\x00\x00\x01\x00\x01coderun", (host, 0))
            s.recvfrom(64)
            return "reply"
        def tried(host):
            try:
                return ping(host)
            except BaseException as e:
                return type(e).__name__
        report(node=tried(NODE), gateway=tried("10.88.0.1"), service=tried("10.96.0.1"))''',
            "Completed", refused("node", "gateway", "service")),
    Hostile("ipv6-ping-all-nodes", r'''
        def ping():
            s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM, socket.IPPROTO_ICMPV6)
            s.settimeout(2)
            s.sendto(b"\x80\x00\x00\x00\x00\x01\x00\x01coderun", ("ff02::1", 0, 0, socket.if_nametoindex("eth0")))
            s.recvfrom(64)
            return "reply"
        def tried():
            try:
                return ping()
            except BaseException as e:
                return type(e).__name__
        report(r=tried())''',
            "Completed", refused("r")),
    Hostile("ipv6-tcp-fe80-1", r'''
        report(ports={str(p): tcp("fe80::1%eth0", p) for p in (6443, 10250, TRAP)})''',
            "Completed", all_refused("ports")),
    Hostile("ipv6-node-addresses", r'''
        tried = {}
        for a in NODE6:
            for p in (6443, 10250, TRAP):
                tried[f"tcp [{a}]:{p}"] = tcp(scoped(a), p)
            tried[f"udp [{a}]:{TRAP}"] = udp(scoped(a), TRAP)
        report(ports=tried or {"no IPv6 address on the node": "none"})''',
            "Completed", all_refused("ports")),
    Hostile("ipv6-addresses-in-sandbox", r'''
        v6 = [l.split() for l in open("/proc/net/if_inet6")] if os.path.exists("/proc/net/if_inet6") else []
        report(addrs=[a[0] for a in v6 if a[0] != "0" * 31 + "1"])''',
            "Completed", lambda s, f: f["addrs"] == []),
    # ------------------------------------------------------------------ the runner (PID 1) and its frame
    Hostile("kill-minus-one", r'''
        child = os.fork()
        if child == 0:
            time.sleep(30)
            os._exit(0)
        time.sleep(0.3)
        r = attempt(lambda: os.kill(-1, signal.SIGKILL))
        _, st = os.waitpid(child, 0)
        report(r=r, child_signal=os.WTERMSIG(st) if os.WIFSIGNALED(st) else None)''',
            {"Completed", "Signaled"}, lambda s, f: (s["reason"] == "Signaled" and s.get("signal") == 9)
            or (f["r"] == "allowed" and f["child_signal"] == 9)),
    Hostile("signals-to-pid1", r'''
        for n in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
            os.kill(1, n)
            time.sleep(0.2)
        report(alive=True)''',
            "Completed", lambda s, f: f["alive"] is True and s["exitCode"] == 0),
    Hostile("more-signals-to-pid1", r'''
        for n in (signal.SIGQUIT, signal.SIGUSR2, signal.SIGALRM, signal.SIGPIPE, signal.SIGWINCH, signal.SIGCONT,
                  signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
            os.kill(1, n)
            time.sleep(0.1)
        report(alive=True)''',
            "Completed", lambda s, f: f["alive"] is True and s["exitCode"] == 0),
    # PID 1 of the program's own namespace is the runner's init, not the runner: a signal there never reaches the
    # runner. The init ignores what it can; SIGSTOP is undone; SIGKILL ends the program's namespace (its doing).
    Hostile("sigkill-pid1", r'''
        report(pid=os.getpid(), before=True)
        os.kill(1, signal.SIGKILL)
        time.sleep(1)
        report(after=True)''',
            "Signaled", lambda s, f: f.get("pid") == 2 and "after" not in f and s["signal"] == 9),
    Hostile("sigstop-pid1", r'''
        r = attempt(lambda: os.kill(1, signal.SIGSTOP))
        time.sleep(1)
        report(r=r, alive=True)''',
            "Completed", lambda s, f: f["alive"] is True and s["exitCode"] == 0),
    Hostile("pidfd-pid1", r'''
        proc1 = os.open("/proc/1", os.O_RDONLY | os.O_DIRECTORY)
        by_proc = sysc(424, proc1, signal.SIGSTOP, 0, 0)  # pidfd_send_signal
        init = sysc(434, 1, 0)  # pidfd_open(1)
        by_open = sysc(424, init, signal.SIGSTOP, 0, 0) if init >= 0 else -1
        time.sleep(1)
        report(comm=open("/proc/1/comm").read().strip(), by_proc=by_proc, by_open=by_open, alive=True)''',
            "Completed", lambda s, f: f["alive"] is True and s["exitCode"] == 0),
    Hostile("forged-frame-exit-3", r'''
        line = "\n" + FRAME + FORGED + "\n"
        fd1 = attempt(lambda: open("/proc/1/fd/1", "w").write(line))
        for _ in range(3):
            sys.stdout.write(line)
        sys.stdout.flush()
        report(fd1=fd1, marker="REAL-OUTPUT")
        sys.exit(3)''',
            "NonZeroExit", lambda s, f: s["exitCode"] == 3 and f["fd1"] not in BREACH and f["marker"] == "REAL-OUTPUT"
            and s["stdout"] != FORGED_STDOUT),
    Hostile("forged-frame-exit-0", r'''
        bad = json.dumps({"version": 1, "reason": "Timeout", "exitCode": 124, "stdout": "FORGED-STDOUT"})
        for _ in range(3):
            print(FRAME + bad, flush=True)
        report(marker="REAL-OUTPUT")''',
            "Completed", lambda s, f: s["exitCode"] == 0 and f["marker"] == "REAL-OUTPUT" and s["stdout"] != FORGED_STDOUT),
    Hostile("forged-frame-stderr", r'''
        sys.stderr.write("\n" + FRAME + FORGED + "\n")
        fd2 = attempt(lambda: open("/proc/1/fd/2", "w").write("\n" + FRAME + FORGED + "\n"))
        report(fd2=fd2)
        sys.exit(5)''',
            "NonZeroExit", lambda s, f: s["exitCode"] == 5 and f["fd2"] not in BREACH),
    Hostile("forged-frame-partial", r'''
        report(marker="REAL-OUTPUT")
        sys.stdout.write(FRAME + FORGED[:40])
        sys.stdout.flush()
        os._exit(0)''',
            "Completed", lambda s, f: s["exitCode"] == 0 and f["marker"] == "REAL-OUTPUT"),
    Hostile("forged-frame-dev-stdout", r'''
        with open("/dev/stdout", "w") as o:
            o.write("\n" + FRAME + FORGED + "\n")
        with open("/proc/self/fd/1", "w") as o:
            o.write("\n" + FRAME + FORGED + "\n")
        report(marker="REAL-OUTPUT")
        sys.exit(7)''',
            "NonZeroExit", lambda s, f: s["exitCode"] == 7 and f["marker"] == "REAL-OUTPUT"),
    Hostile("daemon-outlives", r'''
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(1.5)
                print("LATE-OUTPUT", flush=True)
                open(os.path.join(OUT, "late.txt"), "w").write("late")
                os._exit(0)
            os._exit(0)
        report(parent="done")''',
            "Completed", lambda s, f: f["parent"] == "done" and "LATE-OUTPUT" not in s["stdout"]
            and "late.txt" not in artifact_names(s)),
    Hostile("escaped-sleeper", r'''
        if os.fork() == 0:
            os.setsid()
            for n in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
                signal.signal(n, signal.SIG_IGN)
            os.close(1)
            os.close(2)
            time.sleep(1000)
            os._exit(0)
        report(parent="done")''',
            "Completed", lambda s, f: f["parent"] == "done" and metric(s, "wallMillis") < 5000
            and finish_ms(s) < PROMPT_MS),
    Hostile("exit-255", "sys.exit(255)", "NonZeroExit", lambda s, f: s["exitCode"] == 255),
    Hostile("self-sigsegv", "os.kill(os.getpid(), signal.SIGSEGV)", "Signaled", lambda s, f: s.get("signal") == 11),
    Hostile("self-abort", "os.abort()", "Signaled", lambda s, f: s.get("signal") == 6),
    Hostile("keyboard-interrupt", "raise KeyboardInterrupt", "Signaled", lambda s, f: s.get("signal") == 2),
    Hostile("syntax-error", "x = 1\ny = (\n", "NonZeroExit",
            lambda s, f: s["exitCode"] == 1 and s["error"]["type"] == "SyntaxError" and s["error"].get("line") in (2, 3),
            raw=True),
    Hostile("recursion-error", "def f(n):\n    return f(n + 1)\nf(0)\n", "NonZeroExit",
            lambda s, f: s["error"]["type"] == "RecursionError" and s["error"].get("line") == 2, raw=True),
    Hostile("stdio-closed-then-raise", r'''
        os.close(1)
        os.close(2)
        raise ValueError("nobody hears this")''',
            "NonZeroExit", lambda s, f: s["exitCode"] == 1),
    # ------------------------------------------------------------------ processes, memory, disk, time, output
    # gc frozen so the copies share most of their pages; under gVisor each still costs a few MiB, so the bomb
    # meets the process cap or the memory limit first: either is the program's own reason, said as such
    Hostile("fork-bomb", r'''
        import gc
        gc.disable()
        gc.freeze()
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(0.05)''',
            {"ProcessLimitExceeded", "OOMKilled"}, lambda s, f: re.search("process|memory", s["message"], re.I),
            limits={"memory": "256Mi", "timeoutSeconds": 15}, slow=True),
    Hostile("process-pile-up", "os.execl('/bin/sh', 'sh', '-c', 'while :; do sleep 1000 & done')",
            "ProcessLimitExceeded", lambda s, f: "process" in s["message"].lower(),
            limits={"memory": "256Mi", "timeoutSeconds": 15}, slow=True),
    Hostile("memory-bomb", r'''
        x = []
        while True:
            x.append(b"x" * 10_000_000)''',
            "OOMKilled", lambda s, f: "memory" in s["message"].lower()),
    Hostile("memory-bomb-one-allocation", r'''
        x = b"x" * (1 << 30)
        report(size=len(x))''',
            {"OOMKilled", "NonZeroExit"}, lambda s, f: "size" not in f and (
                s["reason"] == "OOMKilled" or (s.get("error") or {}).get("type") == "MemoryError")),
    Hostile("memory-bomb-in-child", r'''
        child = os.fork()
        if child == 0:
            x = []
            while True:
                x.append(b"y" * 10_000_000)
        _, st = os.waitpid(child, 0)
        report(child_signal=os.WTERMSIG(st) if os.WIFSIGNALED(st) else None)''',
            {"OOMKilled", "Completed"}, lambda s, f: s["reason"] == "OOMKilled" or f["child_signal"] == 9),
    Hostile("tmp-fill", r'''
        f = open("/tmp/fill", "wb")
        while True:
            f.write(b"x" * 1048576)
            f.flush()''',
            "DiskLimitExceeded", lambda s, f: prompt_disk(s, f) and "disk limit" in s["message"],
            limits={"timeoutSeconds": 15}),
    Hostile("tmp-fill-many-files", r'''
        for i in range(64):
            with open(f"/tmp/part{i}", "wb") as f:
                f.write(b"x" * 1048576)
        time.sleep(30)
        report(written=64)''',
            "DiskLimitExceeded", prompt_disk, limits={"timeoutSeconds": 15}),
    Hostile("tmp-fill-unlinked", r'''
        held = []
        for i in range(4):
            f = open(f"/tmp/hidden{i}", "wb")
            os.unlink(f"/tmp/hidden{i}")
            f.write(b"x" * (8 * 1048576))
            f.flush()
            held.append(f)
        time.sleep(30)
        report(written=32)''',
            # /tmp's tmpfs refuses the page past the limit (ENOSPC): the program's write fails and it exits, and
            # its unlinked files go with it, so the runner finds /tmp under the limit again: the kernel's refusal
            # is the containment, and the program's own error says so
            {"DiskLimitExceeded", "NonZeroExit"}, lambda s, f: prompt_disk(s, f) and (
                s["reason"] == "DiskLimitExceeded" or "No space left" in (s.get("error") or {}).get("message", "")),
            limits={"timeoutSeconds": 15}),
    Hostile("workdir-fill", r'''
        for i in range(8):
            with open(f"fill{i}.bin", "wb") as f:
                f.write(b"x" * (4 * 1048576))
        time.sleep(30)
        report(written=32, cwd=os.getcwd())''',
            "DiskLimitExceeded", prompt_disk, limits={"timeoutSeconds": 15}),
    Hostile("outputs-fill", r'''
        for i in range(8):
            with open(os.path.join(OUT, f"fill{i}.bin"), "wb") as f:
                f.write(b"x" * (4 * 1048576))
        time.sleep(30)
        report(written=32)''',
            "DiskLimitExceeded", prompt_disk, limits={"timeoutSeconds": 15}),
    Hostile("inode-flood", r'''
        os.makedirs("/tmp/i", exist_ok=True)
        for i in range(100000):
            open(f"/tmp/i/{i}", "w").close()
        report(written=100000)''',
            "DiskLimitExceeded", lambda s, f: "written" not in f and re.search("file|inode", s["message"], re.I),
            limits={"timeoutSeconds": 15, "cpu": "500m"}),
    Hostile("inode-flood-dirs", r'''
        for i in range(100000):
            os.mkdir(f"/tmp/d{i}")
        report(written=100000)''',
            # each directory also takes bytes: the byte limit or the inode cap, whichever comes first
            "DiskLimitExceeded", lambda s, f: "written" not in f and re.search("file|inode|director|bytes", s["message"], re.I),
            limits={"timeoutSeconds": 15, "cpu": "500m"}),
    Hostile("dev-shm-fill", r'''
        total, err = 0, None
        try:
            with open("/dev/shm/fill", "wb") as f:
                for _ in range(200):
                    f.write(b"x" * 1048576)
                    total += 1048576
        except OSError as e:
            err = type(e).__name__
        report(total=total, err=err)''',
            {"Completed", "OOMKilled", "DiskLimitExceeded"},
            lambda s, f: s["reason"] != "Completed" or f["total"] < 128 * 1048576),
    Hostile("termination-log-flood", r'''
        total = 0
        f = open("/dev/termination-log", "wb", buffering=0)
        for _ in range(128):
            f.write(b"x" * 1048576)
            total += 1048576
            print(json.dumps({"written_mib": total >> 20}), flush=True)
        report(done=True)''',
            "SandboxViolation", lambda s, f: "termination" in s["message"] and "done" not in f
            and f.get("written_mib", 0) <= DISK_LIMIT >> 20),
    Hostile("termination-log-forge", r'''
        open("/dev/termination-log", "w").write(FRAME + FORGED)
        report(wrote=True)''',
            "SandboxViolation", lambda s, f: "termination" in s["message"] and s["stdout"] != FORGED_STDOUT),
    Hostile("cpu-burn", "while True:\n    pass", "Timeout",
            lambda s, f: metric(s, "wallMillis") < 9000, limits={"timeoutSeconds": 5}, slow=True),
    Hostile("cpu-burn-children", r'''
        for _ in range(3):
            if os.fork() == 0:
                os.setsid()
                while True:
                    pass
        while True:
            pass''',
            "Timeout", lambda s, f: metric(s, "wallMillis") < 9000, limits={"timeoutSeconds": 5}, slow=True),
    Hostile("sleep-forever", "time.sleep(10 ** 6)", "Timeout",
            lambda s, f: metric(s, "wallMillis") < 9000, limits={"timeoutSeconds": 5}, slow=True),
    Hostile("sleep-ignoring-signals", r'''
        for n in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGXCPU):
            signal.signal(n, signal.SIG_IGN)
        while True:
            time.sleep(1)''',
            "Timeout", lambda s, f: metric(s, "wallMillis") < 9000, limits={"timeoutSeconds": 5}, slow=True),
    Hostile("stdout-flood", "while True:\n    sys.stdout.write('x' * 65536)", "OutputLimitExceeded",
            lambda s, f: s["stdoutTruncated"] and 0 < len(s["stdout"]) <= 65536),
    Hostile("stderr-flood", "while True:\n    sys.stderr.write('y' * 65536)", "OutputLimitExceeded",
            lambda s, f: s["stderrTruncated"] and 0 < len(s["stderr"]) <= 65536),
    Hostile("flood-from-child", r'''
        child = os.fork()
        if child == 0:
            while True:
                os.write(1, b"z" * 65536)
        os.waitpid(child, 0)''',
            "OutputLimitExceeded", lambda s, f: s["stdoutTruncated"] and len(s["stdout"]) <= 65536),
    Hostile("flood-newlines-both", r'''
        while True:
            sys.stdout.write("\n" * 4096)
            sys.stderr.write("\n" * 4096)''',
            "OutputLimitExceeded", lambda s, f: s["stdoutTruncated"] or s["stderrTruncated"]),
    Hostile("output-just-over-cap", "sys.stdout.write('o' * 70000)", "Completed",
            lambda s, f: s["stdoutTruncated"] and s["stdoutBytes"] == 70000 and s["stdout"] == "o" * len(s["stdout"])
            and 0 < len(s["stdout"]) <= 65536),
    # ------------------------------------------------------------------ artifacts
    # (the default caps with the chart's store: 5 MiB a file, 5 MiB in all, 16 files: docs/data.md)
    Hostile("huge-artifact", r'''
        open(os.path.join(OUT, "big.bin"), "wb").write(b"x" * 6_000_000)
        open(os.path.join(OUT, "ok.txt"), "w").write("ok")''',
            "Completed", lambda s, f: skipped(s).get("big.bin") == "too-large" and artifact_names(s) == ["ok.txt"]),
    Hostile("many-artifacts", r'''
        for i in range(300):
            open(os.path.join(OUT, f"a{i:03}"), "w").write("x")''',
            "Completed", lambda s, f: 0 < len(artifact_names(s)) <= 16 and len(s["artifactsSkipped"]) <= 64
            and len(artifact_names(s)) + len(s["artifactsSkipped"]) + s.get("artifactsSkippedUnlisted", 0) == 300),
    Hostile("artifacts-total-too-large", r'''
        for i in range(4):
            open(os.path.join(OUT, f"part{i}"), "wb").write(bytes([65 + i]) * 2_000_000)''',
            "Completed", lambda s, f: sum(a["size"] for a in s["artifacts"]) <= 5 * 1024 * 1024
            and "total-too-large" in skipped(s).values()),
    Hostile("symlink-out-passwd", r'''
        os.symlink("/etc/passwd", os.path.join(OUT, "passwd"))
        os.symlink("/proc/1/environ", os.path.join(OUT, "environ"))''',
            "Completed", lambda s, f: skipped(s) == {"environ": "symlink", "passwd": "symlink"}
            and not artifact_names(s) and not passwd_leaked(s)),
    Hostile("symlink-dir-out", r'''
        os.symlink("/etc", os.path.join(OUT, "etc"))
        os.symlink(".", os.path.join(OUT, "loop"))''',
            "Completed", lambda s, f: skipped(s).get("etc") == "symlink" and not artifact_names(s)
            and not passwd_leaked(s)),
    Hostile("outputs-dir-replaced-by-symlink", r'''
        os.rmdir(OUT)
        os.symlink("/etc", OUT)''',
            "Completed", lambda s, f: not artifact_names(s) and not passwd_leaked(s)),
    Hostile("hardlink-out", r'''
        report(link=attempt(lambda: os.link("/etc/passwd", os.path.join(OUT, "passwd"))))''',
            "Completed", lambda s, f: f["link"] not in BREACH and not passwd_leaked(s)),
    Hostile("fifo-and-socket-artifacts", r'''
        os.mkfifo(os.path.join(OUT, "pipe"))
        u = socket.socket(socket.AF_UNIX)
        u.bind(os.path.join(OUT, "sock"))
        open(os.path.join(OUT, "ok.txt"), "w").write("ok")''',
            "Completed", lambda s, f: artifact_names(s) == ["ok.txt"]
            and skipped(s) == {"pipe": "not-a-regular-file", "sock": "not-a-regular-file"}),
    Hostile("long-artifact-path", f'''
        p = os.path.join({LONG_DIRS}, "f.txt")
        os.makedirs(os.path.dirname(p))
        open(p, "w").write("deep")
        report(length=len(p) - len(OUT) - 1)''',
            "Completed", lambda s, f: f["length"] > 1024 and len(artifact_names(s)) + len(skipped(s)) == 1
            and all(len(n) <= 1024 for n in artifact_names(s) + list(skipped(s)))),
    Hostile("artifact-names-odd", r'''
        for n in ("-rf", "a b", "..x", "ünï", "x" * 250, ".hidden"):
            open(os.path.join(OUT, n), "w").write(n)''',
            "Completed", lambda s, f: len(artifact_names(s)) + len(skipped(s)) == 6
            and all(re.fullmatch(r"[-._a-zA-Z0-9]+", a["key"]) and len(a["key"]) <= 253 for a in s["artifacts"])),
    # ------------------------------------------------------------------ bytes the operator must carry
    Hostile("non-utf8-stdout", r'''
        sys.stdout.buffer.write(b"\xff\xfe\xfd ok \xc3\x28 \xed\xa0\x80 end\n")''',
            "Completed", lambda s, f: "ok" in s["stdout"] and "end" in s["stdout"]),
    Hostile("nul-bytes-stdout", r'''
        sys.stdout.buffer.write(b"a\x00b\x00c\n")
        sys.stderr.buffer.write(b"e\x00f\n")''',
            "Completed", lambda s, f: s["stdout"].startswith("a") and "c" in s["stdout"] and "f" in s["stderr"]),
    Hostile("separators-stdout-stderr", r'''
        print("a\u2028b\u2029c\x85d")
        print("e\u2028f\u2029g\x85h", file=sys.stderr)''',
            "Completed", lambda s, f: s["stdout"] == "a\u2028b\u2029c\x85d\n" and s["stderr"] == "e\u2028f\u2029g\x85h\n"),
    Hostile("separators-exit-4", r'''
        print("p\u2028q\u2029r\x85s")
        sys.exit(4)''',
            "NonZeroExit", lambda s, f: s["exitCode"] == 4 and s["stdout"] == "p\u2028q\u2029r\x85s\n"),
    Hostile("separators-exception", "raise ValueError('x\\u2028y\\u2029z\\x85w')", "NonZeroExit",
            lambda s, f: s["error"]["type"] == "ValueError" and "x\u2028y\u2029z\x85w" in s["error"]["message"]),
    Hostile("separators-artifact-name", r'''
        open(os.path.join(OUT, "n\u2028m\u2029o\x85p"), "w").write("x")''',
            "Completed", lambda s, f: artifact_names(s) == ["n\u2028m\u2029o\x85p"]),
    # The third attack: an error parsed from stderr whatever the exit status gave a successful run a status.error,
    # which every client renders. Only a failed run's stderr is parsed.
    Hostile("forged-traceback-then-success", r'''
        sys.stderr.write('Traceback (most recent call last):\n  File "/tmp/work/main.py", line 1, in <module>\n'
                         'SecurityViolation: the sandbox was breached\n')
        print("fine")''',
            "Completed", lambda s, f: s["exitCode"] == 0 and not s.get("error") and "SecurityViolation" in s["stderr"]),
    Hostile("forged-artifact-name-escapes", r'''
        open(os.path.join(OUT, "plot.png\x1b]0;pwned\x07\r\x1b[2Kcoderun: exit code 0 (Completed)"), "w").write("x")
        sys.exit(3)''',
            "NonZeroExit", lambda s, f: s["exitCode"] == 3 and len(artifact_names(s)) == 1
            and artifact_names(s)[0].startswith("plot.png")),
    Hostile("long-exception-message", "raise ValueError('m' * 10000)", "NonZeroExit",
            lambda s, f: 0 < len(s["error"]["message"]) <= 4096 and s["error"]["type"] == "ValueError"),
    Hostile("long-exception-type", "raise type('E' * 1000, (Exception,), {})('boom')", "NonZeroExit",
            lambda s, f: 0 < len(s["error"]["type"]) <= 256 and s["error"]["type"].startswith("EEEE")),
    Hostile("huge-line-number", r'''
        sys.stderr.write('Traceback (most recent call last):\n  File "/tmp/work/main.py", line '
                         '99999999999999999999999, in <module>\nValueError: forged\n')
        sys.exit(1)''',
            "NonZeroExit", lambda s, f: s["exitCode"] == 1 and (
                not s.get("error") or s["error"].get("line") is None or 0 < s["error"]["line"] < 2 ** 63)),
    Hostile("control-characters-stdout", r'''
        sys.stdout.write((CONTROL * 9000)[:262144])''',
            "Completed", lambda s, f: len(s.get("stdout") or "") >= 1024 and s["stdoutBytes"] == 262144,
            limits={"outputBytes": 262144}),
    Hostile("control-characters-both", r'''
        sys.stdout.write((CONTROL * 9000)[:262144])
        sys.stderr.write((CONTROL * 9000)[:262144])''',
            "Completed", lambda s, f: len(s.get("stdout") or "") >= 1024 and len(s.get("stderr") or "") > 0,
            limits={"outputBytes": 262144}),
    # ------------------------------------------------------------------ output against validation and redaction
    Hostile("schema-5000-digit-integer", "print('9' * 5000)", "Completed",
            lambda s, f: isinstance((s.get("validation") or {}).get("valid"), bool)
            and (s["validation"]["valid"] or errors(s).strip()) and finish_ms(s) < PROMPT_MS,
            spec={"expect": {"stdoutJSONSchema": {"type": "integer"}}}),
    Hostile("schema-deep-nesting", "print('[' * 100000)", "Completed",
            lambda s, f: s["validation"]["valid"] is False
            and re.search(r"cannot|could not|not be checked|too deep|nest", errors(s), re.I)
            and finish_ms(s) < PROMPT_MS,
            spec={"expect": {"stdoutJSONSchema": {"type": "array"}}}, limits={"outputBytes": 131072}),
    Hostile("schema-unresolvable-ref", "print(1)", "Completed",
            lambda s, f: s["validation"]["valid"] is False and ("#/$defs/missing" in errors(s) or "$ref" in errors(s))
            and finish_ms(s) < PROMPT_MS,
            spec={"expect": {"stdoutJSONSchema": {"$ref": "#/$defs/missing"}}}),
    Hostile("schema-remote-ref-metadata", "print(1)", "Completed",
            lambda s, f: s["validation"]["valid"] is False and (METADATA_V4 in errors(s) or "$ref" in errors(s))
            and finish_ms(s) < PROMPT_MS,
            spec={"expect": {"stdoutJSONSchema": {"$ref": f"http://{METADATA_V4}/latest/meta-data/schema.json"}}}),
    Hostile("schema-self-ref-loop", "print(1)", "Completed",
            lambda s, f: s.get("validation") is not None and finish_ms(s) < PROMPT_MS,
            spec={"expect": {"stdoutJSONSchema": {"$ref": "#"}}}),
    Hostile("schema-catastrophic-pattern", "print(json.dumps('a' * 30 + '!'))", "Completed",
            lambda s, f: s["validation"]["valid"] is False and finish_ms(s) < PROMPT_MS,
            spec={"expect": {"stdoutJSONSchema": {"type": "string", "pattern": "^(a+)+$"}}}),
    Hostile("schema-catastrophic-pattern-properties", "print(json.dumps({'a' * 30 + '!': 1}))", "Completed",
            lambda s, f: s.get("validation") is not None and finish_ms(s) < PROMPT_MS,
            spec={"expect": {"stdoutJSONSchema": {"type": "object", "patternProperties": {"^(a+)+$": {"type": "string"}},
                                                  "additionalProperties": False}}}),
    Hostile("schema-unique-items-quadratic", "print(json.dumps([[i] for i in range(20000)]))", "Completed",
            lambda s, f: s.get("validation") is not None and finish_ms(s) < PROMPT_MS,
            spec={"expect": {"stdoutJSONSchema": {"type": "array", "uniqueItems": True}}},
            limits={"outputBytes": 262144}),
    Hostile("schema-multipleof-infinity", "print('1e400')", "Completed",
            lambda s, f: s.get("validation") is not None and finish_ms(s) < PROMPT_MS,
            spec={"expect": {"stdoutJSONSchema": {"type": "number", "multipleOf": 0.1}}}),
    Hostile("redaction-password-200k", "print('password=' + 'x' * 200000)", "Completed",
            lambda s, f: finish_ms(s) < PROMPT_MS and s["stdout"].startswith("password=")
            and "x" * 64 not in s["stdout"] and s["redactions"] >= 1,
            limits={"outputBytes": 262144}),
    Hostile("redaction-many-key-headers", "sys.stdout.write('-----BEGIN RSA PRIVATE KEY-----\\n' * 8000)", "Completed",
            lambda s, f: finish_ms(s) < PROMPT_MS and s["redactions"] >= 1, limits={"outputBytes": 262144}),
    Hostile("redaction-near-misses", "sys.stdout.write(('ghp_' + 'a' * 35 + ' AKIA' + 'B' * 15 + ' sk-' + 'c' * 19 + ' ') * 3000)",
            "Completed", lambda s, f: finish_ms(s) < PROMPT_MS and len(s["stdout"]) > 0, limits={"outputBytes": 262144}),
    Hostile("secret-stdout", "print('key', AWS, 'and token', GHP)", "Completed",
            lambda s, f: s["stdout"].startswith("key ") and s["redactions"] >= 2, secret=True),
    Hostile("secret-stderr", "print('token', GHP, AWS, file=sys.stderr)", "Completed",
            lambda s, f: s["redactions"] >= 2, secret=True),
    Hostile("secret-exception-message", "raise RuntimeError('leaked ' + AWS + ' ' + GHP)", "NonZeroExit",
            lambda s, f: s["error"]["type"] == "RuntimeError" and s["redactions"] >= 2, secret=True),
    Hostile("secret-exception-type", "raise type(AWS, (Exception,), {})('boom')", "NonZeroExit",
            lambda s, f: s["redactions"] >= 1, secret=True),
    Hostile("secret-artifact-name", r'''
        open(os.path.join(OUT, "k " + AWS + ".txt"), "w").write("x")
        open(os.path.join(OUT, "g " + GHP + ".txt"), "w").write("y")''',
            "Completed", lambda s, f: len(s["artifacts"]) == 2 and s["redactions"] >= 2, secret=True),
    Hostile("secret-skipped-artifact-name", r'''
        os.symlink("/etc/hostname", os.path.join(OUT, "s " + GHP))
        os.mkfifo(os.path.join(OUT, "f " + AWS))''',
            "Completed", lambda s, f: len(skipped(s)) == 2 and s["redactions"] >= 2, secret=True),
    Hostile("secret-cut-by-stdout-cap-ghp", "print('x' * 1010 + ' ' + GHP)", "Completed",
            lambda s, f: s["stdoutTruncated"] and s["redactions"] >= 1, limits={"outputBytes": 1024}, secret=True),
    Hostile("secret-cut-by-stdout-cap-aws", "print('x' * 1013 + ' ' + AWS)", "Completed",
            lambda s, f: s["stdoutTruncated"] and s["redactions"] >= 1, limits={"outputBytes": 1024}, secret=True),
    Hostile("secret-cut-by-stderr-cap", "print('y' * 1015 + ' ' + GHP, file=sys.stderr)", "Completed",
            lambda s, f: s["stderrTruncated"] and s["redactions"] >= 1, limits={"outputBytes": 1024}, secret=True),
    Hostile("secret-cut-by-error-message-cap", "raise ValueError('m' * 4085 + ' ' + GHP)", "NonZeroExit",
            lambda s, f: s["error"]["type"] == "ValueError" and s["redactions"] >= 1, secret=True),
    Hostile("secret-cut-by-artifact-name-cap", r'''
        d = os.path.join(OUT, *(["d" * 200] * 4))
        os.makedirs(d)
        name = "n" * (1024 - len(os.path.relpath(d, OUT)) - 1 - 14) + " " + GHP
        open(os.path.join(d, name), "w").write("x")''',
            "Completed", lambda s, f: s["redactions"] >= 1, secret=True),
    Hostile("secret-in-validation-error", "print(json.dumps(' ' + AWS + ' ' + GHP + ' '))", "Completed",
            lambda s, f: s["validation"]["valid"] is False and s["redactions"] >= 1, secret=True,
            spec={"expect": {"stdoutJSONSchema": {"type": "integer"}}}),
    Hostile("secret-between-invalid-bytes", r'''
        sys.stdout.buffer.write(b"\xff" + AWS.encode() + b"\xfe " + GHP.encode() + b"\x00\n")''',
            "Completed", lambda s, f: s["redactions"] >= 2, secret=True),
    # ------------------------------------------------------------------ what the caller writes
    Hostile("bad-base64", "print(1)", "InvalidSpec", lambda s, f: "contentBase64" in s["message"],
            spec={"files": [{"path": "b.bin", "contentBase64": "abc"}]}, refusable="contentBase64"),
    Hostile("files-dotdot", "print(1)", "InvalidSpec", lambda s, f: "path" in s["message"],
            spec={"files": [{"path": "a/../../etc/x", "content": "x"}]}, refusable="path"),
    Hostile("file-shadows-code", "print('REAL-CODE')", {"Completed", "InvalidSpec"},
            lambda s, f: s["reason"] == "InvalidSpec" or s["stdout"] == "REAL-CODE\n",
            spec={"files": [{"path": "main.py", "content": "print('SHADOW')"}]}, refusable="main.py", raw=True),
    Hostile("code-with-nul", "print('a')\x00\nprint('b')\n", {"NonZeroExit", "InvalidSpec"},
            lambda s, f: s["reason"] == "InvalidSpec" or s["exitCode"] == 1, raw=True, refusable="code"),
    Hostile("created-at-garbage", "print('ok')", "Completed",
            lambda s, f: s["stdout"] == "ok\n" and metric(s, "queueMillis") >= 0,
            meta={"annotations": {"coderun.io/created-at": "yesterday, about noon"}}, raw=True),
    Hostile("created-at-ancient", "print('ok')", "Completed",
            lambda s, f: s["stdout"] == "ok\n" and metric(s, "totalMillis") >= 0,
            meta={"annotations": {"coderun.io/created-at": "0001-01-01T00:00:00+14:00"}}, raw=True),
    # ------------------------------------------------------------------ JavaScript
    # Short-lived children are not needed: sleepers pile up at the process cap, long before memory runs out.
    # Node's spawn costs ~30 ms under gVisor (the cap of 128 is reached after ~4 s on an idle node, later beside
    # the rest of this table), hence the longer deadline.
    Hostile("js-fork-bomb", r'''
        for (;;) {
            try {
                cp.spawn("/bin/sleep", ["1000"], {stdio: "ignore", detached: true}).on("error", () => {});
            } catch (e) {}
        }''',
            "ProcessLimitExceeded", lambda s, f: "process" in s["message"].lower(),
            limits={"memory": "256Mi", "timeoutSeconds": 45}, slow=True, language="javascript"),
    # V8's heap is sized from the memory limit: it is full near the limit (V8's own fatal error, or the kernel's
    # OOM kill first), never at V8's default of about half the limit, and either way the run is OOMKilled.
    Hostile("js-memory-bomb-heap", r'''
        const limit = Math.round(require("v8").getHeapStatistics().heap_size_limit / 1048576);
        const keep = [];
        for (let i = 0; ; i++) {
            keep.push(new Array(100000).fill(1.5));  // 0.8 MB of heap each
            if (i % 20 === 0) report({limit, used: Math.round(process.memoryUsage().heapUsed / 1048576)});
        }''',
            "OOMKilled", lambda s, f: "memory" in s["message"].lower() and s.get("signal") in (None, 6, 9)
            and f["limit"] >= 0.8 * 256 and f["used"] > 0.55 * 256, limits={"memory": "256Mi"}, language="javascript"),
    # Buffers live outside V8's heap, so no heap limit stops them: the sandbox's memory does. The kernel's OOM
    # killer ends gVisor's Sentry, and where containerd's OOM event trails the sandbox's exit (the kubelet then
    # says Error, exit code 128) the node's audit agent, which read the pod's OOM kill count when the sandbox
    # ended, says memory (coderun/audit/oom.py): OOMKilled either way, never InternalError.
    Hostile("js-memory-bomb-buffers", r'''
        const keep = [];
        for (;;) keep.push(Buffer.alloc(10 << 20, 1));''',
            "OOMKilled", lambda s, f: "memory" in s["message"].lower(), limits={"memory": "128Mi"},
            language="javascript"),
    # Every worker is a thread with a V8 isolate of its own: memory runs out before the thread cap (RLIMIT_NPROC).
    # Workers keep starting (two per turn of the event loop, so they do start) and each fills memory of its own:
    # the memory worker threads use counts against the run like the main thread's. A worker takes seconds to start
    # under gVisor at this CPU, so the flood meets the memory limit or the deadline first (3 tries on the cluster:
    # OOMKilled once, Timeout twice); either way it ends within its limits and nothing else.
    Hostile("js-worker-flood", r'''
        const { Worker } = require("worker_threads");
        const flood = () => {
            for (let i = 0; i < 2; i++)
                new Worker("const keep = []; for (;;) keep.push(Buffer.alloc(4 << 20, 1));", {eval: true});
            setImmediate(flood);
        };
        flood();''',
            {"OOMKilled", "Timeout"}, lambda s, f: s["reason"] == "Timeout" or "memory" in s["message"].lower(),
            language="javascript"),
    # A Node error report on stderr, then exit 0: a successful run, with no status.error.
    Hostile("js-forged-error-then-success", r'''
        fs.writeSync(2, "/tmp/work/main.js:1\nthrow new SecurityViolation();\n^\n\nSecurityViolation: breached\n" +
                        "    at Object.<anonymous> (/tmp/work/main.js:1:7)\n\nNode.js v20.19.2\n");
        report({done: true});''',
            "Completed", lambda s, f: f["done"] is True and s["exitCode"] == 0 and not s.get("error")
            and "SecurityViolation" in s["stderr"], language="javascript"),
    # PID 1 of the program's namespace is the runner's init: catchable signals are ignored, SIGSTOP is undone.
    Hostile("js-signals-to-init", r'''
        const sent = {};
        for (const name of ["SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT", "SIGSTOP", "SIGCONT"]) {
            sent[name] = attempt(() => process.kill(1, name));
            sleep(100);
        }
        report({sent, alive: true, pid: process.pid});''',
            "Completed", lambda s, f: f["alive"] is True and f["pid"] == 2 and s["exitCode"] == 0,
            language="javascript"),
    Hostile("js-sigkill-init", r'''
        report({pid: process.pid, before: true});
        process.kill(1, "SIGKILL");
        sleep(1000);
        report({after: true});''',
            "Signaled", lambda s, f: f.get("pid") == 2 and "after" not in f and s["signal"] == 9,
            language="javascript"),
    # Node's internal bindings are the same process with the same uid, filter and namespaces: no way around them.
    Hostile("js-process-binding", r'''
        const bindings = {};
        for (const name of ["fs", "natives", "spawn_sync", "process_wrap", "os", "tcp_wrap", "pipe_wrap", "v8"]) {
            bindings[name] = attempt(() => process.binding(name));
        }
        const id = cp.spawnSync("/usr/bin/id", ["-u"]);  // the public face of the spawn_sync binding
        report({bindings, spawn_uid: id.stdout ? id.stdout.toString().trim() : String(id.error),
                shadow: attempt(() => fs.readFileSync("/etc/shadow")),
                proc_sys: attempt(() => fs.writeFileSync("/proc/sys/kernel/hostname", "x"))});''',
            "Completed", lambda s, f: f["spawn_uid"] == "65532" and refused("shadow", "proc_sys")(s, f),
            language="javascript"),
    Hostile("js-setuid", r'''
        report({uid: attempt(() => process.setuid(0)), gid: attempt(() => process.setgid(0)),
                euid: attempt(() => process.seteuid(0)), egid: attempt(() => process.setegid(0)),
                groups: attempt(() => process.setgroups([0])), now: process.getuid()});''',
            "Completed", lambda s, f: refused("uid", "gid", "euid", "egid", "groups")(s, f) and f["now"] == 65532,
            language="javascript"),
    Hostile("js-proc-1", r'''
        report({environ: attempt(() => fs.readFileSync("/proc/1/environ")),
                root: attempt(() => fs.readdirSync("/proc/1/root")), cwd: attempt(() => fs.readdirSync("/proc/1/cwd")),
                maps: attempt(() => fs.readFileSync("/proc/1/maps")), mem: attempt(() => fs.openSync("/proc/1/mem", "r")),
                stdout: attempt(() => fs.openSync("/proc/1/fd/1", "w")),
                pids: fs.readdirSync("/proc").filter((p) => /^\d+$/.test(p)).map(Number)});''',
            # /proc/1 is the runner's init, not dumpable: the same uid may not open what it holds
            "Completed", lambda s, f: refused("environ", "root", "cwd", "maps", "mem", "stdout")(s, f)
            and 1 in f["pids"] and len(f["pids"]) <= 3, language="javascript"),
    Hostile("big-spec-700k", r'''
        import glob
        sizes = [len(open(p).read()) for p in sorted(glob.glob("data/*.txt"))]
        report(sizes=sizes, stdin=len(sys.stdin.read()), code=len(open(sys.argv[0]).read()))''',
            "Completed", lambda s, f: f["sizes"] == [250 * 1024] * 2 and f["stdin"] == 60 * 1024
            and f["code"] > 120 * 1024,
            spec={"files": [{"path": f"data/{i}.txt", "content": "z" * (250 * 1024)} for i in range(2)],
                  "stdin": "s" * (60 * 1024)}, pad_code_to=128 * 1024 - 64),
]
SECRET_IDS = {h.id for h in PROGRAMS if h.secret}


# ---------------------------------------------------------------------------------------------------- machinery
def _phase_for(reason: str) -> str:
    if reason == "Completed":
        return "Succeeded"
    return "Rejected" if reason in ("InvalidSpec", "PolicyDenied") else "Failed"


def _millicpu(h: Hostile) -> int:
    return millicpu({**SMALL, **h.limits}["cpu"]) + OVERHEAD_MILLICPU


def batches(programs: list[Hostile], room: int = BATCH_MILLICPU) -> list[list[Hostile]]:
    """Quick programs first, those that run to a deadline last, packed to `room` millicores of requests each."""
    out: list[list[Hostile]] = [[]]
    for h in sorted(programs, key=lambda x: x.slow):
        if out[-1] and (sum(map(_millicpu, out[-1])) + _millicpu(h) > room
                        or out[-1][-1].slow != h.slow):
            out.append([])
        out[-1].append(h)
    return out


def _spec(h: Hostile, header: str) -> dict:
    code = textwrap.dedent(h.code).lstrip("\n")
    if h.language == "javascript":
        code = JS_PRELUDE + code
    elif not h.raw:
        code = header + PRELUDE + code
    if h.pad_code_to:
        code += "\n#" + "p" * (h.pad_code_to - len(code) - 3) + "\n"
    return {"language": h.language, "code": code, "limits": {**SMALL, **h.limits}, **h.spec}


class HostTrap:
    """TCP and UDP listeners on the node's own addresses (IPv4 and IPv6), on one port: whatever a sandbox gets
    through to the node is recorded here (and a datagram is echoed, so the sender would see a reply)."""

    def __init__(self, ipv4: str):
        self.hits: list[tuple] = []
        self.stop = threading.Event()
        for _ in range(20):
            socks: list[socket.socket] = []
            try:
                t4 = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(t4)
                t4.bind((ipv4, 0))
                self.port = t4.getsockname()[1]
                u4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(u4)
                u4.bind((ipv4, self.port))
                if socket.has_ipv6:
                    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                        s6 = socket.socket(socket.AF_INET6, kind)
                        socks.append(s6)
                        s6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                        s6.bind(("::", self.port))
                break
            except OSError:
                for s in socks:
                    s.close()
        else:
            raise AssertionError("could not bind the host trap")
        self.socks = socks
        for s in socks:
            if s.type == socket.SOCK_STREAM:
                s.listen(16)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            readable, _, _ = select.select(self.socks, [], [], 0.2)
            for s in readable:
                try:
                    if s.type == socket.SOCK_STREAM:
                        conn, peer = s.accept()
                        self.hits.append(("tcp", peer))
                        conn.close()
                    else:
                        data, peer = s.recvfrom(2048)
                        self.hits.append(("udp", peer, data[:40]))
                        s.sendto(data, peer)
                except OSError as e:
                    self.hits.append(("error", repr(e)))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for s in self.socks:
            s.close()


@dataclass
class SuiteResult:
    namespace: str
    statuses: dict[str, dict] = field(default_factory=dict)
    refused: dict[str, ApiException] = field(default_factory=dict)
    stuck: dict[str, str] = field(default_factory=dict)
    lingering: dict[str, list[str]] = field(default_factory=dict)
    canaries: list[tuple] = field(default_factory=list)
    health: list[tuple[float, str]] = field(default_factory=list)
    trap_hits: list[tuple] = field(default_factory=list)
    standins: StandinHits | None = None  # from the suite's start
    log: str = ""
    seconds: float = 0.0
    batches: int = 0


# The poller is a process of its own: a thread of this one shares its interpreter with the batches' and the
# canary's threads, so a slow answer could be this process's turn for the GIL rather than the operator's.
HEALTH_POLLER = r"""
import sys, time, urllib.request
while True:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
            r.read()
            outcome = str(r.status)
    except Exception as e:
        outcome = repr(e)[:120].replace("\n", " ")
    print(f"{time.monotonic() - started:.4f} {outcome}", flush=True)
    time.sleep(0.25)
"""


def _watch_health(healthz: str, stop: threading.Event, out: list) -> None:
    poller = subprocess.Popen([sys.executable, "-c", HEALTH_POLLER, healthz], stdout=subprocess.PIPE, text=True)
    threading.Thread(target=lambda: (stop.wait(), poller.terminate()), daemon=True).start()
    for line in poller.stdout:
        seconds, _, outcome = line.rstrip("\n").partition(" ")
        out.append((float(seconds), outcome))
    poller.wait()


def _where_the_time_went(run: dict) -> dict:
    """A slow canary's breakdown: created -> sandbox pod (startTime) -> finished (completionTime), and the mode."""
    status = run["status"]
    stamps = [run["metadata"].get("creationTimestamp"), status.get("startTime"), status.get("completionTime")]
    at = [parse_timestamp(s) for s in stamps]
    gap = lambda a, b: round((b - a).total_seconds(), 1) if a and b else None  # noqa: E731
    return {"startMode": status.get("startMode"), "toPod": gap(at[0], at[1]), "podToEnd": gap(at[1], at[2]),
            "wallMillis": (status.get("metrics") or {}).get("wallMillis")}


def _canaries(cluster, namespace: str, stop: threading.Event, out: list) -> None:
    spec = {"language": "python", "code": "print(6*7)",
            "limits": {"cpu": "250m", "memory": "128Mi", "timeoutSeconds": 10}}
    n = 0
    while not stop.is_set():
        name, n = f"canary-{n}", n + 1
        started = time.monotonic()
        try:
            cluster.create_run(namespace, spec, name=name)
            run = cluster.wait_run(namespace, name, timeout=120)
            status = run["status"]
            out.append((name, status.get("phase"), status.get("reason"), status.get("stdout"),
                        round(time.monotonic() - started, 1), _where_the_time_went(run)))
        except Exception as e:  # noqa: BLE001 - recorded and asserted by the canary test
            out.append((name, "error", repr(e)[:300], None, round(time.monotonic() - started, 1), {}))
        stop.wait(CANARY_PAUSE)


def _run_batch(cluster, result: SuiteResult, batch: list[Hostile], header: str) -> None:
    ns = result.namespace
    created: list[str] = []
    for h in batch:
        try:
            cluster.create_run(ns, _spec(h, header), name=h.id, **h.meta)
            created.append(h.id)
        except ApiException as e:
            result.refused[h.id] = e
    within = max({**SMALL, **h.limits}["timeoutSeconds"] for h in batch) + BATCH_GRACE

    def all_terminal() -> bool:
        items = cluster.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
        for run in items:
            name, status = run["metadata"]["name"], run.get("status") or {}
            if name in created and name not in result.statuses and status.get("phase") in TERMINAL:
                result.statuses[name] = status
        return all(name in result.statuses for name in created)

    try:
        wait_for(all_terminal, within, "a batch of hostile runs to finish", interval=0.5)
    except AssertionError:
        for name in created:
            if name not in result.statuses:
                status = cluster.get_run(ns, name).get("status") or {}
                result.stuck[name] = (f"not terminal {within}s after creation: phase={status.get('phase')} "
                                      f"reason={status.get('reason')} message={status.get('message')}")
                cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)

    def pods_of_batch() -> dict[str, list[str]]:
        pods = cluster.core.list_namespaced_pod(ns).items
        return {run: [p.metadata.name for p in pods if (p.metadata.labels or {}).get("coderun.io/run") == run]
                for run in created if run in result.statuses}

    try:  # the node's room is the next batch's (and the canary's): every finished run's pod must go
        wait_for(lambda: not any(pods_of_batch().values()), 60, "the batch's sandbox pods to be deleted")
    except AssertionError:
        result.lingering.update({k: v for k, v in pods_of_batch().items() if v})


@pytest.fixture(scope="module")
def hostile(operator) -> SuiteResult:
    cluster = operator
    namespace = f"e2e-hostile-{int(time.time()) % 100000}"
    cluster.core.create_namespace({"metadata": {"name": namespace, "labels": NAMESPACE_LABELS}})
    if WARM_MODE:  # a pool whose pods have the suite's SMALL limits, so its runs (not those asking more) go warm
        apply_warm_pool(cluster, namespace, WARM_POOL, defaults={k: v for k, v in SMALL.items() if k != "timeoutSeconds"})
    result = SuiteResult(namespace=namespace)
    log_start = cluster.operator.log_mark()
    result.standins = StandinHits()
    node = cluster.node_ip()
    trap = HostTrap(node)
    header = (f"NODE = {node!r}\nNODE6 = {cluster.node_ipv6_addresses()!r}\nTRAP = {trap.port!r}\n"
              f"AWS = {AWS!r}\nGHP = {GHP!r}\nFRAME = {FRAME_PREFIX!r}\nFORGED = {FORGED!r}\n"
              f"CONTROL = {CONTROL!r}\nHOST_KERNEL = {HOST_KERNEL!r}\nimport re\n")
    stop = threading.Event()
    watchers = [threading.Thread(target=_watch_health, args=(cluster.operator.healthz_url(), stop, result.health),
                                 daemon=True),
                threading.Thread(target=_canaries, args=(cluster, namespace, stop, result.canaries), daemon=True)]
    for t in watchers:
        t.start()
    started = time.monotonic()
    try:
        # The pods of the tests before (a warm pass's pools) may still be terminating: wait until they are gone.
        need = max(map(_millicpu, PROGRAMS))
        room = wait_for(lambda: (r := min(BATCH_MILLICPU, cluster.free_millicpu() - CANARY_MILLICPU)) >= need and r,
                        120, f"{need}m of CPU free beside the canary for the table (earlier tests' pods to go)")
        plan = batches(PROGRAMS, room)
        for batch in plan:
            _run_batch(cluster, result, batch, header)
        result.batches = len(plan)
        result.seconds = time.monotonic() - started
        # the canary runs beside the table, not after it: it needs only to have done its rounds meanwhile
        wait_for(lambda: len(result.canaries) >= MIN_CANARIES, 120, f"{MIN_CANARIES} canary runs")
    finally:
        stop.set()
        for t in watchers:
            t.join(130)
        trap.close()
        result.trap_hits = list(trap.hits)
        result.log = cluster.operator.log_since(log_start)
    yield result
    count_start_modes(cluster, namespace)
    cluster.core.delete_namespace(namespace, propagation_policy="Background")


def _summary(status: dict) -> str:
    keys = ("phase", "reason", "message", "exitCode", "signal", "error", "validation", "artifacts",
            "artifactsSkipped", "artifactsSkippedUnlisted", "redactions", "metrics", "stdoutBytes", "stdoutTruncated")
    out = {k: str(status.get(k))[:400] for k in keys if k in status}
    out["stdout_tail"] = (status.get("stdout") or "")[-300:]
    out["stderr_tail"] = (status.get("stderr") or "")[-300:]
    return json.dumps(out, ensure_ascii=True)


# ---------------------------------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("h", PROGRAMS, ids=[h.id for h in PROGRAMS])
def test_hostile_program_is_contained_with_an_accurate_reason(hostile: SuiteResult, h: Hostile, operator):
    if h.id in hostile.refused:
        e = hostile.refused[h.id]
        assert h.refusable and e.status == 422 and h.refusable in (e.body or ""), \
            f"refused at create: {e.status} {str(e.body)[:600]}"
        return
    assert h.id not in hostile.stuck, hostile.stuck.get(h.id)
    status = hostile.statuses[h.id]
    summary = _summary(status)
    allowed = {h.reason} if isinstance(h.reason, str) else h.reason
    assert status.get("reason") in allowed, f"expected {sorted(allowed)}; status: {summary}"
    assert status.get("phase") == _phase_for(status["reason"]), summary
    assert status.get("message"), summary
    facts = facts_of(status)
    try:
        ok = h.check(status, facts)
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as e:
        ok, summary = False, f"{type(e).__name__}: {e}; {summary}"
    assert ok, f"containment/detail check failed; facts={json.dumps(facts)[:800]} status={summary}"
    if h.secret:
        assert not leaked(status), f"secret fragments in the status: {leaked(status)}; status: {summary}"
        for artifact in status.get("artifacts") or []:
            cm = operator.core.read_namespaced_config_map(artifact["configMap"], hostile.namespace)
            keys = " ".join(list((cm.binary_data or {}).keys()) + list((cm.data or {}).keys()))
            assert not [s for s in SECRETS if s[:12] in keys], f"a secret in the artifacts ConfigMap's keys: {keys}"
    assert h.id not in hostile.lingering, f"pod(s) left behind: {hostile.lingering.get(h.id)}"


def test_the_suite_has_the_breadth_it_claims():
    assert len(PROGRAMS) >= 60, len(PROGRAMS)
    assert len({h.id for h in PROGRAMS}) == len(PROGRAMS)
    for h in PROGRAMS:
        limits = {**SMALL, **h.limits}
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]*[a-z0-9]", h.id) and len(h.id) <= 63, h.id
        # Quick programs end within 15 s; a slow one (batched with its kind) within 45 s: Node's fork bomb needs
        # that long beside the table to reach the process cap (~30 ms a spawn under gVisor).
        assert 5 <= limits["timeoutSeconds"] <= (45 if h.slow else 15) and limits["cpu"] in ("250m", "500m"), h.id
        assert limits["memory"] in ("128Mi", "256Mi") and limits["disk"] == "16Mi", h.id
    assert all(sum(map(_millicpu, b)) <= BATCH_MILLICPU for b in batches(PROGRAMS))


def test_no_run_ended_in_a_platform_reason(hostile: SuiteResult):
    platform = {k: (v.get("reason"), (v.get("message") or "")[:200]) for k, v in hostile.statuses.items()
                if v.get("reason") not in PROGRAM_REASONS | {"InvalidSpec"}}
    assert not platform, platform
    assert not hostile.stuck, hostile.stuck


def test_a_canary_kept_succeeding_in_normal_time(hostile: SuiteResult):
    canaries = hostile.canaries
    assert len(canaries) >= MIN_CANARIES, canaries
    bad = [c for c in canaries if c[1:4] != ("Succeeded", "Completed", "42\n") or c[4] >= CANARY_WITHIN
           or c[5].get("toPod") is None or c[5]["toPod"] >= CANARY_ADMITTED_WITHIN]
    print("slowest canaries:", *sorted(canaries, key=lambda c: -c[4])[:5], sep="\n  ")
    assert not bad, (f"{len(bad)}/{len(canaries)} canaries failed, took >= {CANARY_WITHIN}s, or waited "
                     f">= {CANARY_ADMITTED_WITHIN}s for their sandbox pod: {bad}")


def test_the_operator_answered_healthz_within_one_second_throughout(hostile: SuiteResult):
    polls = hostile.health
    assert len(polls) >= 20, f"/healthz polled only {len(polls)} times in {hostile.seconds:.0f}s"
    bad = [(round(t, 2), outcome) for t, outcome in polls if t >= HEALTH_WITHIN or outcome != "200"]
    assert not bad, f"{len(bad)}/{len(polls)} /healthz polls slow or failed: {bad[:20]}"


def test_the_operator_logged_no_traceback(hostile: SuiteResult):
    at = hostile.log.find("Traceback (most recent call last)")
    assert at < 0, hostile.log[max(0, at - 500):at + 2500]


def test_nothing_reached_the_node(hostile: SuiteResult):
    assert not hostile.trap_hits, f"the host trap saw traffic from the sandboxes: {hostile.trap_hits[:20]}"


def test_nothing_reached_the_stand_ins_for_the_outside_world(hostile: SuiteResult):
    """The metadata, DNS and schema-$ref programs above dial or name the stand-ins (e2e/cluster/standins.py):
    no sandbox's packet (nor the operator's fetch of a $ref) arrived there, while the node's probes did."""
    hostile.standins.assert_no_pod_reached_them()


def test_no_sandbox_pod_was_left_behind(hostile: SuiteResult):
    assert not hostile.lingering, hostile.lingering
