"""The data plane's grants (coderun_operator.data.grant): what the operator signs is what the service reads, and
nothing else opens it: another key, a changed byte, an old grant, an egress credential, an oversized token."""
from __future__ import annotations

import dataclasses
import json

import pytest

from coderun.egress import credential
from coderun.egress.signed import b64, sign, unb64
from coderun_operator.data.grant import (BAD_GRANT, GRANT_EXPIRED, MAX_TOKEN_CHARS, GrantRefused, ReadGrant,
                                         RunGrant, StoredObject, UploadGrant, artifact_name_problem, mint, verify)

KEY = b"k" * 32
KEYS = {"k1": KEY}
NOW = 1_800_000_000
SHA = "ab" * 32
OBJ = StoredObject("coderun", "uploads/team-a/" + SHA, 123, SHA)

RUN = RunGrant(namespace="team-a", name="job-1", uid="0f1e-22", expires=NOW + 60,
               inputs=(OBJ, StoredObject("datasets", "raw/x.csv", 0, "")), bucket="coderun",
               artifacts_prefix="runs/team-a/0f1e-22/artifacts/", max_file_bytes=5 << 20, max_total_bytes=10 << 20,
               max_files=16)
UPLOAD = UploadGrant(namespace="team-a", expires=NOW + 60, bucket="coderun", files=((SHA, 123), ("cd" * 32, 0)))
READ = ReadGrant(namespace="team-a", uid="0f1e-22", expires=NOW + 60, bucket="coderun",
                 prefix="runs/team-a/0f1e-22/artifacts/")


@pytest.mark.parametrize("grant", [RUN, UPLOAD, READ], ids=["run", "upload", "read"])
def test_each_kind_round_trips(grant):
    token = mint("k1", KEY, grant)
    assert token.startswith("d1.k1.")
    assert verify(token, KEYS, NOW) == grant


def test_a_grant_with_no_inputs_nor_files_round_trips():
    for grant in (dataclasses.replace(RUN, inputs=()), dataclasses.replace(UPLOAD, files=())):
        assert verify(mint("k1", KEY, grant), KEYS, NOW) == grant


def refusal(token, keys=KEYS, now=NOW) -> tuple[str, str]:
    with pytest.raises(GrantRefused) as e:
        verify(token, keys, now)
    return e.value.reason, str(e.value)


def test_another_key_or_an_unknown_key_id_is_refused():
    token = mint("k1", KEY, RUN)
    assert refusal(token, {"k1": b"o" * 32})[0] == BAD_GRANT
    assert refusal(token, {"k2": KEY})[0] == BAD_GRANT
    assert verify(token, {"k2": b"o" * 32, "k1": KEY}, NOW) == RUN  # rotation: any key held


def test_a_tampered_payload_or_signature_is_refused():
    token = mint("k1", KEY, RUN)
    version, key_id, payload, signature = token.split(".")
    changed = json.loads(unb64(payload))
    changed["mfb"] = 1 << 40
    assert "signature" in refusal(".".join([version, key_id, b64(json.dumps(changed).encode()), signature]))[1]
    assert "signature" in refusal(token[:-2] + ("AA" if token[-2:] != "AA" else "BB"))[1]
    assert refusal(token + "x")[0] == BAD_GRANT


def test_an_expired_grant_is_refused_at_its_expiry():
    token = mint("k1", KEY, RUN)
    assert verify(token, KEYS, RUN.expires - 1) == RUN
    assert refusal(token, now=RUN.expires) == (GRANT_EXPIRED, "the data grant expired: read a fresh one from the "
                                               "run's status")


def test_an_egress_credential_never_opens_the_data_service_nor_a_grant_the_proxy():
    egress = credential.mint("k1", KEY, credential.Grant("team-a", "job-1", "0f1e-22", "default", (), NOW + 60))
    assert credential.verify(egress, KEYS, NOW).uid == "0f1e-22"  # the control: the same key opens the proxy
    reason, message = refusal(egress)
    assert reason == BAD_GRANT and "not a coderun data grant" in message
    # The same payload under the version d1, signed by the same key: still not a grant of any kind.
    _, key_id, payload, _ = egress.split(".")
    body = f"d1.{key_id}.{payload}"
    assert refusal(f"{body}.{b64(sign(KEY, body))}")[0] == BAD_GRANT
    with pytest.raises(credential.CredentialRefused, match="not a coderun egress token"):
        credential.verify(mint("k1", KEY, RUN), KEYS, NOW)


def test_a_token_over_the_cap_is_refused_before_it_is_decoded():
    token = mint("k1", KEY, RUN)
    padded = token + "A" * (MAX_TOKEN_CHARS + 1 - len(token))
    assert refusal(padded) == (BAD_GRANT, f"the data grant is longer than {MAX_TOKEN_CHARS} characters")
    # A grant too large to fit is refused where it is minted, not handed out.
    many = dataclasses.replace(RUN, inputs=tuple(dataclasses.replace(OBJ, key="k" * 1000) for _ in range(16)))
    with pytest.raises(ValueError, match="above 16000"):
        mint("k1", KEY, many)
    # a read grant names the run's prefix, not each artifact: it stays small however many the run stored
    assert len(mint("k1", KEY, READ)) < 300


def signed(payload) -> str:
    body = f"d1.k1.{b64(json.dumps(payload).encode())}"
    return f"{body}.{b64(sign(KEY, body))}"


def good_payload(grant) -> dict:
    return json.loads(unb64(mint("k1", KEY, grant).split(".")[2]))


@pytest.mark.parametrize("grant,field,value", [
    (RUN, "k", "write"), (RUN, "ns", "Team_A"), (RUN, "ns", 7), (RUN, "exp", "soon"), (RUN, "exp", True),
    (RUN, "uid", "../x"), (RUN, "name", ""), (RUN, "mfb", -1), (RUN, "mf", 1.5), (RUN, "ap", "runs/no-slash"),
    (RUN, "b", "A"), (RUN, "in", [["coderun", "k", 1, "AB" * 32]]), (RUN, "in", [["coderun", "k", -1, SHA]]),
    (RUN, "in", [["coderun", "", 1, SHA]]), (RUN, "in", [["coderun", "k\u0000", 1, SHA]]),
    (RUN, "in", [["coderun", "k" * 1025, 1, SHA]]), (RUN, "in", [["coderun", "k", 1]]), (RUN, "in", {"0": 1}),
    (RUN, "in", [["coderun", "k", 1, SHA + "\n"]]),
    (UPLOAD, "f", [["", 3]]), (UPLOAD, "f", [[SHA, "3"]]), (UPLOAD, "f", [[SHA]]),
    (READ, "p", "runs/no-slash"), (READ, "p", ""), (READ, "p", 3), (READ, "b", "A"), (READ, "uid", "../x"),
])
def test_every_field_of_a_signed_payload_is_checked(grant, field, value):
    payload = good_payload(grant)
    assert verify(signed(payload), KEYS, NOW) == grant  # the control: the payload as minted, re-signed
    payload[field] = value
    reason, message = refusal(signed(payload))
    assert reason == BAD_GRANT and "malformed" in message
    with pytest.raises(ValueError):  # what the service would refuse, mint refuses to make
        mint("k1", KEY, dataclasses.replace(grant, **{"namespace": "Team_A"}))


def test_a_payload_missing_a_field_or_not_an_object_is_refused():
    payload = good_payload(RUN)
    del payload["uid"]
    assert "malformed" in refusal(signed(payload))[1]
    assert "malformed" in refusal(signed([1, 2]))[1]
    body = "d1.k1." + b64(b"{not json")
    assert "malformed" in refusal(f"{body}.{b64(sign(KEY, body))}")[1]


@pytest.mark.parametrize("name,problem", [
    ("", "it is empty"), ("/etc/passwd", "it is absolute"), ("a/../b", "it has an empty, '.' or '..' segment"),
    ("..", "it has an empty, '.' or '..' segment"), ("./a", "it has an empty, '.' or '..' segment"),
    ("a//b", "it has an empty, '.' or '..' segment"), ("dir/", "it has an empty, '.' or '..' segment"),
    ("a\0b", "it holds a NUL character"), ("x" * 1025, "it is longer than 1024 characters"),
    ("out/plot.png", None), ("..hidden/.x", None), ("x" * 1024, None), ("données é.csv", None),
])
def test_artifact_names(name, problem):
    assert artifact_name_problem(name) == problem
