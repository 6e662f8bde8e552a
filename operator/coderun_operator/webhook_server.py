"""The validating webhook's HTTPS server: bounded request bodies, and a serving certificate that survives GitOps.

Where the certificate comes from (the chart picks one; environment variables):

- CODERUN_WEBHOOK_SECRET (the chart's default): the operator keeps its own CA and serving certificate in that
  Secret of its namespace: created if absent (the replicas share it, the first writer wins), renewed when it
  nears its end or no longer names the Service, recreated when deleted. Rendering the chart makes no key, so
  every render (each Argo CD or Flux sync) is the same and no private key is ever in a manifest;
- CODERUN_WEBHOOK_CERT / _KEY / _CA: files (cert-manager's Secret, or one of your own, mounted);
- neither (the host-process mode of the local cluster): a certificate made at start, kopf registers it.

With CODERUN_WEBHOOK_CONFIGURATION the leader also keeps that ValidatingWebhookConfiguration's caBundle equal to
the CA it serves under, every REFRESH_SECONDS (a GitOps sync that reverts it is repaired within that time).
kopf restarts its server when the certificate files change (checked every FILE_CHECK_SECONDS), so a rotated
certificate is served without restarting the operator.
"""
from __future__ import annotations

import base64
import datetime
import ipaddress
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

import aiohttp.web
import kopf

from .builders.names import LABEL_MANAGED_BY, MANAGER

if TYPE_CHECKING:
    from .kube_api import KubeApi

log = logging.getLogger("coderun")

# An AdmissionReview of the largest CodeRun the schema admits is well under this (code and stdin 128 KiB each,
# JSON-escaped at most 6x); anything above is refused before it is read or parsed.
MAX_REVIEW_BYTES = 3 * 1024 * 1024
VALIDITY = datetime.timedelta(days=365)
RENEW_BEFORE = datetime.timedelta(days=30)
REFRESH_SECONDS = 30.0
FILE_CHECK_SECONDS = 5.0
SERVING_FILE, CA_FILE = "tls.pem", "ca.crt"  # the key and the certificate in one file: one atomic replace


class BoundedWebhookServer(kopf.WebhookServer):
    """kopf's server, refusing a request body above MAX_REVIEW_BYTES (413) or of unknown length (411) before
    reading it (aiohttp's own cap, 1 MiB, would refuse a legitimate large CodeRun's review)."""

    @staticmethod
    async def _serve(fn: kopf.WebhookFn, request: aiohttp.web.Request) -> aiohttp.web.Response:
        if request.content_length is None:
            raise aiohttp.web.HTTPLengthRequired()
        if request.content_length > MAX_REVIEW_BYTES:
            raise aiohttp.web.HTTPRequestEntityTooLarge(MAX_REVIEW_BYTES, request.content_length)
        return await kopf.WebhookServer._serve(fn, request.clone(client_max_size=MAX_REVIEW_BYTES))


@dataclass(frozen=True)
class Bundle:
    """PEM bytes: the CA the API server trusts, the serving certificate it signed and that certificate's key."""
    ca: bytes
    cert: bytes
    key: bytes

    def secret(self) -> dict[str, Any]:
        data = {"ca.crt": self.ca, "tls.crt": self.cert, "tls.key": self.key}
        return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": {"labels": {LABEL_MANAGED_BY: MANAGER}},
                "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}


def service_names(host: str) -> list[str]:
    """The names the API server may use for the webhook Service: svc.ns.svc, svc.ns, svc (or one address)."""
    names = [host]
    if host.endswith(".svc"):
        service, namespace = host.split(".")[:2]
        names += [f"{service}.{namespace}", service]
    return names


def issue(hosts: list[str], now: datetime.datetime) -> Bundle:
    """A fresh CA and a serving certificate for `hosts` signed by it (the CA's key is not kept: a renewal
    issues both again)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def pem(cert: x509.Certificate) -> bytes:
        return cert.public_bytes(serialization.Encoding.PEM)

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "coderun-webhook-ca")])
    start, end = now - datetime.timedelta(minutes=5), now + VALIDITY
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return Bundle(ca=pem(ca), cert=pem(cert), key=key_pem)


def bundle_from_secret(secret: Mapping[str, Any] | None) -> Bundle | None:
    data = (secret or {}).get("data") or {}
    try:
        return Bundle(*(base64.b64decode(data[k], validate=True) for k in ("ca.crt", "tls.crt", "tls.key")))
    except (KeyError, TypeError, ValueError):
        return None


def needs_renewal(bundle: Bundle | None, hosts: list[str], now: datetime.datetime) -> bool:
    """Missing, unreadable, signed by another CA, near its end, or not naming every host: issue a new one."""
    if bundle is None:
        return True
    from cryptography import x509
    try:
        ca, cert = x509.load_pem_x509_certificate(bundle.ca), x509.load_pem_x509_certificate(bundle.cert)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        named = {str(n.value) for n in names}
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, x509.ExtensionNotFound) as e:
        log.warning("webhook certificate unusable (%s: %s); issuing a new one", type(e).__name__, e)
        return True
    except Exception as e:  # noqa: BLE001 - cryptography's InvalidSignature and friends: not ours, renew
        log.warning("webhook certificate not signed by its CA (%s); issuing a new one", type(e).__name__)
        return True
    return cert.not_valid_after_utc - RENEW_BEFORE <= now or not set(hosts) <= named


def ensure_bundle(api: KubeApi, namespace: str, name: str, hosts: list[str], now: datetime.datetime) -> Bundle:
    """The Secret's bundle, created or renewed if it must be. Replicas racing: the first write wins (create is
    AlreadyExists, replace is a resourceVersion conflict) and the others take what it wrote."""
    for _ in range(3):
        secret = api.read_secret(namespace, name)
        held = bundle_from_secret(secret)
        if held is not None and not needs_renewal(held, hosts, now):
            return held
        fresh = issue(hosts, now)
        version = (secret or {}).get("metadata", {}).get("resourceVersion")
        try:
            api.write_secret(namespace, name, fresh.secret(), version)
        except api.Conflict:
            continue
        log.info("webhook certificate %s/%s %s", namespace, name, "renewed" if secret else "created")
        return fresh
    raise api.Transient(f"Secret {name}: written by someone else three times in a row")


def write_files(bundle: Bundle, directory: str) -> tuple[str, str]:
    """The serving key and certificate (one file) and the CA, each replaced atomically; kopf reloads on change."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    paths = []
    for filename, content in ((CA_FILE, bundle.ca), (SERVING_FILE, bundle.key + bundle.cert)):
        path = os.path.join(directory, filename)
        try:
            with open(path, "rb") as current:
                if current.read() == content:
                    paths.append(path)
                    continue
        except FileNotFoundError:
            pass
        fd, staged = tempfile.mkstemp(dir=directory)
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        os.replace(staged, path)
        paths.append(path)
    ca_path, serving_path = paths
    return serving_path, ca_path


def sync_ca_bundle(api: KubeApi, configuration: str, ca: bytes) -> bool:
    """Point every webhook of the configuration at `ca`; True when it had to change (False: already so, or the
    configuration is not there, e.g. before the chart created it)."""
    found = api.read_webhook_configuration(configuration)
    if found is None:
        log.warning("ValidatingWebhookConfiguration %s not found; its caBundle is set when it appears", configuration)
        return False
    wanted = base64.b64encode(ca).decode()
    hooks = found.get("webhooks") or []
    if all((h.get("clientConfig") or {}).get("caBundle") == wanted for h in hooks):
        return False
    api.set_webhook_ca_bundle(configuration, [h["name"] for h in hooks], wanted)
    log.info("ValidatingWebhookConfiguration %s: caBundle set to the serving CA", configuration)
    return True


class ServingCertificate:
    """The certificate the webhook serves, per the environment (see the module's docstring)."""

    def __init__(self, env: Mapping[str, str], api: KubeApi,
                 now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.timezone.utc)):
        self.env, self.api, self.now = env, api, now
        self.host = env.get("CODERUN_WEBHOOK_HOST", "127.0.0.1")
        self.secret = env.get("CODERUN_WEBHOOK_SECRET")
        self.namespace = env.get("POD_NAMESPACE", "")
        self.configuration = env.get("CODERUN_WEBHOOK_CONFIGURATION")
        self.directory = env.get("CODERUN_WEBHOOK_TLS_DIR") or tempfile.mkdtemp(prefix="coderun-webhook-")
        self.cafile: str | None = None

    def files(self) -> tuple[str, str, str]:
        """(certificate file, key file, CA file) to serve, made or fetched once at start."""
        if self.secret:
            serving, ca = self._from_secret(self.secret)
            return serving, serving, ca
        certfile, keyfile = self.env.get("CODERUN_WEBHOOK_CERT"), self.env.get("CODERUN_WEBHOOK_KEY")
        if certfile and keyfile:
            return certfile, keyfile, self.env.get("CODERUN_WEBHOOK_CA", certfile)
        serving, ca = write_files(issue([self.host], self.now()), self.directory)
        return serving, serving, ca

    def refresh(self) -> None:
        """One pass: the Secret (recreated, renewed) into the files, then the caBundle to match."""
        if self.secret:
            self._from_secret(self.secret)
        self._sync_ca_bundle()

    def _sync_ca_bundle(self) -> None:
        if self.configuration and self.cafile:
            with open(self.cafile, "rb") as ca:
                sync_ca_bundle(self.api, self.configuration, ca.read())

    def keep_fresh(self, stop: threading.Event) -> None:
        """A refresh at once (the caBundle of a fresh install), then every REFRESH_SECONDS until `stop`."""
        while True:
            try:
                self.refresh()
            except Exception as e:  # noqa: BLE001 - the loop must outlive any one pass (API away, a bad file)
                log.warning("webhook certificate refresh: %s: %s", type(e).__name__, str(e)[:300])
            if stop.wait(REFRESH_SECONDS):
                return

    def _from_secret(self, secret: str) -> tuple[str, str]:
        bundle = ensure_bundle(self.api, self.namespace, secret, service_names(self.host), self.now())
        return write_files(bundle, self.directory)

    def server(self) -> BoundedWebhookServer:
        # The caBundle follows in keep_fresh, at once: an API refusal there is logged and retried, and never keeps
        # the operator from starting.
        certfile, keyfile, self.cafile = self.files()
        return BoundedWebhookServer(addr=self.env.get("CODERUN_WEBHOOK_ADDR", self.host),
                                    port=int(self.env["CODERUN_WEBHOOK_PORT"]), host=self.host, certfile=certfile,
                                    pkeyfile=keyfile, cafile=self.cafile, file_check_interval=FILE_CHECK_SECONDS)
