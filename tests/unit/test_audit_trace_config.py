"""The trace session the nodes run: valid for runsc's --pod-init-config, and every point it asks for is one the
summary reads. (Its names and fields were checked against gVisor's own registry, seccheck.Initialize() at the
pinned commit: docs/audit.md.)"""
import json

from coderun.audit import trace_config
from coderun.audit.points import container_pb2, sentry_pb2, syscall_pb2
from coderun.audit.summary import _HANDLERS

# The class each point's messages arrive as (syscalls/linux/points.go, sinks/remote/remote.go).
CLASS_OF = {"container/start": container_pb2.Start, "sentry/clone": sentry_pb2.CloneInfo,
            "sentry/execve": sentry_pb2.ExecveInfo, "sentry/exit_notify_parent": sentry_pb2.ExitNotifyParentInfo,
            "sentry/task_exit": sentry_pb2.TaskExit, "open": syscall_pb2.Open, "openat": syscall_pb2.Open,
            "creat": syscall_pb2.Open, "execve": syscall_pb2.Execve, "execveat": syscall_pb2.Execve,
            "socket": syscall_pb2.Socket, "connect": syscall_pb2.Connect, "sysno": syscall_pb2.Syscall,
            **{name: syscall_pb2.Write for name in trace_config.WRITE_SYSCALLS}}


def message_class(point_name: str):
    parts = point_name.split("/")
    return CLASS_OF["/".join(parts[:2])] if parts[0] != "syscall" else CLASS_OF[parts[1]]


def test_the_pod_init_config_is_one_default_session_with_the_remote_sink():
    config = json.loads(json.dumps(trace_config.pod_init_config(endpoint="/run/x.sock")))
    assert set(config) == {"trace_session"}
    trace = config["trace_session"]
    assert trace["name"] == "Default"
    assert trace["sinks"] == [{"name": "remote", "ignore_setup_error": True,
                               "config": {"endpoint": "/run/x.sock", "retries": 16, "backoff": "25us",
                                          "backoff_max": "20ms"}}]


def test_every_point_is_read_by_the_summary_and_names_its_container_and_process():
    for write_bytes in (False, True):
        points = trace_config.trace_points(write_bytes)
        names = [p["name"] for p in points]
        assert len(names) == len(set(names))
        for point in points:
            cls = message_class(point["name"])
            assert cls is container_pb2.Start or cls in _HANDLERS, point["name"]
            assert {"container_id", "group_id", "parent_thread_group_id", "time"} <= set(point["context_fields"])
            assert point["name"].split("/")[0] != "syscall" or point["name"].endswith("/exit")


def test_cwd_is_asked_only_where_gvisor_offers_it_and_the_opens_need_it():
    with_cwd = {p["name"] for p in trace_config.trace_points(True) if "cwd" in p["context_fields"]}
    assert with_cwd == {"syscall/open/exit", "syscall/openat/exit", "syscall/creat/exit"}
    assert "sentry/exit_notify_parent" not in with_cwd
