"""The agent loop over real HTTP (scripted endpoint, real openai client) with a fake sandbox: retries,
budgets, the breaker, and what the model is told."""
from openai import OpenAI

from coderun.agent import (ANSWERED, CIRCUIT_OPEN, EXECUTION_BUDGET_EXHAUSTED, GAVE_UP, MODEL_ERROR,
                           TOKEN_BUDGET_EXHAUSTED, Agent, AgentConfig, CircuitBreaker)
from coderun.agent.prompts import code_from_text, retry_prompt, verify
from scripted_chat import ScriptedChatServer, call_run_code, last_message, say
from coderun.client import CodeRunError, PolicyDenied, SessionEnded
from coderun.client.result import result_from_object


def result(**status):
    return result_from_object({"metadata": {"name": "run-x", "namespace": "ns"}, "status": status})


OK = result(phase="Succeeded", reason="Completed", exitCode=0, stdout="42\n", stdoutBytes=3)
BUG = result(phase="Failed", reason="NonZeroExit", exitCode=1, stderr="Traceback", stderrBytes=9,
             error={"type": "NameError", "message": "name 'x' is not defined", "line": 2})
LOST = result(phase="Failed", reason="PodDeleted", message="the sandbox pod was deleted")


class FakeRunner:
    """submit() plays scripted outcomes (RunResult or exception) and records requests; each run 'takes'
    `seconds` on the fake clock."""
    def __init__(self, outcomes, clock=None, seconds=1.0):
        self.outcomes, self.requests, self.clock, self.seconds = list(outcomes), [], clock, seconds

    def submit(self, request, wait_timeout=None, labels=None):
        self.requests.append((request, wait_timeout, labels))
        if self.clock:
            self.clock.now += self.seconds
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


PLAN = lambda request: say("1. compute 2. print")  # noqa: E731


def solve(steps, outcomes, files=None, clock=None, breaker=None, **config):
    clock = clock or Clock()
    runner = FakeRunner(outcomes, clock)
    with ScriptedChatServer(steps) as model:
        agent = Agent(runner, OpenAI(base_url=model.base_url, api_key="k", max_retries=0),
                      AgentConfig(model="scripted", **config), breaker=breaker, clock=clock)
        outcome = agent.solve("compute the answer", files=files)
    return outcome, runner, model


def test_a_bug_then_a_fix_then_an_answer():
    steps = [PLAN, lambda r: call_run_code("print(1)\nprint(x)"), lambda r: call_run_code("print(42)", timeout=7),
             lambda r: say("It is " + last_message(r, "tool").splitlines()[-1])]
    outcome, runner, model = solve(steps, [BUG, OK], files={"data.csv": "a\n1\n", "raw.bin": b"\xff"})
    assert outcome.status == ANSWERED and outcome.answer == "It is 42"
    assert [a.problem for a in outcome.attempts] == ["the program failed", None]
    request, wait_timeout, labels = runner.requests[0]
    assert sorted(f.path for f in request.files) == ["data.csv", "raw.bin"]  # the caller's files go along
    assert request.timeout == 30 and runner.requests[1][0].timeout == 7
    assert wait_timeout == 120 and labels == {"coderun.io/agent": "reference"}
    # the generate step offered exactly the run_code tool, the plan and answer steps none
    assert [t["function"]["name"] for t in model.requests[1]["tools"]] == ["run_code"]
    assert "tools" not in model.requests[0] and "tools" not in model.requests[3]
    retry = last_message(model.requests[2], "user")
    assert retry.startswith("Attempt 1 of 3: the program failed.")
    assert "failing line 2: print(x)" in retry and '"type": "NameError"' in retry
    tool_reply = next(m for m in model.requests[2]["messages"] if m["role"] == "tool")
    assert tool_reply["content"].startswith("exit code 1 (NonZeroExit)\nerror: NameError at line 2")
    assert outcome.tokens_used > 0 and len(model.requests) == 4


def test_retries_are_bounded():
    steps = [PLAN] + [lambda r: call_run_code("print(x)")] * 3
    outcome, runner, _ = solve(steps, [BUG, BUG, BUG])
    assert outcome.status == GAVE_UP and len(outcome.attempts) == 3 and len(runner.requests) == 3
    assert outcome.detail == "no verified result after 3 attempts"


def test_an_empty_output_is_not_an_answer():
    silent = result(phase="Succeeded", reason="Completed", exitCode=0, stdout="")
    steps = [PLAN, lambda r: call_run_code("x = 42"), lambda r: call_run_code("print(42)"), lambda r: say("42")]
    outcome, _, model = solve(steps, [silent, OK])
    assert outcome.status == ANSWERED
    assert "the program printed nothing" in last_message(model.requests[2], "user")


def test_fenced_code_works_for_endpoints_without_tool_calls():
    steps = [PLAN, lambda r: say("Here:\n```python\nprint(42)\n```"), lambda r: say("42")]
    outcome, runner, model = solve(steps, [OK])
    assert outcome.status == ANSWERED and runner.requests[0][0].code == "print(42)\n"
    assert last_message(model.requests[2], "user").startswith("The program succeeded")


def test_bad_tool_arguments_cost_an_attempt_and_are_explained():
    steps = [PLAN, lambda r: call_run_code("print(1)", timeout=0), lambda r: call_run_code("print(42)"),
             lambda r: say("42")]
    outcome, runner, model = solve(steps, [OK])
    assert outcome.status == ANSWERED and len(runner.requests) == 1
    tool_reply = next(m for m in model.requests[2]["messages"] if m["role"] == "tool")
    assert tool_reply["content"].startswith("invalid run_code arguments: timeout:")


def test_a_policy_rejection_goes_back_to_the_model():
    denied = result(phase="Rejected", reason="PolicyDenied", policyRule="maximums.memory", message="ask for at most 2Gi")
    steps = [PLAN, lambda r: call_run_code("print(1)"), lambda r: call_run_code("print(42)"), lambda r: say("42")]
    outcome, _, model = solve(steps, [PolicyDenied(denied), OK])
    assert outcome.status == ANSWERED
    assert "the sandbox refused the program: ask for at most 2Gi" in last_message(model.requests[2], "user")


def test_the_token_budget_stops_the_loop():
    steps = [PLAN, lambda r: call_run_code("print(x)"), lambda r: call_run_code("print(x)")]
    outcome, runner, _ = solve(steps, [BUG, BUG], token_budget=400)
    assert outcome.status == TOKEN_BUDGET_EXHAUSTED and "of 400 tokens" in outcome.detail
    assert outcome.tokens_used >= 400


def test_the_execution_budget_stops_the_loop_and_bounds_each_wait():
    clock = Clock()
    runner = FakeRunner([BUG, BUG, BUG], clock, seconds=50)
    with ScriptedChatServer([PLAN] + [lambda r: call_run_code("print(x)")] * 3) as model:
        agent = Agent(runner, OpenAI(base_url=model.base_url, api_key="k", max_retries=0),
                      AgentConfig(model="scripted", execution_budget_seconds=90), clock=clock)
        outcome = agent.solve("t")
    assert outcome.status == EXECUTION_BUDGET_EXHAUSTED and len(runner.requests) == 2
    assert [wait for _, wait, _ in runner.requests] == [90, 40]  # the wait never outlives the budget


def test_platform_failures_open_the_circuit_and_later_tasks_fail_fast():
    breaker = CircuitBreaker(threshold=2, cooldown_seconds=60, clock=Clock())
    steps = [PLAN] + [lambda r: call_run_code("print(42)")] * 2
    outcome, runner, _ = solve(steps, [LOST, CodeRunError("API server unreachable")], breaker=breaker)
    assert outcome.status == CIRCUIT_OPEN and len(runner.requests) == 2
    again, runner, model = solve([PLAN], [], breaker=breaker)
    assert again.status == CIRCUIT_OPEN and runner.requests == [] and model.requests == []


def test_a_failing_chat_endpoint_is_reported():
    outcome, runner, _ = solve([], [])
    assert outcome.status == MODEL_ERROR and "the chat endpoint failed" in outcome.detail and runner.requests == []


def test_prompt_helpers():
    assert verify(OK) is None and verify(BUG) == "the program failed" and verify(LOST) == "the program failed"
    assert code_from_text("a\n```py\nx=1\n```\nb\n```\ny=2\n```") == "y=2\n"
    assert code_from_text("no code") is None
    text = retry_prompt("the program failed", BUG, "import os\nprint(x)\n", 2, 3)
    assert text.splitlines() == [
        "Attempt 2 of 3: the program failed.",
        'structured error: {"type": "NameError", "message": "name \'x\' is not defined", "line": 2}',
        "error: NameError at line 2: name 'x' is not defined",
        "failing line 2: print(x)",
        "Fix the program and call run_code again with the complete corrected program (1 attempt(s) left)."]


class FakeSession:
    """A session of the fake runner: submit() plays its own outcomes; deleted at the task's end."""
    language = "python"

    def __init__(self, outcomes):
        self.outcomes, self.requests, self.deleted = list(outcomes), [], False

    def submit(self, request, wait_timeout=None, labels=None):
        self.requests.append(request)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def delete(self):
        self.deleted = True
        return True


def solve_in_session(steps, session_outcomes, outcomes=()):
    runner, session = FakeRunner(outcomes), FakeSession(session_outcomes)
    runner.session = lambda **kwargs: (setattr(runner, "session_kwargs", kwargs), session)[1]
    with ScriptedChatServer(steps) as model:
        agent = Agent(runner, OpenAI(base_url=model.base_url, api_key="k", max_retries=0),
                      AgentConfig(model="scripted", session=True), clock=Clock())
        outcome = agent.solve("compute the answer", files={"data.csv": "a\n1\n"})
    return outcome, runner, session


def test_with_a_session_the_attempts_run_in_it_and_it_is_deleted_at_the_end():
    steps = [PLAN, lambda r: call_run_code("print(x)"), lambda r: call_run_code("print(42)"), lambda r: say("42")]
    outcome, runner, session = solve_in_session(steps, [BUG, OK])
    assert outcome.status == ANSWERED and [r.code for r in session.requests] == ["print(x)", "print(42)"]
    assert runner.requests == [] and session.deleted and runner.session_kwargs == {"idle_timeout": 120}


def test_a_session_that_ends_leaves_the_attempts_to_plain_runs():
    from coderun.client.sessions import session_info
    ended = session_info({"metadata": {"name": "s", "namespace": "ns"},
                          "status": {"phase": "Ended", "reason": "PolicyDenied", "message": "no sessions"}})
    steps = [PLAN, lambda r: call_run_code("print(x)"), lambda r: call_run_code("print(42)"), lambda r: say("42")]
    outcome, runner, session = solve_in_session(steps, [SessionEnded(ended)], [BUG, OK])
    assert outcome.status == ANSWERED and len(session.requests) == 1
    assert [r[0].code for r in runner.requests] == ["print(x)", "print(42)"]  # the failed one again, then on


def test_the_session_is_asked_for_by_the_environment():
    assert AgentConfig.from_env({"CODERUN_AGENT_MODEL": "m", "CODERUN_AGENT_SESSION": "1"}).session
    assert not AgentConfig.from_env({"CODERUN_AGENT_MODEL": "m"}).session
