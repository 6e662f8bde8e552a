"""What a caller asks to run, and the CodeRun object that carries it. Pure: no API calls.

`RunRequest` is the ONE input model behind the SDK's `run(...)`, the MCP `run_code` tool and the OpenAI /
Anthropic tool definitions (coderun.tools), so the three cannot drift apart.
"""
from __future__ import annotations

import base64
import secrets
import uuid
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Any, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .errors import CodeRunError
from ..api.identity import APPROVED_BY, CREATED_BY, CREATED_BY_GROUPS, REJECTED_BY
from ..api.models import (API_VERSION, CREATED_AT_ANNOTATION, KIND, LANGUAGE_PATTERN, MAX_CODE_BYTES, MAX_FILES,
                          MAX_STDIN_BYTES, QUANTITY_PATTERN, CodeRunSpec, FileInput, Limits)

# Unique to one create call: a retried create that meets AlreadyExists adopts the run only when it carries this.
CREATE_TOKEN_ANNOTATION = "coderun.io/create-token"
CLIENT_LABEL = "coderun.io/client"
DEFAULT_NAME_PREFIX = "run-"
# generateName's alphabet (no vowels, so no words; no 0/1/3 beside o/l/e); 27^8 names per prefix.
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
NAME_SUFFIX_LENGTH = 8
MAX_NAME_LENGTH = 63


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
    memory: str | None = Field(None, pattern=QUANTITY_PATTERN, description=(
        "Memory for the program, e.g. 512Mi or 1Gi (reason OOMKilled when exceeded). Default from the policy "
        "(256Mi)."))
    cpu: str | None = Field(None, pattern=QUANTITY_PATTERN, description=(
        "CPU for the program, e.g. 500m or 2. Default from the policy (1)."))

    @model_validator(mode="before")
    @classmethod
    def _null_is_not_given(cls, value: Any) -> Any:
        """A null argument means the default (a strict tool schema makes a model send every property, the ones
        it does not need as null), so the policy's default applies as when the argument is left out."""
        if isinstance(value, Mapping):
            return {key: item for key, item in value.items() if item is not None}
        return value

    @field_validator("files", mode="before")
    @classmethod
    def _files_from_mapping(cls, value: Any) -> Any:
        """SDK convenience: {"data.csv": "text" or b"bytes"} is accepted beside the wire list form."""
        if isinstance(value, Mapping):
            return [file_input(path, content) for path, content in value.items()]
        return value

    def to_spec(self, limits: Limits | Mapping[str, Any] | None = None) -> CodeRunSpec:
        """The CodeRun spec; `timeout`, `memory` and `cpu` win over `limits`' own when both are given."""
        merged = Limits.model_validate(limits) if isinstance(limits, Mapping) else (limits or Limits())
        asked = {"timeout_seconds": self.timeout, "memory": self.memory, "cpu": self.cpu}
        merged = merged.model_copy(update={key: value for key, value in asked.items() if value is not None})
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


def new_run_name(prefix: str = DEFAULT_NAME_PREFIX) -> str:
    """A unique name chosen by the client, as generateName would, but before the first attempt: a create
    retried after a lost answer then meets its own run (AlreadyExists) instead of making a second one."""
    suffix = "".join(secrets.choice(NAME_ALPHABET) for _ in range(NAME_SUFFIX_LENGTH))
    return prefix[:MAX_NAME_LENGTH - NAME_SUFFIX_LENGTH] + suffix


def creator_annotations(username: str, groups: Sequence[str]) -> dict[str, str]:
    """The creator a run or session states (coderun/api/identity.py): the API server refuses it unless it is the
    requester's own, so the client states what a SelfSubjectReview answered. Groups holding a newline are left
    out, as the admission policy leaves them out of what it compares."""
    return {CREATED_BY: username, CREATED_BY_GROUPS: "\n".join(g for g in groups if "\n" not in g)}


SELF_SUBJECT_REVIEW = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}


def creator_of_review(review: Any) -> dict[str, str]:
    """creator_annotations from a SelfSubjectReview the API server answered (the kubernetes package's model)."""
    info = review.status.user_info
    return creator_annotations(info.username or "", info.groups or ())


def unstated_if_forbidden(refused: CodeRunError) -> dict[str, str]:
    """The creator to state when the SelfSubjectReview was refused: none when the caller may not ask (RBAC without
    system:basic-user; plain runs go unstated, a session is refused saying what to state), else the refusal."""
    if refused.status != 403:
        raise refused
    return {}


def verdict_patch(creator: Mapping[str, str], approve: bool) -> dict[str, Any]:
    """The merge patch that approves (or rejects) a run as this client: the API server takes the verdict only
    under the requester's own username, from someone with the RBAC verb approve (coderun/api/identity.py)."""
    if not creator.get(CREATED_BY):
        raise CodeRunError("this client may not ask the API server who it is (SelfSubjectReview is forbidden to "
                           f"it), and a verdict must carry your own username: kubectl annotate crun NAME "
                           f"{APPROVED_BY if approve else REJECTED_BY}=<your username>", status=403)
    return {"metadata": {"annotations": {APPROVED_BY if approve else REJECTED_BY: creator[CREATED_BY]}}}


def build_body(spec: CodeRunSpec, *, client_name: str, labels: Mapping[str, str] | None = None,
               name: str | None = None, name_prefix: str = DEFAULT_NAME_PREFIX,
               now: datetime | None = None, create_token: str | None = None,
               creator: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The CodeRun to create. Without `name` the client picks a unique one from `name_prefix`; the create
    token marks the object as this call's own; the client label lets an agent list its own runs; `creator`
    (creator_annotations) states who creates it."""
    metadata: dict[str, Any] = {
        "name": name or new_run_name(name_prefix),
        "labels": {CLIENT_LABEL: client_name, **(labels or {})},
        "annotations": {CREATED_AT_ANNOTATION: rfc3339_millis(now or datetime.now(timezone.utc)),
                        CREATE_TOKEN_ANNOTATION: create_token or uuid.uuid4().hex, **(creator or {})},
    }
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata,
            "spec": spec.model_dump(by_alias=True, exclude_none=True)}


def label_selector(client_name: str, labels: Mapping[str, str] | None, mine: bool) -> str | None:
    """`list`'s filter: label equality, plus this client's coderun.io/client when `mine`."""
    wanted = {**({CLIENT_LABEL: client_name} if mine else {}), **(labels or {})}
    return ",".join(f"{k}={v}" for k, v in wanted.items()) or None
