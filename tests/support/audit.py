"""A sandbox's trace points as gVisor's remote sink sends them, built with gVisor's own classes: the audit's unit
tests (test_audit_summary, test_audit_agent) feed them to the summary and to the agent."""
import errno
import socket
import struct

from coderun.audit import wire
from coderun.audit.points import common_pb2, container_pb2, sentry_pb2, syscall_pb2
from coderun.audit.summary import RunAudit

MT = common_pb2.MessageType
CID = "5f0c" * 16                   # the run container's CRI id, as kubelet reports it in containerStatuses
RUNNER, HELPER, NS_INIT, PROGRAM = 10, 11, 12, 13
O_RDONLY, O_WRONLY, O_CREAT, O_TRUNC = 0, 1, 0o100, 0o1000
SIGCHLD, CLONE_THREAD = 17, 0x10000
EXECVE, OPENAT, CONNECT = 59, 257, 42


def inet(address: str, port: int) -> bytes:
    return struct.pack("<H", socket.AF_INET) + struct.pack(">H", port) + socket.inet_aton(address) + b"\0" * 8


class Sandbox:
    """The packets of one sandbox connection, each a point framed as sinks/remote frames it, one tick apart."""

    def __init__(self, container_id: str = CID):
        self.container_id, self.now, self.packets, self.parents = container_id, 1_000, [], {}

    def context(self, tgid, tid=None, cwd="/tmp/work", container_id=None):
        self.now += 1
        return common_pb2.ContextData(container_id=container_id or self.container_id, time_ns=self.now,
                                      thread_group_id=tgid, thread_id=tid or tgid, cwd=cwd,
                                      parent_thread_group_id=self.parents.get(tgid, 0))

    def send(self, message, message_type, dropped=0):
        self.packets.append(wire.encode_point(message, message_type, dropped))
        return self

    def start(self, tgid=RUNNER, argv=("python3", "-I", "/opt/coderun")):
        return self.send(container_pb2.Start(id=self.container_id, args=list(argv),
                                             context_data=self.context(tgid)), MT.MESSAGE_CONTAINER_START)

    def clone(self, creator, child, flags=SIGCHLD):
        message = sentry_pb2.CloneInfo(context_data=self.context(creator), created_thread_group_id=child,
                                       created_thread_id=child, flags=flags)
        if not flags & CLONE_THREAD:
            self.parents[child] = creator
        return self.send(message, MT.MESSAGE_SENTRY_CLONE)

    def execve(self, tgid, argv, memfd=False):
        return self.send(sentry_pb2.ExecveInfo(context_data=self.context(tgid), argv=list(argv),
                                               binary_path=f"/usr/bin/{argv[0]}", binary_in_memfd=memfd),
                         MT.MESSAGE_SENTRY_EXEC)

    def execve_call(self, tgid, pathname):
        """An execve's exit point as gVisor sends it: no errno, whether the exec happened or not."""
        return self.send(syscall_pb2.Execve(context_data=self.context(tgid), sysno=EXECVE, pathname=pathname,
                                            exit=syscall_pb2.Exit()), MT.MESSAGE_SYSCALL_EXECVE)

    def failed_execve(self, tgid, pathname, number=errno.ENOENT):
        return self.send(syscall_pb2.Execve(context_data=self.context(tgid), sysno=EXECVE, pathname=pathname,
                                            exit=syscall_pb2.Exit(errorno=number)), MT.MESSAGE_SYSCALL_EXECVE)

    def open(self, tgid, pathname, flags=O_RDONLY, number=0, fd=-100, fd_path="", cwd="/tmp/work", tid=None):
        message = syscall_pb2.Open(context_data=self.context(tgid, tid=tid, cwd=cwd), sysno=OPENAT, fd=fd,
                                   fd_path=fd_path, pathname=pathname, flags=flags,
                                   exit=syscall_pb2.Exit(result=-1 if number else 3, errorno=number))
        return self.send(message, MT.MESSAGE_SYSCALL_OPEN)

    def socket(self, tgid, family=socket.AF_INET, kind=socket.SOCK_STREAM, number=0):
        return self.send(syscall_pb2.Socket(context_data=self.context(tgid), domain=family, type=kind,
                                            exit=syscall_pb2.Exit(errorno=number)), MT.MESSAGE_SYSCALL_SOCKET)

    def connect(self, tgid, address: bytes, number):
        return self.send(syscall_pb2.Connect(context_data=self.context(tgid), sysno=CONNECT, fd=3, address=address,
                                             exit=syscall_pb2.Exit(errorno=number)), MT.MESSAGE_SYSCALL_CONNECT)

    def raw(self, tgid, sysno, arg5=0, number=0):
        return self.send(syscall_pb2.Syscall(context_data=self.context(tgid), sysno=sysno, arg5=arg5,
                                             exit=syscall_pb2.Exit(errorno=number)), MT.MESSAGE_SYSCALL_RAW)

    def exit(self, tgid, code=0, signal=0):
        status = signal or code << 8
        return self.send(sentry_pb2.ExitNotifyParentInfo(context_data=self.context(tgid), exit_status=status),
                         MT.MESSAGE_SENTRY_EXIT_NOTIFY_PARENT)

    def task_exit(self, tgid, tid=None, code=0):
        return self.send(sentry_pb2.TaskExit(context_data=self.context(tgid, tid=tid), exit_status=code << 8),
                         MT.MESSAGE_SENTRY_TASK_EXIT)

    def program_started(self, argv=("python3", "-u", "main.py")):
        """The runner's way to the program (confinement.enter_program_namespaces): Popen's child, the
        namespace's init, then the fork that sets its limits and execs the command."""
        self.start().open(RUNNER, "/coderun/input/code", cwd="/")
        self.clone(RUNNER, HELPER).clone(HELPER, NS_INIT).clone(NS_INIT, PROGRAM)
        self.open(PROGRAM, "/proc/self/uid_map", O_WRONLY)  # the preexec, still the runner's
        return self.execve(PROGRAM, argv)

    def summary(self, **kwargs) -> dict:
        audit = RunAudit(self.container_id, **kwargs)
        for packet in self.packets:
            audit.add(wire.decode_point(packet))
        return audit.summary()
