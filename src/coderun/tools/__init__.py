"""For agents: tool schemas generated from the SDK's input model (`schemas`) and result rendering (`render`)."""
from .render import error_line, outcome_line, render_result, render_runtimes
from .schemas import (LIST_RUNTIMES, RUN_CODE, TOOL_INPUTS, ListRuntimesInput, anthropic_tools, input_schema,
                      openai_tools, tool_description)

__all__ = ["LIST_RUNTIMES", "RUN_CODE", "TOOL_INPUTS", "ListRuntimesInput", "anthropic_tools", "error_line",
           "input_schema", "openai_tools", "outcome_line", "render_result", "render_runtimes", "tool_description"]
