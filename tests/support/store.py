"""A real S3-compatible store on loopback for the unit tier: the versitygw the cluster runs (built by `make
store-server`, cached), on a free port of 127.0.0.1 over a temporary dir. No stand-in speaks S3 here."""
from __future__ import annotations

import os
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

CACHE = Path(os.environ.get("CODERUN_CACHE", Path.home() / ".cache" / "coderun"))
ACCESS, SECRET = "coderun-test", "coderun-test-secret-0123456789"


def versitygw() -> Path:
    version = next(line.split("=", 1)[1].split()[0] for line in
                   (Path(__file__).parents[2] / "e2e/cluster/versions.sh").read_text().splitlines()
                   if line.startswith("VERSITYGW_VERSION="))
    binary = CACHE / "bin" / f"versitygw-{version}" / "versitygw"
    if not binary.exists():  # `make test-unit` builds it first; a bare pytest builds it here (cached after)
        subprocess.run(["bash", "e2e/cluster/build-binaries.sh", "versitygw"], cwd=Path(__file__).parents[2], check=True)
    return binary


@dataclass
class Store:
    endpoint: str
    process: subprocess.Popen[bytes]

    def client(self) -> Any:
        from coderun_operator.data.store import StoreSettings, client
        return client(StoreSettings(self.endpoint, "us-east-1", ACCESS, SECRET))

    def secret_data(self) -> dict[str, str]:
        """The store's Secret as the API server returns it (base64 values)."""
        import base64
        values = {"endpoint": self.endpoint, "region": "us-east-1", "access-key-id": ACCESS,
                  "secret-access-key": SECRET}
        return {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}


@contextmanager
def running_store(root: Path, buckets: tuple[str, ...] = ("coderun",)) -> Iterator[Store]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (root / "data").mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen([str(versitygw()), "--access", ACCESS, "--secret", SECRET, "--port",
                                f"127.0.0.1:{port}", "posix", str(root / "data")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:  # ready once it accepts a connection (polled, bounded)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, "versitygw exited at start"
                assert time.monotonic() < deadline, "versitygw did not listen within 20 s"
                time.sleep(0.05)
        store = Store(f"http://127.0.0.1:{port}", process)
        s3 = store.client()
        for bucket in buckets:
            s3.create_bucket(Bucket=bucket)
        yield store
    finally:
        process.terminate()
        process.wait(10)


DATA_KEY = b"k" * 32


def install_data_plane(api: Any, store: Store) -> Any:
    """What the chart makes for the data plane, in a FakeK8s: the data service's Service and one ready pod, its
    grant key, the store's Secret; and the DataPlane the operator builds from them."""
    import base64
    from coderun_operator.data_plane import DataPlane, DataSettings
    api.objects[("Service", "coderun-system", "coderun-data")] = {
        "metadata": {"name": "coderun-data", "namespace": "coderun-system"},
        "spec": {"selector": {"app": "data"}, "clusterIP": "10.96.0.50",
                 "ports": [{"name": "data", "port": 8080, "targetPort": 8080}]}}
    api.objects[("Pod", "coderun-system", "data-1")] = {
        "metadata": {"name": "data-1", "namespace": "coderun-system", "labels": {"app": "data"}},
        "status": {"podIP": "10.88.0.7", "conditions": [{"type": "Ready", "status": "True"}]}}
    api.objects[("Secret", "coderun-system", "coderun-data-keys")] = {
        "metadata": {"name": "coderun-data-keys"}, "data": {"k1": base64.b64encode(DATA_KEY).decode()}}
    api.objects[("Secret", "coderun-system", "coderun-store")] = {
        "metadata": {"name": "coderun-store"}, "data": store.secret_data()}
    return DataPlane(api, DataSettings("coderun-system", "coderun-data", "coderun-data-keys", "k1", False,
                                       "coderun-system", "coderun-store", "coderun", None))
