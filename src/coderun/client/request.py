"""What a caller asks to run, and the CodeRun object that carries it. Pure: no API calls.

`RunRequest` is the ONE input model behind the SDK's `run(...)`, the MCP `run_code` tool and the OpenAI /
Anthropic tool definitions (coderun.tools), so the three cannot drift apart.
"""
from __future__ import annotations

import base64
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..api.models import (API_VERSION, KIND, LANGUAGE_PATTERN, MAX_CODE_BYTES, MAX_FILES, MAX_STDIN_BYTES,
                          CodeRunSpec, FileInput, Limits)

CREATED_AT_ANNOTATION = "coderun.io/created-at"
CLIENT_LABEL = "coderun.io/client"
DEFAULT_NAME_PREFIX = "run-"


class RunRequest(BaseModel):
    """Run a program in an isolated sandbox (no network, no secrets) and get its stdout, stderr, exit code and
    structured error. Files the program writes to $CODERUN_OUTPUT_DIR come back as artifacts."""
    model_config = ConfigDict(extra="forbid")

    code: str = Field(min_length=1, max_length=MAX_CODE_BYTES, description=(
        "The complete program source. Print the results you need to stdout."))
    language: str = Field("python", pattern=LANGUAGE_PATTERN, description=(
        "The runtime, e.g. python (with numpy, pandas, matplotlib). list_runtimes shows what is offered."))
    files: list[FileInput] | None = Field(None, max_length=MAX_FILES, description=(
        "Input files placed in the working directory before the program starts, e.g. "
        "[{\"path\": \"data.csv\", \"content\": \"a,b\\n1,2\\n\"}]. Use contentBase64 for binary content."))
    stdin: str | None = Field(None, max_length=MAX_STDIN_BYTES, description="Text passed on standard input.")
    timeout: int | None = Field(None, ge=1, le=3600, description=(
        "Seconds the program may run before it is stopped (reason Timeout). Default from the policy (5)."))

    @field_validator("files", mode="before")
    @classmethod
    def _files_from_mapping(cls, value: Any) -> Any:
        """SDK convenience: {"data.csv": "text" or b"bytes"} is accepted beside the wire list form."""
        if isinstance(value, Mapping):
            return [file_input(path, content) for path, content in value.items()]
        return value

    def to_spec(self, limits: Limits | Mapping[str, Any] | None = None) -> CodeRunSpec:
        """The CodeRun spec; `timeout` wins over limits.timeoutSeconds when both are given."""
        merged = Limits.model_validate(limits) if isinstance(limits, Mapping) else (limits or Limits())
        if self.timeout is not None:
            merged = merged.model_copy(update={"timeout_seconds": self.timeout})
        has_limits = merged.model_dump(exclude_none=True) != {}
        return CodeRunSpec(language=self.language, code=self.code, stdin=self.stdin, files=self.files,
                           limits=merged if has_limits else None)


def file_input(path: str, content: str | bytes) -> FileInput:
    """A spec file: text when the bytes are UTF-8, base64 otherwise."""
    if isinstance(content, str):
        return FileInput(path=path, content=content)
    try:
        return FileInput(path=path, content=content.decode("utf-8"))
    except UnicodeDecodeError:
        return FileInput(path=path, content_base64=base64.b64encode(content).decode("ascii"))



def sandbox_path(local_path: str) -> str:
    """Where a local file lands in the sandbox by default: its base name (the spec allows no '..' or '/')."""
    return PurePosixPath(local_path.replace("\\", "/")).name


def rfc3339_millis(moment: datetime) -> str:
    """2026-11-22T10:00:00.123Z: the precision the operator needs for queueMillis and totalMillis."""
    utc = moment.astimezone(timezone.utc)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def build_body(spec: CodeRunSpec, *, client_name: str, labels: Mapping[str, str] | None = None,
               name: str | None = None, name_prefix: str = DEFAULT_NAME_PREFIX,
               now: datetime | None = None) -> dict[str, Any]:
    """The CodeRun to create. Without `name` the API server picks a unique one from `name_prefix`, so two
    callers never collide; the client label lets an agent list its own runs."""
    metadata: dict[str, Any] = {
        "labels": {CLIENT_LABEL: client_name, **(labels or {})},
        "annotations": {CREATED_AT_ANNOTATION: rfc3339_millis(now or datetime.now(timezone.utc))},
    }
    if name:
        metadata["name"] = name
    else:
        metadata["generateName"] = name_prefix
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata,
            "spec": spec.model_dump(by_alias=True, exclude_none=True)}
