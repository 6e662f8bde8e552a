"""The webhook's own certificate (created once, shared, renewed, recreated when deleted), the caBundle kept equal
to it, a rotated certificate served without a restart, and request bodies bounded before they are read."""
import asyncio
import base64
import datetime
import ssl
import threading
import urllib.parse

import pytest
from cryptography import x509

from coderun_operator import webhook_server
from coderun_operator.webhook_server import (MAX_REVIEW_BYTES, BoundedWebhookServer, ServingCertificate,
                                                 bundle_from_secret, ensure_bundle, issue, needs_renewal,
                                                 service_names, sync_ca_bundle, write_files)
from fake_k8s import Conflict, FakeK8s, Refused

NOW = datetime.datetime(2026, 11, 23, tzinfo=datetime.timezone.utc)
HOSTS = service_names("coderun-webhook.coderun-system.svc")


def test_the_certificate_names_the_service_and_is_signed_by_its_ca():
    bundle = issue(HOSTS, NOW)
    cert, ca = x509.load_pem_x509_certificate(bundle.cert), x509.load_pem_x509_certificate(bundle.ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)
    assert names == ["coderun-webhook.coderun-system.svc", "coderun-webhook.coderun-system", "coderun-webhook"]
    cert.verify_directly_issued_by(ca)
    assert not needs_renewal(bundle, HOSTS, NOW)
    assert needs_renewal(bundle, HOSTS, NOW + webhook_server.VALIDITY - datetime.timedelta(days=10))
    assert needs_renewal(bundle, ["other.ns.svc"], NOW)
    assert needs_renewal(issue(HOSTS, NOW).__class__(bundle.ca, issue(HOSTS, NOW).cert, bundle.key), HOSTS, NOW)
    assert needs_renewal(bundle_from_secret({"data": {"ca.crt": "not base64!"}}), HOSTS, NOW)


def test_the_secret_is_created_once_and_shared():
    api = FakeK8s()
    first = ensure_bundle(api, "ns", "tls", HOSTS, NOW)
    secret = api.objects[("Secret", "ns", "tls")]
    assert secret["type"] == "kubernetes.io/tls" and bundle_from_secret(secret) == first
    assert ensure_bundle(api, "ns", "tls", HOSTS, NOW + datetime.timedelta(days=1)) == first  # another replica
    assert api.calls.count("write_secret") == 1


def test_a_deleted_or_expiring_secret_is_issued_again():
    api = FakeK8s()
    first = ensure_bundle(api, "ns", "tls", HOSTS, NOW)
    del api.objects[("Secret", "ns", "tls")]
    second = ensure_bundle(api, "ns", "tls", HOSTS, NOW)
    assert second.ca != first.ca and bundle_from_secret(api.objects[("Secret", "ns", "tls")]) == second
    third = ensure_bundle(api, "ns", "tls", HOSTS, NOW + webhook_server.VALIDITY - datetime.timedelta(days=1))
    assert third.ca != second.ca


def test_a_replica_that_loses_the_race_takes_the_winners_certificate():
    api = FakeK8s()
    winner = issue(HOSTS, NOW)

    def someone_else_first(namespace, name):
        api.fail.pop("write_secret")
        api.objects[("Secret", namespace, name)] = api._stamp({**winner.secret(), "metadata": {"name": name}})
        raise Conflict("409")

    api.fail["write_secret"] = someone_else_first
    assert ensure_bundle(api, "ns", "tls", HOSTS, NOW) == winner


def configuration(ca_bundle=None):
    hooks = [{"name": n, "clientConfig": {"service": {"name": "coderun-webhook"}}} for n in ("run", "policy")]
    if ca_bundle:
        for hook in hooks:
            hook["clientConfig"]["caBundle"] = ca_bundle
    return {"metadata": {"name": "coderun"}, "webhooks": hooks}


def test_the_ca_bundle_follows_the_served_ca():
    api = FakeK8s()
    api.objects[("ValidatingWebhookConfiguration", "", "coderun")] = configuration("c3RhbGU=")
    bundle = issue(HOSTS, NOW)
    assert sync_ca_bundle(api, "coderun", bundle.ca)
    hooks = api.objects[("ValidatingWebhookConfiguration", "", "coderun")]["webhooks"]
    assert {h["clientConfig"]["caBundle"] for h in hooks} == {base64.b64encode(bundle.ca).decode()}
    assert hooks[0]["clientConfig"]["service"] == {"name": "coderun-webhook"}
    assert not sync_ca_bundle(api, "coderun", bundle.ca)
    assert not sync_ca_bundle(FakeK8s(), "missing", bundle.ca)


def test_a_deleted_secret_is_recreated_and_the_ca_bundle_follows(tmp_path):
    api = FakeK8s()
    api.objects[("ValidatingWebhookConfiguration", "", "coderun")] = configuration()
    env = {"CODERUN_WEBHOOK_PORT": "0", "CODERUN_WEBHOOK_HOST": HOSTS[0], "CODERUN_WEBHOOK_SECRET": "tls",
           "POD_NAMESPACE": "ns", "CODERUN_WEBHOOK_CONFIGURATION": "coderun", "CODERUN_WEBHOOK_TLS_DIR": str(tmp_path)}
    certificate = ServingCertificate(env, api, now=lambda: NOW)
    server = certificate.server()
    assert server.certfile == server.pkeyfile == str(tmp_path / "tls.pem")
    served = (tmp_path / "ca.crt").read_bytes()
    stop = threading.Event()
    stop.set()  # one pass, then return
    certificate.keep_fresh(stop)
    hooks = api.objects[("ValidatingWebhookConfiguration", "", "coderun")]["webhooks"]
    assert hooks[0]["clientConfig"]["caBundle"] == base64.b64encode(served).decode()
    del api.objects[("Secret", "ns", "tls")]
    certificate.refresh()
    rotated = (tmp_path / "ca.crt").read_bytes()
    assert rotated != served and bundle_from_secret(api.objects[("Secret", "ns", "tls")]).ca == rotated
    assert hooks[0]["clientConfig"]["caBundle"] == base64.b64encode(rotated).decode()


def test_a_refused_ca_bundle_patch_neither_stops_the_start_nor_the_loop(tmp_path):
    api = FakeK8s()

    def forbidden(name):
        raise Refused(f"ValidatingWebhookConfiguration {name}: 403 forbidden", 403)

    api.fail["read_webhook_configuration"] = forbidden
    env = {"CODERUN_WEBHOOK_PORT": "0", "CODERUN_WEBHOOK_HOST": HOSTS[0], "CODERUN_WEBHOOK_SECRET": "tls",
           "POD_NAMESPACE": "ns", "CODERUN_WEBHOOK_CONFIGURATION": "coderun", "CODERUN_WEBHOOK_TLS_DIR": str(tmp_path)}
    certificate = ServingCertificate(env, api, now=lambda: NOW)
    assert certificate.server().certfile == str(tmp_path / "tls.pem")
    stop = threading.Event()
    stop.set()
    certificate.keep_fresh(stop)  # logged, not raised
    assert api.calls.count("read_webhook_configuration") == 1


def test_host_mode_makes_its_own_certificate_and_files_mode_uses_the_files(tmp_path):
    host_mode = ServingCertificate({"CODERUN_WEBHOOK_HOST": "127.0.0.1", "CODERUN_WEBHOOK_TLS_DIR": str(tmp_path)},
                                   FakeK8s())
    certfile, keyfile, cafile = host_mode.files()
    assert b"PRIVATE KEY" in open(keyfile, "rb").read() and b"CERTIFICATE" in open(cafile, "rb").read()
    files = ServingCertificate({"CODERUN_WEBHOOK_CERT": "/m/tls.crt", "CODERUN_WEBHOOK_KEY": "/m/tls.key",
                                "CODERUN_WEBHOOK_CA": "/m/ca.crt"}, FakeK8s())
    assert files.files() == ("/m/tls.crt", "/m/tls.key", "/m/ca.crt")


async def _served_certificate(port: int, ca: bytes) -> bytes:
    context = ssl.create_default_context(cadata=ca.decode())
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return der


async def _post(port: int, ca: bytes, headers: dict[str, str], body: bytes) -> int:
    context = ssl.create_default_context(cadata=ca.decode())
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(f"POST /validate-run HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{lines}\r\n".encode() + body)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    writer.close()
    return status


def test_a_rotated_certificate_is_served_without_a_restart_and_bodies_are_bounded(tmp_path):
    first = issue(["127.0.0.1"], NOW)
    certfile, cafile = write_files(first, str(tmp_path))

    async def review(request, **_):
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": request["request"]["uid"], "allowed": True}}

    async def scenario():
        server = BoundedWebhookServer(addr="127.0.0.1", host="127.0.0.1", port=0, certfile=certfile,
                                      pkeyfile=certfile, cafile=cafile, file_check_interval=0.05)
        serving = server(review).__aiter__()
        url = (await serving.__anext__())["url"]
        port = urllib.parse.urlsplit(url).port
        try:
            assert await _served_certificate(port, first.ca) == x509.load_pem_x509_certificate(
                first.cert).public_bytes(ssl_der())
            body = b'{"request": {"uid": "u1"}}'
            assert await _post(port, first.ca, {"Content-Length": str(len(body))}, body) == 200
            assert await _post(port, first.ca, {"Content-Length": str(MAX_REVIEW_BYTES + 1)}, b"{}") == 413
            assert await _post(port, first.ca, {"Transfer-Encoding": "chunked"}, b"2\r\n{}\r\n0\r\n\r\n") == 411
            restarted = asyncio.ensure_future(serving.__anext__())
            await asyncio.sleep(0)  # let kopf take the files' digest before they change
            second = issue(["127.0.0.1"], NOW)
            write_files(second, str(tmp_path))
            # kopf yields again once it serves the new files (on a new port: this test lets it pick one)
            port = urllib.parse.urlsplit((await asyncio.wait_for(restarted, timeout=10))["url"]).port
            assert await _served_certificate(port, second.ca) == x509.load_pem_x509_certificate(
                second.cert).public_bytes(ssl_der())
        finally:
            await serving.aclose()

    asyncio.run(scenario())


def ssl_der():
    from cryptography.hazmat.primitives.serialization import Encoding
    return Encoding.DER


@pytest.mark.parametrize("host, names", [("svc.ns.svc", ["svc.ns.svc", "svc.ns", "svc"]), ("127.0.0.1", ["127.0.0.1"])])
def test_service_names(host, names):
    assert service_names(host) == names
