"""status.network from what the egress proxy's pods logged of a run (results/network.py): merged in time order,
summarised and bounded, the log ConfigMap's text capped, a spent budget ending the run, a refusal in the message."""
import json

from coderun.api.models import MAX_NETWORK_HOSTS, CodeRunStatus, EgressBudget
from coderun.api.reasons import Phase, Reason
from coderun_operator.results import network
from coderun_operator.results.network import PodAnswer
from coderun_operator.results.status import Outcome


def record(host="pypi.pkgs.svc.cluster.local", port=443, verdict="allowed", reason="Allowed", at="10:00:01",
           sent=100, received=900):
    return {"time": f"2026-11-22T{at}.000+00:00", "host": host, "port": port, "verdict": verdict, "reason": reason,
            "bytes_sent": sent, "bytes_received": received, "method": "CONNECT"}


def answer(*records, requests=None, dropped=0):
    return PodAnswer(tuple(records), requests if requests is not None else len(records),
                     sum(r["bytes_sent"] for r in records), sum(r["bytes_received"] for r in records), dropped)


def test_two_pods_answers_merge_in_time_order_and_summarise_by_destination():
    first = answer(record(at="10:00:03"), record(host="evil.example", verdict="denied", reason="NotAllowed",
                                                 at="10:00:01", sent=50, received=0))
    second = answer(record(at="10:00:02"))
    assert [r["time"][11:19] for r in network.merged([first, second])] == ["10:00:01", "10:00:02", "10:00:03"]
    summary = network.summarise([first, second], complete=True, log_config_map="demo-egress-log")
    assert summary == {
        "requests": 3, "allowed": 2, "denied": 1, "bytesSent": 250, "bytesReceived": 1800,
        "hosts": [{"host": "evil.example", "port": 443, "allowed": 0, "denied": 1, "reason": "NotAllowed",
                   "bytesSent": 50, "bytesReceived": 0},
                  {"host": "pypi.pkgs.svc.cluster.local", "port": 443, "allowed": 2, "denied": 0,
                   "bytesSent": 200, "bytesReceived": 1800}],
        "complete": True, "logConfigMap": "demo-egress-log"}
    CodeRunStatus.model_validate({"network": summary})  # declared, so the API server keeps it


def test_the_pods_counts_include_what_they_could_not_keep_and_hosts_are_capped():
    many = answer(*[record(host=f"h{i}.example") for i in range(40)], requests=45, dropped=5)
    summary = network.summarise([many], complete=False)
    assert summary["requests"] == 45 and summary["dropped"] == 5 and summary["complete"] is False
    assert len(summary["hosts"]) == MAX_NETWORK_HOSTS and summary["hostsOmitted"] == 40 - MAX_NETWORK_HOSTS


def test_what_a_program_sent_is_shown_printable_and_bounded():
    hostile = record(host="\x1b[31mevil\r\n" + "x" * 400, port="443", verdict="denied", reason="Not\nAllowed",
                     sent=-5, received="lots")
    entry = network.summarise([PodAnswer((hostile, "not a record"))], True)["hosts"][0]
    assert "\x1b" not in entry["host"] and "\n" not in entry["host"] and len(entry["host"]) == 253
    assert entry["port"] is None and entry["reason"] == "Denied" and entry["bytesSent"] == 0
    CodeRunStatus.model_validate({"network": network.summarise([PodAnswer((hostile,))], True)})


def test_a_log_short_of_the_requests_its_proxy_admitted_is_never_complete():
    """The acl helper counts every request as it is asked; the log counts what reached it. A flood whose records
    squid lost shows both counts and complete: false, even when every pod answered in time."""
    short = PodAnswer((record(),), requests=10_170, admitted=24_000, dropped=10_169)
    summary = network.summarise([short, answer(record())], complete=True)
    assert (summary["requests"], summary["admitted"], summary["complete"]) == (10_171, 24_000, False)
    CodeRunStatus.model_validate({"network": summary})
    whole = PodAnswer((record(),), requests=24_000, admitted=24_000, dropped=23_999)  # positive control
    summary = network.summarise([whole], complete=True)
    assert (summary["requests"], summary["admitted"], summary["complete"]) == (24_000, 24_000, True)
    assert network.summarise([whole], complete=False)["complete"] is False  # a pod not asked still counts


def test_nothing_asked_is_an_empty_summary():
    assert network.summarise([], complete=True) == {"requests": 0, "allowed": 0, "denied": 0, "bytesSent": 0,
                                                    "bytesReceived": 0, "complete": True}


def test_the_log_keeps_whole_records_up_to_its_cap():
    records = [record(host="a" * 200) for _ in range(4000)]
    text, truncated = network.log_text(records)
    assert truncated and len(text.encode()) <= network.MAX_LOG_BYTES and text.endswith("\n")
    assert all(json.loads(line)["host"] == "a" * 200 for line in text.splitlines())
    assert network.log_text(records[:3]) == ("".join(json.dumps(r, separators=(",", ":")) + "\n"
                                                     for r in records[:3]), False)


COMPLETED = Outcome(Phase.SUCCEEDED, Reason.COMPLETED, "the program exited with code 0", {"exitCode": 0})


def test_a_refusal_is_named_in_the_run_s_message():
    summary = network.summarise([answer(record(), record(host="other.example", verdict="denied",
                                                          reason="NotAllowed"))], True)
    ended = network.with_network(COMPLETED, summary, None, "web")
    assert ended.phase == Phase.SUCCEEDED and ended.fields["network"] == summary and ended.fields["exitCode"] == 0
    assert ended.message == ("the program exited with code 0; the egress proxy refused 1 request: "
                             "other.example:443 (NotAllowed); see status.network")
    quiet = network.with_network(COMPLETED, network.summarise([answer(record())], True), None, "web")
    assert quiet.message == COMPLETED.message


def test_a_spent_budget_ends_the_run_with_its_own_reason():
    refused = answer(record(), record(), record(host="x.example", verdict="denied", reason="BudgetExceeded"))
    ended = network.with_network(COMPLETED, network.summarise([refused], True), EgressBudget(requests=2), "web")
    assert (ended.phase, ended.reason) == (Phase.FAILED, Reason.EGRESS_BUDGET_EXCEEDED)
    assert ended.message.startswith("the program spent its egress budget under CodeRunPolicy web: 3 requests, its "
                                    "budget being 2 (spec.egressBudget.requests)")
    # Two replicas each within the budget, together over it: the counts decide.
    split = [answer(record(received=600)), answer(record(received=600))]
    over = network.with_network(COMPLETED, network.summarise(split, True), EgressBudget(bytes=1000), "web")
    assert over.reason == Reason.EGRESS_BUDGET_EXCEEDED and "1400 bytes" in over.message
    within = network.with_network(COMPLETED, network.summarise(split, True), EgressBudget(bytes=5000), "web")
    assert within.reason == Reason.COMPLETED
    timed_out = Outcome(Phase.FAILED, Reason.TIMEOUT, "the program did not finish within 5s")
    kept = network.with_network(timed_out, network.summarise([refused], True), EgressBudget(requests=2), "web")
    assert kept.reason == Reason.TIMEOUT and "spent its egress budget" in kept.message
