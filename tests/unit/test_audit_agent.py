"""The node audit agent on real sockets: runsc's side is a SOCK_SEQPACKET peer sending the packets the remote sink
sends (built with gVisor's classes, tests/support/audit.py), the operator's side a real HTTP client."""
import errno
import hashlib
import hmac
import http.client
import json
import os
import shutil
import socket
import stat
import struct
import tempfile
import threading
import time

import pytest
from support.audit import CID, HELPER, NS_INIT, O_CREAT, O_WRONLY, PROGRAM, RUNNER, Sandbox, inet

from coderun.audit import agent, bearer, oom, trace_config, wire
from coderun.audit.points import common_pb2, sentry_pb2, syscall_pb2
from coderun.audit.record import Record
from coderun.audit.store import MiB, Limits, Store

MT = common_pb2.MessageType
PAUSE = "a1" * 32  # the pod sandbox's (pause) container, started first on every connection
OTHER = "b2" * 32
KEY = b"\x00rotated-secret\n"
WAIT_S = 10  # a bound no passing test reaches


def finished_run(container_id=CID):
    """A run that read its input and ended: the runner's task_exit makes the audit complete."""
    sandbox = Sandbox(container_id).program_started()
    sandbox.open(PROGRAM, "data/visits.csv").exit(PROGRAM, code=1)
    return sandbox.exit(NS_INIT).exit(HELPER, code=1).task_exit(RUNNER)


# finished_run's packets before this index leave its audit incomplete (the namespace init's exit completes it)
COMPLETING = 8


def pause_start():
    return Sandbox(PAUSE).start(tgid=1, argv=["/pause"]).packets


def handshake(version=1):
    return common_pb2.Handshake(version=version).SerializeToString()


class Sandboxes:
    """runsc's side: one SOCK_SEQPACKET connection per sandbox, served by the sink's own per-connection code."""

    def __init__(self, sink):
        self.sink = sink

    def open(self):
        runsc, agent_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        served = threading.Thread(target=self.sink.serve_connection, args=(agent_end,), daemon=True)
        served.start()
        runsc.send(handshake())
        assert common_pb2.Handshake.FromString(runsc.recv(1024)).version == wire.PROTOCOL_VERSION
        return runsc, served

    def run(self, *packet_lists):
        """A whole sandbox's life: every packet, then the close; returns once the sink has kept them all."""
        runsc, served = self.open()
        for packets in packet_lists:
            for packet in packets:
                runsc.send(packet)
        runsc.close()
        served.join(WAIT_S)
        assert not served.is_alive()


@pytest.fixture
def make_agent(tmp_path):
    servers = []

    def make(limits=Limits(), cgroup_root=None):
        store = Store(limits)
        key_file = tmp_path / "key"
        key_file.write_bytes(KEY)
        server = agent.AgentServer(("127.0.0.1", 0), store, agent.KeyFile(str(key_file)))
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return store, Sandboxes(agent.Sink(store, "unused", cgroup_root=cgroup_root)), server.server_address[1]

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()


def get(port, path, key=KEY, headers=None):
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S + 5)
    sent = {"Authorization": bearer.authorization_header(key)} if key is not None else {}
    client.request("GET", path, headers={**sent, **(headers or {})})
    response = client.getresponse()
    body = json.loads(response.read())
    client.close()
    return response.status, body, response


def lines(answer):
    """The record's points, after its first line (what no point can show)."""
    first, *points = [json.loads(line) for line in answer["record"].splitlines()]
    assert first["point"] == "coderun/untraced" and "io_uring_setup" in first["refusedBeforeTheTrace"], first
    return points


# --- the sink

def test_the_handshake_is_answered_and_an_older_protocol_refused(make_agent):
    store, sandboxes, _ = make_agent()
    runsc, served = sandboxes.open()  # asserts the reply is a version-1 Handshake
    runsc.close()
    served.join(WAIT_S)
    old, agent_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    refused = threading.Thread(target=sandboxes.sink.serve_connection, args=(agent_end,), daemon=True)
    refused.start()
    old.send(handshake(version=0))
    old.settimeout(WAIT_S)
    assert old.recv(1024) == b""  # no reply: the connection is closed
    refused.join(WAIT_S)
    assert len(store.connections) == 1


def test_the_listening_socket_is_private_replaces_a_stale_one_and_admits_only_its_uid():
    with tempfile.TemporaryDirectory(dir="/tmp") as directory:  # short: a unix socket path has 108 bytes
        path = os.path.join(directory, "sink.sock")
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        stale.bind(path)
        stale.close()
        for allowed, answered in ((os.getuid(), True), (os.getuid() + 1, False)):
            store = Store()
            sink = agent.Sink(store, path, allowed_uid=allowed)
            sink.listen()
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            threading.Thread(target=sink.serve_forever, daemon=True).start()
            runsc = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            runsc.settimeout(WAIT_S)
            runsc.connect(path)
            try:
                runsc.send(handshake())
                reply = runsc.recv(1024)
            except (BrokenPipeError, ConnectionResetError):  # refused before the handshake was sent
                reply = b""
            assert (reply == wire.handshake_reply()) is answered and (reply == b"") is not answered
            runsc.close()
            sink.close()


@pytest.mark.parametrize("broken, why", [
    (wire.HEADER.pack(4, MT.MESSAGE_SYSCALL_OPEN, 0), "header size 4"),  # seen on receipt
    (wire.HEADER.pack(8, MT.MESSAGE_SYSCALL_OPEN, 0) + b"\x0a\xff\xff", "does not parse"),  # seen when asked
])
def test_a_packet_that_does_not_parse_ends_the_connection_and_the_answer_says_why(make_agent, broken, why):
    store, sandboxes, port = make_agent()
    sandboxes.run(pause_start(), Sandbox().program_started().packets, [broken])
    status, answer, _ = get(port, f"/v1/containers/{CID}?wait={WAIT_S * 1000}")
    assert status == 200 and answer["audit"]["complete"] is False and answer["audit"]["processes"]
    assert answer["connection"]["closed"] is True and why in answer["connection"]["error"]
    assert len(lines(answer)) == len(Sandbox().program_started().packets)  # the record stops where it broke


@pytest.mark.parametrize("oversized", [True, False], ids=["a-70-KB-point", "none"])
def test_a_packet_longer_than_the_agent_takes_is_one_lost_point_said_plainly_and_the_rest_is_folded(
        make_agent, oversized):
    """SOCK_SEQPACKET throws a long packet's rest away and stays aligned: the agent counts it lost, from the latest
    point's time, and folds what follows (without it, the same run is complete and says nothing of losses)."""
    store, sandboxes, port = make_agent()
    packets = finished_run().packets
    started = len(Sandbox().program_started().packets)
    if oversized:  # an exec's argv may be megabytes
        packets[started:started] = [wire.HEADER.pack(8, MT.MESSAGE_SENTRY_EXEC, 0) + b"x" * 70_000]
    sandboxes.run(pause_start(), packets)
    status, answer, _ = get(port, f"/v1/containers/{CID}")
    audit = answer["audit"]
    assert status == 200 and "error" not in answer["connection"]
    assert audit["filesRead"] == [{"path": "data/visits.csv", "count": 1}]  # folded after the long one
    assert audit["counts"]["pointsLost"] == int(oversized) and audit["complete"] is not oversized
    assert ("1 trace points were lost" in audit["message"]) if oversized else "message" not in audit


# --- the question

def test_each_container_of_a_connection_gets_its_own_audit_and_record(make_agent):
    _, sandboxes, port = make_agent()
    other = Sandbox(OTHER).program_started()
    other.open(PROGRAM, "/etc/shadow", number=13).exit(PROGRAM).task_exit(RUNNER)
    sandboxes.run(pause_start(), finished_run().packets, other.packets)

    status, mine, response = get(port, f"/v1/containers/{CID}")
    assert status == 200 and response.getheader("Content-Type") == "application/json"
    assert mine["audit"]["complete"] and mine["audit"]["filesRead"] == [{"path": "data/visits.csv", "count": 1}]
    assert mine["audit"]["outsideWorkdir"]["denied"] == 0 and mine["recordCut"] == 0
    assert mine["connection"] == {"closed": True}
    _, theirs, _ = get(port, f"/v1/containers/{OTHER}")
    assert theirs["audit"]["filesRead"] == [] and theirs["audit"]["outsideWorkdir"]["examples"] == ["/etc/shadow"]
    assert {line["point"] for line in lines(mine)} == {"start", "openat", "clone", "exec", "exit", "task_exit"}
    assert len(lines(mine)) == len(finished_run().packets) and len(lines(theirs)) == len(other.packets)
    _, since_claim, _ = get(port, f"/v1/containers/{CID}?since=1005&wait=0")
    assert lines(since_claim)[0]["t"] == 1005 and since_claim["audit"]["runner"]["processes"] == 0


def test_the_record_is_the_containers_points_since_the_claim_in_order():
    sandbox = finished_run()
    record = Record(CID, since_ns=1_005)
    for packet in pause_start() + sandbox.packets:
        record.add(wire.decode_point(packet).message)
    got = lines({"record": record.text()})
    assert [line["t"] for line in got] == list(range(1_005, sandbox.now + 1))
    first = got[0]  # the namespace init's clone of the program, by its creator
    assert first == {"t": 1_005, "tid": NS_INIT, "tgid": NS_INIT, "ppid": HELPER, "point": "clone",
                     "createdThreadId": PROGRAM, "createdThreadGroupId": PROGRAM, "flags": "17"}


def test_the_record_never_carries_an_environment(make_agent):
    _, sandboxes, port = make_agent()
    sandbox = Sandbox().program_started()
    sandbox.send(sentry_pb2.ExecveInfo(context_data=sandbox.context(PROGRAM), argv=["sh"], env=["TOKEN=s3cret"]),
                 MT.MESSAGE_SENTRY_EXEC)
    sandbox.send(syscall_pb2.Execve(context_data=sandbox.context(PROGRAM), sysno=59, pathname="/bin/curl",
                                    envv=["TOKEN=s3cret"], exit=syscall_pb2.Exit(errorno=2)),
                 MT.MESSAGE_SYSCALL_EXECVE)
    sandboxes.run(sandbox.packets)
    _, answer, _ = get(port, f"/v1/containers/{CID}")
    assert "s3cret" not in answer["record"] and "TOKEN" not in answer["record"]
    tail = lines(answer)[-2:]
    assert tail[0]["point"] == "exec" and tail[0]["argv"] == ["sh"] and "env" not in tail[0]
    assert tail[1]["point"] == "execve" and tail[1]["pathname"] == "/bin/curl" and "envv" not in tail[1]


def test_the_record_is_cut_at_a_whole_line_and_says_how_many_were_left_out():
    sandbox = Sandbox().program_started()
    for number in range(200):
        sandbox.open(PROGRAM, f"file-{number}.csv")
    whole = Record(CID)
    cut = Record(CID, max_bytes=4096)
    for packet in sandbox.packets:
        whole.add(wire.decode_point(packet).message)
        cut.add(wire.decode_point(packet).message)
    assert len(cut.text().encode()) <= 4096 and cut.text().endswith("\n")
    assert whole.text().startswith(cut.text()) and whole.cut == 0
    assert len(cut.lines) + cut.cut == len(whole.lines) == 1 + len(sandbox.packets) and cut.cut > 0  # 1: the head


def test_the_answer_comes_as_soon_as_the_audit_is_complete():
    evaluated = threading.Event()

    class Watched(Store):
        @staticmethod
        def _look(fold, since_ns):
            evaluated.set()
            return Store._look(fold, since_ns)

    store = Watched()
    sandboxes = Sandboxes(agent.Sink(store, "unused"))
    runsc, served = sandboxes.open()
    whole = finished_run().packets
    for packet in pause_start() + whole[:COMPLETING]:  # all but the ends that complete it
        runsc.send(packet)
    answers = []
    asking = threading.Thread(target=lambda: answers.append(store.answer(CID, 0, WAIT_S)))
    started = time.monotonic()
    asking.start()
    assert evaluated.wait(WAIT_S)  # it looked once: not complete, so it waits
    for packet in whole[COMPLETING:]:
        runsc.send(packet)
    asking.join(WAIT_S)
    assert answers and answers[0]["audit"]["complete"] is True
    assert answers[0]["connection"] == {"closed": False}  # it did not wait for the sandbox to end
    assert time.monotonic() - started < WAIT_S / 2
    runsc.close()
    served.join(WAIT_S)


def test_the_look_after_the_first_is_not_held_to_the_pace():
    """The point the first look missed (the program's exit, still in the socket) is usually the next one: the
    look it wakes comes at once. With the pace at a minute, a paced second look would come only at the end of
    the question's wait."""
    evaluated = threading.Event()

    class Watched(Store):
        @staticmethod
        def _look(fold, since_ns):
            evaluated.set()
            return Store._look(fold, since_ns)

    store = Watched(Limits(pace_s=60))
    sandboxes = Sandboxes(agent.Sink(store, "unused"))
    runsc, served = sandboxes.open()
    whole = finished_run().packets
    sent = pause_start() + whole[:COMPLETING]
    for packet in sent:
        runsc.send(packet)
    with store.lock:  # all of them stored before the question: the look they would wake is not the one tested
        assert store.appeared.wait_for(lambda: CID in store.by_container, WAIT_S)
        connection = store.by_container[CID]
    with connection.lock:  # a waiter of its own, so the points notify it
        connection.waiting += 1
        assert connection.changed.wait_for(lambda: connection.points == len(sent), WAIT_S)
        connection.waiting -= 1
    answers = []
    asking = threading.Thread(target=lambda: answers.append(store.answer(CID, 0, WAIT_S)))
    asking.start()
    assert evaluated.wait(WAIT_S)
    for packet in whole[COMPLETING:]:
        runsc.send(packet)
    asking.join(WAIT_S / 2)
    assert answers and answers[0]["audit"]["complete"] is True
    runsc.close()
    served.join(WAIT_S)


def test_an_incomplete_audit_is_answered_at_the_bound_as_incomplete(make_agent):
    _, sandboxes, port = make_agent()
    runsc, served = sandboxes.open()
    for packet in Sandbox().program_started().packets:
        runsc.send(packet)
    started = time.monotonic()
    status, answer, _ = get(port, f"/v1/containers/{CID}?wait=300")
    assert time.monotonic() - started >= 0.3
    assert status == 200 and answer["audit"]["complete"] is False and answer["connection"] == {"closed": False}
    runsc.close()
    served.join(WAIT_S)


def test_a_container_whose_start_trails_the_question_is_answered(make_agent):
    store, sandboxes, port = make_agent()
    answers = []
    asking = threading.Thread(target=lambda: answers.append(get(port, f"/v1/containers/{CID}?wait=10000")))
    asking.start()
    sandboxes.run(pause_start(), finished_run().packets)
    asking.join(WAIT_S)
    assert answers[0][0] == 200 and answers[0][1]["audit"]["complete"] is True


def test_a_sandbox_the_kernel_oom_killed_is_answered_so_from_its_pods_memory_cgroup(make_agent, tmp_path):
    """The Sentry died (no exit points: the audit is incomplete); the count is read when its connection closed."""
    root = tmp_path / "cgroup"
    pod = pod_cgroup(root, "memory/kubepods/pod0f1e", [PAUSE, CID], oom_kills=1)
    store, sandboxes, port = make_agent(cgroup_root=str(root))
    sandboxes.run(pause_start(), Sandbox().program_started().packets)
    connection, = store.connections.values()
    assert connection.describe().endswith("; the kernel OOM-killed it")  # the agent's log line at the close
    (pod / "memory.oom_control").unlink()  # the kubelet removes the cgroup after the sandbox ended: read already
    _, answer, _ = get(port, f"/v1/containers/{CID}?wait=0")
    assert answer["audit"]["complete"] is False and answer["connection"] == {"closed": True, "oomKilled": True}


def test_a_sandbox_that_ended_otherwise_or_whose_cgroup_is_gone_says_so(make_agent, tmp_path):
    root = tmp_path / "cgroup"
    pod = pod_cgroup(root, "memory/kubepods/pod0f1e", [PAUSE, CID], oom_kills=0)
    _, sandboxes, port = make_agent(cgroup_root=str(root))
    sandboxes.run(pause_start(), finished_run().packets)
    assert get(port, f"/v1/containers/{CID}")[1]["connection"] == {"closed": True, "oomKilled": False}
    shutil.rmtree(pod)  # the kubelet removed the pod's cgroup first: not known, never "no OOM kill"
    _, sandboxes, port = make_agent(cgroup_root=str(root))
    sandboxes.run(pause_start(), finished_run().packets)
    assert get(port, f"/v1/containers/{CID}")[1]["connection"] == {"closed": True}


def test_a_connection_the_agent_dropped_says_nothing_of_memory(make_agent, tmp_path):
    """A packet that does not parse ends the connection while the sandbox may run on (and be OOM-killed later)."""
    root = tmp_path / "cgroup"
    pod_cgroup(root, "memory/kubepods/pod0f1e", [PAUSE, CID], oom_kills=0)
    _, sandboxes, port = make_agent(cgroup_root=str(root))
    sandboxes.run(pause_start(), Sandbox().program_started().packets, [b"\x00" * 3])
    connection = get(port, f"/v1/containers/{CID}")[1]["connection"]
    assert connection["closed"] is True and "error" in connection and "oomKilled" not in connection


def pod_cgroup(root, pod_path, containers, oom_kills, v2=False, scopes=False):
    """A pod's memory cgroup as the kubelet and runsc lay it out: the Sentry's kill counted in the pod's own
    directory (cgroup v1 counts a kill where the victim was), its containers' directories below it (named by the
    id, or cri-containerd-<id>.scope with the systemd driver)."""
    pod = root / pod_path
    for container in containers:
        name = f"cri-containerd-{container}.scope" if scopes else container
        (pod / name).mkdir(parents=True)
        (pod / name / ("memory.events" if v2 else "memory.oom_control")).write_text(
            "oom 0\noom_kill 0\n" if v2 else "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    counts = f"low 0\nhigh 0\nmax 4\noom 1\noom_kill {oom_kills}\n" if v2 else \
        f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kills}\n"
    (pod / ("memory.events" if v2 else "memory.oom_control")).write_text(counts)
    return pod


@pytest.mark.parametrize("pod_path, v2, scopes", [
    ("memory/kubepods/pod0f1e", False, False),                 # v1, cgroupfs driver, Guaranteed (this cluster)
    ("memory/kubepods/burstable/pod0f1e", False, False),       # v1, Burstable
    ("memory/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f1e.slice", False, True),  # v1, systemd
    ("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e.slice", True, True),  # v2, systemd driver
    ("kubepods/besteffort/pod0f1e", True, False),              # v2, cgroupfs driver
    ("kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod0f1e.slice", True, True),  # kind: --cgroup-root=/kubelet
    ("memory/kubelet/kubepods/pod0f1e", False, False),         # the same with cgroupfs on v1
])
def test_the_pods_cgroup_is_found_by_a_container_id_in_each_layout(tmp_path, pod_path, v2, scopes):
    root = tmp_path / "cgroup"
    for controller in ("cpu", "pids"):  # v1's other controllers hold the same tree, without memory's counts
        if not v2:
            pod_cgroup(root, pod_path.replace("memory/", f"{controller}/"), [PAUSE, CID], 0, scopes=scopes)
    pod_cgroup(root, pod_path.replace("0f1e", "9999"), [OTHER], oom_kills=3, v2=v2, scopes=scopes)  # another's kill
    pod = pod_cgroup(root, pod_path, [PAUSE, CID], oom_kills=0, v2=v2, scopes=scopes)
    assert oom.pod_directory(root, [PAUSE, CID]) == pod and oom.pod_oom_killed(root, [CID]) is False
    killed_below = pod / (f"cri-containerd-{PAUSE}.scope" if scopes else PAUSE) / \
        ("memory.events" if v2 else "memory.oom_control")
    killed_below.write_text(killed_below.read_text().replace("oom_kill 0", "oom_kill 1"))
    assert oom.pod_oom_killed(root, [PAUSE, CID]) is True  # v1 counts where the victim was: below is read too
    assert oom.pod_oom_killed(root, ["c3" * 32]) is None and oom.pod_oom_killed(root, []) is None


def test_an_unknown_container_is_404_after_the_wait(make_agent):
    _, sandboxes, port = make_agent()
    sandboxes.run(pause_start(), finished_run().packets)
    started = time.monotonic()
    status, body, _ = get(port, f"/v1/containers/{OTHER}?wait=100")
    assert status == 404 and OTHER in body["message"] and time.monotonic() - started >= 0.1
    assert get(port, f"/v1/containers/{PAUSE}")[0] == 200  # the pause container is a container too


def test_after_a_restart_a_sandbox_it_never_saw_is_said_untraced_never_an_empty_audit(make_agent):
    """The agent restarted: runsc's connections went with the old one, so a live sandbox has none here. The answer
    is a 404 naming the agent's start (the operator makes it an Unavailable audit), and a connection that did come
    is still answered (the positive control)."""
    store, sandboxes, port = make_agent()
    sandboxes.run(pause_start(), finished_run(OTHER).packets)
    status, body, _ = get(port, f"/v1/containers/{CID}?wait=0")
    assert status == 404 and "audit" not in body
    assert time.strftime("%Y-%m-%dT%H:%M", time.gmtime(store.started)) in body["message"]
    assert "a sandbox created before then is not traced" in body["message"]
    status, body, _ = get(port, f"/v1/containers/{OTHER}?wait=0")
    assert status == 200 and body["audit"]["complete"] is True


@pytest.mark.parametrize("pod_dir", [
    "memory/kubepods/besteffort/pod0f1e2d3c-0000-4000-8000-00000000abcd",                  # v1, cgroupfs
    "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e2d3c_0000_4000_8000_00000000abcd.slice",
])
def test_a_sandboxs_tenant_is_its_pods_namespace_from_the_cgroup_and_the_pod_log_directory(tmp_path, pod_dir):
    from coderun.audit import tenant
    cgroup = tmp_path / "cgroup"
    (cgroup / pod_dir / PAUSE).mkdir(parents=True)
    (cgroup / pod_dir.replace("0f1e2d3c", "99999999") / OTHER).mkdir(parents=True)
    logs = tmp_path / "pods"
    (logs / "tenant-a_run-1_0f1e2d3c-0000-4000-8000-00000000abcd").mkdir(parents=True)
    (logs / "tenant-b_run-2_99999999-0000-4000-8000-00000000abcd").mkdir()
    tenant_of = tenant.resolver(str(cgroup), str(logs))
    assert tenant_of(PAUSE) == "namespace tenant-a" and tenant_of(OTHER) == "namespace tenant-b"
    assert tenant_of(CID) is None                                  # no such pod: the connection is its own tenant
    assert tenant.resolver(str(cgroup), "") is None                # not told where the logs are: no resolver


def test_the_agent_logs_the_caps_it_chose_from_its_memory_limit(tmp_path, caplog):
    (tmp_path / "memory.max").write_text("402653184\n")
    with caplog.at_level("INFO", logger="coderun.audit.agent"):
        limits = agent.caps(agent.parse_args(["--own-cgroup", str(tmp_path)]))
    assert limits.total_bytes == int(384 * 1024 * 1024 * 0.4)
    said = caplog.text
    assert "memory limit 384 MiB" in said and "154 MiB in all, 4.0 MiB a sandbox, 25% of it a namespace" in said
    assert agent.caps(agent.parse_args(["--own-cgroup", str(tmp_path), "--total-mib", "10"])).total_bytes == 10 * MiB


@pytest.mark.parametrize("path", [
    f"/v1/containers/{CID.upper()}",
    f"/v1/containers/{CID[:-1]}",
    f"/v1/containers/{CID}0",
    f"/v1/containers/{CID}?since=-1",
    f"/v1/containers/{CID}?wait=1.5",
    f"/v1/containers/{CID}?wait=",
    f"/v1/containers/{CID}?since=1&since=2",
    f"/v1/containers/{CID}?sinse=1",
    f"/v1/containers/{CID}?since=%EF%BC%91",  # a fullwidth digit one: a digit to str.isdigit, not here
])
def test_a_malformed_question_is_400(make_agent, path):
    _, _, port = make_agent()
    status, body, _ = get(port, path)
    assert status == 400 and body["message"]


def test_a_body_is_refused(make_agent):
    _, _, port = make_agent()
    status, body, _ = get(port, f"/v1/containers/{CID}", headers={"Content-Length": "2"})
    assert status == 400 and "body" in body["message"]


@pytest.mark.parametrize("key", [None, b"another key", b""])
def test_without_the_operators_bearer_it_is_401(make_agent, key):
    _, sandboxes, port = make_agent()
    sandboxes.run(finished_run().packets)
    status, body, response = get(port, f"/v1/containers/{CID}", key=key)
    assert status == 401 and "audit" not in body and response.getheader("WWW-Authenticate") == "Bearer"


def test_a_rotated_key_is_read_again(tmp_path):
    path = tmp_path / "key"
    path.write_bytes(b"first")
    keys = agent.KeyFile(str(path))
    assert keys.key() == b"first"
    os.replace(_written(tmp_path / "new", b"second"), path)  # as the kubelet swaps a Secret's files
    assert keys.key() == b"second"
    path.unlink()
    assert keys.key() == b""  # and with no key, no bearer is right
    assert not bearer.is_authorized(bearer.authorization_header(b""), b"")


def test_the_bearer_is_the_keys_hmac_of_the_agents_name_as_the_operator_computes_it():
    expected = hmac.new(KEY, b"coderun-audit-agent", hashlib.sha256).hexdigest()
    assert bearer.agent_bearer(KEY) == expected and bearer.is_authorized(f"Bearer {expected}", KEY)
    assert not bearer.is_authorized(f"Bearer {expected[:-1]}0", KEY) and not bearer.is_authorized(expected, KEY)


def _written(path, content):
    path.write_bytes(content)
    return path


def test_health_needs_no_bearer_and_other_paths_are_404(make_agent):
    _, _, port = make_agent()
    assert get(port, "/healthz", key=None)[:2] == (200, {"status": "ok"})
    assert get(port, "/readyz", key=None)[:2] == (200, {"status": "ok"})
    assert get(port, f"/v1/containers/{CID}/audit")[0] == 404
    assert get(port, "/")[0] == 404


def test_it_is_ready_only_once_the_key_has_reached_it(tmp_path):
    """The key's Secret is mounted optional (the operator makes it at its start): alive without it, not ready."""
    path = tmp_path / "key"
    server = agent.AgentServer(("127.0.0.1", 0), Store(Limits()), agent.KeyFile(str(path), "coderun-audit-key"))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        port = server.server_address[1]
        assert get(port, "/healthz", key=None)[0] == 200
        status, body, _ = get(port, "/readyz", key=None)
        assert status == 503 and "no key yet from Secret coderun-audit-key" in body["message"], body
        os.replace(_written(tmp_path / "new", KEY), path)  # the kubelet brings the Secret's file
        assert get(port, "/readyz", key=None)[:2] == (200, {"status": "ok"})
    finally:
        server.shutdown()
        server.server_close()


# --- the bounds

def flood_then_the_things_it_would_hide(opens, container_id=CID, distinct=False):
    """The issue's program: a flood of open/close on its own /tmp, then /etc/passwd, a marker in the work dir, a
    connect to the API server's Service address and `sh -c echo`, then its end."""
    sandbox = Sandbox(container_id).program_started()
    for number in range(opens):
        sandbox.open(PROGRAM, f"/tmp/flood-{number % 5000}" if distinct else "/tmp/flood", O_WRONLY | O_CREAT)
    sandbox.open(PROGRAM, "/etc/passwd")
    sandbox.open(PROGRAM, "marker.txt", O_WRONLY | O_CREAT)
    sandbox.socket(PROGRAM).connect(PROGRAM, inet("10.96.0.1", 443), 0)
    sandbox.clone(PROGRAM, 40).execve(40, ["sh", "-c", "echo"]).exit(40)
    return sandbox.exit(PROGRAM).exit(NS_INIT).exit(HELPER, code=0).task_exit(RUNNER)


def assert_the_flood_hid_nothing(audit, opens):
    assert audit["complete"] is True and audit["counts"]["pointsLost"] == 0, audit
    assert "/etc/passwd" in audit["outsideWorkdir"]["examples"]
    assert {"path": "marker.txt", "count": 1} in audit["filesWritten"]
    assert audit["connectAttempts"] == [{"family": "inet", "address": "10.96.0.1", "port": 443,
                                         "result": "connected", "count": 1}]
    assert [p["argv"] for p in audit["processes"]] == [["python3", "-u", "main.py"], ["sh", "-c", "echo"]]
    written = sum(row["count"] for row in audit["filesWritten"] if row["path"].startswith("/tmp/flood"))
    assert written + audit.get("omitted", {}).get("filesWritten", 0) >= min(opens, 1) and written <= opens


@pytest.mark.parametrize("distinct", [False, True], ids=["one-path", "5000-paths"])
def test_a_flood_of_200k_opens_costs_counts_and_hides_nothing_that_came_after(distinct):
    store = Store(Limits(connection_bytes=1024 * 1024))
    connection = store.open()
    opens = 200_000
    for packet in pause_start() + flood_then_the_things_it_would_hide(opens, distinct=distinct).packets:
        store.add(connection, packet)
    answer = store.answer(CID, 0, 0)
    audit = answer["audit"]
    assert_the_flood_hid_nothing(audit, opens)
    if not distinct:
        assert {"path": "/tmp/flood", "count": opens} in audit["filesWritten"]  # one row, every open counted
    else:  # distinct keys past the tracked ones are counted, not kept
        shown = sum(row["count"] for row in audit["filesWritten"] if row["path"].startswith("/tmp/flood"))
        assert shown + audit["omitted"]["filesWritten"] >= 5000 - 1000
    # The record: the routine lines are cut at their share, the reserve's are all there.
    points = lines(answer)
    assert {"execve", "exec", "connect", "socket", "clone"} <= {line["point"] for line in points} | {"execve"}
    assert any(line.get("pathname") == "/etc/passwd" for line in points) or answer["recordCut"]
    assert any(line["point"] == "exec" and line["argv"] == ["sh", "-c", "echo"] for line in points)
    assert any(line["point"] == "connect" for line in points) and answer["recordCut"] > 0
    assert connection.held <= store.limits.connection_bytes


def test_without_the_flood_the_same_program_is_recorded_whole():
    """The positive control: the same assertions hold on the program alone, and its record is not cut."""
    store = Store()
    connection = store.open()
    for packet in pause_start() + flood_then_the_things_it_would_hide(0).packets:
        store.add(connection, packet)
    answer = store.answer(CID, 0, 0)
    assert_the_flood_hid_nothing(answer["audit"], 0) and answer["recordCut"] == 0
    assert any(line.get("pathname") == "/etc/passwd" for line in lines(answer))


def test_a_point_gvisor_dropped_makes_the_audit_incomplete_and_says_from_when(make_agent):
    store, sandboxes, port = make_agent()
    sandbox = flood_then_the_things_it_would_hide(10)
    # The sink's counter as concurrent writers deliver it: out of order, never a wrap.
    for index, dropped in ((12, 3), (13, 1), (14, 3)):
        header = struct.unpack_from("<HHI", sandbox.packets[index])
        sandbox.packets[index] = struct.pack("<HHI", header[0], header[1], dropped) + sandbox.packets[index][8:]
    sandboxes.run(pause_start(), sandbox.packets)
    audit = get(port, f"/v1/containers/{CID}")[1]["audit"]
    assert audit["counts"]["pointsLost"] == 3 and audit["complete"] is False
    assert "3 trace points were lost" in audit["message"] and "1970-01-01T00:00:00.000Z on" in audit["message"]


def test_a_connections_budget_keeps_its_reserve_for_what_routine_points_cannot_spend():
    """A tiny budget: the flood's distinct keys are soon only counted, the record's routine lines cut; the
    processes, the connect and the denied open still come through, whole."""
    store = Store(Limits(connection_bytes=160 * 1024))
    connection = store.open()
    sandbox = flood_then_the_things_it_would_hide(20_000, distinct=True)
    sandbox.packets[-5:-5] = Sandbox().open(PROGRAM, "/tmp/secret", number=13).packets  # denied, after the flood
    for packet in pause_start() + sandbox.packets:
        store.add(connection, packet)
    answer = store.answer(CID, 0, 0)
    audit = answer["audit"]
    assert_the_flood_hid_nothing(audit, 20_000)
    assert audit["filesRead"][0] == {"path": "/tmp/secret", "count": 0, "denied": 1}  # from the reserve, first
    assert audit["omitted"]["filesWritten"] > 4000
    assert connection.held <= 160 * 1024


def test_what_a_connection_holds_is_bounded_by_its_budget_however_long_its_paths_and_argv():
    """The review's hostile program: 1,100 denied opens in /tmp and 1,100 failed ones outside it, of 4 KB paths,
    then 1,000 ended `sh -c <60 KB>` execs. Every key, example and process is charged, paths and argv are cut
    where they are kept: the memory it grows by is its budget and a constant (it was 67 MiB against 1 MiB)."""
    import gc
    import tracemalloc
    store = Store(Limits(connection_bytes=MiB))
    connection = store.open()
    for packet in pause_start():
        store.add(connection, packet)
    sandbox = Sandbox(CID).program_started()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]

        def send(_sandbox):
            for packet in sandbox.packets:
                store.add(connection, packet)
            sandbox.packets.clear()

        long = "d/" * 1990
        for number in range(1100):
            send(sandbox.open(PROGRAM, f"/tmp/{long}{number}", number=errno.EACCES))
        for number in range(1100):
            send(sandbox.open(PROGRAM, f"/nope/{long}{number}", number=errno.ENOENT))
        for number in range(1000):
            send(sandbox.clone(PROGRAM, 1000 + number).execve(1000 + number, ["sh", "-c", "x" * 60000])
                 .exit(1000 + number))
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert connection.held <= MiB and grown <= MiB + 256 * 1024, grown
    audit = store.answer(CID, 0, 0)["audit"]
    assert audit["counts"]["processes"] == 1001 and audit["counts"]["syscallsDenied"] == 1100
    assert audit["outsideWorkdir"]["reads"] == 1100 and len(audit["outsideWorkdir"]["examples"][0]) == 512
    kept = [row for row in audit["processes"] if row["argv"]]
    assert kept and all(row["argv"][2] == "x" * 255 + "…" and "argvOmitted" not in row for row in kept[1:])


def test_a_tenant_cannot_take_more_than_its_share_and_the_others_keep_theirs():
    limits = Limits(total_bytes=4 * 1024 * 1024, connection_bytes=4 * 1024 * 1024, namespace_share=0.25)
    store = Store(limits, tenant_of=lambda container: "tenant-a" if container != OTHER else "tenant-b")
    floods = []
    for number in range(3):
        connection = store.open()
        container = f"{number:x}0" * 32
        start = Sandbox(container).start(tgid=1, argv=["/pause"]).packets
        for packet in start + flood_then_the_things_it_would_hide(5000, container, distinct=True).packets:
            store.add(connection, packet)
        floods.append(connection)
    share = limits.total_bytes * limits.namespace_share
    assert store.tenants["tenant-a"] <= share and sum(c.held for c in floods) <= share
    victim = store.open()
    for packet in Sandbox(OTHER).start(tgid=1, argv=["/pause"]).packets + finished_run(OTHER).packets:
        store.add(victim, packet)
    audit = store.answer(OTHER, 0, 0)["audit"]
    assert audit["complete"] is True and audit["filesRead"] == [{"path": "data/visits.csv", "count": 1}]
    assert store.tenants["tenant-b"] == victim.held and victim.held < share
    for number, connection in enumerate(floods):  # each flood's own audit still whole
        assert_the_flood_hid_nothing(store.answer(f"{number:x}0" * 32, 0, 0)["audit"], 5000)


def test_a_tenants_share_is_freed_by_its_own_oldest_closed_connection_never_anothers():
    """A namespace whose share its closed floods hold: its next run evicts its own oldest one and is kept whole;
    another tenant's closed connection (older still) stays."""
    limits = Limits(total_bytes=8 * MiB, connection_bytes=MiB, namespace_share=0.25)
    tenants = {}
    store = Store(limits, tenant_of=lambda container: tenants[container])

    def run(container, tenant, opens):
        tenants[container] = tenant
        connection = store.open()
        start = Sandbox(container).start(tgid=1, argv=["/pause"]).packets
        for packet in start + flood_then_the_things_it_would_hide(opens, container, distinct=True).packets:
            store.add(connection, packet)
        store.close(connection)
        return connection

    other = run("e0" * 32, "tenant-b", 100)
    floods = [run(f"{number:x}0" * 32, "tenant-a", 5000) for number in range(2)]
    routine_share = limits.total_bytes * limits.namespace_share * (1 - limits.reserve_share)
    assert store.tenants["tenant-a"] > routine_share - 64 * 1024  # full, but for less than the next run needs
    later = run(OTHER, "tenant-a", 900)
    assert floods[0].number not in store.connections and floods[1].number in store.connections
    assert other.number in store.connections and later.number in store.connections
    answer = store.answer(OTHER, 0, 0)
    assert_the_flood_hid_nothing(answer["audit"], 900)
    assert answer["recordCut"] == 0  # its routine record lines were kept, not cut for the closed floods' sake


def test_the_oldest_closed_connection_makes_room_when_the_agents_budget_is_short():
    store = Store(Limits(total_bytes=1024 * 1024, connection_bytes=1024 * 1024, namespace_share=1.0))
    first = store.open()
    for packet in flood_then_the_things_it_would_hide(3000, distinct=True).packets:
        store.add(first, packet)
    store.close(first)
    second = store.open()
    for packet in flood_then_the_things_it_would_hide(3000, OTHER, distinct=True).packets:
        store.add(second, packet)
    assert store.answer(OTHER, 0, 0)["audit"]["complete"] is True
    assert first.number not in store.connections and CID not in store.by_container  # it went for the live one
    assert store.total_bytes == second.held <= 1024 * 1024


def test_a_sessions_later_run_is_answered_from_the_fold_without_the_earlier_runs_counts():
    """The fold cannot know a run's start in advance: it splits its counters at quiet gaps, and a question from a
    time in the gap before a session's next run adds up only what came after (the process table is exact)."""
    store = Store()
    connection = store.open()
    sandbox = Sandbox().program_started()
    sandbox.open(PROGRAM, "first.csv").open(PROGRAM, "shared.csv").exit(PROGRAM)
    sandbox.now += 200_000_000                                         # the operator's round trip: a quiet gap
    since = sandbox.now - 100_000_000
    second = PROGRAM + 10
    sandbox.clone(NS_INIT, second).execve(second, ["python3", "-u", "main.py"])
    sandbox.open(second, "shared.csv").open(second, "/etc/hosts").exit(second)
    for packet in sandbox.packets:
        store.add(connection, packet)
    later = store.answer(CID, since, 0)["audit"]
    assert later["filesRead"] == [{"path": "shared.csv", "count": 1}] and later["complete"] is True
    assert [p["argv"] for p in later["processes"]] == [["python3", "-u", "main.py"]]
    assert later["outsideWorkdir"]["examples"] == ["/etc/hosts"]
    assert store.answer(CID, sandbox.now + 1, 0)["audit"]["filesRead"] == []  # a start after every point
    whole = store.answer(CID, 0, 0)["audit"]                           # the positive control: both runs
    assert {f["path"]: f["count"] for f in whole["filesRead"]} == {"first.csv": 1, "shared.csv": 2}
    assert whole["counts"]["processes"] == 2


@pytest.mark.parametrize("files, expected", [
    ({"memory.max": "402653184\n"}, 402653184),                                  # v2, the chart's 384Mi
    ({"memory.max": "max\n"}, None),                                              # v2, no limit
    ({"memory/memory.limit_in_bytes": "402653184\n"}, 402653184),                # v1
    ({"memory/memory.limit_in_bytes": "9223372036854771712\n"}, None),            # v1, no limit
    ({}, None),
])
def test_the_caps_are_sized_from_the_containers_memory_limit(tmp_path, files, expected):
    from coderun.audit.store import memory_limit
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    limit, _ = memory_limit(tmp_path)
    assert limit == expected
    limits = Limits.for_memory(limit)
    if expected:
        assert limits.total_bytes == int(expected * 0.4) and limits.connection_bytes == 4 * 1024 * 1024
        assert limits.total_bytes * limits.namespace_share < expected / 4
    else:
        assert limits == Limits()
    assert Limits.for_memory(64 * 1024 * 1024).connection_bytes == 1024 * 1024  # never below a MiB a sandbox


def test_a_closed_connection_is_kept_for_its_retention_then_dropped(make_agent):
    store, sandboxes, port = make_agent(Limits(retention_s=60))
    sandboxes.run(finished_run().packets)
    store.expire(time.monotonic() + 59)
    assert get(port, f"/v1/containers/{CID}")[0] == 200
    store.expire(time.monotonic() + 61)
    assert get(port, f"/v1/containers/{CID}")[0] == 404 and store.total_bytes == 0 and not store.tenants


def test_past_the_connection_cap_the_oldest_closed_goes_and_with_none_closed_a_sandbox_is_refused():
    store = Store(Limits(connections=2))
    sandboxes = Sandboxes(agent.Sink(store, "unused"))
    sandboxes.run(finished_run().packets)                    # closed
    still_open = []
    for container in (OTHER, PAUSE):                          # the second one makes room: the closed one goes
        runsc, served = sandboxes.open()
        runsc.send(Sandbox(container).start().packets[0])
        still_open.append((runsc, served))
    with store.lock:
        assert store.appeared.wait_for(lambda: {OTHER, PAUSE} <= set(store.by_container), WAIT_S)
    assert CID not in store.by_container and len(store.connections) == 2

    late, agent_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    refused = threading.Thread(target=sandboxes.sink.serve_connection, args=(agent_end,), daemon=True)
    refused.start()
    late.send(handshake())
    late.settimeout(WAIT_S)
    assert late.recv(1024) == wire.handshake_reply() and late.recv(1024) == b""  # answered, then let go
    refused.join(WAIT_S)
    assert len(store.connections) == 2
    for runsc, served in still_open:
        runsc.close()
        served.join(WAIT_S)


# --- the command

def test_the_pod_init_config_is_written_whole_for_the_socket(tmp_path):
    path = tmp_path / "pod-init.json"
    agent.write_atomically(str(path), json.dumps(trace_config.pod_init_config(endpoint="/run/x.sock")))
    written = json.loads(path.read_text())
    assert written["trace_session"]["sinks"][0]["config"]["endpoint"] == "/run/x.sock"
    assert [p.name for p in tmp_path.iterdir()] == ["pod-init.json"]
