"""An OpenAI Agents SDK agent that answers by running Python in coderun's sandbox.

    pip install 'coderun[openai-agents]'
    OPENAI_API_KEY=... python examples/openai_agents_agent.py "What is the 30th Fibonacci number?"

Runs go to the kubeconfig's namespace, or CODERUN_NAMESPACE. The tools are strict (the SDK's default): a model
sends every argument, null for the ones it leaves to the namespace's policy.
"""
import asyncio
import os
import sys

from agents import Agent, Runner

from coderun.client import AsyncCodeRunClient
from coderun.tools.frameworks.openai_agents import coderun_tools

INSTRUCTIONS = ("Answer by running a complete Python program with run_code and reading what it prints. When it "
                "fails, read the error and its line, fix the program and run it again.")


def build_agent(client, model=None) -> Agent:
    """The agent, with coderun's tools running through `client` (`model`: the SDK's default when None)."""
    return Agent(name="analyst", instructions=INSTRUCTIONS, tools=coderun_tools(client), model=model)


async def main(question: str) -> None:
    agent = build_agent(AsyncCodeRunClient(namespace=os.environ.get("CODERUN_NAMESPACE")))
    print((await Runner.run(agent, question)).final_output)


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "What is the 30th Fibonacci number?"))
