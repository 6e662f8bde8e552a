"""The framework examples against a real cluster, as their users run them but for the model: each example builds
its agent (or its tools) from coderun's adapters with a real client (KUBECONFIG, the namespace given) and a
scripted model (no model API is called), and answers "What is 6*7?" by running print(6*7) in the sandbox. Prints
one JSON object: {framework: the agent's answer}. e2e/test_examples.py runs it with the frameworks' venv
(make test-frameworks makes it) and compares each answer with the run the cluster recorded.

    python tests/frameworks/on_cluster.py NAMESPACE"""
import asyncio
import json
import sys

from agents import RunConfig, Runner

from coderun.client import AsyncCodeRunClient, CodeRunClient
from scripted import STRICT_CALL, ScriptedModel, example, scripted_chat_model, scripted_llm

QUESTION = "What is 6*7?"


async def openai_agents(namespace: str) -> str:
    async with AsyncCodeRunClient(namespace=namespace) as client:
        agent = example("openai_agents_agent").build_agent(client, model=ScriptedModel(STRICT_CALL))
        return (await Runner.run(agent, QUESTION, run_config=RunConfig(tracing_disabled=True))).final_output


def langchain(namespace: str) -> str:
    module = example("langchain_tools")
    tools = module.coderun_tools(CodeRunClient(namespace=namespace), strict=True)
    return module.answer(scripted_chat_model(STRICT_CALL), tools, QUESTION)


async def llamaindex(namespace: str) -> str:
    async with AsyncCodeRunClient(namespace=namespace) as client:
        agent = example("llamaindex_agent").build_agent(client, scripted_llm(STRICT_CALL, []))
        return str(await agent.run(user_msg=QUESTION))


def main(namespace: str) -> None:
    answers = {"openai-agents": asyncio.run(openai_agents(namespace)), "langchain": langchain(namespace),
               "llamaindex": asyncio.run(llamaindex(namespace))}
    print(json.dumps(answers))


if __name__ == "__main__":
    main(sys.argv[1])
