"""Bytes in and out through coderun's data plane against a plain copy with the store's own client, on the running
local cluster as users install it (`make bench-data`: the chart's store, data service and operator; issue 37,
docs/data.md). Its figures are in docs/testing.md.

For each size (10 MB, 100 MB, 1 GiB), one at a time, on this node (the cluster's only one), each figure the median
of 3 (--repeat; 1 GiB once):
  plain put / get: boto3 (the store's own client, its defaults: multipart, 8 MiB parts, 10 threads) from the host
       straight to the store's Service with the store's own credentials: upload_file then download_file of the
       same random bytes, file to file;
  upload (caller -> data service -> store): the SDK's send_uploads for a run waiting for its file, timed from
       the moment the run asks for it to the data service's answer (the SDK's hashing of the file beforehand is
       not in it);
  fetch (store -> data service -> sandbox): the runner lays the input out before the program starts; no status
       field times that alone, so it is estimated as the time from the runner's start (status.startTime +
       metrics.startupMillis) to the program's first line (its own clock, printed) minus the same for a run whose
       input is 1 MiB, uploaded the same way;
  store (sandbox -> data service -> store): the runner stores artifacts after the program ended, and nothing
       times that alone either: estimated as the run's time outside its program (totalMillis - queue - startup -
       wall: the runner's work, its frame, the operator's checks and status write) for a run whose program writes
       the bytes to $CODERUN_OUTPUT_DIR (8 MiB blocks of os.urandom, inside its own wall time) minus the same for a
       run writing 1 MiB (its noise is the operator's reaction time: said when a figure is within it);
  download (store -> data service -> caller): the SDK's client.artifact(result, name, path=...), checked against
       the run's sha256 as it streams.
An artifact is at most 512 MiB (the API's cap on data.artifacts.maxFileBytes): "1 GiB out" is two files of 512 MiB.
Meanwhile every 0.5 s: each operator replica's process_resident_memory_bytes (its metrics port, by pod IP) and each
data service process's VmRSS (it has no metrics endpoint: /proc of its process on this host, found by its pod's
cgroup); the peak per size.

Targets (issue 37): every coderun figure >= 50% of the plain copy's same direction (put for upload and store, get
for fetch and download); the operator's peak RSS within +-20 MiB across sizes. Prints whether each holds.
"""
from __future__ import annotations

import argparse
import base64
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(1, str(REPO / "e2e"))  # e2e/, after e2e/bench/ (its neighbours)
from conftest import NAMESPACE_LABELS, ChartOperator, Cluster, wait_for  # noqa: E402
from framework.policy import apply_policy  # noqa: E402
from memory import KUBECONFIG, scrape  # noqa: E402
from coderun.client import CodeRunClient  # noqa: E402
from coderun.client.inputs import split_files, with_inputs  # noqa: E402
from coderun.client.request import RunRequest  # noqa: E402
from coderun.client.waiting import DEFAULT_WAIT_SECONDS  # noqa: E402

MB, MiB, GiB = 1000 * 1000, 1 << 20, 1 << 30
SIZES = {"10 MB": 10 * MB, "100 MB": 100 * MB, "1 GiB": GiB}
SMALL = MiB  # past the inline caps (256 KiB): it takes the same way, only shorter
MAX_ARTIFACT = 512 * MiB  # the API's cap on data.artifacts.maxFileBytes
SYSTEM = ChartOperator.namespace
POLICY = {
    "admission": "Record",
    "maximums": {"memory": "2Gi", "disk": "2Gi", "timeoutSeconds": 900},
    "data": {"maxInputBytes": GiB, "maxInputsTotalBytes": 2 * GiB,
             "artifacts": {"maxFiles": 4, "maxFileBytes": MAX_ARTIFACT, "maxTotalBytes": GiB}},
}
LIMITS = {"cpu": "1", "memory": "1Gi", "disk": "1536Mi", "timeoutSeconds": 600}
READ = "import time\nstarted = time.time()\nimport os\nprint(started, os.path.getsize('blob'))"
WRITE = """import os
out, block = os.environ["CODERUN_OUTPUT_DIR"], 8 << 20
for name, size in FILES:
    with open(os.path.join(out, name), "wb") as f:
        while size:
            f.write(os.urandom(min(block, size)))
            size -= min(block, size)
"""


def random_file(directory: Path, size: int) -> Path:
    path = directory / f"blob-{size}"
    with path.open("wb") as out:
        left = size
        while left:
            out.write(os.urandom(min(8 * MiB, left)))
            left -= min(8 * MiB, left)
    return path


def mb_per_s(size: int, seconds: float) -> float:
    return size / seconds / MB if seconds > 0 else float("inf")


class Peaks:
    """Samples the operator replicas' and the data service processes' resident memory every 0.5 s; the peak of
    each while a phase (a size) is current."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.phase: str | None = None
        self.operator: dict[str, float] = {}
        self.data: dict[str, float] = {}
        self.samples = 0
        self.misses: list[str] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _pods(self, component: str) -> list:
        return [p for p in self.cluster.core.list_namespaced_pod(
            SYSTEM, label_selector=f"app.kubernetes.io/instance=coderun,app.kubernetes.io/component={component}").items
            if p.status.pod_ip and not p.metadata.deletion_timestamp]

    def _data_pids(self) -> list[int]:
        """The data service's processes on this host: `python -m coderun_operator.data` in a data pod's cgroup."""
        uids = [p.metadata.uid.replace("-", "_") for p in self._pods("data")]
        uids += [p.metadata.uid for p in self._pods("data")]
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if b"coderun_operator.data" not in (entry / "cmdline").read_bytes():
                    continue
                cgroup = (entry / "cgroup").read_text()
            except OSError:
                continue
            if any(uid in cgroup for uid in uids):
                pids.append(int(entry.name))
        return pids

    def _loop(self) -> None:
        operator_urls = [f"http://{p.status.pod_ip}:9108/metrics" for p in self._pods("operator")]
        data_pids = self._data_pids()
        if not data_pids:
            self.misses.append("no data service process found on this host")
        while not self.stopped.wait(0.5):
            phase = self.phase
            if phase is None:
                continue
            operator_mib = []
            for url in operator_urls:
                try:
                    operator_mib.append(scrape(url)["process_resident_memory_bytes"] / MiB)
                except Exception as e:  # a replica gone is a figure missing, said below, never a crash
                    self.misses.append(f"{url}: {type(e).__name__}")
            data_mib = []
            for pid in data_pids:
                try:
                    rss = [line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                           if line.startswith("VmRSS:")][0]
                    data_mib.append(int(rss.split()[1]) / 1024)
                except (OSError, IndexError):
                    self.misses.append(f"data pid {pid} gone")
            self.samples += 1
            if operator_mib:
                self.operator[phase] = max(self.operator.get(phase, 0.0), max(operator_mib))
            if data_mib:
                self.data[phase] = max(self.data.get(phase, 0.0), max(data_mib))

    def __enter__(self) -> "Peaks":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join(5)


class Store:
    """boto3 straight to the store's Service, with the store's own credentials (the Secret coderun-store)."""

    def __init__(self, cluster: Cluster):
        secret = cluster.core.read_namespaced_secret("coderun-store", SYSTEM).data
        value = {k: base64.b64decode(v).decode() for k, v in secret.items()}
        service = cluster.core.read_namespaced_service("coderun-store", SYSTEM)
        port = value["endpoint"].rsplit(":", 1)[1].strip("/")
        self.endpoint = f"http://{service.spec.cluster_ip}:{port}"
        self.bucket = os.environ.get("CODERUN_STORE_BUCKET", "coderun")
        self.s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name=value["region"],
                               aws_access_key_id=value["access-key-id"],
                               aws_secret_access_key=value["secret-access-key"],
                               config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}))

    def copy(self, path: Path, key: str, back: Path) -> tuple[float, float]:
        """Seconds to put `path` at `key`, and to get it back into `back`."""
        config = TransferConfig()  # boto3's defaults: what a plain copy with the store's client does
        started = time.monotonic()
        self.s3.upload_file(str(path), self.bucket, key, Config=config)
        put = time.monotonic() - started
        started = time.monotonic()
        self.s3.download_file(self.bucket, key, str(back), Config=config)
        get = time.monotonic() - started
        assert back.stat().st_size == path.stat().st_size
        back.unlink()
        self.s3.delete_object(Bucket=self.bucket, Key=key)
        return put, get

    def remove(self, prefix: str) -> int:
        """Delete every object under `prefix`; how many there were."""
        keys = [o["Key"] for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                                      Prefix=prefix)
                for o in page.get("Contents", [])]
        for key in keys:
            self.s3.delete_object(Bucket=self.bucket, Key=key)
        return len(keys)


def outside_program(result) -> float:
    """Seconds of the run outside its program: created -> status written, less the wait for a pod, the pod's
    start and the program itself."""
    m = result.metrics
    return (m.total_millis - (m.queue_millis or 0) - (m.startup_millis or 0) - (m.wall_millis or 0)) / 1000


def before_program(result) -> float:
    """Seconds from the runner's start (the pod's creation, status.startTime, plus metrics.startupMillis) to the
    program's first line (its own clock, printed: the same host clock under gVisor): the inputs' fetch and layout
    with the runner's other work before the program and the interpreter's start."""
    started = datetime.fromisoformat(result.start_time.replace("Z", "+00:00")).timestamp()
    return float(result.stdout.split()[0]) - started - result.metrics.startup_millis / 1000


def run_in(client: CodeRunClient, path: Path) -> tuple[float, float]:
    """A run whose input is `path`: (seconds of its upload, seconds before its program's first line)."""
    _, uploads = split_files({"blob": path})
    spec = with_inputs(RunRequest(code=READ).to_spec(LIMITS), [], uploads)
    created = client.create(spec)
    waiting = client.wait_for(created.name, lambda r: r.upload is not None, timeout=120)
    assert waiting.upload is not None, (waiting.phase, waiting.reason, waiting.message)
    started = time.monotonic()
    client.send_uploads(waiting, uploads, timeout=120)
    uploaded = time.monotonic() - started
    result = client.wait(created.name, timeout=DEFAULT_WAIT_SECONDS + 900)
    size = path.stat().st_size
    assert result.phase == "Succeeded" and result.stdout.split()[1] == str(size), (
        result.reason, result.message, result.stdout, (result.stderr or "")[-500:])
    assert result.inputs[0].size == size, result.inputs
    client.delete(result.name)
    return uploaded, before_program(result)


def run_out(client: CodeRunClient, size: int, directory: Path) -> tuple[float, float, int]:
    """A run whose program writes `size` bytes (files of at most 512 MiB): (seconds outside its program, seconds to
    download every file with the SDK, files)."""
    files = [(f"out-{i}.bin", min(MAX_ARTIFACT, size - i * MAX_ARTIFACT))
             for i in range((size + MAX_ARTIFACT - 1) // MAX_ARTIFACT)]
    result = client.run(WRITE.replace("FILES", repr(files)), limits=LIMITS, wait_timeout=DEFAULT_WAIT_SECONDS + 900)
    assert result.phase == "Succeeded", (result.reason, result.message, (result.stderr or "")[-500:],
                                         result.artifacts_skipped)
    stored = {a.name: a for a in result.artifacts or ()}
    assert set(stored) == {name for name, _ in files} and all(a.stored for a in stored.values()), \
        (result.artifacts, result.artifacts_skipped)
    started = time.monotonic()
    for name, file_size in files:
        got = client.artifact(result, name, path=directory / name)
        assert got.stat().st_size == file_size
        got.unlink()
    downloaded = time.monotonic() - started
    client.delete(result.name)
    return outside_program(result), downloaded, len(files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--repeat", type=int, default=3, help="each size below 1 GiB, each way (median)")
    parser.add_argument("--small-runs", type=int, default=5, help="runs of 1 MiB each way, the baseline (median)")
    args = parser.parse_args()
    cluster = Cluster()
    store = Store(cluster)
    namespace = f"bench-data-{uuid.uuid4().hex[:5]}"
    cluster.core.create_namespace({"metadata": {"name": namespace, "labels": NAMESPACE_LABELS}})
    rows = []
    try:
        apply_policy(cluster, namespace, "default", POLICY)
        client = CodeRunClient(namespace, kubeconfig=str(KUBECONFIG), client_name="bench-data")
        with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp, Peaks(cluster) as peaks:
            directory = Path(tmp)
            peaks.phase = "1 MiB"
            small_in = [run_in(client, random_file(directory, SMALL))[1] for _ in range(args.small_runs)]
            small_out = [run_out(client, SMALL, directory)[0] for _ in range(args.small_runs)]
            base_in, base_out = statistics.median(small_in), statistics.median(small_out)
            # an estimate no larger than this is lost in the run-to-run spread of the runs it is measured against
            noise = {"fetch": max(small_in) - min(small_in), "store": max(small_out) - min(small_out)}
            print(f"1 MiB runs (median of {args.small_runs}): runner start -> program {base_in:.2f} s "
                  f"{sorted(round(s, 2) for s in small_in)}, outside the program {base_out:.2f} s "
                  f"{sorted(round(s, 2) for s in small_out)}", flush=True)
            for label in args.sizes:
                size = SIZES[label]
                peaks.phase = label
                times: dict[str, list[float]] = {}
                # each repeat with bytes of its own: an upload the store holds already is answered at once
                for _ in range(args.repeat if size < GiB else 1):
                    path = random_file(directory, size)
                    put, get = store.copy(path, f"bench/{namespace}/{size}", directory / "back")
                    upload, before = run_in(client, path)
                    path.unlink()
                    outside, download, files = run_out(client, size, directory)
                    for key, value in (("put", put), ("get", get), ("upload", upload), ("fetch", before - base_in),
                                       ("store", outside - base_out), ("download", download)):
                        times.setdefault(key, []).append(value)
                seconds = {key: statistics.median(values) for key, values in times.items()}
                row = {"label": label, "size": size, "files": files,
                       "noise": [k for k in ("fetch", "store") if seconds[k] <= noise[k]],
                       **{key: mb_per_s(size, value) for key, value in seconds.items()}}
                rows.append(row)
                print(f"{label}: seconds (each the median of {len(times['put'])}) "
                      + " ".join(f"{key}{'~' * (key in noise)} {value:.2f}" for key, value in seconds.items())
                      + f" ({files} file{'s' * (files > 1)} out)", flush=True)
            time.sleep(1)  # not synchronisation: one more sample of the last size's memory after its runs
            peaks.phase = None
    finally:
        cluster.core.delete_namespace(namespace, propagation_policy="Background")
        wait_for(lambda: not any(n.metadata.name == namespace for n in cluster.core.list_namespace().items), 600,
                 "the bench's namespace to be deleted")
        # the operator deletes a run's objects with the run; uploads are not expired yet (docs/data.md): the
        # bench takes its own away, and says if a run's were left
        left = store.remove(f"runs/{namespace}/")
        print(f"the bench's uploads removed from the store ({store.remove(f'uploads/{namespace}/')} objects); "
              f"runs' objects left after their runs were deleted: {left}")
    report(rows, peaks)


def report(rows: list[dict], peaks: Peaks) -> None:
    print(f"\none at a time on this node; MB/s = 10^6 bytes/s; plain = boto3 to the store's Service "
          f"(upload_file/download_file, its defaults); sandbox {LIMITS['cpu']} CPU, gVisor")
    print(f"{'size':>7} | {'plain put':>9} {'plain get':>9} | {'upload':>7} {'fetch~':>7} | {'store~':>7} "
          f"{'download':>8} | {'worst ratio':>11} | {'operator RSS':>12} {'data svc RSS':>12}")
    ratios = []
    for row in rows:
        pairs = {"upload": row["upload"] / row["put"], "fetch": row["fetch"] / row["get"],
                 "store": row["store"] / row["put"], "download": row["download"] / row["get"]}
        pairs = {k: v for k, v in pairs.items() if k not in row["noise"]}
        worst = min(pairs, key=pairs.get)
        ratios.append((row["label"], pairs, row["noise"]))
        shown = {k: "noise" if k in row["noise"] else f"{row[k]:.0f}" for k in ("fetch", "store")}
        print(f"{row['label']:>7} | {row['put']:9.0f} {row['get']:9.0f} | {row['upload']:7.0f} {shown['fetch']:>7} | "
              f"{shown['store']:>7} {row['download']:8.0f} | {worst:>8} {pairs[worst]:.0%} | "
              f"{peaks.operator.get(row['label'], float('nan')):8.1f} MiB {peaks.data.get(row['label'], float('nan')):8.1f} MiB")
    print("in: upload = caller -> data service -> store (the SDK, timed); fetch~ = store -> sandbox, estimated (the "
          "runner's start to the program's first line, less a 1 MiB input's).\nout: store~ = sandbox -> store, "
          "estimated (the run's time outside its program, less a 1 MiB artifact's); download = store -> caller (the "
          "SDK, timed, sha256 checked). 1 GiB out is two artifacts of 512 MiB.")
    for label, pairs, lost in ratios:
        print(f"  {label}: " + ", ".join(f"{k} {v:.0%} of plain {'put' if k in ('upload', 'store') else 'get'}"
                                        for k, v in pairs.items())
              + "".join(f", {k} not measurable (within the 1 MiB runs' spread)" for k in lost))
    held = all(v >= 0.5 for _, pairs, _ in ratios for v in pairs.values())
    print(f"target >= 50% of the store's own throughput (the figures measured): {'HOLDS' if held else 'MISSED'}")
    operator = [peaks.operator[r["label"]] for r in rows if r["label"] in peaks.operator]
    if operator:
        # flat: every size's peak within 20 MiB of the smallest size's
        drift = max(abs(v - operator[0]) for v in operator)
        print(f"operator peak RSS (the larger of its replicas) across sizes: {min(operator):.1f}..{max(operator):.1f} "
              f"MiB, at most {drift:.1f} MiB from the {rows[0]['label']} figure (1 MiB runs: "
              f"{peaks.operator.get('1 MiB', float('nan')):.1f} MiB); target +-20 MiB: "
              f"{'HOLDS' if drift <= 20 else 'MISSED'}")
    data = [peaks.data[r["label"]] for r in rows if r["label"] in peaks.data]
    if data:
        print(f"data service peak RSS across sizes: {min(data):.1f}..{max(data):.1f} MiB "
              f"(1 MiB runs: {peaks.data.get('1 MiB', float('nan')):.1f} MiB)")
    print(f"({peaks.samples} samples; {len(peaks.misses)} missed{': ' + peaks.misses[0] if peaks.misses else ''})")


if __name__ == "__main__":
    main()
