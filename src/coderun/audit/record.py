"""A run's full record: its container's points as JSON lines, bounded, never carrying an environment.

One line per point, in the order the sink sent them: {"t": time_ns, "tid", "tgid", "ppid", "point": short name,
then the message's own fields (protobuf's JSON mapping: lowerCamel names, 64-bit integers as strings, bytes as
base64)}. The context (container, times, ids) is the line's head, not repeated. An execve's environment is
cleared before the message is turned into JSON: it is the program's secrets, and the record leaves the node.
Routine lines (undenied opens and writes) have a share of it; the rest is kept for what a flood must not hide."""

from __future__ import annotations

import json

from google.protobuf import json_format
from google.protobuf.message import Message

from coderun.sandbox.runner.seccomp import DENIED_SYSCALLS
from .points import container_pb2, sentry_pb2, syscall_pb2
from .trace_config import RAW_EXITS

# The record goes into a ConfigMap beside the run (1 MiB in all): room is left for the rest of it.
MAX_RECORD_BYTES = 768 * 1024
# ExecveInfo.env (sentry/execve) and Execve.envv (syscall/execve): no session option turns them off.
ENVIRONMENT_FIELDS = ("env", "envv")
SENTRY_NAMES = {
    container_pb2.Start: "start",
    sentry_pb2.CloneInfo: "clone",
    # The new image (argv, binary): apart from the execve call's exit, which says what was asked and its result.
    sentry_pb2.ExecveInfo: "exec",
    sentry_pb2.ExitNotifyParentInfo: "exit",
    sentry_pb2.TaskExit: "task_exit",
    sentry_pb2.MmapInfo: "mmap",
}
# amd64 numbers of the syscalls the session traces (session.trace_points); the message carries sysno anyway.
SYSCALL_NAMES = {2: "open", 257: "openat", 85: "creat", 59: "execve", 322: "execveat", 41: "socket",
                 42: "connect", 1: "write", 18: "pwrite64", 20: "writev", 296: "pwritev", 328: "pwritev2",
                 **{number: name for name, number in RAW_EXITS.items()}}


def point_name(message: Message) -> str:
    name = SENTRY_NAMES.get(type(message))
    if name is not None:
        return name
    sysno = getattr(message, "sysno", None)
    if sysno in SYSCALL_NAMES:
        return SYSCALL_NAMES[sysno]
    if isinstance(message, syscall_pb2.Syscall):
        return f"sysno/{sysno}"
    return type(message).__name__.lower()


def record_line(message: Message) -> str:
    """The point's line (no newline). Clears the message's context and environment: call it last."""
    context = message.context_data
    head = {"t": context.time_ns, "tid": context.thread_id, "tgid": context.thread_group_id,
            "ppid": context.parent_thread_group_id, "point": point_name(message)}
    message.ClearField("context_data")
    for name in ENVIRONMENT_FIELDS:
        if name in message.DESCRIPTOR.fields_by_name:
            message.ClearField(name)
    fields = json_format.MessageToDict(message)
    return json.dumps({**head, **{k: v for k, v in fields.items() if k not in head}}, separators=(",", ":"))


class Record:
    """The lines of one container since a time, built as the points arrive, kept up to max_bytes, cut at a whole
    line. Routine points (opens and writes that were not denied) may fill only `routine_share` of it: the rest is
    the reserve of processes, connects, sockets and denied opens, so a flood of opens cannot push them out. Past its
    share each kind is only counted (`cut`). `charge(bytes, reserved)`: the agent's memory budget, False when spent
    (the line is cut too). `text(since_ns)`: the kept lines from a time on (a warm pod's claim, a session's run)."""

    def __init__(self, container_id: str, since_ns: int = 0, max_bytes: int = MAX_RECORD_BYTES,
                 routine_share: float = 0.5, charge=None):
        self.container_id, self.since_ns, self.max_bytes = container_id, since_ns, max_bytes
        self.routine_bytes = int(max_bytes * routine_share)
        self.charge = charge
        self.lines: list[tuple[int, str]] = [(0, UNTRACED_LINE)]
        self.size = self.routine = len(UNTRACED_LINE.encode())
        self.cut = 0

    def add(self, message: Message | None, reserved: bool = True) -> None:
        if message is None:
            return
        context = message.context_data
        if context.container_id != self.container_id or context.time_ns < self.since_ns:
            return
        if self.size >= self.max_bytes or (not reserved and self.routine >= self.routine_bytes):
            self.cut += 1  # full for its kind: not even turned into JSON
            return
        time_ns = context.time_ns
        line = record_line(message) + "\n"
        size = len(line.encode())
        if (self.size + size > self.max_bytes or (not reserved and self.routine + size > self.routine_bytes)
                or (self.charge is not None and not self.charge(size + 64, reserved))):
            # Full for its kind from now on: a flood's later lines are counted without being made.
            if reserved:
                self.size = self.max_bytes
            else:
                self.routine = self.routine_bytes
            self.cut += 1
            return
        self.lines.append((time_ns, line))
        self.size += size
        if not reserved:
            self.routine += size

    def text(self, since_ns: int = 0) -> str:
        return "".join(line for time_ns, line in self.lines if time_ns >= since_ns or time_ns == 0)


# The record's first line: what no point can show. The runner's seccomp filter refuses these before gVisor's
# trace (kernel/task_syscall.go checks a task's filter first), so a program's attempt at one leaves no point.
UNTRACED_LINE = json.dumps({"point": "coderun/untraced", "refusedBeforeTheTrace": sorted(DENIED_SYSCALLS),
                            "why": "the runner's seccomp filter refuses these before gVisor traces a syscall: "
                                   "an attempt leaves no point"}, separators=(",", ":")) + "\n"
