"""Real-size data on the real cluster (issue 37, docs/data.md): a 200 MB CSV in through the SDK, pandas reading it
under a 2 GiB limit, a 50 MB cleaned CSV out through the store, its sha256 in the status equal to the bytes the
SDK returns; an earlier run's artifact as the next run's input; the same in a session; the CLI; the limits said
out loud; and a hostile program that looks for the store, the grant, another run's objects, and a way to change
its input under the pin."""
import hashlib
import json
import subprocess
import sys

import pytest

from coderun.client import CodeRunClient
from conftest import KUBECONFIG
from framework.policy import apply_policy

MiB = 1024 * 1024
ROWS = 8_000_000  # ~200 MB of CSV
POLICY = {
    "admission": "Record",
    "maximums": {"memory": "2Gi", "disk": "512Mi", "timeoutSeconds": 600},
    "data": {"maxInputBytes": 512 * MiB, "maxInputsTotalBytes": 1024 * MiB,
             "artifacts": {"maxFiles": 8, "maxFileBytes": 128 * MiB, "maxTotalBytes": 256 * MiB}},
    "sessions": {"allowed": True, "maxSessions": 2},
}
LIMITS = {"memory": "2Gi", "disk": "256Mi", "timeoutSeconds": 300}

# The seeds' own example: average conversion, and the converted rows as a cleaned CSV.
ANALYSE = """
import os, pandas as pd
df = pd.read_csv("sales.csv")
print(len(df), round(df["converted"].mean(), 6))
df[df["converted"] == 1].to_csv(os.path.join(os.environ["CODERUN_OUTPUT_DIR"], "cleaned.csv"), index=False)
"""


@pytest.fixture(scope="module")
def sales_csv(tmp_path_factory):
    """id,amount,converted: two rows in five converted; written in blocks, never held whole."""
    path = tmp_path_factory.mktemp("data") / "sales.csv"
    digest = hashlib.sha256()
    with path.open("wb") as out:
        header = b"id,amount,converted\n"
        out.write(header)
        digest.update(header)
        for start in range(0, ROWS, 100_000):
            block = "".join(f"{i},{(i * 7919) % 100000 / 100:.2f},{int(i % 5 < 2)}\n"
                            for i in range(start, min(start + 100_000, ROWS))).encode()
            out.write(block)
            digest.update(block)
    return path, digest.hexdigest()


@pytest.fixture
def client(operator, cluster, namespace) -> CodeRunClient:
    apply_policy(cluster, namespace, "default", POLICY)
    return CodeRunClient(namespace, kubeconfig=str(KUBECONFIG), client_name="e2e-data")


def test_a_200_mb_csv_in_and_a_50_mb_artifact_out_pinned_by_their_hashes(client, sales_csv):
    path, sha = sales_csv
    result = client.run(ANALYSE, files={"sales.csv": path}, limits=LIMITS)
    assert (result.phase, result.reason) == ("Succeeded", "Completed"), (result.message, result.stderr[-2000:])
    assert result.stdout.split() == [str(ROWS), "0.4"]
    # the input as it was laid out: its source, size and sha256, the file's own
    [laid] = result.inputs
    assert (laid.path, laid.size, laid.sha256, laid.source) == ("sales.csv", path.stat().st_size, sha,
                                                                  f"upload:{sha}")
    [cleaned] = result.artifacts
    assert cleaned.name == "cleaned.csv" and cleaned.stored and cleaned.size > 50 * 1000 * 1000
    data = client.artifact(result, "cleaned.csv")
    assert len(data) == cleaned.size and hashlib.sha256(data).hexdigest() == cleaned.sha256
    assert data.startswith(b"id,amount,converted\n0,0.0,1\n1,79.19,1\n5,395.95,1\n")
    # the run's memory held the DataFrame, not the upload: the input came from its own volume
    assert result.metrics.max_rss_bytes < 2048 * MiB


def test_an_earlier_runs_artifact_is_the_next_runs_input_without_passing_through_the_caller(client):
    first = client.run("import os\nopen(os.path.join(os.environ['CODERUN_OUTPUT_DIR'], 'ids.txt'), 'w')"
                       ".write('\\n'.join(str(i) for i in range(200000)))", limits=LIMITS)
    assert first.phase == "Succeeded" and first.artifacts[0].stored  # past the inline 256 KiB
    second = client.run("print(sum(int(x) for x in open('ids.txt')))", limits=LIMITS,
                        inputs=[{"path": "ids.txt", "artifact": {"run": first.name, "name": "ids.txt"}}])
    assert (second.phase, second.stdout) == ("Succeeded", f"{sum(range(200000))}\n"), second.message
    assert second.inputs[0].sha256 == first.artifacts[0].sha256
    assert second.inputs[0].source == f"run/{first.name}/ids.txt"


def test_a_session_uploads_once_and_every_later_run_reads_the_file(client, sales_csv):
    path, sha = sales_csv
    with client.session(limits={"memory": "2Gi", "disk": "256Mi"}, keep_state=True) as session:
        uploaded = session.upload({"sales.csv": path}, timeout=120)
        assert uploaded.phase == "Succeeded" and uploaded.inputs[0].sha256 == sha, uploaded.message
        first = session.run("import pandas as pd\ndf = pd.read_csv('sales.csv')\nprint(len(df))", timeout=300)
        assert (first.phase, first.stdout) == ("Succeeded", f"{ROWS}\n"), (first.message, first.stderr[-2000:])
        again = session.run("print(round(df['converted'].mean(), 6))", timeout=120)
        assert (again.phase, again.stdout) == ("Succeeded", "0.4\n"), again.message
        assert again.inputs[0].sha256 == sha


def test_the_cli_sends_a_large_file_and_gets_the_artifact_back(client, namespace, tmp_path):
    big = tmp_path / "numbers.txt"
    big.write_bytes(b"".join(b"%d\n" % i for i in range(400_000)))  # ~2.6 MB: past the inline limit
    cli = [sys.executable, "-m", "coderun.cli", "--kubeconfig", str(KUBECONFIG), "-n", namespace]
    code = ("import os, shutil\nshutil.copy('numbers.txt', os.path.join(os.environ['CODERUN_OUTPUT_DIR'], "
            "'copy.txt'))\nprint(sum(1 for _ in open('numbers.txt')))")
    ran = subprocess.run([*cli, "run", "--keep", "-o", "json", "-c", code, "--file", f"{big}:numbers.txt",
                          "--timeout", "120"], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    status = json.loads(ran.stdout)
    assert status["stdout"] == "400000\n"
    out = tmp_path / "back.txt"
    got = subprocess.run([*cli, "artifacts", "get", status["name"], "copy.txt", "-o", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]
    assert out.read_bytes() == big.read_bytes()


def test_limits_are_loud_a_skipped_artifact_is_named_with_why(client):
    result = client.run("import os\nd = os.environ['CODERUN_OUTPUT_DIR']\n"
                        "open(os.path.join(d, 'big.bin'), 'wb').write(b'x' * (130 * 1024 * 1024))\n"
                        "open(os.path.join(d, 'ok.txt'), 'w').write('fine')", limits=LIMITS)
    assert result.phase == "Succeeded"
    assert [a.name for a in result.artifacts] == ["ok.txt"]
    assert [(s.name, s.why) for s in result.artifacts_skipped] == [("big.bin", "too-large")]
    assert "big.bin" in str(result) and "too-large" in str(result)


@pytest.mark.parametrize("inputs,reason,names", [
    ([{"path": "a.csv", "upload": {"sha256": "0" * 64, "size": 10}}], None, None),  # awaited: checked below
    ([{"path": "a.csv", "s3": {"bucket": "coderun", "key": "runs/elsewhere/x"}}], "InputNotAllowed", "a.csv"),
    ([{"path": "a.csv", "artifact": {"run": "no-such-run", "name": "x"}}], "InputNotAllowed", "no-such-run"),
])
def test_an_input_that_cannot_be_had_ends_with_a_reason_that_names_it(client, inputs, reason, names):
    if reason is None:
        created = client.run("print(1)", inputs=inputs, wait=False, limits=LIMITS)
        waiting = client.wait_for(created.name, lambda r: r.reason == "WaitingForUpload", timeout=60)
        assert waiting.upload is not None and waiting.upload.files[0].path == "a.csv"
        client.delete(created.name)
        return
    result = client.run("print(1)", inputs=inputs, limits=LIMITS)
    assert (result.phase, result.reason) == ("Failed", reason)
    assert names in result.message and result.pod_name is None


HOSTILE = """
import json, os, socket, urllib.request, urllib.error
facts = {}
def attempt(name, fn):
    try:
        facts[name] = fn()
    except Exception as e:
        facts[name] = f"refused: {type(e).__name__}: {e}"[:200]
def tcp(host, port):
    s = socket.create_connection((host, port), timeout=3)
    s.close()
    return "connected"
def get(url, token=None):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return f"{answer.status}: {answer.read(200)!r}"
    except urllib.error.HTTPError as e:
        return f"http {e.code}"
data_url, store_ip = DATA_URL, STORE_IP
attempt("store", lambda: tcp(store_ip, 7070))
attempt("data-no-grant", lambda: get(f"{data_url}/v1/inputs/0"))
needle = ".".join(["d1", "k1", ""]).encode()  # a grant's head, never written out whole in this file
forged = ".".join(["d1", "k1", "e30", "A" * 43])
attempt("data-forged", lambda: get(f"{data_url}/v1/inputs/0", forged))
attempt("other-run", lambda: get(f"{data_url}/v1/artifacts/secret.csv"))
found = []
for root in ("/coderun", "/proc/self", "/tmp", "/etc", "/run"):
    for dirpath, dirnames, names in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("task", "fd", "fdinfo", "map_files", "ns", "net")]
        for name in names:
            try:
                with open(os.path.join(dirpath, name), "rb") as f:
                    if needle in f.read(1 << 20):
                        found.append(os.path.join(dirpath, name))
            except Exception:
                pass
facts["grant-files"] = found
facts["grant-env"] = [k for k, v in os.environ.items() if needle.decode() in v]
attempt("read-input", lambda: len(open("sales.csv", "rb").read()))
attempt("write-input", lambda: open("sales.csv", "ab").write(b"x") and "wrote")
attempt("write-after-chmod", lambda: (os.chmod(os.path.realpath("sales.csv"), 0o666),
                                      open(os.path.realpath("sales.csv"), "r+b").write(b"x")) and "wrote")
attempt("create-beside", lambda: open(os.path.join(os.path.dirname(os.path.realpath("sales.csv")), "new"), "wb")
        and "created")
attempt("replace", lambda: os.rename("/tmp/work/main.py", os.path.realpath("sales.csv")) or "replaced")
out = os.environ["CODERUN_OUTPUT_DIR"]
attempt("hardlink", lambda: os.link(os.path.realpath("sales.csv"), os.path.join(out, "linked.csv")) or "linked")
attempt("symlink", lambda: os.symlink(os.path.realpath("sales.csv"), os.path.join(out, "sym.csv")) or "linked")
open(os.path.join(out, "mine.txt"), "w").write("positive control")
print(json.dumps(facts))
"""


def test_hostile_code_cannot_reach_the_store_find_the_grant_or_change_its_input(client, cluster, namespace):
    store_ip = cluster.core.list_namespaced_pod(
        "coderun-system", label_selector="app.kubernetes.io/component=store").items[0].status.pod_ip
    data_pod_ip = cluster.core.list_namespaced_pod(
        "coderun-system", label_selector="app.kubernetes.io/component=data").items[0].status.pod_ip
    payload = b"id\n" + b"1\n" * 300_000  # past the inline limit: it goes by upload and the grant
    code = HOSTILE.replace("DATA_URL", repr(f"http://{data_pod_ip}:8080")).replace("STORE_IP", repr(store_ip))
    result = client.run(code, files={"sales.csv": payload}, limits=LIMITS)
    assert result.phase == "Succeeded", (result.message, result.stderr[-2000:])
    facts = json.loads(result.stdout)
    assert facts["store"].startswith("refused"), facts          # no route to the store
    assert facts["data-no-grant"] == "http 401" and facts["data-forged"] == "http 401", facts
    assert facts["other-run"] == "http 401", facts
    assert facts["grant-files"] == [] and facts["grant-env"] == [], facts  # the grant is nowhere it can read
    assert facts["read-input"] == len(payload), facts                  # the positive control: it reads its input
    for attempt in ("write-input", "write-after-chmod", "create-beside", "replace"):
        assert facts[attempt].startswith("refused"), (attempt, facts)  # its view of the inputs is read-only
    skipped = {s.name: s.why for s in result.artifacts_skipped or ()}
    assert skipped.get("sym.csv") == "symlink", skipped
    assert "linked.csv" not in {a.name for a in result.artifacts}
    assert [a.name for a in result.artifacts] == ["mine.txt"]          # what it wrote itself is kept
    assert result.inputs[0].sha256 == hashlib.sha256(payload).hexdigest()
