"""The program's syscall filter: classic BPF that refuses namespaces, mounts and the kernel's riskier interfaces."""

from __future__ import annotations

import errno
import functools
import os

# Every namespace flag of clone(2): the program may fork, never make namespaces.
CLONE_NAMESPACE_FLAGS = 0x7E020000
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
X32_SYSCALL_BIT = 0x40000000
BPF_LD_W_ABS, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_RET = 0x20, 0x15, 0x35, 0x45, 0x06
SECCOMP_DATA_ARCH, SECCOMP_DATA_NR, SECCOMP_DATA_ARG0 = 4, 0, 16
# What the program never needs and the sandbox kernel (gVisor's Sentry) need not expose to it: namespaces and
# mounts (what containerd's default profile allows only with CAP_SYS_ADMIN), BPF, keyrings, perf events,
# userfaultfd, io_uring, kernel modules and kexec. Refused with EPERM; clone3 with ENOSYS, so libc falls back
# to clone, whose flags the filter can read.
DENIED_SYSCALLS = (
    "unshare setns mount umount2 pivot_root chroot open_tree move_mount fsopen fsconfig fsmount fspick "
    "mount_setattr open_by_handle_at name_to_handle_at bpf keyctl add_key request_key perf_event_open "
    "userfaultfd io_uring_setup io_uring_enter io_uring_register kexec_load kexec_file_load init_module "
    "finit_module delete_module acct swapon swapoff reboot quotactl quotactl_fd syslog fanotify_init "
    "lookup_dcookie sethostname setdomainname").split()
# os.uname().machine -> (AUDIT_ARCH_*, syscall numbers), from the kernel's tables.
SYSCALL_TABLES = {
    "x86_64": (0xC000003E, dict(
        unshare=272, setns=308, mount=165, umount2=166, pivot_root=155, chroot=161, open_tree=428, move_mount=429,
        fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442, open_by_handle_at=304,
        name_to_handle_at=303, bpf=321, keyctl=250, add_key=248, request_key=249, perf_event_open=298,
        userfaultfd=323, io_uring_setup=425, io_uring_enter=426, io_uring_register=427, kexec_load=246,
        kexec_file_load=320, init_module=175, finit_module=313, delete_module=176, acct=163, swapon=167,
        swapoff=168, reboot=169, quotactl=179, quotactl_fd=443, syslog=103, fanotify_init=300, lookup_dcookie=212,
        sethostname=170, setdomainname=171, clone=56, clone3=435)),
    "aarch64": (0xC00000B7, dict(
        unshare=97, setns=268, mount=40, umount2=39, pivot_root=41, chroot=51, open_tree=428, move_mount=429,
        fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442, open_by_handle_at=265,
        name_to_handle_at=264, bpf=280, keyctl=219, add_key=217, request_key=218, perf_event_open=241,
        userfaultfd=282, io_uring_setup=425, io_uring_enter=426, io_uring_register=427, kexec_load=104,
        kexec_file_load=294, init_module=105, finit_module=273, delete_module=106, acct=89, swapon=224,
        swapoff=225, reboot=142, quotactl=60, quotactl_fd=443, syslog=116, fanotify_init=262, lookup_dcookie=18,
        sethostname=161, setdomainname=162, clone=220, clone3=435)),
}


@functools.lru_cache(maxsize=None)  # the fork server computes it once for all its forks
def syscall_filter(machine: str) -> list[tuple[int, int, int, int]] | None:
    """The program's seccomp filter as classic BPF (code, jt, jf, k), or None for an architecture without a
    table. Another architecture's calling convention (e.g. x32 or i386 on x86_64) is refused outright."""
    if machine not in SYSCALL_TABLES:
        return None
    audit_arch, numbers = SYSCALL_TABLES[machine]
    denied = [numbers[name] for name in DENIED_SYSCALLS]
    body_length = 4 + len(denied) + 4
    allow, deny, no_such = body_length, body_length + 1, body_length + 2

    def jump(at: int, op: int, k: int, if_true: int | None, if_false: int | None) -> tuple[int, int, int, int]:
        # BPF jumps are relative to the next instruction; None falls through.
        relative = [0 if target is None else target - at - 1 for target in (if_true, if_false)]
        return (op, relative[0], relative[1], k)

    code = [(BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARCH)]
    code.append(jump(len(code), BPF_JEQ, audit_arch, None, deny))
    code.append((BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_NR))
    code.append(jump(len(code), BPF_JGE, X32_SYSCALL_BIT, deny, None))
    for number in denied:
        code.append(jump(len(code), BPF_JEQ, number, deny, None))
    code.append(jump(len(code), BPF_JEQ, numbers["clone3"], no_such, None))
    code.append(jump(len(code), BPF_JEQ, numbers["clone"], None, allow))
    code.append((BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARG0))  # the low half of the flags
    code.append(jump(len(code), BPF_JSET, CLONE_NAMESPACE_FLAGS, deny, allow))
    assert len(code) == body_length
    code += [(BPF_RET, 0, 0, SECCOMP_RET_ALLOW), (BPF_RET, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM),
             (BPF_RET, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS)]
    return code


def install_syscall_filter() -> bool:
    """Install the filter on this process and everything it starts (no_new_privs makes that unprivileged)."""
    instructions = syscall_filter(os.uname().machine)
    if instructions is None:
        return False
    import ctypes

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                    ("k", ctypes.c_uint32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    table = (SockFilter * len(instructions))(*instructions)
    program = SockFprog(len(instructions), table)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) == 0
