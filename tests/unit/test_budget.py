import json

from coderun_operator.results.budget import (ETCD_OBJECT_LIMIT_BYTES, escaped_prefix, fit, json_size, smaller_statuses,
                                    status_budget)


def test_trim_is_proportional_to_the_escaped_size():
    status = {"phase": "Succeeded", "stdout": "\x01" * 150_000, "stderr": "e" * 150_000}
    fitted = fit(status, 500_000)
    assert json_size(fitted) <= 500_000
    # Each stream gives up bytes in proportion to its escaped size (stdout: 6 bytes a character), and
    # neither is emptied: the old byte-count trim cut stdout to "" here.
    given_up = {f: json_size(status[f]) - json_size(fitted[f]) for f in ("stdout", "stderr")}
    assert 5 < given_up["stdout"] / given_up["stderr"] < 7
    assert len(fitted["stdout"]) > 50_000 and len(fitted["stderr"]) > 50_000
    assert fitted["stdoutTruncated"] and fitted["stderrTruncated"]
    assert status["stdout"] == "\x01" * 150_000  # the input is not changed


def test_escaped_prefix_never_exceeds_its_bytes():
    text = "a\"\\\n\x00é" * 1000
    for limit in (0, 1, 7, 100, 3333):
        assert json_size(escaped_prefix(text, limit)) <= max(limit, 2)


def test_the_spec_takes_its_share_of_the_object():
    small = {"metadata": {}, "spec": {"code": "x"}}
    large = {"metadata": {}, "spec": {"code": "x" * 1_200_000}}
    assert status_budget(small) == 900 * 1024
    assert status_budget(large) < ETCD_OBJECT_LIMIT_BYTES - 1_200_000


def test_the_ladder_ends_in_a_minimal_status_that_says_why():
    status = {"phase": "Failed", "reason": "NonZeroExit", "message": "m", "stdout": "x" * 100_000,
              "validation": {"valid": False, "errors": ["e" * 1000] * 20}, "conditions": []}
    refusals = []
    ladder = smaller_statuses(status, 900 * 1024, refusals)
    first, second = next(ladder), next(ladder)
    assert first["stdout"] == status["stdout"] and len(second["stdout"]) <= 4096
    assert len(second["validation"]["errors"]) == 3
    refusals.append("413 request is too large")
    minimal = next(ladder)
    assert minimal["stdout"] is None and minimal["validation"] is None
    assert "413 request is too large" in minimal["message"] and len(json.dumps(minimal)) < 4096
