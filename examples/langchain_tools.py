"""A LangChain chat model that answers by running Python in coderun's sandbox: the tool-calling loop, by hand.

    pip install 'coderun[langchain]' langchain-openai
    OPENAI_API_KEY=... python examples/langchain_tools.py "What is the 30th Fibonacci number?"

Any chat model with tool calling works in `answer`; bind the tools with the strictness coderun_tools got (strict:
every argument sent, null for the ones left to the namespace's policy). Runs go to the kubeconfig's namespace, or
CODERUN_NAMESPACE.
"""
import os
import sys

from langchain_core.messages import HumanMessage, SystemMessage

from coderun.client import CodeRunClient
from coderun.tools.frameworks.langchain import coderun_tools

INSTRUCTIONS = ("Answer by running a complete Python program with run_code and reading what it prints. When it "
                "fails, read the error and its line, fix the program and run it again.")


def answer(model, tools, question: str, max_steps: int = 6) -> str:
    """Ask `model` (tools bound) until it answers without calling a tool; each call runs through its tool."""
    by_name = {tool.name: tool for tool in tools}
    messages = [SystemMessage(INSTRUCTIONS), HumanMessage(question)]
    for _ in range(max_steps):
        reply = model.invoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            return reply.content
        messages += [by_name[call["name"]].invoke(call) for call in reply.tool_calls]  # ToolMessages
    return f"no answer in {max_steps} steps"


def main(question: str) -> None:
    from langchain_openai import ChatOpenAI  # the model's provider: only this function needs it

    tools = coderun_tools(CodeRunClient(namespace=os.environ.get("CODERUN_NAMESPACE")), strict=True)
    model = ChatOpenAI(model=os.environ.get("OPENAI_MODEL", "gpt-4.1")).bind_tools(tools, strict=True)
    print(answer(model, tools, question))


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]) or "What is the 30th Fibonacci number?")
