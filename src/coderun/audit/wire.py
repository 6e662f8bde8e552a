"""The remote sink's wire protocol (gVisor pkg/sentry/seccheck/sinks/remote): one SOCK_SEQPACKET connection per
sandbox, opened by runsc on the host when it creates the pod's sandbox.

1. runsc sends a bare `gvisor.common.Handshake{version}`; the agent answers with its own (remote.go `setup`).
2. Then every packet is one point: an 8-byte header (wire/wire.go `Header`, little-endian on amd64 and arm64:
   header_size u16, message_type u16, dropped_count u32) and, from byte header_size on, the point's protobuf
   message, whose class the message type names (common.proto `MessageType`).

dropped_count is the sink's running count of points it could not write (the socket was full), wrapping at 2**32.
The header is a C struct, so it is unpacked with struct; every payload is parsed by the protobuf classes."""

from __future__ import annotations

import struct
from typing import NamedTuple

from google.protobuf.message import DecodeError, Message

from .points import common_pb2, container_pb2, sentry_pb2, syscall_pb2

# wire.CurrentVersion; gVisor refuses a remote whose version is lower than 1 (remote.go minSupportedVersion).
PROTOCOL_VERSION = 1
HEADER = struct.Struct("<HHI")
# remote.go reads the handshake into a 10240-byte buffer; a packet larger than that from runsc is not a handshake.
MAX_HANDSHAKE_BYTES = 10240

MessageType = common_pb2.MessageType
CLASSES: dict[int, type[Message]] = {
    MessageType.MESSAGE_CONTAINER_START: container_pb2.Start,
    MessageType.MESSAGE_SENTRY_CLONE: sentry_pb2.CloneInfo,
    MessageType.MESSAGE_SENTRY_EXEC: sentry_pb2.ExecveInfo,
    MessageType.MESSAGE_SENTRY_EXIT_NOTIFY_PARENT: sentry_pb2.ExitNotifyParentInfo,
    MessageType.MESSAGE_SENTRY_TASK_EXIT: sentry_pb2.TaskExit,
    MessageType.MESSAGE_SENTRY_MMAP: sentry_pb2.MmapInfo,
    MessageType.MESSAGE_SYSCALL_RAW: syscall_pb2.Syscall,
    MessageType.MESSAGE_SYSCALL_OPEN: syscall_pb2.Open,
    MessageType.MESSAGE_SYSCALL_CLOSE: syscall_pb2.Close,
    MessageType.MESSAGE_SYSCALL_READ: syscall_pb2.Read,
    MessageType.MESSAGE_SYSCALL_WRITE: syscall_pb2.Write,
    MessageType.MESSAGE_SYSCALL_CONNECT: syscall_pb2.Connect,
    MessageType.MESSAGE_SYSCALL_EXECVE: syscall_pb2.Execve,
    MessageType.MESSAGE_SYSCALL_SOCKET: syscall_pb2.Socket,
    MessageType.MESSAGE_SYSCALL_CHDIR: syscall_pb2.Chdir,
    MessageType.MESSAGE_SYSCALL_SETID: syscall_pb2.Setid,
    MessageType.MESSAGE_SYSCALL_SETRESID: syscall_pb2.Setresid,
    MessageType.MESSAGE_SYSCALL_PRLIMIT64: syscall_pb2.Prlimit,
    MessageType.MESSAGE_SYSCALL_PIPE: syscall_pb2.Pipe,
    MessageType.MESSAGE_SYSCALL_FCNTL: syscall_pb2.Fcntl,
    MessageType.MESSAGE_SYSCALL_DUP: syscall_pb2.Dup,
    MessageType.MESSAGE_SYSCALL_SIGNALFD: syscall_pb2.Signalfd,
    MessageType.MESSAGE_SYSCALL_CHROOT: syscall_pb2.Chroot,
    MessageType.MESSAGE_SYSCALL_EVENTFD: syscall_pb2.Eventfd,
    MessageType.MESSAGE_SYSCALL_CLONE: syscall_pb2.Clone,
    MessageType.MESSAGE_SYSCALL_BIND: syscall_pb2.Bind,
    MessageType.MESSAGE_SYSCALL_ACCEPT: syscall_pb2.Accept,
    MessageType.MESSAGE_SYSCALL_TIMERFD_CREATE: syscall_pb2.TimerfdCreate,
    MessageType.MESSAGE_SYSCALL_TIMERFD_SETTIME: syscall_pb2.TimerfdSetTime,
    MessageType.MESSAGE_SYSCALL_TIMERFD_GETTIME: syscall_pb2.TimerfdGetTime,
    MessageType.MESSAGE_SYSCALL_FORK: syscall_pb2.Fork,
    MessageType.MESSAGE_SYSCALL_INOTIFY_INIT: syscall_pb2.InotifyInit,
    MessageType.MESSAGE_SYSCALL_INOTIFY_ADD_WATCH: syscall_pb2.InotifyAddWatch,
    MessageType.MESSAGE_SYSCALL_INOTIFY_RM_WATCH: syscall_pb2.InotifyRmWatch,
    MessageType.MESSAGE_SYSCALL_SOCKETPAIR: syscall_pb2.SocketPair,
    MessageType.MESSAGE_SYSCALL_MMAP: syscall_pb2.Mmap,
    MessageType.MESSAGE_SYSCALL_LISTEN: syscall_pb2.Listen,
    MessageType.MESSAGE_SYSCALL_PTRACE: syscall_pb2.Ptrace,
}


class WireError(ValueError):
    """A packet that is not what the remote sink sends: the connection cannot be trusted past it."""


class Point(NamedTuple):
    """One decoded packet. message is None for a message type this schema does not know (gVisor may add types
    without a version bump, common.proto says: they are counted, not fatal)."""
    message_type: int
    dropped_count: int
    message: Message | None


def handshake_reply() -> bytes:
    return common_pb2.Handshake(version=PROTOCOL_VERSION).SerializeToString()


def read_handshake(packet: bytes) -> int:
    """The sandbox's protocol version, from its first packet."""
    if len(packet) >= MAX_HANDSHAKE_BYTES:
        raise WireError(f"handshake of {len(packet)} bytes")
    try:
        version = common_pb2.Handshake.FromString(packet).version
    except DecodeError as error:
        raise WireError(f"handshake does not parse: {error}") from None
    if version < PROTOCOL_VERSION:
        raise WireError(f"sandbox protocol version {version} is older than {PROTOCOL_VERSION}")
    return version


def encode_point(message: Message, message_type: int, dropped_count: int = 0) -> bytes:
    """A packet as remote.go `write` frames it (for tests and tools; the agent only decodes)."""
    return HEADER.pack(HEADER.size, message_type, dropped_count & 0xFFFFFFFF) + message.SerializeToString()


def read_header(packet: bytes) -> tuple[int, int, int]:
    """(header_size, message_type, dropped_count), checked: the agent reads only this on receipt (a packet's
    payload is decoded when a run's audit is asked for)."""
    if len(packet) < HEADER.size:
        raise WireError(f"packet of {len(packet)} bytes is shorter than the header")
    header_size, message_type, dropped_count = HEADER.unpack_from(packet)
    # A newer gVisor may send a longer header (its size says where the payload starts); never a shorter one.
    if header_size < HEADER.size or header_size > len(packet):
        raise WireError(f"header size {header_size} in a packet of {len(packet)} bytes")
    return header_size, message_type, dropped_count


def decode_point(packet: bytes) -> Point:
    header_size, message_type, dropped_count = read_header(packet)
    cls = CLASSES.get(message_type)
    if cls is None:
        return Point(message_type, dropped_count, None)
    try:
        message = cls.FromString(packet[header_size:])
    except DecodeError as error:
        raise WireError(f"{cls.DESCRIPTOR.full_name} does not parse: {error}") from None
    return Point(message_type, dropped_count, message)
