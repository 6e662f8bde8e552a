"""Each framework's tool objects send the schema coderun generates, and a call through the framework's own
invoke path runs through the SDK and comes back as the one rendering (render_result) the MCP server gives."""
import asyncio

import pytest
from agents import Agent, RunConfig, Runner
from agents.models.chatcmpl_converter import Converter as ChatConverter
from agents.models.openai_responses import Converter as ResponsesConverter
from langchain_core.messages import ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult

from coderun.client import AsyncCodeRunClient
from coderun.tools import LIST_RUNTIMES, RUN_CODE, openai_tools, responses_tools, tool_parameters
from coderun.tools.frameworks import langchain, llama_index, openai_agents
from scripted import ADMISSION_DENIAL, STRICT_CALL, SUCCEEDED_TEXT, ScriptedModel, created_specs, scripted_llm


# ---- OpenAI Agents SDK
@pytest.mark.parametrize("strict", [True, False])
def test_agents_sdk_sends_our_schema_to_the_responses_and_chat_completions_apis(sync_client, strict):
    tools = openai_agents.coderun_tools(sync_client, strict=strict)
    assert ResponsesConverter.convert_tools(tools, handoffs=[]).tools == responses_tools(strict=strict)
    chat = [ChatConverter.tool_to_openai(tool) for tool in tools]
    assert chat == [{**t, "function": {**t["function"], "strict": strict}} for t in openai_tools(strict=strict)]


def test_agents_sdk_runs_run_code_through_the_sdk_and_hands_back_the_rendering(api, client):
    model = ScriptedModel(STRICT_CALL)
    agent = Agent(name="analyst", model=model, tools=openai_agents.coderun_tools(client))
    result = asyncio.run(Runner.run(agent, "What is 6*7?", run_config=RunConfig(tracing_disabled=True)))
    assert result.final_output == SUCCEEDED_TEXT
    assert created_specs(api) == [{"language": "python", "code": "print(6*7)"}]  # nulls: the policy's defaults


def test_agents_sdk_hands_a_refusal_back_as_text_the_model_reads(api, client):
    api.refuse_create = lambda body: (403, ADMISSION_DENIAL)
    agent = Agent(name="analyst", model=ScriptedModel({"code": "x"}), tools=openai_agents.coderun_tools(client))
    result = asyncio.run(Runner.run(agent, "go", run_config=RunConfig(tracing_disabled=True)))
    assert result.final_output == "refused by policy (maximums.memory): memory 4Gi is above the policy's maximum 2Gi"


# ---- LangChain
@pytest.mark.parametrize("strict", [True, False])
def test_langchain_binds_our_schema(sync_client, strict):
    tools = langchain.coderun_tools(sync_client, strict=strict)
    # What ChatOpenAI.bind_tools(tools, strict=...) sends: langchain-core's conversion.
    assert [convert_to_openai_tool(tool, strict=strict or None) for tool in tools] == openai_tools(strict=strict)


def _tool_call(arguments):
    return {"type": "tool_call", "id": "c1", "name": RUN_CODE, "args": arguments}


def test_langchain_runs_a_tool_call_through_the_sdk(api, client):
    run_code = langchain.coderun_tools(client, strict=True)[0]
    if isinstance(client, AsyncCodeRunClient):  # ainvoke only
        message = asyncio.run(run_code.ainvoke(_tool_call(STRICT_CALL)))
    else:
        message = run_code.invoke(_tool_call(STRICT_CALL))
    assert isinstance(message, ToolMessage) and message.tool_call_id == "c1"
    assert (message.content, message.status) == (SUCCEEDED_TEXT, "success")
    assert created_specs(api) == [{"language": "python", "code": "print(6*7)"}]


def test_langchain_marks_a_refusal_as_an_error_tool_message(api, sync_client):
    api.refuse_create = lambda body: (403, ADMISSION_DENIAL)
    run_code = langchain.coderun_tools(sync_client)[0]
    message = run_code.invoke(_tool_call({"code": "x"}))
    assert message.status == "error"
    assert message.content == "refused by policy (maximums.memory): memory 4Gi is above the policy's maximum 2Gi"


def test_langchain_with_an_async_client_refuses_sync_invoke_with_langchains_own_message(api):
    run_code = langchain.coderun_tools(AsyncCodeRunClient(kubeconfig=str(api.kubeconfig_path)))[0]
    with pytest.raises(NotImplementedError, match="does not support sync invocation"):
        run_code.invoke(_tool_call({"code": "x"}))


# ---- LlamaIndex
@pytest.mark.parametrize("strict", [True, False])
def test_llamaindex_sends_our_schema(sync_client, strict):
    for tool in llama_index.coderun_tools(sync_client, strict=strict):
        sent = tool.metadata.to_openai_tool()["function"]
        schema = tool_parameters(sent["name"], strict=strict)
        # LlamaIndex passes type, properties and required; a strict LLM adds additionalProperties: false itself.
        assert sent["parameters"] == {k: v for k, v in schema.items() if k != "additionalProperties"}
        assert sent["description"] == responses_tools()[[RUN_CODE, LIST_RUNTIMES].index(sent["name"])]["description"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # LlamaIndex's workflow inspects pydantic objects
def test_llamaindex_agent_runs_run_code_through_the_sdk(api, client):
    seen = []
    agent = FunctionAgent(tools=llama_index.coderun_tools(client, strict=True), llm=scripted_llm(STRICT_CALL, seen))

    async def run():
        handler = agent.run(user_msg="What is 6*7?")
        results = [event async for event in handler.stream_events() if isinstance(event, ToolCallResult)]
        return results, await handler

    results, answer = asyncio.run(run())
    assert [(r.tool_name, r.tool_output.content, r.tool_output.is_error) for r in results] == [
        (RUN_CODE, SUCCEEDED_TEXT, False)]
    assert [m.content for m in seen] == [SUCCEEDED_TEXT] and str(answer) == SUCCEEDED_TEXT
    assert created_specs(api) == [{"language": "python", "code": "print(6*7)"}]


def test_llamaindex_sync_call_with_a_sync_client(sync_client):
    run_code = llama_index.coderun_tools(sync_client)[0]
    assert run_code.call(**STRICT_CALL).content == SUCCEEDED_TEXT
