"""What a hostile CodeRunPolicy's regexes cost the operator (`python e2e/bench/policy_memory.py`; no cluster).

Issue 17: twelve characters of RE2 (`\\pL{300}`) cost the leader 24-44 MiB, kept after the policy was deleted.
This loads policies the way the operator does (Controller.on_policy, the loader the webhook also runs) and
prints the process's RSS:

1. the attack: 64 redaction + 256 denied patterns of `\\pL{300}`: refused at the first pattern, in milliseconds;
2. the worst policy the budgets admit: 64 + 256 distinct patterns filling the policy's program budget, then
   matched against hostile input (a 256 KiB output, 128 KiB of code) so RE2's DFA caches fill to their limit;
3. the same policy deleted: its compiled patterns are freed (glibc's malloc_trim returns the pages).
"""
from __future__ import annotations

import ctypes
import gc
import random
import string
import time

from coderun.api.models import CodeRunSpec
from coderun_operator.controller import Controller
from coderun_operator.policy import evaluate
from coderun_operator.policy.patterns import POLICY_MAX_PROGRAM, redactor


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def trimmed_rss_mib() -> float:
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mib()


def policy_object(redaction: list[str], denied: list[str]) -> dict:
    return {"metadata": {"name": "hostile", "namespace": "bench", "uid": "bench-uid", "resourceVersion": "1"},
            "spec": {"redactionPatterns": redaction,
                     "codeRules": {"deniedPatterns": [{"language": "python", "pattern": p} for p in denied]}}}


def budget_filling_patterns(count: int, offset: int) -> list[str]:
    """Distinct patterns, 320 of them near the policy's budget, each one's DFA exponential in its counted repeat
    (`a` then 16 word characters: 2^16 states on random letters), so matching fills RE2's caches to max_mem."""
    return [rf"a[\w.]{{16}}[:=]k{offset + i}" for i in range(count)]


def main() -> None:
    ctl = Controller()
    rng = random.Random(17)
    output = "".join(rng.choice(string.ascii_letters + string.digits + "._:=/+ \n") for _ in range(256 * 1024))
    code = "\n".join("x = " + "".join(rng.choice(string.ascii_letters + "._:=") for _ in range(120))
                     for _ in range(1000))
    print(f"baseline                         RSS {trimmed_rss_mib():7.1f} MiB")

    attack = policy_object([r"\pL{300}"] * 64, [r"\pL{300}"] * 256)
    started = time.perf_counter()
    ctl.on_policy(attack, deleted=False)
    took = (time.perf_counter() - started) * 1000
    held = ctl.store.policies("bench")["hostile"]
    print(f"attack (\\pL{{300}} x 320) loaded   RSS {rss_mib():7.1f} MiB  in {took:.0f} ms: "
          f"{getattr(held, 'message', held)!s:.110}")
    ctl.on_policy(attack, deleted=True)

    for cycle in range(1, 4):  # RSS after each deletion stays flat: nothing of a deleted policy is kept
        load_match_delete(ctl, output, code, cycle)


def load_match_delete(ctl: Controller, output: str, code: str, cycle: int) -> None:
    worst = policy_object(budget_filling_patterns(64, 0), budget_filling_patterns(256, 64))
    print(f"cycle {cycle}")
    started = time.perf_counter()
    ctl.on_policy(worst, deleted=False)
    took = (time.perf_counter() - started) * 1000
    loaded = ctl.store.policies("bench")["hostile"]
    print(f"worst admitted policy loaded     RSS {rss_mib():7.1f} MiB  in {took:.0f} ms "
          f"({loaded.compiled_patterns.program_size} of {POLICY_MAX_PROGRAM} RE2 instructions)")
    started = time.perf_counter()
    redacted, count = redactor(loaded, ctl.store.policies("bench")).redact(output)
    verdict = evaluate(CodeRunSpec.model_validate({"language": "python", "code": code}), loaded)
    took = (time.perf_counter() - started) * 1000
    print(f"after matching hostile input     RSS {rss_mib():7.1f} MiB  in {took:.0f} ms "
          f"({count} redactions, code {type(verdict).__name__})")
    del loaded, redacted, verdict
    ctl.on_policy(worst, deleted=True)
    print(f"policy deleted                   RSS {trimmed_rss_mib():7.1f} MiB")


if __name__ == "__main__":
    main()
