"""The scratch dir as the runner's own tmpfs (run.json scratchTmpfs): its kernel refuses the entry or the page past
the caps when it is made, however far behind the runner's checks are, and the runner reads the counts from statfs.
Run as PID 1 (the runner mounts it in namespaces of its own) and as an unprivileged uid, as in the pod; they skip on a
host that refuses unprivileged user namespaces. Where the runner has no namespaces of its own, the walk counts as
before (the last test)."""
from __future__ import annotations

import os
import textwrap

import pytest

MIB = 1024 * 1024
PAGE = os.sysconf("SC_PAGE_SIZE")
# What the runner lays out in the scratch dir before the program starts: work/, work/main.py, home/, outputs/.
RUNNERS_ENTRIES = 4


def program(source: str) -> str:
    return textwrap.dedent(source).lstrip()


@pytest.fixture
def capped_run(as_nobody, as_pid1, user_mounts):
    """run(code, **run.json overrides) as in the pod: unprivileged, PID 1, the scratch a capped tmpfs."""
    run, drop = as_nobody
    return lambda code, **overrides: run(code, wrapper=(*as_pid1, *drop), scratchTmpfs=True, **overrides)


@pytest.mark.parametrize("then", ["time.sleep(30)", "pass"], ids=["keeps-running", "exits-at-once"])
def test_the_entry_past_the_inode_cap_is_refused_and_reported(capped_run, then):
    # The kernel stops the program at exactly one entry past the cap, checks or no checks; the runner reads that
    # from statfs, whether the program lingers or ends at once having handled the error.
    code = program(f"""
        import errno, itertools, os, time
        for i in itertools.count():  # directories in /tmp and files in the work dir: both are inodes
            try:
                os.mkdir(f"../d{{i}}") if i % 2 else open(f"f{{i}}", "w").close()
            except OSError as exc:
                print(i, errno.errorcode[exc.errno], flush=True)
                break
        {then}
    """)
    run = capped_run(code, maxInodes=500, timeoutSeconds=30)
    assert run.frame["stdout"] == f"{500 + 1 - RUNNERS_ENTRIES} ENOSPC\n", run.frame
    assert run.frame["reason"] == "DiskLimitExceeded", run.frame
    assert run.frame["limit"] == {"kind": "inodes", "limit": 500, "observed": 501}
    assert run.elapsed < 5
    # Nothing reached the volume under the tmpfs.
    assert list(run.work.parent.iterdir()) == []


@pytest.mark.parametrize("keep", ["pass", "os.unlink(name)"], ids=["named", "unlinked-but-open"])
def test_the_page_past_the_disk_limit_is_refused_and_reported(capped_run, keep):
    # Files of 256 KiB each (no single one meets RLIMIT_FSIZE), deleted-but-open ones too: ENOSPC one page
    # past the disk limit, and the runner counts the same pages.
    code = program(f"""
        import errno, itertools, os, time
        held, written = [], 0
        for i in itertools.count():
            name = f"f{{i}}"
            held.append(open(name, "wb", buffering=0))
            {keep}
            try:
                for _ in range(64):
                    written += held[-1].write(b"x" * 4096)
            except OSError as exc:
                print(written, errno.errorcode[exc.errno], flush=True)
                break
        time.sleep(30)
    """)
    run = capped_run(code, diskBytes=2 * MIB, timeoutSeconds=30)
    written, error = run.frame["stdout"].split()
    assert error == "ENOSPC" and 2 * MIB - 2 * PAGE <= int(written) <= 2 * MIB, run.frame  # main.py has a page
    assert run.frame["reason"] == "DiskLimitExceeded" and run.frame["limit"]["kind"] == "disk", run.frame
    assert run.frame["limit"]["observed"] == 2 * MIB + PAGE
    assert run.elapsed < 5


def test_the_runner_still_collects_the_artifacts_and_lays_out_a_warm_input(capped_run):
    code = program("""
        import os
        open(os.path.join(os.environ["CODERUN_OUTPUT_DIR"], "a.txt"), "w").write("artifact")
        info = os.statvfs(os.environ["TMPDIR"])
        print(open("data.txt").read(), info.f_files, info.f_files - info.f_ffree - 1)
    """)
    run = capped_run(code, input_files={"data.txt": b"laid out"}, warm_nonce="0123456789abcdef" * 4,
                     maxInodes=100)
    assert run.frame["reason"] == "Completed", run.frame
    # work/, main.py, data.txt, home/, outputs/, a.txt: the input counts against the cap, as the walk counts it.
    assert run.frame["stdout"] == "laid out 102 6\n"
    assert [(a["name"], a["size"]) for a in run.frame["artifacts"]] == [("a.txt", 8)]
    assert list(run.work.parent.iterdir()) == []


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="nothing here is x86_64's, but the filter's table is")
def test_the_program_cannot_lift_the_caps(capped_run):
    code = program("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        scratch = os.environ["TMPDIR"].encode()
        def attempt(name, result):
            print(name, "refused" if result == -1 and ctypes.get_errno() == 1 else f"allowed {result}")
        print([line.split()[1] for line in open("/proc/self/status") if line.startswith(("CapPrm", "CapEff"))])
        attempt("umount", libc.umount2(scratch, 0))
        attempt("umount-detach", libc.umount2(scratch, 2))
        attempt("remount", libc.mount(None, scratch, None, 32, b"nr_inodes=1000000,size=1g"))  # MS_REMOUNT
        attempt("mount-over", libc.mount(b"tmpfs", scratch, b"tmpfs", 0, b"nr_inodes=1000000"))
        attempt("unshare-user-mount", libc.unshare(0x10000000 | 0x20000))
        print(os.statvfs(scratch).f_files)
    """)
    run = capped_run(code, maxInodes=100)
    assert run.frame["reason"] == "Completed", run.frame
    assert run.frame["stdout"].splitlines() == [
        "['0000000000000000', '0000000000000000']", "umount refused", "umount-detach refused", "remount refused",
        "mount-over refused", "unshare-user-mount refused", "102"], run.frame


def test_without_namespaces_of_its_own_the_walk_counts(run_runner):
    # Not PID 1 (a host, the runner tier): no mount, the walk finds the cap passed, and the files are the volume's.
    code = program("""
        import itertools
        for i in itertools.count():
            open(f"f{i}", "w").close()
    """)
    run = run_runner(code, maxInodes=500, timeoutSeconds=20, scratchTmpfs=True)
    assert (run.frame["reason"], run.frame["limit"]["kind"]) == ("DiskLimitExceeded", "inodes"), run.frame
    assert run.frame["limit"]["observed"] > 500
    assert len(os.listdir(run.work)) > 400
