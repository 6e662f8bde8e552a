"""Policy data: runtimes (image, command), default and maximum limits. Frozen, so a decision cannot drift."""
from __future__ import annotations

from dataclasses import dataclass, field

from .models import ResourceLimits


@dataclass(frozen=True)
class Runtime:
    """How one language runs: the image (pin it by digest in production; the built-in policy names the local
    cluster's tag), the command the runner starts, the file the code goes to."""
    language: str
    image: str
    command: tuple[str, ...]
    code_file: str
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Policy:
    name: str
    runtimes: dict[str, Runtime]
    defaults: ResourceLimits
    maximums: ResourceLimits
    runtime_class: str = "gvisor"
    ttl_seconds_after_finished: int = 3600
    # How long a pod may wait to be scheduled or to start before the run fails instead of pending forever.
    start_deadline_seconds: int = 300
    artifact_max_files: int = 16
    artifact_max_file_bytes: int = 256 * 1024
    artifact_max_total_bytes: int = 512 * 1024
    redaction_patterns: tuple[str, ...] = field(default_factory=tuple)
    # Enforced by the runner inside the sandbox (the kubelet's podPidsLimit is the backstop outside it).
    max_processes: int = 128
    max_inodes: int = 16384


@dataclass(frozen=True)
class Decision:
    """An allowed run: the policy, the runtime and the limits after defaults."""
    policy: Policy
    runtime: Runtime
    limits: ResourceLimits


@dataclass(frozen=True)
class Denial:
    """A refused run. `rule` names the policy rule, `message` says what to change."""
    reason: str
    rule: str
    message: str


SANDBOX_PYTHON_IMAGE = "coderun.local/sandbox-python:v1"

# The built-in policy, used until CodeRunPolicy bundles exist: python only, the baseline limits of the
# design, the caller may ask for less or for more up to the maximums.
DEFAULT_POLICY = Policy(
    name="builtin-default",
    runtimes={
        "python": Runtime(language="python", image=SANDBOX_PYTHON_IMAGE,
                          command=("python3", "-u", "main.py"), code_file="main.py"),
    },
    defaults=ResourceLimits(timeout_seconds=5, memory="256Mi", cpu="1", disk="64Mi", output_bytes=64 * 1024),
    maximums=ResourceLimits(timeout_seconds=300, memory="2Gi", cpu="2", disk="1Gi", output_bytes=256 * 1024),
)
