"""The run's input: run.json checked once and typed with its defaults, the files laid out under the work dir (never
outside it, never through a symlink), and a warm pod's input read from stdin into the layout of a ConfigMap mount."""

from __future__ import annotations

import base64
import json
import os
import re
import stat

from .capture import READ_CHUNK

DEFAULT_OUTPUT_BYTES = 65536
DEFAULT_FLOOD_BYTES = 1048576
DEFAULT_ARTIFACT_CAPS = {"maxFiles": 16, "maxFileBytes": 262144, "maxTotalBytes": 524288}
DEFAULT_MAX_INODES = 16384
DEFAULT_MAX_PROCESSES = 128
# Accepted ranges of the sandbox limits in run.json (an RLIMIT must fit the kernel's type; PID_MAX_LIMIT).
MAX_DISK_BYTES = 2**62
MAX_INODES = 2**31 - 1
MAX_PROCESSES = 4194304
# Kubernetes ConfigMap key rules: a key never names another file or a dir.
CONFIGMAP_KEY = re.compile(r"^(?!\.\.)[-._a-zA-Z0-9]+$")
# What stays inline in the frame (run.json artifacts.inlineFileBytes/inlineTotalBytes); past it, with the data
# plane's artifactsToStore, an artifact goes to the store. Absent: all that the caps allow stays inline (as before).
INLINE_CAPS = {"inlineFileBytes": "maxFileBytes", "inlineTotalBytes": "maxTotalBytes"}
# The data plane (run.json `data`): the data service's address (a pod's IP: sandboxes resolve no names), the run's
# grant, and the inputs the grant names (index i is GET /v1/inputs/<i>).
DATA_URL = re.compile(r"^http://(?:\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-fA-F:.]+\]|[a-z0-9][-a-z0-9.]{0,252}):\d{1,5}/?$")
DATA_TOKEN = re.compile(r"^[A-Za-z0-9._-]{1,16000}$")  # never a byte that could end a header
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
MAX_DATA_INPUTS = 256


class InvalidInput(Exception):
    """The input ConfigMap is malformed or asks for something unsafe."""


def validate_relative_path(path: object, what: str) -> str:
    """Return a normalised relative path, or raise InvalidInput.

    Defence in depth: the API rejects these too, but the runner must never
    write outside its work dir whatever the ConfigMap says.
    """
    if not isinstance(path, str) or not path or "\0" in path:
        raise InvalidInput(f"{what}: path must be a non-empty string")
    if path.startswith("/"):
        raise InvalidInput(f"{what}: absolute path {path!r} is not allowed")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidInput(f"{what}: path {path!r} must not contain '..'")
    if not parts:
        raise InvalidInput(f"{what}: path {path!r} names no file")
    return "/".join(parts)


def resolve_inside(root: str, relative: str) -> str:
    """Join and check that the result (symlinks resolved) stays under root."""
    real_root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(real_root, relative))
    if os.path.commonpath([real_root, target]) != real_root or target == real_root:
        raise InvalidInput(f"path {relative!r} resolves outside the work dir")
    return target


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise InvalidInput(message)


def _non_negative_int(value: object, field: str) -> int:
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
             f"run.json: {field} must be a non-negative integer")
    return value  # type: ignore[return-value]


def _limit(value: object, field: str, maximum: int) -> int:
    """A sandbox limit: 0 would stop every program at once, and an RLIMIT must fit the kernel's type."""
    _require(isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= maximum,
             f"run.json: {field} must be an integer from 1 to {maximum}")
    return value  # type: ignore[return-value]


def parse_run_spec(raw: dict) -> dict:
    """Validate run.json and fill defaults; raise InvalidInput on anything odd."""
    _require(isinstance(raw, dict), "run.json must be a JSON object")
    _require(raw.get("version") == 1, "run.json: version must be 1")
    command = raw.get("command")
    _require(isinstance(command, list) and bool(command)
             and all(isinstance(a, str) and "\0" not in a for a in command),
             "run.json: command must be a non-empty list of strings")
    timeout = raw.get("timeoutSeconds")
    _require(isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
             and 0 < timeout < 86400, "run.json: timeoutSeconds must be a positive number")
    caps = dict(DEFAULT_ARTIFACT_CAPS)
    artifacts = raw.get("artifacts") or {}
    _require(isinstance(artifacts, dict), "run.json: artifacts must be an object")
    for name in caps:
        if name in artifacts:
            caps[name] = _non_negative_int(artifacts[name], f"artifacts.{name}")
    for name, bound in INLINE_CAPS.items():
        caps[name] = min(_non_negative_int(artifacts.get(name, caps[bound]), f"artifacts.{name}"), caps[bound])
    env = raw.get("env") or {}
    _require(isinstance(env, dict) and all(
        isinstance(k, str) and isinstance(v, str) and k and "=" not in k
        and "\0" not in k + v for k, v in env.items()),
        "run.json: env must map names (no '=') to strings")
    stdin_key = raw.get("stdinKey")
    _require(stdin_key is None or (isinstance(stdin_key, str) and CONFIGMAP_KEY.match(stdin_key)),
             "run.json: stdinKey must be null or a ConfigMap key")
    code_file = validate_relative_path(raw.get("codeFile"), "codeFile")
    files = raw.get("files") or []
    _require(isinstance(files, list), "run.json: files must be a list")
    seen = {code_file}
    checked_files = []
    for index, entry in enumerate(files):
        _require(isinstance(entry, dict), f"run.json: files[{index}] must be an object")
        path = validate_relative_path(entry.get("path"), f"files[{index}]")
        key = entry.get("key")
        _require(isinstance(key, str) and bool(CONFIGMAP_KEY.match(key)),
                 f"files[{index}]: key must be a ConfigMap key")
        _require(path not in seen, f"files[{index}]: path {path!r} is used twice")
        seen.add(path)
        checked_files.append({"path": path, "key": key})
    data = parse_data(raw.get("data"), seen)
    flood = raw.get("floodBytes", DEFAULT_FLOOD_BYTES)
    disk, memory = raw.get("diskBytes"), raw.get("memoryBytes")
    scratch_tmpfs = raw.get("scratchTmpfs", False)
    _require(isinstance(scratch_tmpfs, bool), "run.json: scratchTmpfs must be true or false")
    return {
        "diskBytes": None if disk is None else _limit(disk, "diskBytes", MAX_DISK_BYTES),
        "memoryBytes": None if memory is None else _limit(memory, "memoryBytes", MAX_DISK_BYTES),
        "maxInodes": _limit(raw.get("maxInodes", DEFAULT_MAX_INODES), "maxInodes", MAX_INODES),
        "maxProcesses": _limit(raw.get("maxProcesses", DEFAULT_MAX_PROCESSES), "maxProcesses", MAX_PROCESSES),
        # The scratch dir a tmpfs of the runner's whose kernel enforces maxInodes and diskBytes (see
        # confinement.mount_capped_scratch): its bytes are then memory, so the operator asks for it.
        "scratchTmpfs": scratch_tmpfs,
        "language": raw.get("language"),
        "command": command,
        "codeFile": code_file,
        "timeoutSeconds": float(timeout),
        "outputBytes": _non_negative_int(raw.get("outputBytes", DEFAULT_OUTPUT_BYTES), "outputBytes"),
        "floodBytes": _non_negative_int(flood, "floodBytes"),
        "artifacts": caps,
        "files": checked_files,
        "stdinKey": stdin_key,
        "env": env,
        "data": data,
    }


def parse_data(data: object, work_paths: set[str]) -> dict | None:
    """run.json `data`, checked (None: no data plane). Its inputs' paths are links in the work dir beside the
    program's files: none may be one of those, nor a dir of another input or file."""
    if data is None:
        return None
    _require(isinstance(data, dict), "run.json: data must be an object")
    url, token, inputs = data.get("url"), data.get("token"), data.get("inputs") or []
    _require(isinstance(url, str) and bool(DATA_URL.match(url)), "run.json: data.url must be http://<address>:<port>")
    _require(isinstance(token, str) and bool(DATA_TOKEN.match(token)), "run.json: data.token is malformed")
    _require(isinstance(inputs, list) and len(inputs) <= MAX_DATA_INPUTS,
             f"run.json: data.inputs must be a list of at most {MAX_DATA_INPUTS}")
    to_store = data.get("artifactsToStore", False)
    _require(isinstance(to_store, bool), "run.json: data.artifactsToStore must be true or false")
    taken = set(work_paths)
    checked = []
    for index, entry in enumerate(inputs):
        _require(isinstance(entry, dict), f"run.json: data.inputs[{index}] must be an object")
        path = validate_relative_path(entry.get("path"), f"data.inputs[{index}]")
        sha256 = entry.get("sha256")
        # "" : an object nobody pinned (an S3 input without a pin or sha256 metadata): its size is checked, and
        # the frame reports the sha256 of the bytes as they came
        _require(isinstance(sha256, str) and (sha256 == "" or bool(SHA256_HEX.match(sha256))),
                 f"data.inputs[{index}]: sha256 must be 64 lowercase hex digits, or empty (not pinned)")
        size = _non_negative_int(entry.get("size"), f"data.inputs[{index}].size")
        _require(path not in taken, f"data.inputs[{index}]: path {path!r} is used twice")
        taken.add(path)
        checked.append({"path": path, "size": size, "sha256": sha256})
    dirs = {"/".join(p.split("/")[:i]) for p in taken for i in range(1, p.count("/") + 1)}
    for entry in checked:
        _require(entry["path"] not in dirs and not any(d in taken for d in _dirs_of(entry["path"])),
                 f"data.inputs: path {entry['path']!r} is both a file and a dir of another path")
    return {"url": url, "token": token, "inputs": checked, "artifactsToStore": to_store}


def _dirs_of(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def read_input_key(input_dir: str, key: str) -> bytes:
    """Read one ConfigMap key (a symlink into ..data, which is followed)."""
    try:
        with open(os.path.join(input_dir, key), "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        raise InvalidInput(f"input key {key!r} is missing") from None


def load_run_spec(input_dir: str) -> dict:
    try:
        raw = json.loads(read_input_key(input_dir, "run.json"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"run.json is not valid JSON: {exc}") from None
    return parse_run_spec(raw)


# The warm pool's input (`--input-stdin`): one ASCII decimal length, a newline, then that many bytes of JSON
# {"nonce": str, "data": {key: text}, "binaryData": {key: base64}}: the input ConfigMap's keys, plus the nonce
# the runner puts in its frame so the operator can trust a frame read from the attach stream.
MAX_STDIN_INPUT_BYTES = 16 * 1024 * 1024
NONCE = re.compile(r"^[0-9a-f]{32,128}$")


class InputIncomplete(Exception):
    """The input stream ended (or broke) before the whole document arrived."""


def read_exactly(stream, count: int) -> bytes:
    chunks, missing = [], count
    while missing:
        chunk = stream.read(min(missing, READ_CHUNK))
        if not chunk:
            raise InputIncomplete(f"the input stream ended after {count - missing} of {count} bytes")
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


def read_length_line(stream) -> int:
    """The ASCII decimal length that starts a document. InputIncomplete when the stream ends first (a clean end
    of stream before any byte of it too: the caller tells the two apart by what it expects)."""
    header = stream.readline(24)
    if not header.endswith(b"\n"):
        raise InputIncomplete("the input stream ended before its length line")
    _require(header[:-1].isdigit(), "the input's length line is not a decimal number")
    return int(header)


def parse_input_document(body: bytes) -> tuple[str, dict[str, bytes]]:
    """(nonce, {ConfigMap key: content}) of one input document, or InvalidInput naming what is wrong."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidInput(f"the input is not valid JSON: {str(exc)[:200]}") from None
    _require(isinstance(document, dict), "the input must be a JSON object")
    nonce, data, binary = document.get("nonce"), document.get("data") or {}, document.get("binaryData") or {}
    _require(isinstance(nonce, str) and bool(NONCE.match(nonce)), "the input's nonce must be 32-128 hex digits")
    _require(isinstance(data, dict) and isinstance(binary, dict), "data and binaryData must be objects")
    entries = {}
    for key, value in [*data.items(), *binary.items()]:
        _require(isinstance(key, str) and bool(CONFIGMAP_KEY.match(key)) and isinstance(value, str),
                 f"input key {str(key)[:64]!r} must be a ConfigMap key with a string value")
        _require(key not in entries, f"input key {key!r} is in both data and binaryData")
        entries[key] = value.encode("utf-8", "surrogatepass") if key in data else _base64(value, key)
    return nonce, entries


def lay_out_input(entries: dict[str, bytes], input_dir: str) -> None:
    """The keys as the ConfigMap mount has them: one file per key."""
    os.makedirs(input_dir, mode=0o700, exist_ok=True)
    for key, content in entries.items():
        write_new_file(input_dir, key, content)


def read_stdin_input(stream, input_dir: str) -> str:
    """Read the warm pool's input document from `stream` into `input_dir`, laid out as the ConfigMap mount is
    (one file per key), and return the nonce. InputIncomplete on a short stream, InvalidInput on a bad one."""
    nonce, entries = read_stdin_document(stream)
    lay_out_input(entries, input_dir)
    return nonce


def read_stdin_document(stream) -> tuple[str, dict[str, bytes]]:
    """The warm pool's input document from `stream`, not laid out yet: (its nonce, its keys)."""
    length = read_length_line(stream)
    _require(0 < length <= MAX_STDIN_INPUT_BYTES, f"the input is larger than {MAX_STDIN_INPUT_BYTES} bytes")
    return parse_input_document(read_exactly(stream, length))


def _base64(value: str, key: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise InvalidInput(f"input key {key!r} is not valid base64") from None


def write_new_file(work_dir: str, relative: str, content: bytes) -> None:
    """Create one input file under work_dir; never through a symlink. A file (or symlink) already at the path (a
    session's earlier run left it) is unlinked first, never written through: the new file is always made afresh
    (O_EXCL|O_NOFOLLOW), so a symlink a program planted cannot redirect the write. A directory there is refused."""
    parent = os.path.dirname(relative)
    target = os.path.join(resolve_inside(work_dir, parent) if parent else os.path.realpath(work_dir),
                          os.path.basename(relative))
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if parent:
            resolve_inside(work_dir, parent)  # parents exist now: re-check them
        _unlink_unless_directory(target, relative)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError as exc:  # e.g. "a" and "a/b" both given
        raise InvalidInput(f"cannot create {relative!r}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)


def link_input(work_dir: str, relative: str, target: str) -> None:
    """`<work>/<relative>` a symlink to target (the input in the inputs dir), made as write_new_file makes a
    file: parents inside the work dir only, whatever a session's earlier run left at the path unlinked first."""
    parent = os.path.dirname(relative)
    link = os.path.join(resolve_inside(work_dir, parent) if parent else os.path.realpath(work_dir),
                        os.path.basename(relative))
    try:
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if parent:
            resolve_inside(work_dir, parent)
        _unlink_unless_directory(link, relative)
        os.symlink(target, link)
    except OSError as exc:
        raise InvalidInput(f"cannot link input {relative!r} in the work dir: {exc.strerror}") from None


def _unlink_unless_directory(path: str, relative: str) -> None:
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            raise InvalidInput(f"cannot create {relative!r}: a directory is in its place")
        os.unlink(path)
    except FileNotFoundError:
        pass


def empty_directory(path: str) -> None:
    """An empty directory at path, whatever a program left there: a symlink or file in its place is removed,
    never followed, and so is every entry below it (a mount point, such as a warm pod's input volume, stays)."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    os.makedirs(path, mode=0o700, exist_ok=True)
    for root, dirs, files in os.walk(path, topdown=False):  # symlinks to directories are listed, not entered
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:
            entry = os.path.join(root, name)
            if os.path.islink(entry):
                os.unlink(entry)
            else:
                os.rmdir(entry)


def materialise_inputs(spec: dict, input_dir: str, work_dir: str) -> None:
    os.makedirs(work_dir, exist_ok=True)
    write_new_file(work_dir, spec["codeFile"], read_input_key(input_dir, "code"))
    for entry in spec["files"]:
        write_new_file(work_dir, entry["path"], read_input_key(input_dir, entry["key"]))
