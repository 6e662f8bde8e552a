"""Running one program's code in an interpreter that is already started, as if `python3 -u main.py` had run it.

A session with keepState (and, later, a warm pod's pre-started interpreter) runs each run's code here, in a
`__main__` module whose globals persist from run to run. What the program sees is a cold run's: `__name__` is
"__main__", `__file__` the code file's absolute path, sys.argv == ["main.py"], sys.path[0] the work dir, the
work dir as cwd; an uncaught error goes through sys.excepthook with no frame of this module in its traceback, so
stderr (and the error parser's type, message and line) are a cold run's; SystemExit, KeyboardInterrupt and
atexit end the run as they would end the process. The code is compiled from the file the runner wrote, so
linecache shows its lines in tracebacks as a cold run's do.

Stdlib only, and cheap to import: it is loaded into the program's own interpreter before the code arrives.
"""

from __future__ import annotations

import atexit
import builtins
import os
import signal
import sys
import threading
import types
from importlib.machinery import SourceFileLoader

# What a SystemExit whose code is not an int exits with, as CPython's handle_system_exit does (after printing it).
EXIT_FOR_OTHER_CODES = 1
EXIT_FOR_UNCAUGHT = 1


def main_module(path: str) -> types.ModuleType:
    """A fresh `__main__` for a session: the module a cold `python3 main.py` would run in (its globals then
    persist from run to run: pickle and dataclasses find the run's classes in sys.modules["__main__"])."""
    module = types.ModuleType("__main__")
    module.__dict__.update(_main_attributes(path), __builtins__=builtins)
    return module


def _main_attributes(path: str) -> dict:
    return {"__name__": "__main__", "__file__": path, "__cached__": None, "__package__": None, "__spec__": None,
            "__loader__": SourceFileLoader("__main__", path), "__doc__": None}


def exit_status(code: object) -> int:
    """The exit status of a process ended by `raise SystemExit(code)`, as CPython computes it: None is 0; an int
    is cut to a byte by the kernel (one beyond a C long is -1: 255); anything else is printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if -(1 << 63) <= code < (1 << 63) else 255
    try:
        print(code, file=sys.stderr)
    except Exception:  # a __str__ that raises: CPython prints nothing then either
        pass
    return EXIT_FOR_OTHER_CODES


def _without_own_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback from the program's first frame on: this module's frames are not the program's."""
    while tb is not None and tb.tb_frame.f_code is run_as_main.__code__:
        tb = tb.tb_next
    return tb


def _report_uncaught(error: BaseException) -> None:
    """What CPython does with an exception that reaches the top of `main.py`: sys.excepthook."""
    error.__traceback__ = _without_own_frames(error.__traceback__)
    try:
        sys.excepthook(type(error), error, error.__traceback__)
    except Exception:  # an excepthook of the program's that fails: CPython falls back to its own
        sys.__excepthook__(type(error), error, error.__traceback__)


def _end_of_program() -> None:
    """What a process does at its end, before it exits: wait for the program's non-daemon threads, run its atexit
    handlers (CPython clears them once run, so the next run starts with none), flush its streams."""
    main = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def run_as_main(module: types.ModuleType, work_dir: str, code_file: str = "main.py") -> int:
    """Run the code file (already written to work_dir) in `module`, as a cold `python3 -u <code_file>` run from
    work_dir would. Return what that process's subprocess.returncode would be: its exit status, or -SIGINT for an
    uncaught KeyboardInterrupt (CPython ends such a process by the signal)."""
    path = os.path.join(os.path.abspath(work_dir), code_file)
    module.__dict__.update(_main_attributes(path))
    os.chdir(work_dir)
    sys.argv[:] = [code_file]
    sys.path[0:1] = [os.path.dirname(path)]
    sys.modules["__main__"] = module
    status = 0
    try:
        with open(path, "rb") as handle:
            source = handle.read()
        exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)
    except SystemExit as exc:
        status = exit_status(exc.code)
    except KeyboardInterrupt as exc:
        _report_uncaught(exc)
        status = -signal.SIGINT
    except BaseException as exc:  # noqa: BLE001 - the program's own error: reported as CPython reports it
        _report_uncaught(exc)
        status = EXIT_FOR_UNCAUGHT
    try:
        _end_of_program()
    except SystemExit as exc:  # an atexit handler may exit too; CPython ignores that status, so do we
        del exc
    except BaseException as exc:  # noqa: BLE001
        _report_uncaught(exc)
    return status
