"""What the agent says to the model at each step. Pure functions of the task and the results."""
from __future__ import annotations

import json
import re

from ..client.result import RunResult
from ..tools import error_line

SYSTEM = ("You solve tasks by writing programs that run in an isolated sandbox (no network). Input files are in "
          "the working directory. A program must print its result to stdout. Run programs with the run_code "
          "tool; base every answer on the program's actual output, never on a guess.")

GENERATE = ("Now write the complete program and call run_code with it. Read the input files from the working "
            "directory and print the result.")

ANSWER = ("The program succeeded. Answer the task in one or two sentences, using only values from its output "
          "above.")


def task_prompt(task: str, file_names: list[str]) -> str:
    files = f"\nInput files in the working directory: {', '.join(file_names)}." if file_names else ""
    return f"Task: {task}{files}\nFirst write a short plan (3 steps at most); do not write code yet."


def verify(result: RunResult) -> str | None:
    """None when the run answers the task; otherwise what is wrong, in words the model acts on."""
    if result.rejected:
        return f"the sandbox refused the program: {result.message}"
    if not result.succeeded or (result.exit_code or 0) != 0:
        return "the program failed"
    if result.validation and not result.validation.valid:
        return "the output did not pass validation: " + "; ".join(result.validation.errors)
    if not (result.stdout or "").strip():
        return "the program printed nothing; print the result to stdout"
    return None


def retry_prompt(problem: str, result: RunResult, code: str, attempt: int, max_attempts: int) -> str:
    """Carries the structured error and the failing source line, so the model fixes that line, not a guess."""
    lines = [f"Attempt {attempt} of {max_attempts}: {problem}."]
    if result.error:
        lines.append("structured error: " + json.dumps(result.error.model_dump(exclude_none=True)))
        lines.append(error_line(result, code) or "")
    lines.append(f"Fix the program and call run_code again with the complete corrected program "
                 f"({max_attempts - attempt} attempt(s) left).")
    return "\n".join(line for line in lines if line)


_FENCED = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def code_from_text(text: str | None) -> str | None:
    """For endpoints without tool calling: the last fenced code block of a reply."""
    blocks = _FENCED.findall(text or "")
    return blocks[-1] if blocks else None
