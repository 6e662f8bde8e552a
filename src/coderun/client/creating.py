"""Create a CodeRun so that a retry never makes two runs and never adopts someone else's.

The client chooses the name and a create token before the first attempt (request.build_body). A create refused
with 429 or 5xx, or that got no answer at all, is sent again with the same body after a backoff. If an earlier
attempt had in fact landed, the retry meets 409 AlreadyExists: the run is read back and taken as this call's own
only when it carries this call's token; any other run of that name is an error.
"""
from __future__ import annotations

import random
from typing import Any, Callable, Mapping

from .errors import CodeRunError
from .request import CREATE_TOKEN_ANNOTATION
from .steps import Create, Get, Plan, Sleep
from .waiting import is_transient

CREATE_ATTEMPTS = 6
FIRST_BACKOFF_SECONDS = 0.25
MAX_BACKOFF_SECONDS = 4.0


def create_backoff(attempt: int, jitter: float) -> float:
    """Seconds before attempt `attempt + 1`: doubling, capped, and spread (jitter in [0, 1)) so hundreds of
    clients refused at once by a throttled API server do not come back at once."""
    return min(FIRST_BACKOFF_SECONDS * 2 ** (attempt - 1), MAX_BACKOFF_SECONDS) * (0.5 + jitter / 2)


def is_own(existing: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """Whether the run found under the body's name is the one this create call made: its token matches, and so
    does every field of the spec it sent (the spec is immutable; anyone who may read runs can copy the token, so
    a run deleted and made again under the name with other code is not ours)."""
    token = body["metadata"]["annotations"][CREATE_TOKEN_ANNOTATION]
    return (((existing.get("metadata") or {}).get("annotations") or {}).get(CREATE_TOKEN_ANNOTATION) == token
            and _holds(existing.get("spec"), body["spec"]))


def _holds(found: Any, sent: Any) -> bool:
    """`found` has every value `sent` has (the API server may add defaults beside them)."""
    if isinstance(sent, Mapping):
        return isinstance(found, Mapping) and all(_holds(found.get(key), value) for key, value in sent.items())
    if isinstance(sent, list):
        return isinstance(found, list) and len(found) == len(sent) and all(map(_holds, found, sent))
    return found == sent


def create_plan(body: Mapping[str, Any], *, attempts: int = CREATE_ATTEMPTS,
                jitter: Callable[[], float] = random.random) -> Plan[dict[str, Any]]:
    """The created CodeRun (or this call's own found after a lost answer). Raises the last refusal when it is
    not worth retrying or the attempts ran out."""
    name = body["metadata"]["name"]
    for attempt in range(1, attempts + 1):
        try:
            return (yield Create(body))
        except CodeRunError as e:
            if e.status == 409:
                break
            if not is_transient(e.status) or attempt == attempts:
                raise
            yield Sleep(create_backoff(attempt, jitter()))
    existing = yield Get(name)
    if is_own(existing, body):
        return existing
    raise CodeRunError(f"create CodeRun {name} failed: 409 a CodeRun named {name} already exists and this client "
                       f"did not create it; choose another name (or leave name unset for a generated one)",
                       status=409)
