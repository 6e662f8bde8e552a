"""The watch loop against scripted fetch/watch fakes: resume after drops, deadline, deletion."""
import pytest

from coderun.client import RunNotFound, RunTimeout
from coderun.client.request import RunRequest
from coderun.client.sessions import BATCH_LABEL, batch_labels, batch_requests, batch_wait_seconds
from coderun.client.steps import Fetch, FetchAll, drive
from coderun.client.waiting import (STARTUP_ALLOWANCE_SECONDS, UNKNOWN_RUN_TIMEOUT_SECONDS, WaitStats, WatchDropped,
                                    is_transient, refuse, wait_all_outcome, wait_all_plan, wait_plan)


def wait_until_finished(fetch, watch, deadline, *, max_watch_seconds, clock, sleep=None, on_update=None,
                        stats=None):
    """The wait plan with scripted steps: `fetch()` answers Fetch, `watch(rv, seconds)` yields the events."""
    plan = wait_plan("r", deadline, max_watch_seconds=max_watch_seconds, clock=clock, on_update=on_update,
                     stats=stats)
    return drive(plan, lambda step: fetch() if isinstance(step, Fetch) else sleep(step.seconds),
                 lambda step: watch(step.resource_version, step.seconds))


def obj(phase=None, rv="1"):
    return {"metadata": {"name": "r", "resourceVersion": rv}, **({"status": {"phase": phase}} if phase else {})}


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class Script:
    """fetch() answers from `lists`; each watch() plays the next entry of `watches` (events, or an exception)."""
    def __init__(self, lists, watches, clock=None, watch_cost=0.0):
        self.lists, self.watches, self.clock, self.watch_cost = list(lists), list(watches), clock, watch_cost
        self.watch_calls = []

    def fetch(self):
        item = self.lists.pop(0)
        if isinstance(item, Exception):
            raise item
        return item, (item or {}).get("metadata", {}).get("resourceVersion", "0")

    def watch(self, rv, seconds):
        self.watch_calls.append((rv, seconds))
        if self.clock:
            self.clock.now += self.watch_cost
        step = self.watches.pop(0)
        for event in step:
            if isinstance(event, Exception):
                raise event
            yield event


def test_finished_at_first_list_needs_no_watch():
    script = Script([obj("Succeeded")], [])
    last, finished = wait_until_finished(script.fetch, script.watch, 10, max_watch_seconds=5, clock=lambda: 0)
    assert finished and last["status"]["phase"] == "Succeeded" and script.watch_calls == []


def test_watch_resumes_from_the_list_resource_version_and_returns_on_a_terminal_event():
    stats = WaitStats()
    script = Script([obj("Pending", rv="7")], [[("MODIFIED", obj("Running", "8")), ("MODIFIED", obj("Failed", "9"))]])
    seen = []
    last, finished = wait_until_finished(script.fetch, script.watch, 10, max_watch_seconds=5, clock=lambda: 0,
                                         on_update=lambda o: seen.append(o["status"]["phase"]), stats=stats)
    assert finished and last["status"]["phase"] == "Failed"
    assert script.watch_calls == [("7", 5)]
    assert seen == ["Pending", "Running", "Failed"] and stats.phases == seen


def test_a_dropped_watch_is_followed_by_a_new_list_and_watch():
    clock = FakeClock()
    stats = WaitStats()
    script = Script([obj("Pending", "1"), obj("Running", "5"), obj("Running", "6")],
                    [[("MODIFIED", obj("Running", "2")), WatchDropped("connection reset")],
                     [],  # the server-side timeout ended this one cleanly
                     [("MODIFIED", obj("Succeeded", "7"))]], clock=clock)
    last, finished = wait_until_finished(script.fetch, script.watch, 60, max_watch_seconds=5, clock=clock,
                                         sleep=clock.sleep, stats=stats)
    assert finished and last["status"]["phase"] == "Succeeded"
    assert [rv for rv, _ in script.watch_calls] == ["1", "5", "6"]
    assert (stats.lists, stats.watches, stats.drops) == (3, 3, 1)


def test_a_failing_list_is_retried_with_backoff_until_it_answers():
    clock = FakeClock()
    script = Script([WatchDropped("refused"), WatchDropped("refused"), obj("Succeeded")], [], clock=clock)
    _, finished = wait_until_finished(script.fetch, script.watch, 60, max_watch_seconds=5, clock=clock,
                                      sleep=clock.sleep)
    assert finished and clock.now == pytest.approx(0.25 + 0.5)


def test_the_deadline_ends_the_wait_unfinished_with_the_last_state():
    clock = FakeClock()
    script = Script([obj("Running", "1"), obj("Running", "2")], [[], []], clock=clock, watch_cost=6)
    last, finished = wait_until_finished(script.fetch, script.watch, 10, max_watch_seconds=6, clock=clock)
    assert not finished and last["status"]["phase"] == "Running"
    assert [seconds for _, seconds in script.watch_calls] == [6, 4]  # the last watch only gets what is left


def test_a_deleted_run_is_not_waited_for():
    with pytest.raises(RunNotFound):
        wait_until_finished(Script([None], []).fetch, None, 10, max_watch_seconds=5, clock=lambda: 0)
    script = Script([obj("Running")], [[("DELETED", obj("Running"))]])
    with pytest.raises(RunNotFound):
        wait_until_finished(script.fetch, script.watch, 10, max_watch_seconds=5, clock=lambda: 0)


def test_bookmarks_are_not_state():
    script = Script([obj("Pending")], [[("BOOKMARK", {"metadata": {"resourceVersion": "9"}}),
                                        ("MODIFIED", obj("Succeeded"))]])
    last, finished = wait_until_finished(script.fetch, script.watch, 10, max_watch_seconds=5, clock=lambda: 0)
    assert finished and last["status"]["phase"] == "Succeeded"


@pytest.mark.parametrize("status,transient", [(None, True), (410, True), (429, True), (503, True),
                                              (403, False), (404, False), (422, False)])
def test_which_failures_are_retried(status, transient):
    assert is_transient(status) is transient


def test_refusals_say_what_to_change():
    assert "RBAC" in str(refuse("create CodeRun", 403, "forbidden"))
    assert isinstance(refuse("get CodeRun x", 404, "not found"), RunNotFound)
    assert refuse("create CodeRun", 422, "spec.limits.memory: Invalid").status == 422


def test_a_watch_streams_error_event_is_a_drop_when_transient_and_a_refusal_otherwise():
    from coderun.client import CodeRunError
    from coderun.client.waiting import watch_event
    assert watch_event("watch", b'{"type": "MODIFIED", "object": {"metadata": {"name": "r"}}}\n') == (
        "MODIFIED", {"metadata": {"name": "r"}})
    gone = b'{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}'
    with pytest.raises(WatchDropped, match="410 too old"):
        watch_event("watch CodeRun r", gone)
    forbidden = b'{"type": "ERROR", "object": {"kind": "Status", "code": 403, "message": "forbidden"}}'
    with pytest.raises(CodeRunError) as refused:
        watch_event("watch CodeRun r", forbidden)
    assert refused.value.status == 403 and not isinstance(refused.value, WatchDropped)


# ---------------------------------------------------------------- many runs, one watch
def run_obj(name, phase=None, rv="1"):
    return {"metadata": {"name": name, "resourceVersion": rv}, **({"status": {"phase": phase}} if phase else {})}


def wait_all(lists, watches, names=("a", "b", "c"), deadline=100, clock=None):
    """wait_all_plan with scripted steps: each FetchAll answers the next of `lists` (items), each watch plays the
    next of `watches`; (what it returned, the selectors asked for, the watches opened)."""
    clock = clock or FakeClock()
    asked, opened = [], []

    def perform(step):
        if isinstance(step, FetchAll):
            asked.append(step.labels)
            item = lists.pop(0)
            if isinstance(item, Exception):
                raise item
            return item, "10"
        clock.sleep(step.seconds)

    def watch(step):
        opened.append(step.selector())
        for event in watches.pop(0):
            if isinstance(event, Exception):
                raise event
            yield event
        clock.sleep(step.seconds)  # the server ended the watch at its time
    last = drive(wait_all_plan(list(names), "coderun.io/client=me", deadline, max_watch_seconds=30, clock=clock),
                 perform, watch)
    return last, asked, opened


def test_many_runs_are_waited_for_over_one_list_and_one_watch_of_their_selection():
    last, asked, opened = wait_all(
        [[run_obj("a", "Succeeded"), run_obj("b", "Running"), run_obj("c"), run_obj("other", "Running")]],
        [[("MODIFIED", run_obj("other", "Failed")), ("MODIFIED", run_obj("c", "Running")),
          ("MODIFIED", run_obj("b", "Succeeded")), ("MODIFIED", run_obj("c", "Failed")),
          ("MODIFIED", run_obj("c", "Succeeded"))]])
    assert {name: obj["status"]["phase"] for name, obj in last.items()} == {"a": "Succeeded", "b": "Succeeded",
                                                                           "c": "Failed"}
    assert asked == ["coderun.io/client=me"]
    assert opened == [{"label_selector": "coderun.io/client=me"}]


def test_a_dropped_watch_of_many_lists_again_and_keeps_what_it_saw():
    last, asked, opened = wait_all(
        [[run_obj("a", "Running"), run_obj("b", "Running"), run_obj("c", "Running")],
         WatchDropped("reset"),
         [run_obj("a", "Succeeded"), run_obj("b", "Running"), run_obj("c", "Rejected")]],
        [[("MODIFIED", run_obj("a", "Succeeded")), WatchDropped("connection lost")],
         [("MODIFIED", run_obj("b", "Succeeded"))]])
    assert {name: obj["status"]["phase"] for name, obj in last.items()} == {"a": "Succeeded", "b": "Succeeded",
                                                                           "c": "Rejected"}
    assert len(asked) == 3 and len(opened) == 2


def test_a_run_not_selected_or_deleted_is_named_and_the_deadline_returns_what_was_seen():
    with pytest.raises(RunNotFound, match="CodeRun c is not among the runs selected by coderun.io/client=me"):
        wait_all([[run_obj("a"), run_obj("b")]], [])
    with pytest.raises(RunNotFound, match="CodeRun b was deleted"):
        wait_all([[run_obj("a"), run_obj("b"), run_obj("c")]], [[("DELETED", run_obj("b", "Running"))]])
    clock = FakeClock()
    last, _, _ = wait_all([[run_obj("a", "Succeeded"), run_obj("b", "Running"), run_obj("c", "Running")]],
                          [[("MODIFIED", run_obj("b", "Succeeded"))]], deadline=30, clock=clock)
    assert last["c"]["status"]["phase"] == "Running"
    with pytest.raises(RunTimeout) as timed_out:
        wait_all_outcome(["a", "b", "c"], "ns", 30, last)
    assert timed_out.value.last.phase == "Running"
    assert [r.phase for r in wait_all_outcome(["b", "a"], "ns", 30, last)] == ["Succeeded", "Succeeded"]


def test_a_batch_is_labelled_apart_and_waited_for_as_long_as_its_runs_in_turn():
    first, second = batch_labels({"task": "humaneval"}), batch_labels(None)
    assert first["task"] == "humaneval" and first[BATCH_LABEL] != second[BATCH_LABEL]
    requests = batch_requests(["1", RunRequest(code="2", language="python")], "python", 10)
    assert [(r.code, r.timeout) for r in requests] == [("1", 10), ("2", None)]
    assert batch_wait_seconds(requests, None) == STARTUP_ALLOWANCE_SECONDS + 10 + UNKNOWN_RUN_TIMEOUT_SECONDS
    assert batch_wait_seconds(requests, 5) == 5
