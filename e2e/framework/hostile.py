"""The hostile programs' common prelude (report, attempt, tcp, udp) and how their facts are read back."""
from __future__ import annotations

import json


BREACH = ("allowed", "open", "reply")


PRELUDE = r'''
import ctypes, errno, json, os, resource, signal, socket, stat, struct, sys, time
LIBC = ctypes.CDLL(None, use_errno=True)
OUT = os.environ.get("CODERUN_OUTPUT_DIR", "/tmp/outputs")
def report(**facts):
    sys.stdout.write(json.dumps(facts) + "\n")
    sys.stdout.flush()
def attempt(fn):
    try:
        fn()
        return "allowed"
    except BaseException as e:
        return type(e).__name__
def attempt_list(path):
    try:
        return os.listdir(path)
    except OSError:
        return []
def sysc(number, *args):
    return LIBC.syscall(ctypes.c_long(number), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
def addr_of(host, port, kind):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    info = socket.getaddrinfo(host, port, family, kind, 0, socket.AI_NUMERICHOST)[0]
    return info[0], info[4]
def tcp(host, port, timeout=2):
    try:
        family, addr = addr_of(host, port, socket.SOCK_STREAM)
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(addr)
        return "open"
    except BaseException as e:
        return type(e).__name__
def udp(host, port, payload=b"coderun-hostile", timeout=2):
    try:
        family, addr = addr_of(host, port, socket.SOCK_DGRAM)
        s = socket.socket(family, socket.SOCK_DGRAM)
        s.settimeout(timeout)
        s.sendto(payload, addr)
        s.recvfrom(2048)
        return "reply"
    except BaseException as e:
        return type(e).__name__
def scoped(addr):
    return addr + "%eth0" if addr.lower().startswith("fe80") else addr
'''


def facts_of(status: dict) -> dict:
    """The program's own report: the last JSON object line it printed."""
    for line in reversed((status.get("stdout") or "").split("\n")):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return {}
