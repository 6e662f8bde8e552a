"""The socket address a connect(2) point carries: the raw struct sockaddr the program passed (gVisor copies
addrlen bytes, syscalls/linux CaptureAddress), a kernel struct, so unpacked with struct and ipaddress."""

from __future__ import annotations

import ipaddress
import struct
from typing import NamedTuple

AF_UNSPEC, AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET = 0, 1, 2, 10, 16, 17
SOCK_STREAM, SOCK_DGRAM, SOCK_RAW, SOCK_SEQPACKET = 1, 2, 3, 5
SOCK_TYPE_MASK = 0xF  # type without SOCK_NONBLOCK and SOCK_CLOEXEC
FAMILIES = {AF_UNSPEC: "unspec", AF_UNIX: "unix", AF_INET: "inet", AF_INET6: "inet6", AF_NETLINK: "netlink",
            AF_PACKET: "packet"}
TYPES = {SOCK_STREAM: "stream", SOCK_DGRAM: "dgram", SOCK_RAW: "raw", SOCK_SEQPACKET: "seqpacket"}


class Address(NamedTuple):
    family: str
    address: str  # an IP address, a unix socket path ('@name' for the abstract namespace), or '' if unreadable
    port: int | None


def family_name(family: int) -> str:
    return FAMILIES.get(family, f"family-{family}")


def protocol_name(family: int, sock_type: int) -> str:
    """tcp, udp, raw, unix, … for a socket(2) family and type."""
    kind = sock_type & SOCK_TYPE_MASK
    if family in (AF_INET, AF_INET6):
        return {SOCK_STREAM: "tcp", SOCK_DGRAM: "udp", SOCK_RAW: "raw"}.get(kind, TYPES.get(kind, f"type-{kind}"))
    return family_name(family)


def parse(raw: bytes) -> Address:
    if len(raw) < 2:
        return Address("unknown", "", None)
    family = struct.unpack_from("<H", raw)[0]  # sa_family_t, host order (little-endian on amd64 and arm64)
    if family == AF_INET and len(raw) >= 8:
        return Address("inet", str(ipaddress.IPv4Address(raw[4:8])), struct.unpack_from(">H", raw, 2)[0])
    if family == AF_INET6 and len(raw) >= 24:
        return Address("inet6", str(ipaddress.IPv6Address(raw[8:24])), struct.unpack_from(">H", raw, 2)[0])
    if family == AF_UNIX:
        path = raw[2:]
        if path[:1] == b"\0":
            return Address("unix", "@" + path[1:].decode("utf-8", "backslashreplace"), None)
        return Address("unix", path.split(b"\0", 1)[0].decode("utf-8", "backslashreplace"), None)
    return Address(family_name(family), "", None)
