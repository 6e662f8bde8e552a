"""The SDK's conversations with the API server as plans of steps, so the sync and the async client share ONE logic
and differ only in how they perform a step (blocking calls, or awaited ones).

A plan is a generator: it yields a step, receives the step's answer, and returns its outcome. A step that fails is
thrown into the plan at its yield, and the plan decides (retry, list again, give up). `drive` runs a plan with
blocking I/O; coderun.client.aio has the awaiting driver. The plans: waiting.wait_plan, creating.create_plan,
deleting.delete_plan, runtimes.runtimes_plan, waiting.wait_all_plan.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterable, Iterator, Mapping, TypeVar, Union

T = TypeVar("T")


@dataclass(frozen=True)
class Create:
    """Create the CodeRun `body` (it carries its name); answers the created object."""
    body: Mapping[str, Any]


@dataclass(frozen=True)
class Get:
    """Read the CodeRun; answers the object."""
    name: str


@dataclass(frozen=True)
class Delete:
    """Delete the CodeRun (its pod, ConfigMaps and artifacts go with it, in the background)."""
    name: str


@dataclass(frozen=True)
class GetPolicy:
    """Read the CodeRunPolicy; answers the object."""
    name: str


@dataclass(frozen=True)
class Fetch:
    """List the one run being waited for: answers (the object or None when absent, the list's resourceVersion)."""
    name: str


@dataclass(frozen=True)
class FetchAll:
    """List the runs `labels` (a label selector) selects: answers (their objects, the list's resourceVersion)."""
    labels: str


@dataclass(frozen=True)
class OpenWatch:
    """Watch the run from `resource_version` for at most `seconds`; or, given `labels` (a label selector), every
    run it selects (`name` then says what for, in messages). The driver holds the stream until the next OpenWatch
    or the plan's end, and closes it then whatever happens (an error, a cancelled task)."""
    name: str
    resource_version: str
    seconds: float
    labels: str | None = None

    def selector(self) -> dict[str, str]:
        """The list call's selector argument."""
        return {"label_selector": self.labels} if self.labels else {"field_selector": f"metadata.name={self.name}"}


@dataclass(frozen=True)
class NextEvent:
    """The open watch's next (event type, object), or None when the server ended the watch."""


@dataclass(frozen=True)
class Sleep:
    seconds: float


Step = Union[Create, Get, Delete, GetPolicy, Fetch, FetchAll, OpenWatch, NextEvent, Sleep]
Plan = Generator[Step, Any, T]
# OpenWatch -> (event type, object) until the server ends the watch
Watch = Callable[[OpenWatch], Iterable[tuple[str, Mapping[str, Any]]]]


def advance(plan: Plan[T], answer: Any, failure: BaseException | None) -> tuple[bool, Any]:
    """(done, outcome) when the plan returned, else (False, its next step): the half both drivers share."""
    try:
        return False, (plan.throw(failure) if failure is not None else plan.send(answer))
    except StopIteration as done:
        return True, done.value


def drive(plan: Plan[T], perform: Callable[[Step], Any], watch: Watch | None = None) -> T:
    """Run `plan` with blocking I/O: `perform` answers every step but the watch's; `watch` opens event streams."""
    events: Iterator[tuple[str, Mapping[str, Any]]] | None = None
    answer, failure = None, None
    try:
        while True:
            done, step = advance(plan, answer, failure)
            if done:
                return step
            answer, failure = None, None
            try:
                if isinstance(step, OpenWatch):
                    _close(events)
                    events = iter(watch(step))
                elif isinstance(step, NextEvent):
                    answer = next(events, None)
                else:
                    answer = perform(step)
            except Exception as e:  # the plan decides what a failed step means
                failure = e
    finally:
        _close(events)
        plan.close()


def _close(events: Iterator[Any] | None) -> None:
    close = getattr(events, "close", None)
    if close:
        close()
