"""Compile gVisor's trace point schema (the .proto files beside this module) into the Python classes beside it.

`make audit-protos` runs this; tests/unit/test_audit_points.py compiles again and fails when the committed classes
differ. protoc needs each file at the path gVisor's imports name (pkg/sentry/seccheck/points/), so the files are
staged there; the generated absolute imports (`from pkg.sentry.seccheck.points import common_pb2`) are made
relative, so the classes load as coderun.audit.points.*_pb2 with the descriptors' own gVisor file names."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
GVISOR_DIR = "pkg/sentry/seccheck/points"
SCHEMAS = ("common", "container", "sentry", "syscall")
ABSOLUTE_IMPORT = re.compile(r"^from pkg\.sentry\.seccheck\.points import ", re.MULTILINE)


def compile_schemas() -> dict[str, str]:
    """{module file name: generated source}, from grpcio-tools' protoc (imported here only: the runtime never
    needs it)."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        staged, out = Path(tmp, "in"), Path(tmp, "out")
        (staged / GVISOR_DIR).mkdir(parents=True)
        out.mkdir()
        for name in SCHEMAS:
            (staged / GVISOR_DIR / f"{name}.proto").write_bytes((HERE / f"{name}.proto").read_bytes())
        args = ["protoc", f"-I{staged}", f"--python_out={out}"]
        args += [str(staged / GVISOR_DIR / f"{name}.proto") for name in SCHEMAS]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {args}")
        return {f"{name}_pb2.py": ABSOLUTE_IMPORT.sub("from . import ", (out / GVISOR_DIR / f"{name}_pb2.py")
                                                        .read_text())
                for name in SCHEMAS}


def main() -> int:
    for file_name, source in compile_schemas().items():
        (HERE / file_name).write_text(source)
        print(f"wrote {HERE / file_name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
