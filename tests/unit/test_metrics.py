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
