"""The CodeRun API as pydantic models: the one source of the CRD schema, the SDK's types and the tool schemas.

Field descriptions become `kubectl explain` text; `x-kubernetes-validations` carry the CEL rules the API
server enforces at admission, so bad input is refused at `kubectl apply` with a message naming the field.
"""
from __future__ import annotations

from typing import Any

import base64
import binascii
import ipaddress
import re

from pydantic import ConfigDict, Field, field_validator, model_validator

from ..egress.rules import HOST_PATTERN, MAX_NAME_LENGTH, Rule, valid_host_rule

from .base import ApiModel as ApiModel, _cel as _cel  # re-exported: every kind's module imports them from here
from .reasons import Phase
from .scheduling import Scheduling

GROUP = "coderun.io"
# The millisecond the client created a run (the SDK and the CLI write it): creationTimestamp has seconds only.
CREATED_AT_ANNOTATION = "coderun.io/created-at"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "CodeRun"
PLURAL = "coderuns"
SHORT_NAME = "crun"

# Bounds the API server enforces whatever the policy says; policies choose defaults and maximums inside them.
MAX_CODE_BYTES = 128 * 1024
MAX_STDIN_BYTES = 128 * 1024
MAX_FILES = 16
MAX_FILE_CONTENT_CHARS = 256 * 1024
MAX_INPUT_TOTAL_CHARS = 768 * 1024  # code + stdin + files must fit one ConfigMap (1 MiB) with room to spare
MAX_OUTPUT_BYTES = 256 * 1024       # per stream, so the status stays far below etcd's 1.5 MiB object limit
# Inputs by reference (docs/data.md): fetched by the runner from the data service, never through the API server.
MAX_INPUTS = 16
MAX_INPUT_BYTES = 16 * 1024**3      # one input, whatever a policy says (a policy's default cap is 1 GiB)
MAX_OBJECT_KEY_CHARS = 1024         # S3's own bound on a key
SHA256_PATTERN = r"^[0-9a-f]{64}$"
# An S3 bucket name (3-63 lowercase letters, digits, dots and hyphens).
BUCKET_PATTERN = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"
# An object name of the API server: what a CodeRun's name may be.
OBJECT_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"

LANGUAGE_PATTERN = r"^[a-z][a-z0-9-]{0,31}$"
# A CodeRunSession's name as a run names it: a DNS-1123 subdomain (what the API server allows as an object name).
SESSION_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
MAX_SESSION_NAME_CHARS = 253
SESSION_NO_POLICY_REF = "a run in a session takes the session's policy: remove spec.policyRef"
SESSION_NO_POD_LIMITS = ("a run in a session shares the session's pod: set memory, cpu and disk on the "
                         "CodeRunSession; a run may set only limits.timeoutSeconds and limits.outputBytes")
INPUT_PATH_TWICE = "a path is named by both spec.files and spec.inputs: give each file one path"
SESSION_NO_CACHE = "the cache does not apply to runs in a session (their result depends on the session's state)"
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|Ki|Mi|Gi)?$"


def _quantity_range(low: str, high: str, example: str) -> dict[str, Any]:
    return {"x-kubernetes-validations": [_cel(
        f"isQuantity(self) && quantity(self).compareTo(quantity('{low}')) >= 0"
        f" && quantity(self).compareTo(quantity('{high}')) <= 0",
        f"must be a quantity between {low} and {high}, for example '{example}'")]}


class Limits(ApiModel):
    """Resource limits for one run. Unset fields take the policy's defaults; values above the policy's
    maximums are refused with reason PolicyDenied."""
    timeout_seconds: int | None = Field(None, ge=1, le=3600, description=(
        "Wall-clock limit for the program in seconds. The program's whole process group is killed at the "
        "deadline and the run ends with reason Timeout."))
    memory: str | None = Field(None, pattern=QUANTITY_PATTERN, description=(
        "Memory limit (Kubernetes quantity, e.g. 256Mi). Exceeding it ends the run with reason OOMKilled."),
        json_schema_extra=_quantity_range("16Mi", "64Gi", "256Mi"))
    cpu: str | None = Field(None, pattern=QUANTITY_PATTERN, description="CPU limit (quantity, e.g. '1' or 500m).",
                            json_schema_extra=_quantity_range("50m", "64", "500m"))
    disk: str | None = Field(None, pattern=QUANTITY_PATTERN, description=(
        "Size of the writable /tmp, e.g. 64Mi: a tmpfs the sandbox's kernel caps at this size (ENOSPC past it), "
        "held in memory, so the sandbox pod's memory limit is limits.memory plus this."),
        json_schema_extra=_quantity_range("1Mi", "100Gi", "64Mi"))
    output_bytes: int | None = Field(None, ge=1024, le=MAX_OUTPUT_BYTES, description=(
        "Bytes of stdout and of stderr kept in the status (each). Beyond it the stream is truncated "
        "(stdoutTruncated/stderrTruncated); a flood far beyond it stops the program with OutputLimitExceeded."))


class ResourceLimits(Limits):
    """Limits with every field set: a policy's defaults and maximums, and a run's effective limits. The one
    shape of limits everywhere (spec, policy, status, SDK), so no conversion can drop or misspell one."""
    model_config = ConfigDict(frozen=True)
    # Required here, described as in Limits (a redeclared field keeps nothing of the parent's).
    timeout_seconds: int = Field(description=Limits.model_fields["timeout_seconds"].description)
    memory: str = Field(description=Limits.model_fields["memory"].description)
    cpu: str = Field(description=Limits.model_fields["cpu"].description)
    disk: str = Field(description=Limits.model_fields["disk"].description)
    output_bytes: int = Field(description=Limits.model_fields["output_bytes"].description)


_RELATIVE_PATH_RULE = _cel(
    "!self.path.startsWith('/') && !self.path.split('/').exists(s, s == '..' || s == '.' || s == '')",
    "path must be relative, without '..', '.' or empty segments (e.g. data/input.csv)", ".path")


def relative_path(path: str) -> str:
    """The CEL rule above, so the SDK says it before the API server does."""
    if path.startswith("/") or any(part in ("", ".", "..") for part in path.split("/")):
        raise ValueError(f"path {path!r} must be relative, without '..', '.' or empty segments (e.g. data/input.csv)")
    return path


class FileInput(ApiModel):
    """A small input file materialised in the program's working directory before it starts."""
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("has(self.content) != has(self.contentBase64)",
             "set exactly one of content or contentBase64"),
        _RELATIVE_PATH_RULE,
    ]})
    path: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9._/-]+$", description=(
        "Relative path inside the working directory, e.g. data.csv or data/input.csv."))
    content: str | None = Field(None, max_length=MAX_FILE_CONTENT_CHARS, description="Text content (UTF-8).")
    content_base64: str | None = Field(None, max_length=MAX_FILE_CONTENT_CHARS, pattern=r"^[A-Za-z0-9+/=\s]*$",
                                       description="Binary content, base64-encoded.")

    @field_validator("content_base64")
    @classmethod
    def _decodes(cls, value: str | None) -> str | None:
        # The CRD pattern admits the alphabet; only decoding tells a wrong length or misplaced padding.
        if value is not None:
            try:
                base64.b64decode("".join(value.split()), validate=True)
            except (binascii.Error, ValueError) as e:
                raise ValueError(f"is not valid base64 ({e}); encode the file with base64 -w0") from None
        return value


class S3Input(ApiModel):
    """An object in the S3-compatible store, in a bucket and under a prefix the run's policy allows
    (spec.data.buckets of its CodeRunPolicy). The platform's credentials fetch it; the caller and the program
    never hold them."""
    bucket: str = Field(min_length=3, max_length=63, pattern=BUCKET_PATTERN, description="The bucket.")
    key: str = Field(min_length=1, max_length=MAX_OBJECT_KEY_CHARS, description="The object's key.")


class ArtifactInput(ApiModel):
    """An artifact of an earlier CodeRun in the same namespace, created by the same identity, that has finished:
    chains runs ("clean" then "analyse") without the bytes passing through the caller."""
    run: str = Field(min_length=1, max_length=253, pattern=OBJECT_NAME_PATTERN, description=(
        "The earlier CodeRun's name (same namespace)."))
    name: str = Field(min_length=1, max_length=MAX_OBJECT_KEY_CHARS, description=(
        "The artifact's name, as in that run's status.artifacts."))


class UploadInput(ApiModel):
    """A file the caller uploads to the data service (the SDK, the CLI and the MCP server do it for you): the run
    waits (Pending, WaitingForUpload) with status.upload naming where, then starts once the bytes are there."""
    sha256: str = Field(pattern=SHA256_PATTERN, description="Hex sha256 of the file: the upload must match it.")
    size: int = Field(ge=0, le=MAX_INPUT_BYTES, description="The file's size in bytes.")


class InputRef(ApiModel):
    """An input by reference: fetched outside the program, checked (size against the policy's cap, sha256 against
    the pin), then laid out read-only at its path in the working directory. It does not count against
    limits.disk; the policy caps inputs (spec.data of its CodeRunPolicy)."""
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("[has(self.s3), has(self.artifact), has(self.upload)].filter(x, x).size() == 1",
             "set exactly one of s3, artifact or upload"),
        _RELATIVE_PATH_RULE,
        _cel("!has(self.upload) || !has(self.sha256) || self.sha256 == self.upload.sha256",
             "sha256 must equal upload.sha256 (or be left out)", ".sha256"),
    ]})
    path: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9._/-]+$", description=(
        "Relative path inside the working directory, e.g. data.csv or data/input.csv."))
    sha256: str | None = Field(None, pattern=SHA256_PATTERN, description=(
        "The pin: the run fails InputMismatch unless the input's bytes have this hex sha256."))
    s3: S3Input | None = None
    artifact: ArtifactInput | None = None
    upload: UploadInput | None = None

    @field_validator("path")
    @classmethod
    def _relative(cls, path: str) -> str:
        return relative_path(path)

    @model_validator(mode="after")
    def _one_source(self) -> "InputRef":
        # The CEL rules above, so the SDK says it before the API server does.
        if sum(x is not None for x in (self.s3, self.artifact, self.upload)) != 1:
            raise ValueError(f"input {self.path}: set exactly one of s3, artifact or upload")
        if self.upload is not None and self.sha256 is not None and self.sha256 != self.upload.sha256:
            raise ValueError(f"input {self.path}: sha256 must equal upload.sha256 (or be left out)")
        return self

    def source(self) -> str:
        """How the status names where the input came from."""
        if self.s3 is not None:
            return f"s3://{self.s3.bucket}/{self.s3.key}"
        if self.artifact is not None:
            return f"run/{self.artifact.run}/{self.artifact.name}"
        assert self.upload is not None
        return f"upload:{self.upload.sha256}"


class Expect(ApiModel):
    """Optional output validation. The result is reported in status.validation and the OutputValid condition;
    it does not change the phase."""
    exit_code: int | None = Field(None, ge=0, le=255, description="The exit code the program must end with.")
    stdout_json_schema: dict[str, Any] | None = Field(
        None, alias="stdoutJSONSchema", description="A JSON Schema that stdout, parsed as JSON, must satisfy.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})


class CacheSpec(ApiModel):
    """Reuse the result of an identical earlier run instead of running again."""
    enabled: bool = Field(False, description="Look for an identical finished run and copy its result.")
    ttl_seconds: int = Field(600, ge=1, le=86400, description="How old a reusable result may be.")


class CodeRunSpec(ApiModel):
    """What to run. Immutable once created: to run something else, create a new CodeRun."""
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("self == oldSelf", "spec is immutable once created; create a new CodeRun instead"),
        _cel(f"size(self.code) + (has(self.stdin) ? size(self.stdin) : 0) + (has(self.files) ? "
             "self.files.map(f, has(f.content) ? size(f.content) : size(f.contentBase64)).sum() : 0)"
             f" <= {MAX_INPUT_TOTAL_CHARS}",
             f"code, stdin and files together must stay under {MAX_INPUT_TOTAL_CHARS // 1024} KiB"),
            _cel("!has(self.session) || !has(self.policyRef)", SESSION_NO_POLICY_REF, ".policyRef"),
        _cel("!has(self.files) || !has(self.inputs) || !self.inputs.exists(i, self.files.exists(f, f.path == i.path))",
             INPUT_PATH_TWICE, ".inputs"),
        _cel("!has(self.session) || !has(self.limits) || (!has(self.limits.memory) && !has(self.limits.cpu) && "
             "!has(self.limits.disk))", SESSION_NO_POD_LIMITS, ".limits"),
        _cel("!has(self.session) || !has(self.cache) || !has(self.cache.enabled) || !self.cache.enabled",
             SESSION_NO_CACHE, ".cache"),
    ]})
    language: str = Field(pattern=LANGUAGE_PATTERN, description=(
        "The runtime to use, e.g. python. The policy maps it to an image and command."))
    code: str = Field(min_length=1, max_length=MAX_CODE_BYTES, description="The program's source code.")
    stdin: str | None = Field(None, max_length=MAX_STDIN_BYTES, description="Text passed on standard input.")
    files: list[FileInput] | None = Field(None, max_length=MAX_FILES, description=(
        f"Small input files, placed relative to the working directory (code, stdin and files together under "
        f"{MAX_INPUT_TOTAL_CHARS // 1024} KiB); larger ones go in spec.inputs."),
        json_schema_extra={"x-kubernetes-validations": [
            _cel("self.all(f, self.exists_one(g, g.path == f.path))", "file paths must be unique")]})
    inputs: list[InputRef] | None = Field(None, max_length=MAX_INPUTS, description=(
        "Inputs by reference, of any size the policy allows: an object in the store, an earlier run's artifact, "
        "or an upload. Fetched outside the program and laid out read-only (docs/data.md)."),
        json_schema_extra={"x-kubernetes-validations": [
            _cel("self.all(f, self.exists_one(g, g.path == f.path))", "input paths must be unique")]})
    limits: Limits | None = Field(None, description="Resource limits; unset fields take the policy's defaults.")
    policy_ref: str | None = Field(None, max_length=253, description=(
        "Name of the CodeRunPolicy (in the run's namespace) to apply; empty means the namespace's policy "
        "named default, else the built-in baseline."))
    expect: Expect | None = Field(None, description="Optional validation of the program's output.")
    cache: CacheSpec | None = Field(None, description="Optional reuse of an identical earlier result.")
    ttl_seconds_after_finished: int | None = Field(None, ge=0, le=30 * 86400, description=(
        "Delete the CodeRun this many seconds after it finished (default from the policy)."))
    session: str | None = Field(None, min_length=1, max_length=MAX_SESSION_NAME_CHARS, pattern=SESSION_NAME_PATTERN,
                                description=(
        "Run in this CodeRunSession's sandbox (same namespace), after the session's earlier runs, one at a time: "
        "files in the working directory stay from run to run, and with the session's keepState so do the "
        "interpreter's variables. Only the identity that created the session may name it. The session's policy "
        "and pod limits apply (policyRef, and limits other than timeoutSeconds and outputBytes, must be unset); "
        "the cache does not."))

    @model_validator(mode="after")
    def _session_rules(self) -> "CodeRunSpec":
        if self.files and self.inputs and {f.path for f in self.files} & {i.path for i in self.inputs}:
            raise ValueError(INPUT_PATH_TWICE)
        # The same rules as the CEL above, so the SDK and the webhook say it before the API server does.
        if self.session is not None:
            if self.policy_ref is not None:
                raise ValueError(SESSION_NO_POLICY_REF)
            if self.limits is not None and any(v is not None for v in (self.limits.memory, self.limits.cpu,
                                                                           self.limits.disk)):
                raise ValueError(SESSION_NO_POD_LIMITS)
            if self.cache is not None and self.cache.enabled:
                raise ValueError(SESSION_NO_CACHE)
        return self


IMAGE_PATTERN = r"^[a-z0-9][a-z0-9._/:@-]*$"
RUNTIME_CLASS_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
UNSANDBOXED_RUNTIME_CLASSES = ("runc",)


class Runtime(ApiModel):
    """How one language runs: the image (pin it by digest, name@sha256:..., in production), the command the
    runner starts, the file the code is written to, and the sandbox runtime."""
    language: str = Field(pattern=LANGUAGE_PATTERN, description="The name callers use in spec.language.")
    image: str = Field(min_length=1, max_length=512, pattern=IMAGE_PATTERN, description=(
        "The sandbox image with the coderun runner as its entrypoint; pin it by digest in production."))
    command: list[str] = Field(min_length=1, max_length=16, description=(
        "The program's command, run in the working directory, e.g. [python3, -u, main.py]."),
        json_schema_extra={"items": {"type": "string", "maxLength": 256}})
    code_file: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description=(
        "The file the code is written to, in the working directory, e.g. main.py."))
    runtime_class_name: str = Field("gvisor", pattern=RUNTIME_CLASS_PATTERN, description=(
        "The RuntimeClass of the sandbox pod: gvisor by default; kata or another sandbox runtime where the "
        "cluster has it. runc (no sandbox) needs spec.allowUnsandboxedRuntime."))


class EgressPort(ApiModel):
    port: int = Field(ge=1, le=65535, description="Destination port.")
    protocol: str = Field("TCP", pattern=r"^(TCP|UDP)$", description="TCP or UDP (UDP for cidr rules only).")


# Why a host is refused, said once for the API server (CEL) and for Python (the SDK, the webhook, the tests).
HOST_IS_AN_ADDRESS = "host is a DNS name, not an IP address: use cidr for addresses"
HOST_WILDCARD = "a wildcard is allowed only as the whole first label, as in *.example.org (subdomains only)"
HOST_MALFORMED = ("host must be a lowercase DNS name of two labels or more, without a trailing dot, such as "
                  "api.github.com, or *. and such a name")
HOST_OR_CIDR = "set exactly one of host (a name, reached through the egress proxy) and cidr (an address range)"
HOST_PORTS_TCP = "a host rule's ports are TCP: the egress proxy carries HTTP and HTTPS"


class EgressRule(ApiModel):
    """One destination runs may reach: a host name (through the egress proxy) or an address range (directly)."""
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("has(self.host) != has(self.cidr)", HOST_OR_CIDR),
        _cel("!has(self.host) || !has(self.ports) || self.ports.all(p, !has(p.protocol) || p.protocol == 'TCP')",
             HOST_PORTS_TCP, ".ports"),
    ]})
    host: str | None = Field(None, max_length=MAX_NAME_LENGTH, description=(
        "A DNS name (api.github.com), or *. and a name for its subdomains one label deep (*.example.org matches "
        "a.example.org, not example.org nor a.b.example.org), reached through the egress proxy (HTTP and HTTPS, "
        "every request logged). Names inside the cluster are written in full (mirror.pkgs.svc.cluster.local): the "
        "proxy uses no search domains. A name resolving into the cluster's own ranges is refused unless a cidr "
        "rule of the policy covers the address."),
        json_schema_extra={"pattern": HOST_PATTERN, "x-kubernetes-validations": [
            _cel(r"!self.contains(':') && !self.matches('^[0-9.]+$')", HOST_IS_AN_ADDRESS),
            _cel(r"!self.contains('*') || self.matches('^[*][.][^*]+$')", HOST_WILDCARD)]})
    cidr: str | None = Field(None, max_length=64, description=(
        "An IPv4 or IPv6 CIDR, e.g. 10.0.0.5/32 or 2001:db8::/64, reached directly."))
    ports: list[EgressPort] | None = Field(None, max_length=16, description="Ports; empty means every port.")

    @field_validator("host")
    @classmethod
    def _a_name(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if ":" in value or re.fullmatch(r"[0-9.]+", value):
            raise ValueError(HOST_IS_AN_ADDRESS)
        if "*" in value and not re.fullmatch(r"\*\.[^*]+", value):
            raise ValueError(HOST_WILDCARD)
        if not valid_host_rule(value):
            raise ValueError(HOST_MALFORMED)
        return value

    @field_validator("cidr")
    @classmethod
    def _a_cidr(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ipaddress.ip_network(value, strict=False)
            except ValueError:
                raise ValueError("cidr must be a CIDR such as 10.0.0.5/32 or 2001:db8::/64") from None
        return value

    @model_validator(mode="after")
    def _host_or_cidr(self) -> "EgressRule":
        if (self.host is None) == (self.cidr is None):
            raise ValueError(HOST_OR_CIDR)
        if self.host is not None and any(p.protocol != "TCP" for p in self.ports or ()):
            raise ValueError(HOST_PORTS_TCP)
        return self

    def as_rule(self) -> Rule:
        """The rule as the egress proxy applies it (it travels in the run's credential)."""
        return Rule(host=self.host, cidr=self.cidr, ports=tuple(p.port for p in self.ports or ()))


class EgressBudget(ApiModel):
    """What one run may spend through the egress proxy (host rules; a cidr rule's direct route is not counted).
    Past it the proxy refuses the run's further requests and the run ends Failed, reason EgressBudgetExceeded.
    A request counts as the proxy is asked it, allowed or refused; its bytes when it ends, so the last request
    allowed may go over a byte budget by its own size."""
    bytes: int | None = Field(None, ge=1, le=1 << 50, description=(
        "Bytes the program sends and receives through the proxy, all requests together. An https:// tunnel is cut "
        "where its bytes flow, one 16 KiB chunk past the budget; a plain http:// response is counted only when it "
        "ends, so for plain HTTP the budget refuses the next request, it does not limit a response's size."))
    requests: int | None = Field(None, ge=1, le=10_000_000, description=(
        "Requests the program makes through the proxy, allowed or refused."))


MiB = 1024**2
GiB = 1024**3


class DataBucket(ApiModel):
    """A place in the store runs of the policy may name as input (spec.inputs[].s3)."""
    bucket: str = Field(min_length=3, max_length=63, pattern=BUCKET_PATTERN, description="The bucket.")
    prefix: str = Field("", max_length=MAX_OBJECT_KEY_CHARS, description=(
        "Only keys that start with this (empty: the whole bucket). End it with / to name a folder."))


class ArtifactCaps(ApiModel):
    """What a run may leave as artifacts; a file past a cap is skipped, named in status.artifactsSkipped with why."""
    max_files: int = Field(16, ge=1, le=256, description="Files kept at most.")
    max_file_bytes: int = Field(5 * MiB, ge=1, le=512 * MiB, description="One file's size at most (default 5 MiB).")
    max_total_bytes: int = Field(5 * MiB, ge=1, le=1 * GiB, description="All files together at most (default 5 MiB).")


class DataPolicy(ApiModel):
    """Inputs by reference and artifacts in the store (docs/data.md)."""
    buckets: list[DataBucket] | None = Field(None, max_length=16, description=(
        "Where spec.inputs[].s3 may point; unset: no S3 input (artifacts of earlier runs and uploads still work)."))
    max_input_bytes: int = Field(1 * GiB, ge=1, le=MAX_INPUT_BYTES, description=(
        "One input's size at most (default 1 GiB); a larger one fails the run InputTooLarge."))
    max_inputs_total_bytes: int = Field(2 * GiB, ge=1, le=4 * MAX_INPUT_BYTES, description=(
        "All of a run's inputs together at most (default 2 GiB): the size of the pod's input volume."))
    artifacts: ArtifactCaps | None = None
    artifact_ttl_seconds: int | None = Field(None, ge=60, le=30 * 86400, alias="artifactTTLSeconds", description=(
        "Delete stored artifacts this long after the run ended (within ten minutes after), even if the run is "
        "kept longer. Unset: they go with the run."))
    upload_wait_seconds: int = Field(900, ge=10, le=86400, description=(
        "How long a run waits for its uploads before it fails InputUnavailable (default 900)."))


class DecisionRecord(ApiModel):
    """What the policy decided at admission, kept so a policy changed later cannot change a run already admitted
    (a queued run, or one waiting for approval, starts with exactly this)."""
    policy: str = Field(description="The CodeRunPolicy that applied, or builtin-default.")
    policy_digest: str = Field(description="sha256 of that policy's spec, for audit.")
    runtime: Runtime
    limits: ResourceLimits = Field(description="The limits the run got: its own, else the policy's defaults.")
    egress: list[EgressRule] | None = Field(None, max_length=64, description=(
        "The destinations the run may reach (the policy's egress); unset: none."))
    egress_budget: EgressBudget | None = None
    redaction_patterns: list[str] | None = Field(None, max_length=64, description=(
        "The policy's own redaction patterns (RE2), applied to the output besides the built-in ones."))
    max_processes: int = Field(description="The most processes the program may have at once.")
    max_inodes: int = Field(description="The most files and directories the program may create under /tmp.")
    ttl_seconds_after_finished: int = Field(description="Seconds the finished run is kept before it is deleted.")
    approval_required: bool = Field(False, description="The run waited for a person's approval before it started.")
    allow_self_approval: bool = Field(False, description="The run's creator could approve it.")
    max_concurrent_runs: int | None = Field(None, description=(
        "Runs of the policy with a sandbox at once in the namespace; more wait Queued. Unset: no cap."))
    data: DataPolicy | None = Field(None, description="The policy's inputs and artifacts settings; unset: defaults.")
    # Kept whole, not typed again in the status schema: the policy's schema checked it, and a second copy of the
    # affinity's schema would double the CodeRun CRD.
    scheduling: Scheduling | None = Field(None, description=(
        "The policy's scheduling of the run's pod (CodeRunPolicy spec.scheduling); fields it left unset, or all "
        "when unset, took the chart's defaults."), json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
    start_deadline_seconds: int | None = Field(None, description=(
        "How long the pod could wait to be scheduled and started; unset: 300."))


class ApprovalRecord(ApiModel):
    """Who decided a run that needed approval, as the API server identified them (never a string the caller
    chose), and who created it; identities are shown bounded and without control characters."""
    approved_by: str | None = Field(None, description="The username that approved the run.")
    rejected_by: str | None = Field(None, description="The username that rejected the run.")
    creator: str | None = Field(None, description="The username that created the run.")
    time: str = Field(description="When the operator acted on the decision.", json_schema_extra={"format": "date-time"})


class Metrics(ApiModel):
    """Timings in milliseconds. queue: CodeRun created -> pod created; startup: pod created -> program
    started; wall: the program itself; total: CodeRun created -> result written."""
    wall_millis: int | None = Field(None, description="Wall-clock time of the program.")
    cpu_millis: int | None = Field(None, description=(
        "CPU time (user + system) of the program and its children (of a program ended at a timeout or a limit, what "
        "they had used when it was ended)."))
    max_rss_bytes: int | None = Field(None, alias="maxRSSBytes", description="Peak resident memory of the program.")
    queue_millis: int | None = Field(None, description="CodeRun created -> sandbox pod created.")
    startup_millis: int | None = Field(None, description="Sandbox pod created -> program started.")
    total_millis: int | None = Field(None, description="CodeRun created -> result written.")
    interpreter_prestarted: bool | None = Field(None, description=(
        "True when the program ran in an interpreter started before its code came (a warm or session pod's, with "
        "the image's common modules imported): startup then holds no interpreter start."))


class RunError(ApiModel):
    """The program's uncaught error, parsed from its traceback when possible."""
    type: str = Field(description="Exception type, e.g. ZeroDivisionError.")
    message: str = Field(description="Exception message.")
    line: int | None = Field(None, description="Line in the submitted code where it was raised.")


class Artifact(ApiModel):
    """A file the program wrote to $CODERUN_OUTPUT_DIR: a small one in a ConfigMap owned by the CodeRun, a larger
    one in the store (stored: true; read it with status.dataGrant, or the SDK, the CLI or the MCP server)."""
    name: str = Field(description="Path relative to the output directory.")
    size: int = Field(description="Size in bytes.")
    sha256: str = Field(description="Hex sha256 of the content.")
    config_map: str | None = Field(None, description="ConfigMap holding the content (binaryData), when inline.")
    key: str | None = Field(None, description="Key of the content inside that ConfigMap, when inline.")
    stored: bool | None = Field(None, description="The content is in the store, not in a ConfigMap.")


class InputRecord(ApiModel):
    """An input by reference as the run got it: where from, and the size and sha256 of the bytes laid out."""
    path: str = Field(description="Where the program found it, relative to the working directory.")
    source: str = Field(description="s3://bucket/key, run/<run>/<artifact> or upload:<sha256>.")
    size: int = Field(description="Size in bytes.")
    sha256: str = Field(description="Hex sha256 of the bytes.")


class DataGrant(ApiModel):
    """Where and with what a caller reaches the data service (docs/data.md). Whoever may read this run may use it,
    until it expires."""
    url: str = Field(description="The data service's address.")
    token: str = Field(description="The grant, sent as `Authorization: Bearer <token>`.")
    expires: str = Field(description="When the grant stops working.", json_schema_extra={"format": "date-time"})


class UploadFile(ApiModel):
    path: str = Field(description="The input's path.")
    sha256: str = Field(description="The bytes to upload, by hex sha256.")
    size: int = Field(description="Their size.")


class UploadWait(DataGrant):
    """The run waits for these uploads (PUT <url>/v1/uploads/<sha256>); it fails InputUnavailable when they have
    not come by `expires`."""
    files: list[UploadFile] = Field(default_factory=list, max_length=MAX_INPUTS, description="What to upload.")


class SkippedArtifact(ApiModel):
    """An output file that was not kept as an artifact, and why."""
    name: str = Field(description="Path relative to the output directory.")
    why: str = Field(description=(
        "symlink, hard-link, not-a-regular-file, too-large (over the per-file cap), too-many, total-too-large, "
        "store-failed (the store refused or could not be reached) or corrupt (its bytes did not match the size "
        "and sha256 the runner reported)."))


class Validation(ApiModel):
    """The output checked against spec.expect."""
    valid: bool = Field(description="Whether the output met spec.expect.")
    errors: list[str] = Field(default_factory=list, description="What did not match, one line each.")


MAX_NETWORK_HOSTS = 16


class NetworkHost(ApiModel):
    """One destination the program asked the egress proxy for, with what happened to its requests."""
    host: str = Field(max_length=253, description="The name asked for (as the program sent it, shown safely).")
    port: int | None = Field(None, description="The port asked for.")
    allowed: int = Field(0, description="Requests the proxy let through.")
    denied: int = Field(0, description="Requests the proxy refused.")
    reason: str | None = Field(None, max_length=64, description=(
        "Why the last refusal: NotAllowed, ProtectedAddress, Unresolved, NotAName, SNIMismatch, BudgetExceeded, ..."))
    bytes_sent: int = Field(0, description="Bytes the program sent to it.")
    bytes_received: int = Field(0, description="Bytes the program received from it.")


class NetworkStatus(ApiModel):
    """What the run sent where through the egress proxy, summarised (runs of policies with host rules). Every
    request is in the ConfigMap logConfigMap names, one JSON record a line, owned by the run."""
    requests: int = Field(0, description="Requests the proxy logged of the run, allowed or refused.")
    admitted: int | None = Field(None, description=(
        "Requests the proxy's checks counted as the run asked them (exact). More than requests: records were lost "
        "before they were logged, and complete is false."))
    allowed: int = Field(0, description="Requests it let through.")
    denied: int = Field(0, description="Requests it refused.")
    bytes_sent: int = Field(0, description="Bytes the program sent through the proxy.")
    bytes_received: int = Field(0, description="Bytes the program received through the proxy.")
    hosts: list[NetworkHost] | None = Field(None, max_length=MAX_NETWORK_HOSTS, description=(
        f"The destinations, refused ones first, then by requests; at most {MAX_NETWORK_HOSTS}."))
    hosts_omitted: int | None = Field(None, description="Further destinations not listed in hosts.")
    dropped: int | None = Field(None, description=(
        "Requests counted above whose records the proxy did not keep (a run's log is capped per proxy pod)."))
    complete: bool = Field(True, description=(
        "False when a proxy replica could not be asked when the run ended, or its log had not caught up with the "
        "requests it admitted (admitted above requests): some requests are missing here."))
    log_config_map: str | None = Field(None, description="The ConfigMap with every request's record (requests.jsonl).")
    log_truncated: bool | None = Field(None, description="The ConfigMap holds only the first records (it is capped).")
    proxy_pod: str | None = Field(None, description=(
        "The egress proxy pod the run was pinned to when it started: the only one its program dials, which counts "
        "its budget."))


# status.audit's bounds (docs/audit.md, "The status"): the agent's summary is cut to these again by the operator.
AUDIT_SOURCES = ("gvisor-trace", "Unavailable")
MAX_AUDIT_FILES = 50
MAX_AUDIT_CONNECTS = 50
MAX_AUDIT_SOCKETS = 20
MAX_AUDIT_PROCESSES = 50
MAX_AUDIT_EXAMPLES = 10
MAX_AUDIT_ARGV = 16
MAX_AUDIT_PATH_CHARS = 512
MAX_AUDIT_ARG_CHARS = 256
MAX_AUDIT_MESSAGE_CHARS = 1024


class AuditFile(ApiModel):
    """A file the program opened under the run's own directories (the work dir's shown relative to it)."""
    path: str = Field(max_length=MAX_AUDIT_PATH_CHARS, description=(
        "The path as the program named it, resolved against its directory (links not followed), controls escaped, "
        "secrets redacted."))
    count: int = Field(0, ge=0, description="Opens that succeeded.")
    failed: int | None = Field(None, ge=0, description="Opens that failed for another reason than a denial.")
    denied: int | None = Field(None, ge=0, description="Opens refused (EACCES, EPERM, EROFS).")
    bytes: int | None = Field(None, ge=0, description="Bytes written, when the nodes trace writes.")


class AuditOutside(ApiModel):
    """Opens outside the run's own directories (libraries, /etc, /proc): counted; unusual ones named."""
    reads: int = Field(0, ge=0, description="Opens for reading.")
    writes: int = Field(0, ge=0, description="Opens for writing.")
    denied: int = Field(0, ge=0, description="Opens refused.")
    examples: list[str] | None = Field(None, max_length=MAX_AUDIT_EXAMPLES, description=(
        f"Paths that are not routine library reads, or were refused; at most {MAX_AUDIT_EXAMPLES}."),
        json_schema_extra={"items": {"type": "string", "maxLength": MAX_AUDIT_PATH_CHARS}})


class AuditConnect(ApiModel):
    """An address the program tried to connect to, and what came of it."""
    family: str = Field(max_length=32, description="inet, inet6, unix, netlink, ...")
    address: str = Field("", max_length=MAX_AUDIT_PATH_CHARS, description=(
        "The IP address or unix socket path ('' when unreadable)."))
    port: int | None = Field(None, ge=0, le=65535, description="The port (inet, inet6).")
    result: str = Field(max_length=32, description=(
        "connected, inProgress, refused, timedOut, unreachable, denied, or the errno's name."))
    count: int = Field(0, ge=0, description="Attempts with this address and result.")


class AuditSocket(ApiModel):
    """Sockets the program made, by kind (a raw or packet socket stands out)."""
    family: str = Field(max_length=32, description="inet, inet6, unix, netlink, packet, ...")
    protocol: str = Field(max_length=32, description="tcp, udp, raw, unix, ...")
    result: str = Field(max_length=32, description="created, or why socket(2) failed.")
    count: int = Field(0, ge=0, description="Sockets of this kind and result.")


class AuditProcess(ApiModel):
    """A process of the program (the runner's own helpers are only counted, in runner)."""
    argv: list[str] = Field(default_factory=list, max_length=MAX_AUDIT_ARGV, description=(
        f"Its command line, at most {MAX_AUDIT_ARGV} items of {MAX_AUDIT_ARG_CHARS} characters, secrets redacted."),
        json_schema_extra={"items": {"type": "string", "maxLength": MAX_AUDIT_ARG_CHARS}})
    argv_omitted: int | None = Field(None, ge=0, description="Arguments left out of argv.")
    from_memfd: bool | None = Field(None, description="Its binary was run from a memfd (never on disk).")
    started_before_run: bool | None = Field(None, description=(
        "The interpreter a warm or session pod started before the run came (its argv is that start's, its start "
        "not recorded); it ran the program from the run's start on."))
    exit_code: int | None = Field(None, description="Its exit code, when it exited by itself.")
    signal: str | None = Field(None, max_length=16, description="The signal that ended it (SIGKILL, ...).")


class AuditCounts(ApiModel):
    """Totals, whatever the lists show."""
    processes: int = Field(0, ge=0, description="Processes of the program.")
    failed_execs: int = Field(0, ge=0, description="exec calls that failed (a missing binary).")
    connect_attempts: int = Field(0, ge=0, description="connect calls.")
    syscalls_denied: int = Field(0, ge=0, description="Calls gVisor refused with EACCES, EPERM or EROFS.")
    openat2: int = Field(0, ge=0, description="openat2 calls (their path is not recorded).")
    addressed_sends: int = Field(0, ge=0, description="sendto/sendmsg calls with an address (not recorded).")
    points_lost: int = Field(0, ge=0, description="Trace points dropped on the way: the record misses them.")
    points_unknown: int = Field(0, ge=0, description="Trace points of a kind the agent does not read.")


class AuditRunner(ApiModel):
    """What coderun's runner did in the sandbox (since the claim, for a warm pod), apart from the program."""
    files_read: int = Field(0, ge=0, description="Files it opened for reading.")
    files_written: int = Field(0, ge=0, description="Files it opened for writing.")
    processes: int = Field(0, ge=0, description="Helper processes it started.")


class AuditOmitted(ApiModel):
    """What the bounded lists left out, per list."""
    files_read: int | None = Field(None, ge=0, description="Entries left out of filesRead.")
    files_written: int | None = Field(None, ge=0, description="Entries left out of filesWritten.")
    connect_attempts: int | None = Field(None, ge=0, description="Entries left out of connectAttempts.")
    sockets_opened: int | None = Field(None, ge=0, description="Entries left out of socketsOpened.")
    processes: int | None = Field(None, ge=0, description="Entries left out of processes.")
    outside_workdir_examples: int | None = Field(None, ge=0, description="Paths left out of outsideWorkdir.examples.")


class AuditStatus(ApiModel):
    """What the program touched, as gVisor's trace points recorded it on the sandbox's node (docs/audit.md):
    files, connections, processes. Unavailable, with a message, when it could not be known: never an empty list
    that reads as "nothing happened"."""
    source: str = Field(description="gvisor-trace, or Unavailable (message says why).",
                        json_schema_extra={"enum": list(AUDIT_SOURCES)})
    message: str | None = Field(None, max_length=MAX_AUDIT_MESSAGE_CHARS, description=(
        "Why the audit is unavailable or partial, and what to check."))
    complete: bool | None = Field(None, description=(
        "The record reached the run's end (the runner's or every program process's exit): false, some of the "
        "run's activity may be missing."))
    files_read: list[AuditFile] | None = Field(None, max_length=MAX_AUDIT_FILES, description=(
        f"Files read under the run's own directories, the work dir first; at most {MAX_AUDIT_FILES}."))
    files_written: list[AuditFile] | None = Field(None, max_length=MAX_AUDIT_FILES, description=(
        f"Files written under the run's own directories; at most {MAX_AUDIT_FILES}."))
    outside_workdir: AuditOutside | None = Field(None, description="Opens outside the run's own directories.")
    connect_attempts: list[AuditConnect] | None = Field(None, max_length=MAX_AUDIT_CONNECTS, description=(
        f"Addresses the program tried to connect to; at most {MAX_AUDIT_CONNECTS}."))
    sockets_opened: list[AuditSocket] | None = Field(None, max_length=MAX_AUDIT_SOCKETS, description=(
        f"Sockets the program made, by kind; at most {MAX_AUDIT_SOCKETS}."))
    processes: list[AuditProcess] | None = Field(None, max_length=MAX_AUDIT_PROCESSES, description=(
        f"The program's processes; at most {MAX_AUDIT_PROCESSES}."))
    counts: AuditCounts | None = Field(None, description="Totals, whatever the lists show.")
    runner: AuditRunner | None = Field(None, description="coderun's runner's own activity, counted apart.")
    omitted: AuditOmitted | None = Field(None, description="What the bounded lists left out.")
    record_config_map: str | None = Field(None, max_length=253, description=(
        "The ConfigMap with the full record (audit.jsonl, one trace point a line), owned by the run."))
    record_cut: int | None = Field(None, ge=0, description=(
        "Records left out of that ConfigMap (the agent's bound and the ConfigMap's size limit)."))


class Condition(ApiModel):
    """Kubernetes API conventions: lastTransitionTime moves only when status flips."""
    type: str = Field(description="What the condition is about (the status's conditions field lists the types).")
    status: str = Field(description="True, False or Unknown.", json_schema_extra={"enum": ["True", "False", "Unknown"]})
    reason: str = Field(description="Why, a CamelCase word.")
    message: str = Field("", description="What happened, for a person.")
    last_transition_time: str = Field(description="When status last changed.", json_schema_extra={"format": "date-time"})
    observed_generation: int | None = Field(None, description="The metadata.generation the condition was set for.")


class CodeRunStatus(ApiModel):
    """The run as the operator reports it: Pending and Running on the way, the result when it ends. Only the
    operator writes it, through this model; every field is declared so none is pruned."""
    phase: Phase | None = Field(None, description="Pending, Running, Succeeded, Failed or Rejected.")
    reason: str | None = Field(None, description="Why the run is in this phase, a CamelCase word.")
    message: str | None = Field(None, description="What happened and, on failure, what to change.")
    exit_code: int | None = Field(None, description="The program's exit code, when it exited by itself.")
    signal: int | None = Field(None, description="The signal that ended the program, if one did.")
    stdout: str | None = Field(None, description="Standard output (head, capped, secrets redacted).")
    stderr: str | None = Field(None, description="Standard error (head, capped, secrets redacted).")
    stdout_bytes: int | None = Field(None, description="Bytes the program wrote to stdout in all.")
    stderr_bytes: int | None = Field(None, description="Bytes the program wrote to stderr in all.")
    stdout_truncated: bool | None = Field(None, description="stdout holds only the head of the stream.")
    stderr_truncated: bool | None = Field(None, description="stderr holds only the head of the stream.")
    stdout_sha256: str | None = Field(None, description="sha256 of the whole stdout stream.")
    stderr_sha256: str | None = Field(None, description="sha256 of the whole stderr stream.")
    redactions: int | None = Field(None, description="How many secret-like strings were redacted.")
    error: RunError | None = None
    metrics: Metrics | None = None
    inputs: list[InputRecord] | None = Field(None, max_length=MAX_INPUTS, description=(
        "The inputs by reference (spec.inputs) as laid out: source, size and sha256."))
    upload: UploadWait | None = Field(None, description=(
        "While the run waits for the caller's uploads: where to send them. Gone once they came."))
    artifacts: list[Artifact] | None = Field(None, description=(
        "Files the program wrote to $CODERUN_OUTPUT_DIR: small ones in a ConfigMap owned by the run, larger ones "
        "in the store (stored: true)."))
    data_grant: DataGrant | None = Field(None, description=(
        "Reads the run's stored artifacts at the data service (GET <url>/v1/artifacts/<name>), until the run "
        "expires."))
    artifacts_skipped: list[SkippedArtifact] | None = Field(None, description=(
        "Output files that were not kept, and why."))
    artifacts_skipped_unlisted: int | None = Field(None, description=(
        "How many more output files were skipped beyond those listed in artifactsSkipped."))
    validation: Validation | None = Field(None, description="The output checked against spec.expect, when it has one.")
    network: NetworkStatus | None = Field(None, description="The run's requests through the egress proxy.")
    audit: AuditStatus | None = Field(None, description=(
        "What the program touched (files, connections, processes), from gVisor's trace points."))
    code_hash: str | None = Field(None, description="sha256 of the code, stdin and files.")
    image: str | None = Field(None, description="The image that ran, with its digest.")
    runtime_class: str | None = Field(None, description="The RuntimeClass of the sandbox pod.")
    policy: str | None = Field(None, description="The policy that was applied.")
    policy_digest: str | None = Field(None, description="sha256 of the applied policy's spec, for audit.")
    decision: DecisionRecord | None = Field(None, description="The policy's decision, recorded at admission.")
    approval: ApprovalRecord | None = Field(None, description="Who approved or rejected the run, and when.")
    policy_rule: str | None = Field(None, description="The policy rule that refused the run, when one did.")
    effective_limits: Limits | None = Field(None, description="The limits the run got after policy defaults.")
    pod_name: str | None = Field(None, description="The sandbox pod (deleted once the result is written).")
    start_mode: str | None = Field(None, description=(
        "Warm: the run took a pre-started pod from its policy's warm pool; Cold: a pod was created for it; "
        "Session: it ran in its session's sandbox."),
        json_schema_extra={"enum": ["Warm", "Cold", "Session"]})
    cached_from: str | None = Field(None, description="The earlier CodeRun whose result was reused.")
    cache_key: str | None = Field(None, description="sha256 of everything that decides the result (see spec.cache).")
    start_time: str | None = Field(None, description="When the sandbox pod was created.",
                                   json_schema_extra={"format": "date-time"})
    completion_time: str | None = Field(None, description="When the run ended (result written, or refused).",
                                        json_schema_extra={"format": "date-time"})
    observed_generation: int | None = Field(None, description="The metadata.generation this status was written for.")
    conditions: list[Condition] | None = Field(None, description=(
        "Accepted, Running, Complete, Failed, Finished (True once the run ended, however it ended: what "
        "`kubectl wait --for=condition=Finished` waits for) and OutputValid, per the Kubernetes API conventions."),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})


class CodeRun(ApiModel):
    """A request to run code once in a sandbox."""
    model_config = ConfigDict(extra="ignore")
    api_version: str = API_VERSION
    kind: str = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: CodeRunSpec
    status: CodeRunStatus | None = None
