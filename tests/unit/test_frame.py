import hashlib
import json

import pytest

from coderun_operator.results.frame import FrameError, logged_frame, parse_frame

REAL = {"version": 1, "reason": "Completed", "exitCode": 0, "stdout": "42\n", "stderr": "",
        "metrics": {"wallMillis": 5, "cpuMillis": 4, "maxRSSBytes": 1000}}


def frame_line(frame):
    text = json.dumps(frame, separators=(",", ":"))
    return "CODERUN-RESULT-V1 " + text, json.dumps({"v": 1, "frameSha256": hashlib.sha256(text.encode()).hexdigest()})


def test_the_vouched_last_frame_is_parsed():
    line, termination = frame_line(REAL)
    frame = parse_frame(f"noise\n{line}\n", termination)
    assert frame.reason == "Completed" and frame.stdout == "42\n" and frame.metrics.wallMillis == 5


def test_a_forged_earlier_frame_is_ignored():
    forged, _ = frame_line({**REAL, "stdout": "forged\n"})
    line, termination = frame_line({**REAL, "reason": "NonZeroExit", "exitCode": 1})
    frame = parse_frame(f"{forged}\n{line}\n", termination)
    assert frame.reason == "NonZeroExit"


@pytest.mark.parametrize("log,termination,why", [
    ("just output\n", None, "no result frame"),
    ("CODERUN-RESULT-V1 {\"version\":1}\n", None, "termination message"),
    ("CODERUN-RESULT-V1 {\"version\":1}\n", '{"frameSha256":"' + "0" * 64 + '"}', "does not match"),
    ("CODERUN-RESULT-V1 {\"version\":1}\n", "not json", "termination message"),
])
def test_missing_unvouched_or_forged_frames_are_errors(log, termination, why):
    with pytest.raises(FrameError, match=why):
        parse_frame(log, termination)


def test_a_vouched_but_malformed_frame_is_an_error_not_a_crash():
    text = json.dumps({"version": "one", "reason": ["x"]})
    termination = json.dumps({"frameSha256": hashlib.sha256(text.encode()).hexdigest()})
    with pytest.raises(FrameError, match="not valid"):
        parse_frame("CODERUN-RESULT-V1 " + text, termination)


def test_a_log_cut_short_is_reported_as_truncated():
    with pytest.raises(FrameError) as cut:
        parse_frame("x" * 100, None, log_complete=False)
    assert cut.value.truncated


def test_line_separators_a_program_prints_do_not_split_the_frame():
    # str.splitlines() would cut the frame at U+2028 / U+0085 and the digest would no longer match.
    line, termination = frame_line({**REAL, "stdout": "a\u2028b\u0085c\u2029d\n"})
    frame = parse_frame(f"noise\u2028\n{line}\n", termination)
    assert frame.stdout == "a\u2028b\u0085c\u2029d\n"


def test_what_the_program_controls_is_bounded_not_refused():
    hostile = {**REAL, "reason": "NonZeroExit", "exitCode": 2**70, "stdoutBytes": 2**80,
               "error": {"type": "T" * 3000, "message": "m" * 9000, "line": 99999999999999999999999},
               "artifactsSkipped": [{"name": "n" * 3000, "why": "symlink"}]}
    line, termination = frame_line(hostile)
    frame = parse_frame(line, termination)
    assert frame.exitCode is None and frame.stdoutBytes == 2**63 - 1 and frame.error.line is None
    # The status's caps plus the runner's 1024-character redaction margin (the status cuts after redacting).
    assert len(frame.error.type) == 1280 and frame.error.type.endswith("…") and len(frame.error.message) == 5120
    assert len(frame.artifactsSkipped[0].name) == 2048


def test_a_runs_frame_is_found_in_a_sandboxs_log_by_its_nonce_whatever_follows_it():
    """After an operator restart: the run's frame among an earlier run's, a forged one (the program writes to the
    runner's stdout), and the runner's nonce-less answers to documents someone else wrote to its stdin."""
    nonce, other = "a" * 64, "b" * 64
    ours, _ = frame_line({**REAL, "nonce": nonce, "stdout": "x" * 100_000})  # far past a log record's 16 KiB
    earlier, _ = frame_line({**REAL, "nonce": other, "stdout": "earlier\n"})
    forged, _ = frame_line({**REAL, "stdout": "forged\n", "note": f'"nonce":"{nonce}"'})
    dropped, _ = frame_line({**REAL, "reason": "InvalidInput"})
    log = "\n".join([earlier, "CODERUN-ACCEPTED 0123", ours, *[dropped] * 12, forged, ""])
    assert logged_frame(log, nonce).stdout == "x" * 100_000
    assert logged_frame(log.replace(ours, ""), nonce) is None  # the forged line names the nonce, not as its own
    assert logged_frame(log, "c" * 64) is None
