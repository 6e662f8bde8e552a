"""A circuit breaker for the sandbox: after N platform failures in a row, stop sending runs for a while."""
from __future__ import annotations

import time
from typing import Callable


class CircuitOpen(Exception):
    """The sandbox failed too often in a row; runs are refused until the cooldown has passed."""


class CircuitBreaker:
    """closed -> (threshold consecutive failures) -> open -> (cooldown) -> half-open: one trial run decides.

    Only platform failures count (API unreachable, pod deleted, internal error): a program's own bug is the
    model's to fix and never opens the circuit."""

    def __init__(self, threshold: int = 3, cooldown_seconds: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.threshold, self.cooldown_seconds, self.clock = threshold, cooldown_seconds, clock
        self.failures = 0
        self.opened_at: float | None = None

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return "closed"
        return "half-open" if self.clock() - self.opened_at >= self.cooldown_seconds else "open"

    def check(self) -> None:
        if self.state == "open":
            wait = self.cooldown_seconds - (self.clock() - self.opened_at)
            raise CircuitOpen(f"the sandbox failed {self.failures} times in a row; not sending runs for "
                              f"another {wait:.0f}s")

    def record_success(self) -> None:
        self.failures, self.opened_at = 0, None

    def record_failure(self) -> None:
        self.failures += 1
        if self.failures >= self.threshold or self.opened_at is not None:  # a failed half-open trial re-opens
            self.opened_at = self.clock()
