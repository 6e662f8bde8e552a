"""The reference agent loop end to end: a scripted model over real HTTP (the real openai client), the real
sandbox. The model's first program has a bug; the loop sends back the structured error; the fixed program's
real output, computed from data made at test time, is what the final answer says."""
import random
import re

import pytest
from openai import OpenAI

from coderun.agent import ANSWERED, Agent, AgentConfig
from scripted_chat import ScriptedChatServer, call_run_code, last_message, say
from coderun.client import CodeRunClient
from conftest import KUBECONFIG

BUGGY = ("import csv\n"
         "rows = list(csv.DictReader(open('sales.csv')))\n"
         "total = sum(float(row['amout']) for row in rows)\n"
         "print(round(total, 2))\n")
FIXED = BUGGY.replace("'amout'", "'amount'")


def answer_from_tool_output(request):
    """The scripted model reads the number from the stdout section of the last tool result; it cannot know it."""
    tool_text = last_message(request, "tool")
    stdout = re.search(r"stdout \(\d+ bytes\):\n(.*)", tool_text).group(1)
    return say(f"The total of the amount column is {stdout.strip()}.")


@pytest.mark.parametrize("in_session", [False, True], ids=["runs", "session"])
def test_the_agent_recovers_from_a_scripted_bug(operator, cluster, namespace, in_session):
    if in_session:  # the task's attempts in one session, which its policy must allow
        cluster.custom.create_namespaced_custom_object("coderun.io", "v1alpha1", namespace, "coderunpolicies", {
            "apiVersion": "coderun.io/v1alpha1", "kind": "CodeRunPolicy", "metadata": {"name": "default"},
            "spec": {"sessions": {"allowed": True}, "defaults": {"cpu": "250m", "memory": "256Mi"}}})
    amounts = [round(random.uniform(1, 500), 2) for _ in range(25)]
    csv_text = "region,amount\n" + "".join(f"r{i % 4},{a}\n" for i, a in enumerate(amounts))
    steps = [
        lambda request: say("1. read sales.csv 2. sum the amount column 3. print it"),
        lambda request: call_run_code(BUGGY),
        lambda request: call_run_code(FIXED),
        answer_from_tool_output,
    ]
    with ScriptedChatServer(steps) as model:
        llm = OpenAI(base_url=model.base_url, api_key="test", max_retries=0)
        runner = CodeRunClient(namespace, kubeconfig=str(KUBECONFIG), client_name="agent")
        agent = Agent(runner, llm, AgentConfig(model="scripted", run_timeout_seconds=20, session=in_session))
        outcome = agent.solve("What is the total of the amount column?", files={"sales.csv": csv_text})

    assert outcome.status == ANSWERED, outcome.detail
    first, second = outcome.attempts
    assert (first.result.error.type, first.result.error.line) == ("KeyError", 3)
    # The retry prompt the model got carried the structured error and the failing line.
    retry = last_message(model.requests[2], "user")
    assert '"type": "KeyError"' in retry and '"line": 3' in retry
    assert "failing line 3: total = sum(float(row['amout']) for row in rows)" in retry
    # The answer is the second run's real output, computed in the sandbox from this test's random data.
    expected = round(sum(amounts), 2)
    assert float(second.result.stdout) == expected
    assert outcome.answer == f"The total of the amount column is {second.result.stdout.strip()}."
    assert outcome.tokens_used > 0 and 0 < outcome.execution_seconds < 120
    modes = {attempt.result.start_mode for attempt in outcome.attempts}
    assert (modes == {"Session"}) if in_session else ("Session" not in modes), modes
    if in_session:  # both attempts in one sandbox, deleted with the task
        assert first.result.pod_name == second.result.pod_name
        assert not cluster.custom.list_namespaced_custom_object("coderun.io", "v1alpha1", namespace,
                                                                "coderunsessions")["items"]
