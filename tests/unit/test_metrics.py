from prometheus_client import REGISTRY

from coderun_operator import metrics


def series(name: str) -> int:
    return sum(len(m.samples) for m in REGISTRY.collect() if m.name == name)


def test_a_caller_chosen_language_never_becomes_a_new_series():
    before = series("coderun_runs")
    for language in (f"lang-{i}" for i in range(50)):
        metrics.observe_finished({"phase": "Rejected", "reason": "PolicyDenied", "metrics": {}},
                                 metrics.language_label(language))
    assert metrics.language_label("python") == "python" and metrics.language_label("cobol") == "other"
    assert metrics.language_label(["not", "a", "string"]) == "other"
    assert series("coderun_runs") - before <= 2  # one new series (language="other"), with its _created twin


def active_samples() -> dict[str, float]:
    family = next(m for m in REGISTRY.collect() if m.name == "coderun_active_runs")
    return {s.labels["namespace"]: s.value for s in family.samples}


def test_active_runs_are_counted_per_namespace_and_a_namespace_with_none_is_absent():
    """A namespace's gauge moves only with its own runs (an e2e test asserts on its namespace exactly)."""
    counts = {"team-a": 2, "team-b": 1}
    metrics.ACTIVE.by_namespace = lambda: dict(counts)
    try:
        assert active_samples() == {"team-a": 2, "team-b": 1}
        counts.pop("team-b")
        counts["team-a"] = 1
        assert active_samples() == {"team-a": 1}
    finally:
        metrics.ACTIVE.by_namespace = dict
    assert active_samples() == {}


def test_the_store_counts_only_unfinished_runs_by_namespace():
    from coderun_operator.controller.store import Store

    store = Store()
    for uid, namespace, phase in (("1", "a", None), ("2", "a", "Running"), ("3", "b", "Succeeded"), ("4", "c", None)):
        store.put_run({"metadata": {"uid": uid, "namespace": namespace, "name": uid},
                       "status": {"phase": phase} if phase else {}})
    assert store.active_by_namespace() == {"a": 2, "c": 1}
