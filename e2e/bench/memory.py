"""The leading operator's memory on the running local cluster (`make bench-memory`), as its own metrics report
it (process_resident_memory_bytes):

  baseline -> the attack policy (64 + 256 patterns of `\\pL{300}`) refused at `kubectl apply` -> the costliest
  policy the budgets admit (64 redaction + 256 denied patterns filling the policy's RE2 budget, e2e/
  policy_memory.py's) applied -> deleted -> with 1,000 finished runs of 512 KiB output each (256 KiB stdout
  + 256 KiB stderr; one real run, 999 answered by the result cache, which needs no pod) -> after they are deleted.

Prints each figure beside the operator's memory limit. Statuses are never listed whole (1,000 x 512 KiB): the
bench counts finished runs from the operator's own counter.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from kubernetes import client, config

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(1, str(REPO / "e2e"))  # e2e/, after e2e/bench/ (its neighbours)
from policy_memory import budget_filling_patterns  # noqa: E402
from conftest import ChartOperator, Cluster  # noqa: E402
from coderun.api.models import GROUP, PLURAL, VERSION  # noqa: E402

KUBECONFIG = REPO / ".cluster" / "kubeconfig"
OPERATOR_NAMESPACE = ChartOperator.namespace
STREAM_BYTES = 256 * 1024
CODE = f"import sys\nsys.stdout.write('o' * {STREAM_BYTES})\nsys.stderr.write('e' * {STREAM_BYTES})\n"


def scrape(url: str) -> dict[str, float]:
    """Unlabelled samples and the sum of each labelled family, by name."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
        if match:
            values[match.group(1)] = values.get(match.group(1), 0.0) + float(match.group(3))
    return values


def rss_mib(url: str) -> float:
    return scrape(url)["process_resident_memory_bytes"] / 2**20


def finished_runs(url: str) -> float:
    return scrape(url).get("coderun_runs_total", 0.0)


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


def kubectl(*args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    binary = subprocess.run(["bash", "-c", "source e2e/cluster/versions.sh && echo $CODERUN_CACHE/bin/"
                             "kubernetes-$KUBERNETES_VERSION/kubectl"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    return subprocess.run([binary, "--kubeconfig", str(KUBECONFIG), *args], input=input, capture_output=True,
                          text=True, check=check)


def policy_manifest(namespace: str, redaction: list[str], denied: list[str]) -> str:
    return json.dumps({"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRunPolicy",
                       "metadata": {"name": "default", "namespace": namespace},
                       "spec": {"admission": "Record", "redactionPatterns": redaction, "codeRules": {
                           "deniedPatterns": [{"language": "python", "pattern": p} for p in denied]}}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    config.load_kube_config(str(KUBECONFIG))
    core, custom = client.CoreV1Api(), client.CustomObjectsApi()
    url = ChartOperator(Cluster()).metrics_url()  # the leading replica's
    namespace = f"bench-memory-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": namespace,
                                        "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    figures = [("baseline", rss_mib(url))]
    try:
        attack = ["\\pL{300}"] * 320
        refused = kubectl("apply", "-f", "-", input=policy_manifest(namespace, attack[:64], attack[64:]), check=False)
        print(f"  the attack policy (\\pL{{300}} x 320) at kubectl apply: "
              f"{'refused: ' + refused.stderr.strip().splitlines()[-1][:160] if refused.returncode else 'ADMITTED'}")
        figures.append(("after the attack policy was refused", rss_mib(url)))
        kubectl("apply", "-f", "-", input=policy_manifest(namespace, budget_filling_patterns(64, 0),
                                                          budget_filling_patterns(256, 64)))
        time.sleep(2)  # not synchronisation: the loader compiles on the watch event; the figure is sampled after
        figures.append(("the costliest admitted policy (64 + 256 patterns)", rss_mib(url)))
        kubectl("-n", namespace, "delete", "coderunpolicy", "default")
        time.sleep(2)
        figures.append(("that policy deleted", rss_mib(url)))
        spec = {"language": "python", "code": CODE, "cache": {"enabled": True, "ttlSeconds": 3600},
                "limits": {"outputBytes": STREAM_BYTES, "timeoutSeconds": 30}}

        def create(name: str) -> None:
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRun", "metadata": {"name": name}, "spec": spec})

        before = finished_runs(url)
        create("source")
        wait_until(lambda: finished_runs(url) >= before + 1, 180, "the source run")
        started = time.monotonic()
        for i in range(1, args.runs):
            create(f"hit-{i:04d}")
        wait_until(lambda: finished_runs(url) >= before + args.runs, 1800, f"{args.runs} finished runs")
        print(f"  {args.runs - 1} cache hits written in {time.monotonic() - started:.0f}s")
        figures.append((f"{args.runs} finished runs of 512 KiB output", rss_mib(url)))
    finally:
        core.delete_namespace(namespace)
        wait_until(lambda: not any(n.metadata.name == namespace for n in core.list_namespace().items), 900,
                   "the namespace to be deleted")
    figures.append(("the runs deleted", rss_mib(url)))
    limit = kubectl("-n", OPERATOR_NAMESPACE, "get", "deployment", "coderun", "-o",
                    "jsonpath={.spec.template.spec.containers[0].resources.limits.memory}").stdout
    print(f"leading operator's resident memory (its limit: {limit})")
    for label, value in figures:
        print(f"  {label:<60} {value:8.1f} MiB")


if __name__ == "__main__":
    main()
