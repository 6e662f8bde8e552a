"""Which way each of a caller's files goes into a run (docs/data.md): inline in the spec when it fits (the small
files, as always), else uploaded to the data service and named in spec.inputs by its sha256. The caller gives every
file the same way (`files=`); the SDK picks. Local files are only sized and hashed here, streamed in chunks: a 2 GB
file never sits in memory.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Iterable, Iterator, Mapping, Sequence, Union, cast

from ..api.models import (MAX_FILE_CONTENT_CHARS, MAX_FILES, MAX_INPUT_BYTES, MAX_INPUT_TOTAL_CHARS, CodeRunSpec,
                          FileInput, InputRef, UploadWait)
from .errors import CodeRunError, InputTooLarge

CHUNK = 1024 * 1024
# What `files=` takes per path: text, bytes, a local file (pathlib.Path), or an open binary file.
FileSource = Union[str, bytes, os.PathLike, BinaryIO]


@dataclass(frozen=True)
class Upload:
    """A file the caller uploads for the run: where the run sees it, where its bytes are, their size and sha256.
    `source` is bytes, a local Path (read again, streamed, at upload time), or an open file read from `offset`."""
    path: str
    source: bytes | Path | BinaryIO
    size: int
    sha256: str
    offset: int = 0

    def input_ref(self) -> InputRef:
        return InputRef.model_validate({"path": self.path, "upload": {"sha256": self.sha256, "size": self.size}})

    @contextmanager
    def open(self) -> Iterator[BinaryIO]:
        """The bytes, from the start, as a file to read in chunks."""
        if isinstance(self.source, bytes):
            yield io.BytesIO(self.source)
        elif isinstance(self.source, Path):
            with self.source.open("rb") as handle:
                yield handle
        else:
            self.source.seek(self.offset)
            yield self.source


def split_files(files: Mapping[str, FileSource] | Sequence[Any] | None, *, code: str = "",
                stdin: str | None = None) -> tuple[list[FileInput], list[Upload]]:
    """(the files that go inline, the files to upload). A file goes inline, in the order given, while it fits one
    inline file (MAX_FILE_CONTENT_CHARS once encoded) and what the spec may carry in all (MAX_INPUT_TOTAL_CHARS with
    the code and stdin, MAX_FILES files); every other file is uploaded."""
    budget = MAX_INPUT_TOTAL_CHARS - len(code) - len(stdin or "")
    inline: list[FileInput] = []
    uploads: list[Upload] = []
    for path, source in _entries(files):
        content = _small_content(path, source)
        # UTF-8 spends at most 4 bytes a character: bytes longer than that never fit, and are not decoded to see.
        if content is not None and not (isinstance(content, bytes) and len(content) > 4 * MAX_FILE_CONTENT_CHARS):
            text, encoded = _inline_form(content)
            chars = len(text if text is not None else encoded or "")
            if chars <= MAX_FILE_CONTENT_CHARS and chars <= budget and len(inline) < MAX_FILES:
                inline.append(FileInput(path=path, content=text, content_base64=encoded))
                budget -= chars
                continue
            uploads.append(_upload_of_bytes(path, content.encode() if isinstance(content, str) else content))
        elif isinstance(content, bytes):
            uploads.append(_upload_of_bytes(path, content))
        else:
            uploads.append(_upload_of_file(path, source))
    return inline, uploads


def _entries(files: Mapping[str, FileSource] | Sequence[Any] | None) -> Iterable[tuple[str, FileSource]]:
    """(path, source) pairs from a mapping, or from a list of FileInput, wire-form dicts or (path, source) pairs."""
    if files is None:
        return []
    if isinstance(files, Mapping):
        return list(files.items())
    entries: list[tuple[str, FileSource]] = []
    for item in files:
        if isinstance(item, FileInput):
            entries.append((item.path, _wire_content(item.path, item.content, item.content_base64)))
        elif isinstance(item, Mapping) and "path" in item:
            entries.append((item["path"], _wire_content(item["path"], item.get("content"),
                                                        item.get("contentBase64", item.get("content_base64")))))
        elif isinstance(item, tuple) and len(item) == 2:
            entries.append(item)
        else:
            raise CodeRunError(f"files: {item!r} is not a file; give {{path: content}}, or a list of "
                               "{\"path\": ..., \"content\": ...} or (path, content)")
    return entries


def _wire_content(path: str, content: Any, content_base64: Any) -> FileSource:
    if (content is None) == (content_base64 is None):
        raise CodeRunError(f"file {path}: set exactly one of content or contentBase64")
    if content is not None:
        return content
    try:
        return base64.b64decode(content_base64, validate=True)
    except (binascii.Error, ValueError, TypeError) as e:
        raise CodeRunError(f"file {path}: contentBase64 is not base64 ({e})") from None


def _inline_form(content: str | bytes) -> tuple[str | None, str | None]:
    """(content, contentBase64) as the spec carries the file: text when it is UTF-8, base64 otherwise."""
    if isinstance(content, str):
        return content, None
    try:
        return content.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, base64.b64encode(content).decode("ascii")


def _small_content(path: str, source: FileSource) -> str | bytes | None:
    """The content when it may fit inline (read whole only then), else None: the file is uploaded as it is."""
    if isinstance(source, (str, bytes)):
        return source
    if isinstance(source, bytearray | memoryview):
        return bytes(source)
    if isinstance(source, os.PathLike):
        local = Path(source)
        try:
            if local.stat().st_size > MAX_FILE_CONTENT_CHARS:
                return None
            return local.read_bytes()
        except OSError as e:
            raise CodeRunError(f"input {path}: cannot read {local}: {e.strerror or e}") from None
    if hasattr(source, "read"):
        return None
    raise CodeRunError(f"input {path}: {type(source).__name__} is not a file's content; give str, bytes, a "
                       "pathlib.Path or an open binary file")


def _upload_of_bytes(path: str, data: bytes) -> Upload:
    _check_size(path, len(data))
    return Upload(path, data, len(data), hashlib.sha256(data).hexdigest())


def _upload_of_file(path: str, source: FileSource) -> Upload:
    if isinstance(source, os.PathLike):
        local = Path(source)
        try:
            with local.open("rb") as stream:
                size, digest = _hash(stream)
        except OSError as e:
            raise CodeRunError(f"input {path}: cannot read {local}: {e.strerror or e}") from None
        _check_size(path, size)
        return Upload(path, local, size, digest)
    handle = cast(BinaryIO, source)  # an open binary file (_small_content refused anything else)
    if not _seekable(handle):
        handle = _spooled(handle)  # a pipe cannot be read twice (once to hash, once to send): keep it on disk
    offset = handle.tell()
    size, digest = _hash(handle)
    _check_size(path, size)
    handle.seek(offset)
    return Upload(path, handle, size, digest, offset)


def _seekable(handle: BinaryIO) -> bool:
    try:
        return handle.seekable()
    except (AttributeError, ValueError):
        return False


def _spooled(handle: BinaryIO) -> BinaryIO:
    spool = tempfile.TemporaryFile()
    while chunk := handle.read(CHUNK):
        if not isinstance(chunk, bytes):
            raise CodeRunError("files: an open file must be opened in binary mode ('rb')")
        spool.write(chunk)
    spool.seek(0)
    return spool


def _hash(handle: BinaryIO) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    while chunk := handle.read(CHUNK):
        if not isinstance(chunk, bytes):
            raise CodeRunError("files: an open file must be opened in binary mode ('rb')")
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


def _check_size(path: str, size: int) -> None:
    if size > MAX_INPUT_BYTES:
        raise InputTooLarge(path, size, f"over coderun's bound of {MAX_INPUT_BYTES // 1024**3} GiB per input")


def upload_of_inline(file: FileInput) -> Upload:
    """A small file as an upload (a session's upload sends every file the one way)."""
    data = file.content.encode() if file.content is not None else \
        base64.b64decode("".join((file.content_base64 or "").split()))
    return _upload_of_bytes(file.path, data)


# A session's upload is laid out by a run of no code (every runtime runs an empty program), so it fails here,
# saying why, rather than in the agent's next step.
UPLOAD_RUN_CODE = "\n"


def with_kept(uploads: Sequence[Upload], kept: Mapping[str, Upload]) -> list[Upload]:
    """A session run's uploads: its own, then every file the session uploaded before at a path the run does not
    name itself (the store holds them by sha256, the session's pod keeps them: nothing is sent or fetched again)."""
    own = {u.path for u in uploads}
    return [*uploads, *(u for path, u in kept.items() if path not in own)]


def artifact_input(result_or_run: Any, artifact_name: str, path: str | None = None) -> InputRef:
    """An input that is an artifact of an earlier run (a RunResult, or a run's name): chains runs without the bytes
    passing through the caller. Given a RunResult, the input is pinned to the artifact's sha256. `path`: where the
    next run sees it (default: the artifact's base name)."""
    run = result_or_run if isinstance(result_or_run, str) else result_or_run.name
    pin = None
    if not isinstance(result_or_run, str):
        artifact = next((a for a in result_or_run.artifacts or () if a.name == artifact_name), None)
        if artifact is None:
            offered = ", ".join(a.name for a in result_or_run.artifacts or ()) or "none"
            raise KeyError(f"run {run} has no artifact {artifact_name!r} (artifacts: {offered})")
        pin = artifact.sha256
    return InputRef.model_validate({"path": path or PurePosixPath(artifact_name).name, "sha256": pin,
                                    "artifact": {"run": run, "name": artifact_name}})


def input_refs(inputs: Sequence[InputRef | Mapping[str, Any]] | None) -> list[InputRef]:
    """`inputs=` as InputRefs (dicts take the wire form: {"path": ..., "s3": {"bucket": ..., "key": ...}})."""
    return [i if isinstance(i, InputRef) else InputRef.model_validate(i) for i in inputs or ()]


def with_inputs(spec: CodeRunSpec, refs: Sequence[InputRef] = (), uploads: Sequence[Upload] = ()) -> CodeRunSpec:
    """The spec with these inputs by reference added (validated again: a path named twice, too many inputs)."""
    if not refs and not uploads:
        return spec
    document = spec.model_dump(by_alias=True, exclude_none=True)
    document["inputs"] = [*document.get("inputs", []), *(i.model_dump(by_alias=True, exclude_none=True)
                                                          for i in [*refs, *(u.input_ref() for u in uploads)])]
    paths = [i["path"] for i in document["inputs"]]
    twice = sorted({p for p in paths if paths.count(p) > 1})
    if twice:  # the API server's rule too (CEL): said here before any request
        raise CodeRunError(f"input paths must be unique: {', '.join(twice)} named twice")
    return CodeRunSpec.model_validate(document)


def asked_for(wait: UploadWait, uploads: Sequence[Upload]) -> list[Upload]:
    """The files the run waits for (status.upload), each once: the store already holds the others."""
    mine = {(u.sha256, u.size): u for u in uploads}
    asked: dict[str, Upload] = {}
    for file in wait.files:
        upload = mine.get((file.sha256, file.size))
        if upload is None:
            raise CodeRunError(f"the run waits for an upload of {file.path} (sha256 {file.sha256}, {file.size} bytes) "
                               "that this client was not given: upload it with the grant in status.upload")
        asked.setdefault(upload.sha256, upload)
    return list(asked.values())
