"""The remote sink's framing, as gVisor's sinks/remote writes it: handshake, 8-byte header, protobuf payload."""
import struct

import pytest

from coderun.audit import wire
from coderun.audit.points import common_pb2, container_pb2, syscall_pb2

MT = common_pb2.MessageType


def test_a_point_round_trips_through_the_header_and_its_class():
    start = container_pb2.Start(id="abc", args=["python3", "-I", "/opt/coderun"],
                                context_data=common_pb2.ContextData(container_id="abc", thread_group_id=7))
    packet = wire.encode_point(start, MT.MESSAGE_CONTAINER_START, dropped_count=3)
    assert packet[:8] == struct.pack("<HHI", 8, 1, 3)  # header_size, message_type, dropped_count (wire.go)
    point = wire.decode_point(packet)
    assert point.message_type == MT.MESSAGE_CONTAINER_START and point.dropped_count == 3
    assert point.message == start


def test_a_longer_header_from_a_newer_gvisor_is_skipped_by_its_size():
    body = syscall_pb2.Open(pathname="/etc/passwd").SerializeToString()
    packet = struct.pack("<HHI", 12, MT.MESSAGE_SYSCALL_OPEN, 0) + b"\xff" * 4 + body
    assert wire.decode_point(packet).message.pathname == "/etc/passwd"


def test_an_unknown_message_type_is_kept_as_unknown_not_fatal():
    point = wire.decode_point(struct.pack("<HHI", 8, 999, 0) + b"\x08\x01")
    assert point.message is None and point.message_type == 999


@pytest.mark.parametrize("packet", [
    b"",
    b"\x08\x00\x07\x00",                                    # shorter than the header
    struct.pack("<HHI", 4, MT.MESSAGE_SYSCALL_OPEN, 0),     # header size below the struct's
    struct.pack("<HHI", 64, MT.MESSAGE_SYSCALL_OPEN, 0),    # header size past the packet
    struct.pack("<HHI", 8, MT.MESSAGE_SYSCALL_OPEN, 0) + b"\x0a\xff\xff",  # a truncated length-delimited field
])
def test_malformed_packets_are_refused(packet):
    with pytest.raises(wire.WireError):
        wire.decode_point(packet)


def test_the_handshake_both_ways():
    assert common_pb2.Handshake.FromString(wire.handshake_reply()).version == wire.PROTOCOL_VERSION
    assert wire.read_handshake(common_pb2.Handshake(version=2).SerializeToString()) == 2
    with pytest.raises(wire.WireError):
        wire.read_handshake(common_pb2.Handshake(version=0).SerializeToString())
    with pytest.raises(wire.WireError):
        wire.read_handshake(b"\x08" * wire.MAX_HANDSHAKE_BYTES)
