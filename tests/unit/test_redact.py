import pytest

from coderun_operator.policy.redact import Redactor

SECRETS = [
    ("aws-access-key", "AKIAIOSFODNN7EXAMPLE"),
    ("github-token", "ghp_" + "a1B2" * 9),
    ("slack-token", "xoxb-1234567890-abcdefghij"),
    ("google-api-key", "AIza" + "A" * 35),
    ("openai-key", "sk-proj-" + "x1" * 12),
    ("anthropic-key", "sk-ant-api03-" + "z9" * 12),
    ("jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"),
    ("private-key", "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----"),
    ("credential", "password=hunter2hunter2"),
]


@pytest.mark.parametrize("kind,secret", SECRETS, ids=[k for k, _ in SECRETS])
def test_key_like_strings_are_redacted(kind, secret):
    text, count = Redactor().redact(f"before {secret} after")
    assert secret not in text and f"[REDACTED:{kind}]" in text and count >= 1
    assert text.startswith("before ")


def test_ordinary_output_is_untouched():
    text = "42\nrate=0.25 skills: ok\ntoken count: 12\n"
    assert Redactor().redact(text) == (text, 0)


def test_policy_patterns_extend_the_builtin_ones():
    text, count = Redactor([r"ACME-\d{6}"]).redact("id ACME-123456")
    assert text == "id [REDACTED:policy]" and count == 1


def test_the_one_pass_check_changes_nothing_a_pattern_would_redact():
    """Redaction first asks one RE2 set of every pattern whether any matches: each pattern keeps its own inline
    flags and quoting (a policy's unterminated \\Q quotes nothing past its own pattern), and a text the set
    passes over is one no pattern changes."""
    policy = [r"(?i)acme-\d{6}", r"(?s)BEGIN.*END", r"(ID:)\w{4}", r"\Qinternal-secret-42", r"\Qcorp\E-[0-9]{6}"]
    corpus = [f"before {secret} after" for _, secret in SECRETS] + [
        "42\nrate=0.25 skills: ok\n", "ACME-123456", "acme-123456", "Acme-12345", "BEGIN\nx\nEND", "BEGINEND",
        "ID:abcd", "id:abcd", "PASSWORD: 'abcdefghij'", "", "aws_secret_access_key = " + "A" * 40,
        "/usr/lib/python3.11/encodings/__init__.py", "token internal-secret-42 and corp-123456"]
    checked = Redactor(policy)
    assert checked._any is not None
    each = Redactor(policy)
    each._any = None  # every pattern in turn, as without the check
    for text in corpus:
        assert checked.redact(text) == each.redact(text), text
    assert checked.redact("acme-123456 and ID:wxyz")[1] == 2
    assert checked.redact("token internal-secret-42 and corp-123456") == (
        "token [REDACTED:policy] and [REDACTED:policy]", 2)


def test_patterns_past_the_one_pass_budget_are_each_still_applied():
    # each within its own budget (~1,000 RE2 instructions), twenty together past the alternation's
    heavy = [r"Q%d[%s-z]{999}" % (i, "abcdefghijklmnopqrst"[i]) for i in range(20)]
    redactor = Redactor(heavy)
    assert redactor._any is None
    assert redactor.redact("x Q7" + "z" * 999) == ("x [REDACTED:policy]", 1)
