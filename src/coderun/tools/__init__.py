"""For agents: tool schemas generated from the SDK's input model (`schemas`, strict variants in `strict`), result
rendering (`render`), the tool call itself for any framework (`invoke`); adapters for agent frameworks live in
`coderun.tools.frameworks`, each importing its framework only when used."""
from .render import error_line, outcome_line, render_result, render_runtimes, touched_line
from .schemas import (LIST_RUNTIMES, RUN_CODE, TOOL_INPUTS, TOOL_NAMES, ListRuntimesInput, anthropic_tools,
                      input_schema, openai_tools, responses_tools, tool_description, tool_parameters)
from .strict import strict_schema

__all__ = ["LIST_RUNTIMES", "RUN_CODE", "TOOL_INPUTS", "TOOL_NAMES", "ListRuntimesInput", "anthropic_tools",
           "error_line", "input_schema", "openai_tools", "outcome_line", "render_result", "render_runtimes",
           "responses_tools", "strict_schema", "tool_description", "tool_parameters", "touched_line"]
