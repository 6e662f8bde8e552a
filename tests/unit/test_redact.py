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
