"""Egress by name, the pure parts: the rules' matching, the credential, squid's helper protocol under hostile input,
the access log's records, the rendered squid.conf. tests/egress runs them under a real squid."""
import io
import json
import os
import re
import socket
import threading
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

from coderun.egress import access_log, credential, helpers, proxy, rules, run_logs, squid_config, squid_helper
from coderun.egress.credential import CredentialRefused, Grant, mint, parse_revocations, render_revocations, verify
from coderun.egress.ranges import protected_networks
from coderun.egress.run_logs import RunLogs, Usage
from coderun.egress.rules import Rule

KEY = b"k" * 32
KEYS = {"k1": KEY}
NOW = 1_800_000_000
PROTECTED = protected_networks({"CODERUN_POD_CIDRS": "10.88.0.0/16", "CODERUN_SERVICE_CIDRS": "10.96.0.0/16"})
RULES = (Rule(host="api.github.com", ports=(443,)), Rule(host="*.example.org"),
         Rule(cidr="10.20.0.0/24", ports=(5432,)), Rule(cidr="10.96.5.0/24", ports=(443,)))


def grant(**changes):
    fields = dict(namespace="ns", name="run1", uid="u-1", policy="pol", rules=RULES, expires=NOW + 60)
    return Grant(**{**fields, **changes})


@pytest.mark.parametrize("rule, name, matches", [
    ("api.github.com", "api.github.com", True),
    ("api.github.com", "github.com", False),
    ("api.github.com", "x.api.github.com", False),
    ("*.example.org", "a.example.org", True),
    ("*.example.org", "example.org", False),       # subdomains only
    ("*.example.org", "a.b.example.org", False),   # one label of wildcard
    ("*.example.org", "aexample.org", False),
    ("*.example.org", ".example.org", False),
])
def test_a_host_rule_matches_exactly_or_one_label_deep(rule, name, matches):
    assert rules.host_matches(rule, name) is matches


@pytest.mark.parametrize("raw, canonical", [
    ("API.GitHub.com", "api.github.com"), ("api.github.com.", "api.github.com"), ("10.0.0.1", None),
    ("[::1]", None), ("::1", None), ("localhost", None), ("a..b", None), ("", None), ("a" * 300 + ".com", None),
    ("evil.com\r\nX: y", None), ("ex ample.com", None),
])
def test_only_dns_names_are_names(raw, canonical):
    assert rules.canonical_name(raw) == canonical


def test_a_name_and_port_need_a_host_rule_and_the_refusal_names_host_policy_and_allowlist():
    assert rules.decide_name(RULES, "pol", "API.github.com", 443).rule == "egress[0] api.github.com:443"
    assert rules.decide_name(RULES, "pol", "a.example.org", 8080).rule == "egress[1] *.example.org:*"
    refused = rules.decide_name(RULES, "pol", "api.github.com", 80)
    assert not refused.allowed and refused.reason == rules.NOT_ALLOWED
    assert refused.message == ("egress to api.github.com:80 is not allowed by CodeRunPolicy pol; it allows "
                               "api.github.com:443, *.example.org:*")
    literal = rules.decide_name(RULES, "pol", "10.20.0.5", 5432)
    assert literal.reason == rules.NOT_A_NAME and "names only" in literal.message
    many = [Rule(host=f"h{i}.example.com") for i in range(20)]
    assert "and 12 more" in rules.decide_name(many, "pol", "x.com", 1).message


def test_a_refusal_quotes_what_the_client_sent_printable_and_bounded():
    message = rules.decide_name(RULES, "pol", "\x1b[31m" + "x" * 500, 80).message
    assert "\x1b" not in message and len(message) < 200


@pytest.mark.parametrize("addresses, port, allowed, says", [
    (["203.0.113.10"], 443, True, None),
    (["10.96.0.1"], 443, False, "it resolves to 10.96.0.1, inside 10.96.0.0/16 (the cluster's Service range)"),
    (["203.0.113.10", "169.254.169.254"], 443, False, "169.254.169.254"),
    (["::ffff:127.0.0.1"], 443, False, "it resolves to 127.0.0.1, inside 127.0.0.0/8 (loopback)"),
    (["0.0.0.0"], 443, False, "0.0.0.0/8"),
    (["10.96.5.7"], 443, True, None),          # a cidr rule covers it, on this port
    (["10.96.5.7"], 80, False, "10.96.5.7"),   # ... not on that one
    ([], 443, False, "does not resolve"),
])
def test_every_address_inside_a_protected_range_needs_a_cidr_rule(addresses, port, allowed, says):
    by_name = rules.decide_name(RULES, "pol", "api.github.com", port)
    by_name = by_name if by_name.allowed else rules.Verdict(True, rules.ALLOWED, "", "egress[0]")
    verdict = rules.decide_addresses(RULES, "pol", "api.github.com", port, by_name, addresses, PROTECTED)
    assert verdict.allowed is allowed and (says is None or says in verdict.message), verdict
    assert verdict.via_cidr is (allowed and addresses == ["10.96.5.7"])


@pytest.mark.parametrize("connect, sni, allowed", [
    ("api.github.com", "api.github.com", True), ("api.github.com", "API.GITHUB.COM.", True),
    ("api.github.com", "evil.com", False), ("api.github.com", "-", False), ("10.0.0.1", "10.0.0.1", False),
])
def test_the_tls_server_name_must_be_the_connect_host(connect, sni, allowed):
    assert rules.decide_sni(connect, sni).allowed is allowed


def test_a_rule_has_exactly_one_target_and_valid_ports():
    for bad in (dict(), dict(host="a.com", cidr="10.0.0.0/8"), dict(host="10.0.0.1"), dict(cidr="nope"),
                dict(host="a.com", ports=(0,)), dict(host="a.com", ports=(70000,))):
        with pytest.raises(ValueError):
            Rule(**bad)


def test_a_token_carries_its_grant_and_opens_nothing_else():
    token = mint("k1", KEY, grant())
    assert verify(token, KEYS, NOW, user="u-1") == grant()
    assert credential.proxy_url("proxy:3128", token, "u-1") == f"http://u-1:{token}@proxy:3128"


@pytest.mark.parametrize("tamper, reason", [
    (lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"), credential.BAD_CREDENTIAL),  # signature
    (lambda t: t.replace("v1.k1.", "v1.k2."), credential.BAD_CREDENTIAL),                       # unknown key
    (lambda t: t.replace("v1.", "v2.", 1), credential.BAD_CREDENTIAL),
    (lambda t: "x" * (credential.MAX_TOKEN_CHARS + 1), credential.BAD_CREDENTIAL),
    (lambda t: "v1.k1.%%%.%%%", credential.BAD_CREDENTIAL),
    (lambda t: "v1.k1.é.é", credential.BAD_CREDENTIAL),
    (lambda t: "", credential.BAD_CREDENTIAL),
])
def test_a_forged_or_broken_token_is_refused(tamper, reason):
    with pytest.raises(CredentialRefused) as refused:
        verify(tamper(mint("k1", KEY, grant())), KEYS, NOW)
    assert refused.value.reason == reason


def test_a_changed_payload_does_not_verify():
    version, key_id, payload, signature = mint("k1", KEY, grant()).split(".")
    other = mint("k1", KEY, grant(rules=(Rule(host="evil.com"),))).split(".")[2]
    with pytest.raises(CredentialRefused):
        verify(".".join([version, key_id, other, signature]), KEYS, NOW)


def test_a_token_ends_at_its_deadline_when_revoked_and_with_another_user_name():
    token = mint("k1", KEY, grant())
    for now, revoked, user, reason in [(NOW + 60, (), "u-1", credential.EXPIRED),
                                       (NOW, {"u-1"}, "u-1", credential.REVOKED),
                                       (NOW, (), "u-2", credential.BAD_CREDENTIAL)]:
        with pytest.raises(CredentialRefused) as refused:
            verify(token, KEYS, now, revoked, user=user)
        assert refused.value.reason == reason


def test_keys_rotate_a_token_of_either_key_verifies():
    old, new = mint("old", KEY, grant()), mint("new", b"n" * 32, grant())
    keys = {"old": KEY, "new": b"n" * 32}
    assert verify(old, keys, NOW) == verify(new, keys, NOW)


def budget_rules(ports: int) -> tuple[Rule, ...]:
    """As many rules as EGRESS_BUDGET allows (at most 64), each with `ports` ports and a name of 40 characters."""
    count = min(64, credential.EGRESS_BUDGET // credential.egress_weight("x" * 40, ports))
    return tuple(Rule(host=f"{i:04d}{'a' * 24}.example.com", ports=tuple(range(1, ports + 1))) for i in range(count))


@pytest.mark.parametrize("ports", [0, 1, 16])
def test_rules_within_the_budget_fit_a_token_with_the_longest_names_kubernetes_allows(ports):
    longest = grant(namespace="n" * 63, name="r" * 253, uid="u" * 36, policy="p" * 253, rules=budget_rules(ports))
    assert sum(credential.egress_weight(r.host, len(r.ports)) for r in longest.rules) <= credential.EGRESS_BUDGET
    assert len(mint("k1", KEY, longest)) <= credential.MAX_TOKEN_CHARS


def test_rules_far_over_the_budget_make_no_token():
    with pytest.raises(ValueError, match="EGRESS_BUDGET"):
        mint("k1", KEY, grant(rules=tuple(Rule(host=f"{i}{'a' * 60}.{'b' * 60}.{'c' * 60}.example.com")
                                            for i in range(64))))


def test_the_revocation_list_round_trips_and_forgets_what_expired():
    text = render_revocations({"u-1": NOW + 10, "u-2": NOW - 1, "BAD UID": NOW + 10}, NOW)
    assert text == f"u-1 {NOW + 10}\n"
    assert parse_revocations([*text.splitlines(), "garbage", "u-3 x", "u-4 " + "9" * 40, ""], NOW) == {"u-1"}


def converse(answer, lines: bytes, **kwargs) -> list[str]:
    out = io.BytesIO()
    squid_helper.serve(answer, stdin=io.BytesIO(lines), stdout=out, **kwargs)
    return out.getvalue().decode().splitlines()


def test_the_helper_protocol_answers_each_channel_and_survives_garbage():
    def answer(words):
        if words == ["boom"]:
            raise RuntimeError("a bug")
        return squid_helper.reply(True, echo=" ".join(words))

    replies = converse(answer, b"0 a%20b c\n1 boom\nnot-a-channel x\n2 \xff\xfe\n" + b"3 " + b"x" * 100 + b"\n4 ok\n",
                       max_line=64)
    assert replies == ['0 OK echo="a b c"', '1 ERR message="the egress proxy\'s helper failed on this request"',
                       '2 OK echo="\ufffd\ufffd"', '3 ERR message="request too long for the egress proxy"',
                       '4 OK echo="ok"']


def test_reply_values_cannot_break_the_line_or_the_quoting():
    assert squid_helper.reply(False, message='a"b\\c\r\nd', none=None) == 'ERR message="a\\"b\\\\c  d"'


def test_answers_are_sent_in_any_order_with_workers():
    release = __import__("threading").Event()

    def answer(words):
        if words == ["slow"]:
            release.wait(5)
        else:
            release.set()
        return squid_helper.reply(True)

    assert converse(answer, b"0 slow\n1 fast\n", workers=2) == ["1 OK", "0 OK"]


def acl(words, resolve=lambda name, port, tenant: ["203.0.113.10"], revoked=()):
    return helpers.answer_acl(words, KEYS, revoked, NOW, resolve, PROTECTED)


def test_the_acl_helper_says_which_rule_allowed_and_why_it_refused():
    token = mint("k1", KEY, grant())
    assert acl(["u-1", token, "api.github.com", "443", "-", "request"]) == (
        'OK message="api.github.com:443 allowed by CodeRunPolicy pol" run="ns/run1" uid="u-1" policy="pol" '
        'rule="egress[0] api.github.com:443"')
    refused = acl(["u-1", token, "evil.com", "443", "-", "request"])
    assert refused.startswith('ERR message="egress to evil.com:443 is not allowed by CodeRunPolicy pol') \
        and 'reason="NotAllowed"' in refused
    internal = acl(["u-1", token, "api.github.com", "443", "-", "request"], resolve=lambda n, p, _: ["10.96.0.1"])
    assert 'reason="ProtectedAddress"' in internal
    covered = acl(["u-1", token, "api.github.com", "443", "-", "request"], resolve=lambda n, p, _: ["10.96.5.1"])
    assert covered.startswith("OK") and 'via_cidr="yes"' in covered
    assert 'reason="Unresolved"' in acl(["u-1", token, "api.github.com", "443", "-", "request"],
                                        resolve=lambda n, p, _: (_ for _ in ()).throw(OSError("NXDOMAIN")))
    assert 'reason="CredentialRevoked"' in acl(["u-1", token, "api.github.com", "443", "-", "request"],
                                               revoked={"u-1"})
    assert acl(["u-1", token, "api.github.com", "443", "evil.com", "sni"]).startswith("ERR")
    assert acl(["u-1", token, "api.github.com", "443", "api.github.com", "sni"]).startswith("OK")
    for garbage in ([], ["u-1"], ["u-1", token, "api.github.com", "99999", "-", "request"],
                    ["u-1", token, "api.github.com", "443", "-", "other"]):
        assert acl(garbage).startswith("ERR")


def test_a_tenant_s_slow_names_cost_its_own_lookups_never_another_tenant_s():
    """getaddrinfo cannot be cut short: a lookup is waited for a bounded time, and a tenant (a policy's runs in one
    namespace) whose lookups hang is refused more once the bound has passed, while another policy's names, and the
    same policy's in another namespace, still resolve."""
    dns_answers = threading.Event()

    def resolve(name, port):
        if name.endswith(".slow.test"):
            dns_answers.wait(30)
        return ["203.0.113.10"]

    lookups = helpers.BoundedLookups(resolve, seconds=0.2, per_tenant=2)
    token = mint("k1", KEY, grant(rules=(Rule(host="*.slow.test"), Rule(host="api.github.com"))))
    for name in ("a.slow.test", "b.slow.test"):
        timed_out = acl(["u-1", token, name, "443", "-", "request"], resolve=lookups)
        assert 'reason="Unresolved"' in timed_out and "did not resolve within 0.2 s" in timed_out
    busy = acl(["u-1", token, "api.github.com", "443", "-", "request"], resolve=lookups)
    assert "2 name lookups of CodeRunPolicy pol's runs in namespace ns were still waiting" in busy
    neighbour = mint("k1", KEY, grant(uid="u-3", namespace="ns-b", rules=(Rule(host="api.github.com"),)))
    assert acl(["u-3", neighbour, "api.github.com", "443", "-", "request"], resolve=lookups).startswith("OK")
    other = mint("k1", KEY, grant(uid="u-2", policy="other", rules=(Rule(host="api.github.com"),)))
    assert acl(["u-2", other, "api.github.com", "443", "-", "request"], resolve=lookups).startswith("OK")
    dns_answers.set()  # the hung lookups end: the tenant's lookups are its own again
    deadline = time.monotonic() + 10
    while "still waiting" in (answer := acl(["u-1", token, "a.slow.test", "443", "-", "request"], resolve=lookups)):
        assert time.monotonic() < deadline, answer
    assert answer.startswith("OK")


def test_a_lookup_past_the_tenant_s_bound_waits_for_a_slot_rather_than_being_refused():
    """Names merely slow to resolve: a third lookup waits for one of two in flight to end, then resolves."""
    answers = {"a.test": threading.Event(), "b.test": threading.Event()}

    def resolve(name, port):
        if name in answers:
            answers[name].wait(30)
        return ["203.0.113.10"]

    lookups = helpers.BoundedLookups(resolve, seconds=10, per_tenant=2)
    results = {}

    def look(name):
        results[name] = lookups(name, 443, ("pol", "ns"))

    threads = [threading.Thread(target=look, args=(name,), daemon=True) for name in ("a.test", "b.test", "c.test")]
    for thread in threads[:2]:
        thread.start()
    deadline = time.monotonic() + 5
    while lookups._in_flight.get(("pol", "ns")) != 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    threads[2].start()
    threads[2].join(0.3)
    assert "c.test" not in results  # waiting for a slot: neither resolved nor refused
    answers["a.test"].set()
    threads[2].join(5)
    assert results.get("c.test") == ["203.0.113.10"]
    answers["b.test"].set()
    for thread in threads[:2]:
        thread.join(5)
    assert set(results) == {"a.test", "b.test", "c.test"}


def test_the_auth_helper_says_yes_or_no_and_nothing_that_could_stick_to_the_user():
    token = mint("k1", KEY, grant())
    assert helpers.answer_auth(["u-1", token], KEYS, (), NOW) == "OK"
    assert helpers.answer_auth(["u-2", token], KEYS, (), NOW) == "ERR"
    assert helpers.answer_auth(["u-1"], KEYS, (), NOW) == "ERR"


def test_the_resolver_reads_the_hosts_file_squid_reads(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# comment\n127.0.0.1 allowed.test Other.Test\nnot-an-address x.test\n::1 six.test # v6\n")
    resolve = helpers.resolver(str(hosts))
    assert resolve("allowed.test", 80) == ["127.0.0.1"] and resolve("other.test", 80) == ["127.0.0.1"]
    assert resolve("six.test", 80) == ["::1"]


def squid_line(**values) -> str:
    fields = {key: "-" for key, _ in squid_config.FIELDS}
    fields.update({k: str(v) for k, v in values.items()})
    return " ".join(fields[key] for key, _ in squid_config.FIELDS)


def test_a_plain_http_request_is_one_record_without_its_query():
    records = access_log.Records()
    entry = records.feed(access_log.parse(squid_line(
        time="1800000000.250", duration_ms=12, client="10.88.0.9", user="u-1", run="ns/run1", uid="u-1", policy="pol",
        method="GET", host="pypi.example.org", port=80, path="/simple/x%3Ftoken%3Dsecret", status=200,
        squid_status="TCP_MISS", bytes_sent=300, bytes_received=4000, server="203.0.113.9",
        rule="egress%5B1%5D%20*.example.org:*", stage="policy", xid=7, hierarchy="HIER_DIRECT")))
    assert entry == {"time": "2027-01-15T08:00:00.250+00:00", "duration_ms": 12, "client": "10.88.0.9",
                     "user": "u-1", "run": "ns/run1", "uid": "u-1", "policy": "pol", "method": "GET",
                     "host": "pypi.example.org",
                     "port": 80, "path": "/simple/x", "status": 200, "squid_status": "TCP_MISS", "bytes_sent": 300,
                     "bytes_received": 4000, "server": "203.0.113.9", "sni": None, "tls": None,
                     "rule": "egress[1] *.example.org:*", "reason": "Allowed", "message": None, "error": None,
                     "verdict": "allowed"}
    json.dumps(entry)


def test_an_https_request_is_one_record_from_both_stages():
    records = access_log.Records()
    decision = squid_line(method="CONNECT", host="api.github.com", port=443, squid_status="NONE_NONE", status=200,
                          sni="evil.com", tls="terminate", reason="SNIMismatch", message="TLS%20server%20name",
                          stage="tls", xid=8, pair=7)
    tunnel_at_tls = squid_line(method="CONNECT", host="api.github.com", port=443, squid_status="TCP_TUNNEL",
                               stage="tls", xid=9, pair=7, hierarchy="HIER_DIRECT")
    outer = squid_line(method="CONNECT", host="api.github.com", port=443, squid_status="TCP_TUNNEL", status=200,
                       bytes_sent=900, bytes_received=40, server="127.0.0.1", stage="policy", xid=7,
                       hierarchy="FIRSTUP_PARENT", rule="egress%5B0%5D", run="ns/run1")
    assert records.feed(access_log.parse(decision)) is None
    assert records.feed(access_log.parse(tunnel_at_tls)) is None
    entry = records.feed(access_log.parse(outer))
    assert entry["verdict"] == "denied" and entry["reason"] == "SNIMismatch" and entry["sni"] == "evil.com"
    assert entry["bytes_sent"] == 900 and entry["server"] is None and entry["path"] is None


@pytest.mark.parametrize("values, verdict, reason", [
    (dict(status=407, squid_status="TCP_DENIED"), "denied", credential.BAD_CREDENTIAL),
    (dict(status=403, squid_status="TCP_DENIED", reason="NotAllowed"), "denied", "NotAllowed"),
    (dict(status=403, squid_status="TCP_DENIED"), "denied", "Denied"),
    (dict(status=503, squid_status="TCP_MISS", error="ERR_CONNECT_FAIL"), "allowed", "Allowed"),
])
def test_the_verdict_and_its_reason(values, verdict, reason):
    entry = access_log.Records().feed(access_log.parse(squid_line(method="GET", host="a.example.org", port=80,
                                                                  stage="policy", **values)))
    assert (entry["verdict"], entry["reason"]) == (verdict, reason)


def test_lines_that_are_no_run_request_are_not_records():
    records = access_log.Records()
    for line in ["", "garbage", squid_line(), squid_line(method="GET", host=squid_config.WARMUP_HOST),
                 squid_line(method="GET", host="a.b", status="x" * 50)[:-1] + " extra"]:
        assert records.feed(access_log.parse(line)) is None


def test_the_log_daemon_writes_json_lines_and_survives_garbage(tmp_path):
    log = tmp_path / "access.jsonl"
    good = squid_line(method="GET", host="a.example.org", port=80, stage="policy", status=200)
    feed = (f"L{good}\n".encode() + b"Lgarbage\n" + b"L" + b"\xff" * 10 + b"\n" + b"L" + b"x" * 70000 + b"\n"
            + b"R\nF\nb1\nr3\n" + f"L{good}\n".encode())
    access_log.serve(str(log), stdin=io.BytesIO(feed))
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["host"] == "a.example.org" for line in lines)


def test_the_log_daemon_reads_squid_s_lines_in_batches_whatever_the_reads_cut():
    """Lines split across reads are joined, an overlong one is skipped however many reads it spans, memory stays
    bounded by the read and the longest line."""
    long = b"L" + b"x" * (access_log.MAX_LINE + 5)
    feed = b"La\nLb\n" + long + b"\nLc\n" + long + b"\nLd\nLe"  # the last line never ended: squid stopped
    for chunk in (3, 7, 1 << 20):
        lines = [line for batch in access_log.batches(io.BytesIO(feed), chunk) for line in batch]
        assert lines == [b"La", b"Lb", b"Lc", b"Ld"], chunk


def test_the_log_daemon_writes_each_run_s_file_once_a_batch_and_counts_before_a_reader_sees(tmp_path):
    runs = RunLogs(str(tmp_path))
    for i in range(3):
        runs.add("u-1", {"n": i, "bytes_sent": 1})
    assert not (tmp_path / "u-1.jsonl").exists() and RunLogs(str(tmp_path)).usage("u-1").requests == 0
    runs.flush()
    assert RunLogs(str(tmp_path)).usage("u-1").requests == 3 and len(runs.read("u-1")[0].splitlines()) == 3
    runs.append("u-1", {"n": 3})
    assert RunLogs(str(tmp_path)).wait_logged("u-1", 0) == (0, runs.usage("u-1"))  # nothing admitted: at once
    runs.append("u-1", {"method": "CONNECT", "bytes_sent": 10, "bytes_received": 20})  # a tunnel's bytes apart
    runs.append("u-1", {"method": "GET", "bytes_received": 5})
    usage = RunLogs(str(tmp_path)).usage("u-1")
    assert (usage.bytes, usage.tunnel_bytes) == (38, 30)
    runs.close()


def test_squid_conf_keeps_every_protected_range_squid_would_otherwise_drop():
    conf = squid_config.render(squid_config.Settings(
        listen="0.0.0.0:3128", tls_stage_port=3129, state_dir="/run/x", launchers="/bin", keys_dir="/k",
        revocations="/r", error_dir="/e", env={"CODERUN_POD_CIDRS": "10.88.0.0/16,10.88.1.0/24"}))
    dst = next(line for line in conf.splitlines() if line.startswith("acl protected dst"))
    # nested ranges collapsed: squid keeps the smaller of two nested ones and ignores the larger
    assert "10.88.0.0/16" in dst and "10.88.1.0/24" not in dst and "fc00::/7" not in dst
    assert "169.254.0.0/16" in dst and "127.0.0.0/8" in dst and "fe80::/10" in dst
    assert "http_port 127.0.0.1:3129 name=tls ssl-bump" in conf and "http_port 0.0.0.0:3128 name=policy\n" in conf
    # The pod's own loopback is refused at every port whatever CIDR rule a run has; the budget check is asked once
    # per request (its key is the transaction's), never joined to another request's pending answer.
    assert "http_access deny proxy_itself all\n" in conf and "acl proxy_itself dst 127.0.0.0/8 ::1/128" in conf
    assert conf.index("deny proxy_itself all") < conf.index("deny protected !via_cidr")
    budget = next(line for line in conf.splitlines() if line.startswith("external_acl_type coderun_budget"))
    assert "%ssl::>sni %master_xaction %DATA" in budget


def _pod_settings(**changes) -> squid_config.Settings:
    return squid_config.Settings(listen="0.0.0.0:3128", tls_stage_port=3129, state_dir="/run/x", launchers="/bin",
                                 keys_dir="/k", revocations="/r", error_dir="/e", **changes)


def test_with_an_upstream_proxy_everything_leaves_through_it_and_connects_never_go_direct():
    without = squid_config.render(_pod_settings())
    assert "never_direct allow all" not in without and "name=upstream" not in without  # the control
    upstream = squid_config.Upstream("proxy.corp.example", 8080)
    conf = squid_config.render(_pod_settings(upstream=upstream))
    lines = conf.splitlines()
    peer, = [line for line in lines if "name=upstream" in line]
    assert peer == ("cache_peer proxy.corp.example parent 8080 0 no-query no-digest no-netdb-exchange default "
                    "name=upstream")
    assert "never_direct allow all" in lines
    # A run's CONNECT still goes to the TLS stage through the relay (budgets, revocation, the SNI check); only
    # what the TLS stage splices, and the policy stage's plain http://, go to the upstream. The upstream peer is
    # not given the run's credential (no login=PASS), the TLS stage's peer keeps it.
    access = [line for line in lines if line.startswith("cache_peer_access upstream")]
    assert access == ["cache_peer_access upstream deny at_policy CONNECT", "cache_peer_access upstream deny warmup",
                      "cache_peer_access upstream allow all"]
    assert "cache_peer_access tls_stage allow at_policy CONNECT" in lines and "login=PASS" not in peer
    # Everything else is as without it: the same checks, in the same order, and the same log format.
    assert [line for line in lines if line.startswith(("http_access", "logformat", "ssl_bump"))] == [
        line for line in without.splitlines() if line.startswith(("http_access", "logformat", "ssl_bump"))]


def test_the_upstream_login_is_escaped_so_no_byte_of_it_ends_or_changes_the_token():
    password = "p a%s:w\"#\n'"
    peer = squid_config.Upstream("10.0.0.5", 3128, "svc-coderun", password).cache_peer()
    login = peer.split(" login=", 1)[1]
    assert " " not in login and "\n" not in login and '"' not in login and "#" not in login
    user, escaped = login.split(":")  # one colon: the one between the two (squid unescapes each, rfc1738_unescape)
    assert (unquote(user), unquote(escaped)) == ("svc-coderun", password)


@pytest.mark.parametrize("upstream, says", [
    (dict(host="proxy corp", port=3128), "not a name or an address"),
    (dict(host="proxy.corp\nhttp_access allow all", port=3128), "not a name or an address"),
    (dict(host="proxy", port=0), "not a port"),
    (dict(host="proxy", port=3128, username="u"), "both a username and a password"),
    (dict(host="proxy", port=3128, username="*", password="p"), "start with *"),
    (dict(host="proxy", port=3128, username="a:b", password="p"), "colon"),
])
def test_an_upstream_that_squid_would_misread_is_refused(upstream, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        squid_config.Upstream(**upstream)
    assert squid_config.Upstream("fd00::5", 3128, "u", "p")  # an IPv6 address is fine


def test_the_pod_reads_the_upstream_from_its_environment_and_the_login_from_the_mounted_secret(tmp_path):
    login = tmp_path / "login"
    login.mkdir()
    (login / "username").write_text("svc")
    (login / "password").write_text("s3cret\n")
    env = {"CODERUN_EGRESS_STATE": str(tmp_path / "state"), "CODERUN_EGRESS_UPSTREAM_HOST": "proxy.corp",
           "CODERUN_EGRESS_UPSTREAM_PORT": "8080", "CODERUN_EGRESS_UPSTREAM_LOGIN": str(login)}
    settings = proxy.settings_from(env)
    assert settings.upstream == squid_config.Upstream("proxy.corp", 8080, "svc", "s3cret")
    assert proxy.settings_from({}).upstream is None
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "tls.pem").write_text("")  # prepare() makes one with openssl otherwise
    config = Path(proxy.prepare(settings))
    assert "login=svc:s3cret" in config.read_text() and config.stat().st_mode & 0o777 == 0o600
    (login / "password").unlink()
    with pytest.raises(ValueError, match="no password"):
        proxy.settings_from(env)


def test_the_log_fields_are_encoded_where_a_client_writes_them():
    encoded = {key for key, code in squid_config.FIELDS if code.startswith("%#")}
    assert {"user", "method", "host", "path", "sni", "message", "pair"} <= encoded


def test_launchers_run_the_package_with_python_isolated(tmp_path):
    squid_config.write_launchers(str(tmp_path), "/usr/bin/python3", "/opt/x")
    auth = (tmp_path / squid_config.AUTH).read_text()
    assert auth.startswith("#!/usr/bin/python3 -I\n") and "from coderun.egress.helpers import main" in auth
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [squid_config.AUTH, squid_config.ACL, squid_config.LOG, squid_config.PROXY])


def test_the_helpers_stay_fast_enough_for_every_request():
    token = mint("k1", KEY, grant())
    started = time.perf_counter()
    for _ in range(1000):
        acl(["u-1", token, "api.github.com", "443", "-", "request"])
    assert time.perf_counter() - started < 2.0  # ~0.1 ms each here; squid also caches answers for 5 s


def test_a_budget_travels_in_the_token_and_read_grant_ignores_only_the_deadline():
    budgeted = grant(budget=credential.Budget(bytes=10_000, requests=None))
    token = mint("k1", KEY, budgeted)
    assert verify(token, KEYS, NOW) == budgeted and verify(mint("k1", KEY, grant()), KEYS, NOW).budget is None
    assert credential.read_grant(token, KEYS) == budgeted  # long expired: still read back, signature checked
    with pytest.raises(CredentialRefused):
        credential.read_grant(token, {"k1": b"x" * 32})


def test_the_token_pattern_matches_every_token_and_nothing_like_it():
    import re
    token = mint("k1", KEY, grant())
    printed = f"HTTPS_PROXY=http://u-1:{token}@10.96.0.9:3128 done"
    assert re.search(credential.TOKEN_PATTERN, printed).group(0) == token
    assert not re.search(credential.TOKEN_PATTERN, "v1.2.3 and v1.k1.abc.def")


@pytest.mark.parametrize("spent_bytes, spent_requests, says", [
    (0, 0, None), (999, 4, None), (1000, 0, "moved 1000 bytes"), (0, 5, "made 5 requests"),
])
def test_a_run_over_its_budget_is_refused_naming_the_field(spent_bytes, spent_requests, says):
    verdict = rules.decide_budget("pol", spent_bytes, spent_requests, 1000, 5)
    assert (verdict is None) == (says is None)
    if says:
        assert verdict.reason == rules.BUDGET_EXCEEDED and says in verdict.message and "spec.egressBudget" in \
            verdict.message


def test_the_acl_helper_s_budget_check_counts_requests_as_it_admits_them_and_bytes_as_logged(tmp_path):
    runs = RunLogs(str(tmp_path))
    moved = {"u-1": Usage(requests=1, bytes_sent=10)}  # the log's count trails: it is not what a request budget uses

    def budget(**changes):
        words = ["u-1", mint("k1", KEY, grant(**changes)), "api.github.com", "443", "-", "budget"]
        return helpers.answer_acl(words, KEYS, (), NOW, lambda n, p, _: ["203.0.113.10"], PROTECTED,
                                  lambda uid: moved.get(uid, Usage()), runs.admit)

    three = credential.Budget(bytes=None, requests=3)
    assert [budget(budget=three) for _ in range(3)] == ["OK"] * 3
    refused = budget(budget=three)
    assert 'reason="BudgetExceeded"' in refused and 'uid="u-1"' in refused and "made 3 requests" in refused
    assert budget() == "OK"  # no budget in the credential: nothing to spend
    # Every request asked is counted, refused or without a budget: the count the run's log must reach at its end.
    assert runs.admitted("u-1") == 5 and runs.admitted("u-2") == 0
    moved["u-1"] = Usage(requests=1, bytes_received=500)
    bytes_refused = budget(budget=credential.Budget(bytes=500, requests=None))
    assert 'reason="BudgetExceeded"' in bytes_refused and "moved 500 bytes" in bytes_refused


def test_requests_racing_from_several_helper_processes_are_each_counted_once(tmp_path, monkeypatch):
    """squid runs several helper processes; each has its own RunLogs, and the lock on the run's file is what they
    share. Threads with their own descriptors contend for it as processes would (flock is per open file); a read
    that takes a moment (here, run_logs' os.read) is where two of them would otherwise both see the same count."""
    class SlowRead:
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def read(fd, n):
            text = os.read(fd, n)
            time.sleep(0.0005)
            return text
    monkeypatch.setattr(run_logs, "os", SlowRead())
    admitted, lock = [], threading.Lock()

    def helper_process():
        runs = RunLogs(str(tmp_path))
        for _ in range(40):
            before = runs.admit("u-1")
            with lock:
                admitted.append(before)

    workers = [threading.Thread(target=helper_process) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert sorted(admitted) == list(range(320))  # each count handed out once: a budget of N admits exactly N
    assert (tmp_path / "u-1.admitted").read_text() == "320"
    with pytest.raises(ValueError):
        RunLogs(str(tmp_path)).admit("../escape")


def test_a_proxy_pod_is_ready_only_with_a_signing_key_and_squid_answering(tmp_path):
    """The keys' Secret is mounted optional (the operator makes it at its start): until a key has arrived the pod
    stays out of the Service, since it could verify no run's credential."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_as_squid():  # what the policy stage says to a request without a credential
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer_as_squid, daemon=True).start()
    keys = tmp_path / "keys"
    keys.mkdir()
    settings = proxy.settings_from({"CODERUN_EGRESS_KEYS": str(keys), "CODERUN_EGRESS_KEYS_SECRET": "my-keys",
                                    "CODERUN_EGRESS_LISTEN": f"127.0.0.1:{listener.getsockname()[1]}"})
    assert "no signing key" in proxy.not_ready(settings) and "from my-keys" in proxy.not_ready(settings)
    (keys / "k1").write_bytes(b"k" * 32)
    assert proxy.not_ready(settings) is None  # the key, and the 407 only squid's policy stage gives
    listener.close()


def test_a_count_file_that_is_not_a_count_refuses_rather_than_starting_the_budget_again(tmp_path):
    runs = RunLogs(str(tmp_path))
    assert [runs.admit("u-1") for _ in range(3)] == [0, 1, 2]
    (tmp_path / "u-1.admitted").write_bytes(b"\x00garbage")
    assert runs.admit("u-1") >= 10 ** 9 and runs.admitted("u-1") >= 10 ** 9  # over any budget: refused
    (tmp_path / "u-2.admitted").write_bytes(b"")  # made, never written (a crash): none admitted yet
    assert runs.admit("u-2") == 0 and (tmp_path / "u-2.admitted").read_text() == "1"


def test_a_credential_naming_its_proxy_pod_is_refused_at_any_other_pod_saying_which():
    bound = mint("k1", KEY, grant(proxy_pod="coderun-egress-proxy-a"))
    assert verify(bound, KEYS, NOW, pod="coderun-egress-proxy-a").proxy_pod == "coderun-egress-proxy-a"
    assert verify(bound, KEYS, NOW).proxy_pod == "coderun-egress-proxy-a"  # a pod that does not know its name
    with pytest.raises(CredentialRefused, match="is for proxy pod coderun-egress-proxy-a, not coderun-egress-proxy-b"):
        verify(bound, KEYS, NOW, pod="coderun-egress-proxy-b")
    assert verify(mint("k1", KEY, grant()), KEYS, NOW, pod="coderun-egress-proxy-b").proxy_pod is None
    words = ["u-1", bound, "api.github.com", "443", "-", "request"]
    answer = helpers.answer_acl(words, KEYS, (), NOW, lambda n, p, _: ["203.0.113.10"], PROTECTED,
                                pod="coderun-egress-proxy-b")
    assert 'reason="WrongProxyPod"' in answer
    assert helpers.answer_auth(["u-1", bound], KEYS, (), NOW, "coderun-egress-proxy-b").startswith("ERR")
    assert helpers.answer_auth(["u-1", bound], KEYS, (), NOW, "coderun-egress-proxy-a").startswith("OK")
