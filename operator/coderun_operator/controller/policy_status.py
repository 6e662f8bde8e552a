"""The one writer of a CodeRunPolicy's status: whether the operator applies it (the Accepted condition) and how
its warm pool stands. Each part is patched only when it changes what the status says, so a policy's events and
the refill's passes cost no writes. The Accepted condition is written by the tick, not by the policy's event: a
webhook answer that loads every policy after a start waits on no write; one the API server did not take is tried
again on the next tick."""
from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Any, Callable, Mapping

from coderun.api.coderunpolicy import CodeRunPolicyStatus, WarmPoolStatus
from ..kube_api import KubeApi
from ..results.status import policy_accepted_status
from .writer import printable, to_wire

log = logging.getLogger("coderun")

PolicyKey = tuple[str, str]  # (namespace, name)


class PolicyStatusWriter:
    def __init__(self, api: KubeApi, clock: Callable[[], datetime]):
        self.api, self.now = api, clock
        self._lock = threading.Lock()
        self._pools: dict[PolicyKey, WarmPoolStatus] = {}  # what each policy's status says of its pool
        self._unwritten: dict[PolicyKey, CodeRunPolicyStatus] = {}  # Accepted conditions for the tick to write

    def accepted(self, policy: Mapping[str, Any], refusal: str | None) -> None:
        """The policy as the operator loaded it: applied (refusal None) or refused, and why; written by `flush`."""
        meta = policy["metadata"]
        key = (meta["namespace"], meta["name"])
        status = policy_accepted_status(policy, refusal, self.now())
        with self._lock:
            self._unwritten.pop(key, None)
            if status is not None:
                self._unwritten[key] = status

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._pools.pop((namespace, name), None)
            self._unwritten.pop((namespace, name), None)

    def pools(self, stands: Mapping[PolicyKey, WarmPoolStatus]) -> None:
        """The warm pools as a refill pass found them: each policy's stand written when it changed, and cleared
        for a policy that no longer has a pool. The writes happen outside the lock: `accepted`, called from a
        policy's event and the webhook's path, never waits on the API server."""
        with self._lock:
            changed: dict[PolicyKey, WarmPoolStatus | None] = {
                key: stand for key, stand in stands.items() if self._pools.get(key) != stand}
            changed.update({key: None for key in self._pools if key not in stands})
        written = {key: stand for key, stand in changed.items()
                   if self._patch(key, CodeRunPolicyStatus.model_validate({"warmPool": stand}))}
        with self._lock:
            for key, stand in written.items():
                if stand is None:
                    self._pools.pop(key, None)
                else:
                    self._pools[key] = stand

    def flush(self) -> None:
        """Write the Accepted conditions not written yet (the tick calls it), outside the lock as above."""
        with self._lock:
            pending = dict(self._unwritten)
        written = [key for key, status in pending.items() if self._patch(key, status)]
        with self._lock:
            for key in written:
                if self._unwritten.get(key) is pending[key]:  # not replaced by a newer one meanwhile
                    del self._unwritten[key]

    def _patch(self, key: PolicyKey, status: CodeRunPolicyStatus) -> bool:
        """Whether the status is written (a policy that is gone needs none)."""
        try:
            self.api.patch_policy_status(*key, printable(to_wire(status)))
            return True
        except (self.api.Transient, self.api.Refused) as e:
            log.warning("policy %s/%s: status not written (%s); will try again", *key, str(e)[:300])
            return False
