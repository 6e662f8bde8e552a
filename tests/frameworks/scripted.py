"""What the framework tests share: the text every framework must hand the model, scripted models for the OpenAI
Agents SDK, LangChain and LlamaIndex (no model API is called), the examples as modules, and what the fake API
server was asked to run."""
import importlib.util
import json
from pathlib import Path

from agents import ModelResponse, Usage
from agents.models.interface import Model
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from llama_index.core.llms import MockFunctionCallingLLM
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from coderun.client.result import result_from_object
from coderun.tools import RUN_CODE, render_result

SUCCEEDED = {"phase": "Succeeded", "reason": "Completed", "exitCode": 0, "stdout": "42\n", "stdoutBytes": 3}
# What every framework must hand the model for a run that ended with SUCCEEDED: the one rendering.
SUCCEEDED_TEXT = render_result(result_from_object({"metadata": {"name": "r", "namespace": "agents"},
                                                   "status": SUCCEEDED}))
ADMISSION_DENIAL = ('admission webhook "validate.coderun.io" denied the request: memory 4Gi is above the '
                    "policy's maximum 2Gi [maximums.memory]")
# What a strict model sends: every property, the ones it does not need as null.
STRICT_CALL = {"code": "print(6*7)", "language": None, "files": None, "stdin": None, "timeout": None}


EXAMPLES = Path(__file__).parents[2] / "examples"


def example(name):
    """examples/<name>.py as a module (its main() is not run)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def created_specs(api):
    return [obj["spec"] for _, event, obj in api.events if event == "ADDED"]


class ScriptedModel(Model):
    """A model that calls run_code once with `arguments`, then answers with what the tool returned."""
    def __init__(self, arguments):
        self.arguments, self.inputs = arguments, []

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, **kwargs):
        self.inputs.append(input)
        outputs = [item for item in input if isinstance(item, dict) and item.get("type") == "function_call_output"]
        if outputs:
            reply = ResponseOutputMessage(id="m1", type="message", role="assistant", status="completed", content=[
                ResponseOutputText(type="output_text", text=outputs[0]["output"], annotations=[])])
        else:
            reply = ResponseFunctionToolCall(id="f1", call_id="c1", type="function_call", name=RUN_CODE,
                                             arguments=json.dumps(self.arguments), status="completed")
        return ModelResponse(output=[reply], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the test runs the agent without streaming")


def scripted_llm(arguments, seen):
    """A function-calling LLM that calls run_code with `arguments`, then answers with the tool's text."""
    def respond(messages, **kwargs):
        tool_messages = [m for m in messages if m.role == MessageRole.TOOL]
        seen.extend(tool_messages)
        if tool_messages:
            return ChatMessage(role=MessageRole.ASSISTANT, content=tool_messages[-1].content)
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=[
            ToolCallBlock(tool_call_id="c1", tool_name=RUN_CODE, tool_kwargs=arguments)])
    return MockFunctionCallingLLM(response_generator=respond, is_chat_model=True)


def scripted_chat_model(arguments):
    """A LangChain chat model that calls run_code with `arguments`, then answers with what the tool returned."""
    def respond(messages):
        results = [m for m in messages if isinstance(m, ToolMessage)]
        if results:
            return AIMessage(results[-1].content)
        return AIMessage("", tool_calls=[{"name": RUN_CODE, "args": arguments, "id": "c1"}])
    return RunnableLambda(respond)
