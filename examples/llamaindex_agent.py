"""A LlamaIndex FunctionAgent that answers by running Python in coderun's sandbox.

    pip install 'coderun[llamaindex]' llama-index-llms-openai
    OPENAI_API_KEY=... python examples/llamaindex_agent.py "What is the 30th Fibonacci number?"

The LLM is created with strict=True, so the tools are coderun's strict variant (every argument sent, null for the
ones left to the namespace's policy). Runs go to the kubeconfig's namespace, or CODERUN_NAMESPACE.
"""
import asyncio
import os
import sys

from llama_index.core.agent.workflow import FunctionAgent

from coderun.client import AsyncCodeRunClient
from coderun.tools.frameworks.llama_index import coderun_tools

INSTRUCTIONS = ("Answer by running a complete Python program with run_code and reading what it prints. When it "
                "fails, read the error and its line, fix the program and run it again.")


def build_agent(client, llm) -> FunctionAgent:
    """The agent, with coderun's strict tools running through `client`."""
    return FunctionAgent(tools=coderun_tools(client, strict=True), llm=llm, system_prompt=INSTRUCTIONS)


async def main(question: str) -> None:
    from llama_index.llms.openai import OpenAI  # the model's provider: only this function needs it

    llm = OpenAI(model=os.environ.get("OPENAI_MODEL", "gpt-4.1"), strict=True)
    agent = build_agent(AsyncCodeRunClient(namespace=os.environ.get("CODERUN_NAMESPACE")), llm)
    print(await agent.run(user_msg=question))


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "What is the 30th Fibonacci number?"))
