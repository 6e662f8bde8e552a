"""A reference agent loop over coderun: plan, generate, execute, verify, answer (needs the `agent` extra)."""
from .breaker import CircuitBreaker, CircuitOpen
from .config import AgentConfig
from .loop import (ANSWERED, CIRCUIT_OPEN, EXECUTION_BUDGET_EXHAUSTED, GAVE_UP, MODEL_ERROR, TOKEN_BUDGET_EXHAUSTED,
                   Agent, AgentResult, Attempt)

__all__ = ["ANSWERED", "CIRCUIT_OPEN", "EXECUTION_BUDGET_EXHAUSTED", "GAVE_UP", "MODEL_ERROR",
           "TOKEN_BUDGET_EXHAUSTED", "Agent", "AgentConfig", "AgentResult", "Attempt", "CircuitBreaker",
           "CircuitOpen"]
