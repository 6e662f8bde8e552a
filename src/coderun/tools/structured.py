"""Typed tool results for clients that read structured content (MCP's outputSchema / structuredContent), and
which artifacts a result shows inline. Pure: no API calls, no MCP import (the tools import without the mcp extra).

A result carries the outcome, the bounded streams, the error and its line, the timings and every artifact with
its size and type; the text rendering (render.py) stays the form a model reads.
"""
from __future__ import annotations

import mimetypes
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote, unquote

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from ..api.models import AuditStatus, InputRecord, Metrics, RunError, SkippedArtifact
from ..api.text import one_line
from ..client.result import RunResult
from ..client.runtimes import RuntimeInfo
from .render import outcome_line
from .schemas import input_schema

# What one result may carry inline: each stream is already capped by the policy's outputBytes (at most 256 KiB),
# structured content repeats it beside the text, so it is cut again here.
MAX_STREAM_CHARS = 16 * 1024
# Artifacts: a host shows images and small text files inline; the rest are listed with name, size and type.
MAX_INLINE_ARTIFACTS = 6            # artifacts read (one ConfigMap read each) per result
MAX_IMAGE_BYTES = 1024 * 1024       # per image
MAX_IMAGES = 4
MAX_TEXT_BYTES = 8 * 1024           # per text file
MAX_TEXTS = 2

# Magic numbers, so a plot saved without a suffix (or a .png that is not one) is judged by its bytes.
_IMAGE_SIGNATURES = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
                     (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"))


class _Output(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class ArtifactOutput(_Output):
    name: str = Field(description="Path relative to $CODERUN_OUTPUT_DIR.")
    size: int = Field(description="Size in bytes.")
    mime_type: str = Field(description="From the content when it was read, else from the name's suffix.")
    shown: Literal["image", "text", "link", "listed"] = Field(description=(
        "image or text: included in this result's content; link: a resource_link to read with resources/read "
        "(a stored artifact); listed: name, size and type only."))
    why_not_shown: str | None = Field(None, description="Why an image or text file was only listed.")
    stored: bool | None = Field(None, description="true: kept in the store (larger than the inline caps), not in a "
                                                  "ConfigMap.")
    uri: str | None = Field(None, description="Where resources/read reads it (coderun://runs/NAMESPACE/RUN/"
                                              "artifacts/NAME).")


class RunOutput(_Output):
    """The run_code tool's structured result."""
    run: str = Field(description="The CodeRun's name (kubectl get crun NAME).")
    namespace: str
    phase: str | None = Field(None, description="Succeeded, Failed or Rejected (Pending/Running if not finished).")
    reason: str | None = Field(None, description="Completed, NonZeroExit, Timeout, OOMKilled, PolicyDenied, ...")
    outcome: str = Field(description="One line: how the run ended, in words to act on.")
    succeeded: bool
    exit_code: int | None = None
    error: RunError | None = Field(None, description="The uncaught error: type, message and line in the code.")
    stdout: str = ""
    stderr: str = ""
    stdout_bytes: int | None = Field(None, description="Bytes the program wrote to stdout in all.")
    stderr_bytes: int | None = Field(None, description="Bytes the program wrote to stderr in all.")
    stdout_truncated: bool = Field(False, description="stdout here is only the head of what the program wrote.")
    stderr_truncated: bool = Field(False, description="stderr here is only the head of what the program wrote.")
    metrics: Metrics | None = Field(None, description="Timings in milliseconds and peak memory.")
    limits: dict[str, str | int] | None = Field(None, description="The limits the run got after policy defaults.")
    artifacts: list[ArtifactOutput] = Field(default_factory=list,
                                            description="Files the program wrote to $CODERUN_OUTPUT_DIR.")
    artifacts_skipped: list[SkippedArtifact] = Field(default_factory=list, description=(
        "Files the program wrote that were not kept, and why (too large for the policy's caps, a link, ...)."))
    inputs: list[InputRecord] = Field(default_factory=list, description=(
        "The inputs by reference as the run got them: path, source, size, sha256."))
    audit: AuditStatus | None = Field(None, description=(
        "What the program touched (files read and written, connect attempts, processes), from gVisor's trace "
        "points; source Unavailable with a message when that is not known."))


class RuntimesOutput(_Output):
    """The list_runtimes tool's structured result."""
    runtimes: list[RuntimeInfo]


def output_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The outputSchema of a tool: the model's JSON schema, self-contained (results are dumped without nulls,
    so an optional field is absent rather than null)."""
    return input_schema(model)


def dump(output: BaseModel) -> dict[str, Any]:
    return output.model_dump(mode="json", by_alias=True, exclude_none=True)


def _bounded(text: str | None, truncated: bool | None) -> tuple[str, bool]:
    text = text or ""  # as the text content has it: JSON escapes control characters itself
    if len(text) > MAX_STREAM_CHARS:
        return text[:MAX_STREAM_CHARS], True
    return text, bool(truncated)


def run_output(result: RunResult, artifacts: list[ArtifactOutput] | None = None) -> RunOutput:
    stdout, stdout_cut = _bounded(result.stdout, result.stdout_truncated)
    stderr, stderr_cut = _bounded(result.stderr, result.stderr_truncated)
    limits = result.effective_limits.model_dump(by_alias=True, exclude_none=True) if result.effective_limits else None
    return RunOutput(run=result.name, namespace=result.namespace, phase=result.phase, reason=result.reason,
                     outcome=outcome_line(result), succeeded=result.succeeded, exit_code=result.exit_code,
                     error=result.error, stdout=stdout, stderr=stderr, stdout_bytes=result.stdout_bytes,
                     stderr_bytes=result.stderr_bytes, stdout_truncated=stdout_cut, stderr_truncated=stderr_cut,
                     metrics=result.metrics, limits=limits or None, artifacts=artifacts or [], audit=result.audit,
                     artifacts_skipped=result.artifacts_skipped or [], inputs=result.inputs or [])


def sniff_image(data: bytes) -> str | None:
    """The image MIME type the bytes are (PNG, JPEG, GIF, WebP), else None."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return next((mime for magic, mime in _IMAGE_SIGNATURES if data.startswith(magic)), None)


def _text(data: bytes) -> str | None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\x00" in text else text


def guessed_type(name: str) -> str:
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


ARTIFACT_URI_PREFIX = "coderun://runs/"


def artifact_uri(namespace: str, run: str, name: str) -> str:
    """The MCP resource URI of one artifact: coderun://runs/NAMESPACE/RUN/artifacts/NAME (NAME URL-quoted)."""
    return f"{ARTIFACT_URI_PREFIX}{quote(namespace, safe='')}/{quote(run, safe='')}/artifacts/{quote(name, safe='/')}"


def parse_artifact_uri(uri: str) -> tuple[str, str, str] | None:
    """(namespace, run, artifact name) from an artifact_uri, None for any other URI."""
    if not uri.startswith(ARTIFACT_URI_PREFIX):
        return None
    namespace, _, rest = uri[len(ARTIFACT_URI_PREFIX):].partition("/")
    run, _, rest = rest.partition("/")
    kind, _, name = rest.partition("/")
    if not namespace or not run or kind != "artifacts" or not name:
        return None
    return unquote(namespace), unquote(run), unquote(name)


def to_read(result: RunResult) -> list[str]:
    """The artifacts worth reading to show inline: small enough to be an image or a text file shown, at most
    MAX_INLINE_ARTIFACTS, in the order the program wrote them. Stored ones are linked, not read."""
    small = [a.name for a in result.artifacts or () if a.size <= MAX_IMAGE_BYTES and not a.stored]
    return small[:MAX_INLINE_ARTIFACTS]


@dataclass
class Shown:
    """What a result shows of its artifacts: the listing, the images and the text files to include."""
    listing: list[ArtifactOutput] = field(default_factory=list)
    images: list[tuple[str, str, bytes]] = field(default_factory=list)  # (name, mime type, bytes)
    texts: list[tuple[str, str, str]] = field(default_factory=list)     # (name, mime type, text)
    links: list[ArtifactOutput] = field(default_factory=list)           # stored artifacts, as resource links


def show_artifacts(result: RunResult, read: dict[str, bytes | str]) -> Shown:
    """Decide, per artifact, whether it is shown as an image, as text, or listed. `read` maps the artifacts
    read (to_read) to their bytes, or to why they could not be read."""
    shown = Shown()
    for artifact in result.artifacts or ():
        data = read.get(artifact.name)
        entry = ArtifactOutput(name=one_line(artifact.name), size=artifact.size, mime_type=guessed_type(artifact.name),
                               shown="listed", uri=artifact_uri(result.namespace, result.name, artifact.name))
        if artifact.stored:
            entry.shown, entry.stored = "link", True
            shown.links.append(entry)
        elif isinstance(data, bytes):
            image, text = sniff_image(data), _text(data)
            if image or (text is not None and entry.mime_type == "application/octet-stream"):
                entry.mime_type = image or "text/plain"
            if image and len(shown.images) < MAX_IMAGES:
                entry.shown = "image"
                shown.images.append((artifact.name, image, data))
            elif image:
                entry.why_not_shown = f"more than {MAX_IMAGES} images"
            elif text is not None and len(data) <= MAX_TEXT_BYTES and len(shown.texts) < MAX_TEXTS:
                entry.shown = "text"
                shown.texts.append((artifact.name, entry.mime_type, text))
            elif text is not None:
                entry.why_not_shown = (f"text over {MAX_TEXT_BYTES} bytes" if len(data) > MAX_TEXT_BYTES
                                       else f"more than {MAX_TEXTS} text files")
        elif isinstance(data, str):
            entry.why_not_shown = one_line(f"could not be read: {data}")
        elif artifact.size > MAX_IMAGE_BYTES:
            entry.why_not_shown = f"over {MAX_IMAGE_BYTES} bytes"
        else:
            entry.why_not_shown = f"more than {MAX_INLINE_ARTIFACTS} artifacts"
        shown.listing.append(entry)
    return shown


def artifacts_line(listing: list[ArtifactOutput]) -> str | None:
    """The text content's artifact line: each with its size and type, and what was only listed and why."""
    if not listing:
        return None
    parts = [f"{a.name} ({a.size} bytes, {a.mime_type}"
             + (", stored: read it with resources/read" if a.shown == "link"
                else f", shown as {a.shown}" if a.shown != "listed" else "")
             + (f"; not shown: {a.why_not_shown}" if a.why_not_shown else "") + ")" for a in listing]
    return one_line("artifacts: " + ", ".join(parts))
