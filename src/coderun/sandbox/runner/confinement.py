"""What keeps the program from the runner: the runner's own user namespace and non-dumpable flag, and the program's
PID and mount namespaces under an init of ours that mirrors its exit status; and the tmpfs whose kernel caps the
scratch dir's inodes and bytes."""

from __future__ import annotations

import os
import resource
import select
import signal
import time

# The program's own PID and mount namespaces (as PID 1 only). In the sandbox's PID namespace the program
# could kill or stop the runner (kill(1, SIGKILL) needs only the same uid, and gVisor's PID 1 has no init
# protection) and its result would be lost; in a namespace of its own, created with a user namespace so no
# privilege is needed, it sees and signals only its own processes.
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
# statvfs f_flag bits (ST_*) -> mount flags (MS_*): a read-only remount of a bind must keep the flags its mount
# has, or a user namespace's kernel refuses it (they are locked).
LOCKED_FLAGS = ((1, MS_RDONLY), (2, MS_NOSUID), (4, MS_NODEV), (8, MS_NOEXEC), (1024, 1024), (2048, 2048),
                (4096, 1 << 21))
PR_SET_DUMPABLE = 4
# Two and a half guard intervals: a zombie lives through at least two checks before the namespace's init reaps it.
ORPHAN_REAP_SECONDS = 0.5
# Past any descriptor a process here holds (the runner opens a handful).
MAX_CLOSE_FD = 65536


def write_id_maps(uid: int, gid: int) -> None:
    """Map our own ids into the new user namespace (the one mapping an unprivileged process may write), so the
    program sees its real uid, not nobody. Best effort: file access is decided by the real ids either way."""
    for name, content in (("setgroups", "deny\n"), ("uid_map", f"{uid} {uid} 1\n"), ("gid_map", f"{gid} {gid} 1\n")):
        try:
            fd = os.open(f"/proc/self/{name}", os.O_WRONLY)  # no O_TRUNC/O_CREAT: gVisor refuses them here
        except OSError:
            continue
        try:
            os.write(fd, content.encode())
        except OSError:
            pass
        finally:
            os.close(fd)


def enter_user_namespace() -> bool:
    """As PID 1, before anything else: move the runner into a user namespace of its own, with its own ids mapped,
    so it may make the program's PID and mount namespaces without privilege, and stays in the program's user
    namespace (it can still read the program's /proc entries to count its processes and open files); and into a
    mount namespace that namespace owns, where it may mount the scratch's tmpfs (mount_capped_scratch). False if
    the runtime refuses (a seccomp profile that denies unshare): the program then runs beside the runner."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0 and libc.unshare(CLONE_NEWUSER) != 0:
        return False
    write_id_maps(uid, gid)  # while still dumpable: the maps of a non-dumpable process are root's
    return True


def capped_scratch_options(max_inodes: int, disk_bytes: int | None, page_size: int) -> str:
    """The scratch tmpfs's options: room for its root and one entry past the cap, and one page past the disk
    limit (or the tmpfs's default, half the memory, without one), so that a full tmpfs is a cap passed, as the
    walk would report it, and the next file or page is refused (ENOSPC)."""
    options = [f"nr_inodes={max_inodes + 2}", "mode=1777"]
    if disk_bytes is not None:
        options.append(f"size={disk_bytes + page_size}")
    return ",".join(options)


def mount_capped_scratch(scratch_dir: str, max_inodes: int, disk_bytes: int | None) -> bool:
    """As PID 1 in our own namespaces (enter_user_namespace), before anything is written there: mount over the
    scratch dir a tmpfs whose kernel (gVisor's Sentry, or Linux) refuses the entry or page past the caps when
    it is made, however little CPU the runner gets to look, and whose statfs counts them (see Guards). Its
    bytes are memory: they count against the pod's memory limit, not the volume's. The program's mount
    namespace is a copy of ours: the runner still reads what it writes there (its artifacts), and it cannot
    lift the caps (no capability after exec, and the syscall filter refuses mount, umount and unshare).
    False where it is refused (no namespaces of ours, a kernel without user mounts): the walk then counts."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    options = capped_scratch_options(max_inodes, disk_bytes, os.sysconf("SC_PAGE_SIZE"))
    try:
        os.makedirs(scratch_dir, exist_ok=True)
    except OSError:
        return False
    return libc.mount(b"tmpfs", os.fsencode(scratch_dir), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()) == 0


def bind_read_only(libc, path: str) -> bool:
    """path read-only in this mount namespace (a bind of it over itself, remounted read-only): the program reads
    what is there, and what the runner adds through its own mount later, and can open for writing, create, unlink
    or rename none of it (the syscall filter refuses it mount and umount). gVisor (runsc, measured 2026-12) still
    lets the owner change attributes through such a mount: chmod, truncate(2) by path, utimes, setxattr. So the
    program (the files' owner: it runs as the runner's uid) can spoil its own run's inputs that way, never another
    run's: a session's runner fetches again any input whose file changed (data.py HeldInput, ctime and size)."""
    try:
        existing = os.statvfs(path).f_flag
    except OSError:
        return False
    raw = os.fsencode(path)
    if libc.mount(raw, raw, None, MS_BIND | MS_REC, None) != 0:
        return False
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
    for st_flag, ms_flag in LOCKED_FLAGS:
        if existing & st_flag:
            flags |= ms_flag
    return libc.mount(None, raw, None, flags, None) == 0


def enter_program_namespaces(max_processes: int, hidden_dir: str | None = None, own_user: bool = False,
                             read_only_dir: str | None = None) -> None:
    """In the child before exec (the runner's preexec): make a PID and a mount namespace and fork twice, so the
    program is PID 2 of it under an init of ours, with a /proc of its own, and return in the program's process.
    The child the runner started (its Popen pid) mirrors the program's exit status, so the run loop sees the
    program's own. Without them (see enter_user_namespace) the program runs beside us as before.

    own_user (a fork of the fork server, which has no capability to make them): in a user namespace of its own
    too, which gives the fork those capabilities, and takes them from the program (drop_capabilities), as the
    exec of a cold start does. There, a refusal raises (OSError): such a fork must not run a program.

    hidden_dir (the raw input, which the runner has read) gets an empty read-only tmpfs over it: the program
    sees its input only where the runner laid it out, the same whether it came from a ConfigMap or a warm pod's
    stdin, and cannot write where a warm pod's runner wrote it (run.json, and the data plane's grant in it). Best
    effort: if refused, it stays visible.

    read_only_dir (the data plane's inputs dir, when it exists): read-only to the program (bind_read_only). Best
    effort too: if refused, the files are still mode 0444 (data.py), which their owner, the program's uid, may
    change; a session's runner fetches again any input whose file changed."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWPID | CLONE_NEWNS | (CLONE_NEWUSER if own_user else 0)) != 0:
        if own_user:
            raise OSError(ctypes.get_errno(), "the program's namespaces were refused")
        return
    if own_user:
        write_id_maps(uid, gid)
    if hidden_dir is not None:
        libc.mount(b"tmpfs", os.fsencode(hidden_dir), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    if read_only_dir is not None and os.path.isdir(read_only_dir):
        bind_read_only(libc, read_only_dir)
    status_read, status_write = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(status_read)
        # The sandbox's /proc would list the runner and its helpers by their outer PIDs: the program sees its
        # own namespace only. Best effort: the sandbox's /proc stays (the runner is not dumpable) if refused.
        libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        program = os.fork()
        if program == 0:
            os.close(status_write)
            if own_user:
                drop_capabilities(libc)
            return
        serve_as_namespace_init(program, status_write, max_processes)
    os.close(status_write)
    mirror_program_status(init, status_read)


LINUX_CAPABILITY_VERSION_3 = 0x20080522


def drop_capabilities(libc) -> None:
    """No effective, permitted or inheritable capability left (the bounding set stays, as after a cold start's
    exec): what a process forked in a user namespace of its own has there would otherwise be the program's."""
    import ctypes
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable}, all zero
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "the program's capabilities could not be dropped")


def close_all_but(keep: int) -> None:
    """The helpers hold none of the program's pipes (the runner reads them to EOF) or Popen's error pipe."""
    os.closerange(0, keep)
    os.closerange(keep + 1, MAX_CLOSE_FD)


def serve_as_namespace_init(program: int, status_write: int, max_processes: int) -> None:
    """PID 1 of the program's namespace: hand the program's wait status to the mirror at once, and keep the
    namespace (what the program left behind, which the runner still counts) until the runner kills it.

    Orphans are reaped every ORPHAN_REAP_SECONDS, not as they end, and not at all while the namespace holds the
    cap's worth of processes: a bomb of short-lived processes leaves its zombies for the runner's next check to
    see, however late that check comes on a busy CPU (reaping them first let such a bomb burn out unseen), while
    orphans that come and go at a sane rate never add up to the cap.
    gVisor gives a namespace's init no protection from its processes' signals: every signal that can be caught
    is (SIGSTOP is undone by the mirror; SIGKILL ends the namespace, the program's own doing)."""
    close_all_but(status_write)
    for number in signal.valid_signals():
        if number not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            try:
                signal.signal(number, lambda _number, _frame: None)
            except (OSError, ValueError):  # the realtime signals libc keeps for itself
                pass
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    next_reap = time.monotonic()
    program_running = True
    while True:
        signal.sigtimedwait([signal.SIGCHLD], ORPHAN_REAP_SECONDS)
        reap_all = time.monotonic() >= next_reap and namespace_processes() < max_processes
        while reap_all or program_running:
            try:
                pid, wait_status = os.waitpid(-1 if reap_all else program, os.WNOHANG)
            except ChildProcessError:  # nobody left: the namespace ends with us
                os._exit(0)
            if pid == 0:
                break
            if pid == program:
                os.write(status_write, wait_status.to_bytes(4, "little"))
                program_running = False
        if reap_all:
            next_reap = time.monotonic() + ORPHAN_REAP_SECONDS


def namespace_processes() -> int:
    """Processes in this PID namespace, zombies included (its own /proc; the sandbox's, counting more, if the
    mount was refused)."""
    try:
        return sum(1 for name in os.listdir("/proc") if name.isdigit())
    except OSError:
        return 0


def mirror_program_status(init: int, status_read: int) -> None:
    """End as the program ended: its exit code, or its signal. Meanwhile, resume our init whenever the program
    stops it. No status means the init was killed and the whole namespace with it: the program killed its own
    init, so it ends as killed."""
    close_all_but(status_read)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda _number, _frame: None)
    raw = b""
    while True:
        ready = select.select([status_read, wake_read], [], [])[0]
        if status_read in ready:
            raw = os.read(status_read, 4)
            break
        os.read(wake_read, 64)
        pid, wait_status = os.waitpid(init, os.WNOHANG | os.WUNTRACED)
        if pid and os.WIFSTOPPED(wait_status):
            os.kill(init, signal.SIGCONT)
    if len(raw) == 4:
        wait_status = int.from_bytes(raw, "little")
        if os.WIFEXITED(wait_status):
            os._exit(os.WEXITSTATUS(wait_status))
        number = os.WTERMSIG(wait_status)
    else:
        number = signal.SIGKILL
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.set_wakeup_fd(-1)
    if number not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
    os._exit(128 + number)


def make_undumpable() -> bool:
    """Keep the program out of /proc/<runner>: a non-dumpable process's /proc entries belong to root, so the
    program (same uid) can neither write to our stdout through /proc/1/fd/1 nor read our memory. The flag is
    per process and execve resets it, so the program itself is unaffected."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
