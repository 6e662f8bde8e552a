"""The agent's settings: endpoint and model from the environment, bounds with safe defaults."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class AgentConfig:
    model: str
    base_url: str | None = None           # any OpenAI-compatible endpoint; None means OpenAI's own
    api_key: str = "unused"               # local endpoints often need none, the client library needs a string
    max_attempts: int = 3                 # program runs per task (the first try plus retries)
    execution_budget_seconds: float = 120.0   # wall time spent waiting on the sandbox, over all attempts
    token_budget: int = 20_000            # prompt + completion tokens, over all model calls of one task
    max_reply_tokens: int = 2_000
    run_timeout_seconds: int = 30         # the program's own limit per run
    breaker_threshold: int = 3            # consecutive platform failures that open the circuit
    breaker_cooldown_seconds: float = 60.0
    session: bool = False                 # a task's attempts in one CodeRunSession (its policy must allow it)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> "AgentConfig":
        """CODERUN_AGENT_MODEL (required), CODERUN_AGENT_BASE_URL, CODERUN_AGENT_API_KEY, and optional
        CODERUN_AGENT_MAX_ATTEMPTS / _EXECUTION_BUDGET_SECONDS / _TOKEN_BUDGET, and CODERUN_AGENT_SESSION=1 to run
        a task's attempts in one session."""
        env = os.environ if env is None else env
        model = overrides.pop("model", None) or env.get("CODERUN_AGENT_MODEL")
        if not model:
            raise ValueError("set CODERUN_AGENT_MODEL to the chat model to use (and CODERUN_AGENT_BASE_URL for a "
                             "non-OpenAI endpoint, CODERUN_AGENT_API_KEY if it needs a key)")
        numbers = {"max_attempts": int, "execution_budget_seconds": float, "token_budget": int}
        from_env = {name: kind(env[f"CODERUN_AGENT_{name.upper()}"]) for name, kind in numbers.items()
                    if f"CODERUN_AGENT_{name.upper()}" in env}
        if "CODERUN_AGENT_SESSION" in env:
            from_env["session"] = env["CODERUN_AGENT_SESSION"].strip().lower() in ("1", "true", "yes")
        return cls(model=model, base_url=env.get("CODERUN_AGENT_BASE_URL") or None,
                   api_key=env.get("CODERUN_AGENT_API_KEY") or "unused", **{**from_env, **overrides})
