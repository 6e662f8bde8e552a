"""The trace session every sandbox of a node runs: runsc's `--pod-init-config` file (runsc/boot/seccheck.go
`InitConfig`: {"trace_session": seccheck.SessionConfig}), set per runtime handler through the `runsc_config`
table of the handler's runsc.toml (`pod-init-config = "/path/pod-init.json"`).

The points answer the issue's questions and nothing more (docs/audit.md says why each): processes (container
start, clone, exec, exit), files (open, openat, creat exits; openat2 raw), network (socket, connect; addressed
sends raw) and failed execs. Exit points carry the arguments and the result, so no enter point is traced. Every
point is asked for the context fields the summary needs: the container, the thread group and its parent (the
runner/program split), the time (a warm pod's claim) and, for opens, the cwd (relative paths)."""

from __future__ import annotations

# Where runsc (as root, on the host, when it creates a pod's sandbox) connects: the agent's listening socket.
DEFAULT_ENDPOINT = "/run/coderun/audit/sink.sock"
BASE_CONTEXT = ["container_id", "time", "thread_id", "group_id", "parent_thread_group_id"]
# sentry/exit_notify_parent offers no cwd (seccheck/metadata.go); the opens need it to resolve relative paths.
WITH_CWD = BASE_CONTEXT + ["cwd"]
# Raw points (no schema in gVisor): the syscall number and six raw arguments, on amd64.
RAW_EXITS = {"openat2": 437, "sendto": 44, "sendmsg": 46, "sendmmsg": 307}
WRITE_SYSCALLS = ("write", "pwrite64", "writev", "pwritev", "pwritev2")


def _point(name: str, context: list[str], optional: list[str] | None = None) -> dict:
    point = {"name": name, "context_fields": context}
    if optional:
        point["optional_fields"] = optional
    return point


def trace_points(write_bytes: bool = False) -> list[dict]:
    """The session's points. write_bytes adds every write's exit (bytes per file written, at the cost of one
    point per write(2), stdout's included)."""
    points = [
        _point("container/start", BASE_CONTEXT),
        _point("sentry/clone", BASE_CONTEXT),
        # binary_info: a stat of the binary, and whether it was a memfd (memfd_create + execveat).
        _point("sentry/execve", BASE_CONTEXT, ["binary_info"]),
        _point("sentry/exit_notify_parent", BASE_CONTEXT),
        _point("sentry/task_exit", BASE_CONTEXT),
        _point("syscall/open/exit", WITH_CWD),
        _point("syscall/openat/exit", WITH_CWD, ["fd_path"]),
        _point("syscall/creat/exit", WITH_CWD),
        _point("syscall/execve/exit", BASE_CONTEXT),
        _point("syscall/execveat/exit", BASE_CONTEXT),
        _point("syscall/socket/exit", BASE_CONTEXT),
        _point("syscall/connect/exit", BASE_CONTEXT),
    ]
    points += [_point(f"syscall/sysno/{number}/exit", BASE_CONTEXT) for number in RAW_EXITS.values()]
    if write_bytes:
        points += [_point(f"syscall/{name}/exit", BASE_CONTEXT, ["fd_path"]) for name in WRITE_SYSCALLS]
    return points


def pod_init_config(endpoint: str = DEFAULT_ENDPOINT, write_bytes: bool = False,
                    ignore_setup_error: bool = True) -> dict:
    """The JSON document for runsc's --pod-init-config.

    ignore_setup_error: a sandbox starts even if the agent is not listening (its runs say the audit is
    Unavailable) rather than failing the pod. retries/backoff: a full socket makes the program's task wait up
    to about 150 ms (doubling from 25 µs, 20 ms at most) before a point is dropped (the default, 0 retries, drops at
    once): a flood is slowed to the agent's pace when the agent is descheduled on a busy node, rather than losing
    points (8 retries of at most 5 ms, about 20 ms, lost 25 of a flood's 90,000 beside another flood on 2 cores)."""
    return {"trace_session": {
        "name": "Default",  # the only session gVisor supports (seccheck.DefaultSessionName)
        "points": trace_points(write_bytes),
        "sinks": [{"name": "remote", "ignore_setup_error": ignore_setup_error,
                   "config": {"endpoint": endpoint, "retries": 16, "backoff": "25us", "backoff_max": "20ms"}}],
    }}
