"""The reference agent loop: plan, generate, execute, verify, answer, with bounded retries and budgets.

The model is any OpenAI-compatible chat endpoint (the `openai` client library); the program runs through the
coderun SDK. Each failed run goes back to the model as a tool result plus a retry prompt carrying the
structured error and the failing line. The loop stops on an answer, after max_attempts runs, when the token or
execution-time budget is spent, or when the circuit breaker says the sandbox itself is failing.

With `session` (AgentConfig, CODERUN_AGENT_SESSION=1) a task's attempts run in one CodeRunSession (a sandbox kept
for the task: no pod start per attempt), deleted when the task ends. A session that cannot start (the namespace's
policy allows none) or that ends mid-task costs nothing but the fallback: the attempts go on as plain runs.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from pydantic import ValidationError

from ..client import CodeRunError, RunRejected, RunRequest, RunResult, RunTimeout, SessionEnded, file_input
from ..client.errors import describe_invalid
from ..tools import RUN_CODE, openai_tools, render_result
from . import prompts
from .breaker import CircuitBreaker, CircuitOpen
from .config import AgentConfig

ANSWERED = "answered"
GAVE_UP = "gave_up"                       # max_attempts runs, none verified
TOKEN_BUDGET_EXHAUSTED = "token_budget_exhausted"
EXECUTION_BUDGET_EXHAUSTED = "execution_budget_exhausted"
CIRCUIT_OPEN = "circuit_open"
MODEL_ERROR = "model_error"


@dataclass
class Attempt:
    code: str
    result: RunResult | None          # None when the run never produced one (platform or API failure)
    problem: str | None               # None when verified
    seconds: float


@dataclass
class AgentResult:
    status: str
    answer: str | None = None
    detail: str = ""
    attempts: list[Attempt] = field(default_factory=list)
    tokens_used: int = 0
    execution_seconds: float = 0.0
    plan: str | None = None


class _Stop(Exception):
    def __init__(self, status: str, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


class Agent:
    """`Agent(runner, llm, config).solve(task, files)`: runner is a CodeRunClient (anything with `submit`),
    llm an `openai.OpenAI` client (anything with `chat.completions.create`)."""

    def __init__(self, runner: Any, llm: Any, config: AgentConfig, breaker: CircuitBreaker | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.runner, self.llm, self.config, self.clock = runner, llm, config, clock
        self.breaker = breaker or CircuitBreaker(config.breaker_threshold, config.breaker_cooldown_seconds, clock)
        self._session: Any = None  # the task's CodeRunSession while solve() runs with config.session

    @classmethod
    def from_env(cls, runner: Any, **overrides: Any) -> "Agent":
        from openai import OpenAI
        config = AgentConfig.from_env(**overrides)
        return cls(runner, OpenAI(base_url=config.base_url, api_key=config.api_key), config)

    def solve(self, task: str, files: Mapping[str, str | bytes] | None = None) -> AgentResult:
        self._session = self._open_session() if self.config.session else None
        try:
            return self._solve(task, files)
        finally:
            session, self._session = self._session, None
            if session is not None:
                try:
                    session.delete()
                except CodeRunError:
                    pass  # its idle timeout ends it

    def _open_session(self) -> Any:
        try:
            return self.runner.session(idle_timeout=max(60, int(self.config.execution_budget_seconds)))
        except CodeRunError:
            return None  # the attempts run as plain runs

    def _solve(self, task: str, files: Mapping[str, str | bytes] | None) -> AgentResult:
        outcome = AgentResult(status=GAVE_UP)
        input_files = [file_input(path, content) for path, content in (files or {}).items()]
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": prompts.SYSTEM},
            {"role": "user", "content": prompts.task_prompt(task, [f.path for f in input_files])}]
        try:
            self.breaker.check()
            outcome.plan = self._chat(messages, outcome).content or ""                      # plan
            messages += [{"role": "assistant", "content": outcome.plan},
                         {"role": "user", "content": prompts.GENERATE}]
            for attempt in range(1, self.config.max_attempts + 1):
                self.breaker.check()  # before spending tokens on a program the sandbox cannot run
                reply = self._chat(messages, outcome, tools=openai_tools((RUN_CODE,)))        # generate
                request, problem = self._request_from(reply, input_files)
                messages.append(_assistant_message(reply))
                if request is None:
                    messages += _feedback(reply, problem)
                    outcome.attempts.append(Attempt("", None, problem, 0.0))
                    continue
                result, problem, seconds = self._execute(request, outcome)                  # execute
                problem = problem or (prompts.verify(result) if result else "no result")     # verify
                outcome.attempts.append(Attempt(request.code, result, problem, seconds))
                messages += _feedback(reply, render_result(result, request.code) if result else problem)
                if problem is None:
                    messages.append({"role": "user", "content": prompts.ANSWER})
                    outcome.answer = self._chat(messages, outcome).content or ""            # answer
                    outcome.status = ANSWERED
                    return outcome
                retry = prompts.retry_prompt(problem, result, request.code, attempt, self.config.max_attempts) \
                    if result else f"Attempt {attempt} failed: {problem}. Call run_code again."
                messages.append({"role": "user", "content": retry})
            outcome.detail = f"no verified result after {self.config.max_attempts} attempts"
        except _Stop as stop:
            outcome.status, outcome.detail = stop.status, stop.detail
        except CircuitOpen as e:
            outcome.status, outcome.detail = CIRCUIT_OPEN, str(e)
        return outcome

    # ---- steps
    def _chat(self, messages: list[dict[str, Any]], outcome: AgentResult, tools: list | None = None):
        remaining = self.config.token_budget - outcome.tokens_used
        if remaining <= 0:
            raise _Stop(TOKEN_BUDGET_EXHAUSTED, f"used {outcome.tokens_used} of {self.config.token_budget} tokens")
        kwargs: dict[str, Any] = {"tools": tools} if tools else {}
        try:
            response = self.llm.chat.completions.create(model=self.config.model, messages=messages,
                                                        max_tokens=min(self.config.max_reply_tokens, remaining),
                                                        **kwargs)
        except Exception as e:  # the client library's errors differ by version; the message is what matters
            raise _Stop(MODEL_ERROR, f"the chat endpoint failed: {e}") from e
        usage = getattr(response, "usage", None)
        outcome.tokens_used += usage.total_tokens if usage and usage.total_tokens else _estimate_tokens(
            messages, response)
        return response.choices[0].message

    def _request_from(self, reply: Any, input_files: list) -> tuple[RunRequest | None, str | None]:
        """(request, problem). The caller's input files always go along; the model's own files are added."""
        call = _run_code_call(reply)
        try:
            if call is not None:
                arguments = json.loads(call.function.arguments or "{}")
            else:
                code = prompts.code_from_text(reply.content)
                if code is None:
                    return None, "no program: call run_code with the complete program"
                arguments = {"code": code}
            request = RunRequest.model_validate(arguments)
        except json.JSONDecodeError as e:
            return None, f"run_code arguments are not valid JSON ({e})"
        except ValidationError as e:
            return None, f"invalid run_code arguments: {describe_invalid(e)}"
        own = {f.path for f in request.files or ()}
        files = [f for f in input_files if f.path not in own] + list(request.files or ())
        timeout = request.timeout or self.config.run_timeout_seconds
        return request.model_copy(update={"files": files or None, "timeout": timeout}), None

    def _execute(self, request: RunRequest, outcome: AgentResult) -> tuple[RunResult | None, str | None, float]:
        """(result, platform problem, seconds). Budgets and the breaker are checked before the run."""
        remaining = self.config.execution_budget_seconds - outcome.execution_seconds
        if remaining <= 0:
            raise _Stop(EXECUTION_BUDGET_EXHAUSTED, f"spent {outcome.execution_seconds:.1f}s of "
                                                    f"{self.config.execution_budget_seconds:.0f}s on runs")
        self.breaker.check()
        started = self.clock()
        result, problem, refused = None, None, False
        try:
            result = self._submit(request, remaining)
        except RunRejected as e:
            result = e.result
            if result is None:  # refused at creation: the message says what to change, as a Rejected status would
                problem, refused = f"the policy refused the run ({e.rule}): {e.message}", True
        except (RunTimeout, CodeRunError) as e:
            problem = f"the sandbox did not deliver a result ({e})"
        seconds = self.clock() - started
        outcome.execution_seconds += seconds
        if (problem and not refused) or (result and result.infrastructure_failure):
            self.breaker.record_failure()
        else:
            self.breaker.record_success()
        return result, problem, seconds


    def _submit(self, request: RunRequest, wait_timeout: float) -> RunResult:
        """In the task's session when there is one of the request's language, else as a run of its own; a session
        that ended (or never started: its policy allows none) is dropped and the attempt runs on its own."""
        labels = {"coderun.io/agent": "reference"}
        session = self._session
        if session is not None and request.language == session.language and not (request.memory or request.cpu):
            try:
                return session.submit(request, wait_timeout=wait_timeout, labels=labels)
            except SessionEnded:
                self._session = None
        return self.runner.submit(request, wait_timeout=wait_timeout, labels=labels)


def _assistant_message(reply: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or ""}
    if reply.tool_calls:
        message["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                 for c in reply.tool_calls]
    return message


def _run_code_call(reply: Any) -> Any:
    return next((c for c in reply.tool_calls or () if c.function.name == RUN_CODE), None)


def _feedback(reply: Any, text: str | None) -> list[dict[str, Any]]:
    """Every tool call needs its answer: the run's text for the run_code call, a note for any other. Without
    tool calls (fenced-code endpoints) the text goes back as a user message."""
    if not reply.tool_calls:
        return [{"role": "user", "content": text or ""}]
    answered = _run_code_call(reply)
    return [{"role": "tool", "tool_call_id": c.id,
             "content": (text or "") if c is answered else f"not run: only {RUN_CODE} is available, once per turn"}
            for c in reply.tool_calls]


def _estimate_tokens(messages: list[dict[str, Any]], response: Any) -> int:
    """Endpoints that report no usage still spend the budget: about 4 characters a token."""
    characters = sum(len(str(m.get("content") or "")) for m in messages)
    characters += len(str(response.choices[0].message.content or ""))
    return characters // 4 + 1
