"""The circuit breaker and the agent's settings: pure, with a fake clock."""
import pytest

from coderun.agent import AgentConfig, CircuitBreaker, CircuitOpen


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def test_opens_after_threshold_consecutive_failures_and_half_opens_after_cooldown():
    clock = Clock()
    breaker = CircuitBreaker(threshold=2, cooldown_seconds=30, clock=clock)
    breaker.record_failure()
    breaker.check()  # one failure: still closed
    breaker.record_failure()
    assert breaker.state == "open"
    with pytest.raises(CircuitOpen, match="2 times in a row; not sending runs for another 30s"):
        breaker.check()
    clock.now = 30
    assert breaker.state == "half-open"
    breaker.check()  # one trial is let through
    breaker.record_failure()  # ... and a failed trial re-opens at once
    assert breaker.state == "open"
    clock.now = 60
    breaker.record_success()
    assert breaker.state == "closed" and breaker.failures == 0


def test_a_success_resets_the_count():
    breaker = CircuitBreaker(threshold=2, clock=Clock())
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    assert breaker.state == "closed"


def test_config_from_env():
    config = AgentConfig.from_env({"CODERUN_AGENT_MODEL": "m", "CODERUN_AGENT_BASE_URL": "http://127.0.0.1:9/v1",
                                   "CODERUN_AGENT_API_KEY": "k", "CODERUN_AGENT_MAX_ATTEMPTS": "5",
                                   "CODERUN_AGENT_TOKEN_BUDGET": "900"})
    assert (config.model, config.base_url, config.api_key) == ("m", "http://127.0.0.1:9/v1", "k")
    assert (config.max_attempts, config.token_budget, config.execution_budget_seconds) == (5, 900, 120.0)
    assert AgentConfig.from_env({}, model="x", max_attempts=1).max_attempts == 1
    with pytest.raises(ValueError, match="set CODERUN_AGENT_MODEL"):
        AgentConfig.from_env({})
