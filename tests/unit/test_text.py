"""One sanitiser for untrusted text shown outside the stdout/stderr passthrough."""
import pytest

from coderun import cli
from coderun.api.text import one_line, printable
from coderun.client.result import result_from_object
from coderun.tools import render_result

# What a program printed as an artifact name in the third attack: set the terminal title (OSC), erase the line
# (CSI 2K, carriage return) and write a forged summary over the real one.
FORGERY = "plot.png\x1b]0;pwned\x07\r\x1b[2Kcoderun: run-a exit code 0 (Completed)"


@pytest.mark.parametrize("text", [FORGERY, "a\x9b31mred", "evil\u202egnp.exe", "x\u2028y", "bell\x07", "nul\x00"])
def test_no_control_or_format_character_survives(text):
    for clean in (printable(text), one_line(text)):
        assert all(c == "\n" or c == "\t" or c.isprintable() for c in clean), clean
        assert "\\" in clean  # shown, not dropped: a reader sees that something was there


def test_plain_text_and_other_scripts_pass_unchanged():
    text = "naïve Straße 東京 — ok: 42 %"
    assert printable(text) == one_line(text) == text
    assert printable("two\nlines\tand a tab") == "two\nlines\tand a tab"
    assert one_line("two\nlines") == "two\\x0alines"


def test_a_forged_artifact_name_cannot_rewrite_the_cli_summary():
    result = result_from_object({"metadata": {"name": "run-a", "namespace": "ns"}, "status": {
        "phase": "Failed", "reason": "NonZeroExit", "exitCode": 3, "message": "the program exited with code 3",
        "artifacts": [{"name": FORGERY, "size": 1, "sha256": "0" * 64, "configMap": "c", "key": "k"}]}})
    line = cli.summary_line(result)
    assert line.startswith("coderun: run-a exit code 3 (NonZeroExit)")
    assert "\x1b" not in line and "\r" not in line and "\x07" not in line
    text = render_result(result)
    assert "\x1b" not in text and "\r" not in text and text.splitlines()[0].startswith("exit code 3")


def test_an_error_message_with_escapes_is_shown_escaped_to_the_model_and_the_terminal():
    result = result_from_object({"metadata": {"name": "run-a", "namespace": "ns"}, "status": {
        "phase": "Failed", "reason": "NonZeroExit", "exitCode": 1,
        "error": {"type": "ValueError\x1b[8m", "message": "hidden\x1b[0m\rexit code 0", "line": 1}}})
    for text in (cli.summary_line(result), render_result(result, "raise ValueError()")):
        assert "\x1b" not in text and "\r" not in text
