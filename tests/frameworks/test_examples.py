"""examples/ for the agent frameworks: each imports without a model key or a cluster, builds its agent or tools
from coderun's adapters, and answers a question through a scripted model and the fake API server."""
import asyncio
import importlib.util
from pathlib import Path

import pytest
from agents import RunConfig, Runner
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableLambda

from coderun.tools import LIST_RUNTIMES, RUN_CODE
from scripted import STRICT_CALL, SUCCEEDED_TEXT, ScriptedModel, created_specs, scripted_llm

EXAMPLES = Path(__file__).parents[2] / "examples"


def example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_openai_agents_example(api, client):
    agent = example("openai_agents_agent").build_agent(client, model=ScriptedModel(STRICT_CALL))
    assert [tool.name for tool in agent.tools] == [RUN_CODE, LIST_RUNTIMES]
    assert all(tool.strict_json_schema for tool in agent.tools)
    result = asyncio.run(Runner.run(agent, "What is 6*7?", run_config=RunConfig(tracing_disabled=True)))
    assert result.final_output == SUCCEEDED_TEXT and len(created_specs(api)) == 1


def test_langchain_example(api, sync_client):
    module = example("langchain_tools")
    tools = module.coderun_tools(sync_client, strict=True)

    def model(messages):  # calls run_code, then answers with what the tool returned
        results = [m for m in messages if isinstance(m, ToolMessage)]
        if results:
            return AIMessage(results[-1].content)
        return AIMessage("", tool_calls=[{"name": RUN_CODE, "args": STRICT_CALL, "id": "c1"}])

    assert module.answer(RunnableLambda(model), tools, "What is 6*7?") == SUCCEEDED_TEXT
    assert created_specs(api) == [{"language": "python", "code": "print(6*7)"}]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # LlamaIndex's workflow inspects pydantic objects
def test_llamaindex_example(api, client):
    seen = []
    agent = example("llamaindex_agent").build_agent(client, scripted_llm(STRICT_CALL, seen))
    assert [tool.metadata.name for tool in agent.tools] == [RUN_CODE, LIST_RUNTIMES]

    async def ask():  # the agent's workflow starts in the running loop
        return await agent.run(user_msg="What is 6*7?")

    assert str(asyncio.run(ask())) == SUCCEEDED_TEXT
    assert [m.content for m in seen] == [SUCCEEDED_TEXT] and len(created_specs(api)) == 1
