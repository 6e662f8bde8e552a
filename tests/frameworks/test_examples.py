"""examples/ for the agent frameworks: each imports without a model key or a cluster, builds its agent or tools
from coderun's adapters, and answers a question through a scripted model and the fake API server."""
import asyncio

import pytest
from agents import RunConfig, Runner

from coderun.tools import LIST_RUNTIMES, RUN_CODE
from scripted import (STRICT_CALL, SUCCEEDED_TEXT, ScriptedModel, created_specs, example, scripted_chat_model,
                      scripted_llm)


def test_openai_agents_example(api, client):
    agent = example("openai_agents_agent").build_agent(client, model=ScriptedModel(STRICT_CALL))
    assert [tool.name for tool in agent.tools] == [RUN_CODE, LIST_RUNTIMES]
    assert all(tool.strict_json_schema for tool in agent.tools)
    result = asyncio.run(Runner.run(agent, "What is 6*7?", run_config=RunConfig(tracing_disabled=True)))
    assert result.final_output == SUCCEEDED_TEXT and len(created_specs(api)) == 1


def test_langchain_example(api, sync_client):
    module = example("langchain_tools")
    tools = module.coderun_tools(sync_client, strict=True)
    assert module.answer(scripted_chat_model(STRICT_CALL), tools, "What is 6*7?") == SUCCEEDED_TEXT
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
