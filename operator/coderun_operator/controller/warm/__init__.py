"""The warm pool: pre-started sandbox pods per policy and language, each claimed once by a run that fits it.

A pool pod is the sandbox pod of a cold run with its runner already up and waiting on stdin. A run whose
policy keeps a pool, and whose cpu, memory and disk are the pool's, claims a ready pod with one conditional
patch, records the claim in its status, then a thread of its own attaches (controller/attach.py), sends the
input with a fresh nonce and reads the frame straight off the stream: no pod start, no kubelet relist on the
critical path.

Nothing here is needed for a result, only for speed. The claimed pod is owned by the run and followed like a
cold run's pod, so if the stream breaks (or the operator dies) the result still comes from the log and the
termination message once the container ends. The input is only ever sent by the attach of the claim;
a pod whose input never arrived is deleted and the run starts cold, and a runner that got only part of its
input never runs the program (InputIncomplete), so no program runs twice.

`trust` (pure: pool identity, genuine pods, this claim's frame), `claim` (claiming, the claim's one attach, whose
frame goes back through a callback, and the cold fallbacks), `refill` (the refill loop).
"""
from .claim import Claims
from .refill import Refill

__all__ = ["Claims", "Refill"]
