"""The async SDK's concurrency curve: N runs at once from one AsyncCodeRunClient, for each N in --levels.

On the local cluster (`make bench-concurrency`): N concurrent `run("print(1)")` in a fresh namespace; the wall
time until the last result and each run's latency (its run call to its result), p50 and p99. The curve shows
what the node makes of N sandboxes at once; the client holds one watch per run and no thread.

Without a cluster (`--stub`, `make bench-concurrency-stub`): the same calls against the unit tier's stub API
server (tests/unit/aio_stub_api.py) in the same event loop, whose "operator" finishes each run --run-seconds
after its create. Every level should take about --run-seconds; what is above it is the client's own overhead
(and the stub's, on the same core). `--threads` adds the way AsyncCodeRunClient worked before: the sync client
in asyncio.to_thread, bound by the default thread pool (min(32, CPUs + 4) threads).
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Awaitable, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "unit"))
from aio_stub_api import StubApi  # noqa: E402 - the unit tier's stub API server

from coderun.client import AsyncCodeRunClient, CodeRunClient, RunResult  # noqa: E402

KUBECONFIG = Path(__file__).resolve().parents[2] / ".cluster" / "kubeconfig"
CODE = "print(1)"


def levels(text: str) -> list[int]:
    try:
        found = [int(n) for n in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--levels takes numbers separated by commas, like 1,12,40; got {text!r}")
    if not found or min(found) < 1:
        raise argparse.ArgumentTypeError(f"--levels: each level is a number of runs, 1 or more; got {text!r}")
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=levels, default=None,
                        help="runs at once, comma-separated (default 1,12,40,100 on the cluster; "
                             "1,12,40,100,200,400 with --stub)")
    parser.add_argument("--stub", action="store_true", help="against the in-process stub API server, no cluster")
    parser.add_argument("--run-seconds", type=float, default=1.0, help="--stub: how long each run takes")
    parser.add_argument("--threads", action="store_true",
                        help="--stub: also time the sync client in asyncio.to_thread (the old async client)")
    parser.add_argument("--wait-timeout", type=float, default=900,
                        help="the cluster: how long one run may take before it counts as failed")
    args = parser.parse_args(argv)
    if args.threads and not args.stub:
        parser.error("--threads compares against the stub only; add --stub")
    args.levels = args.levels or ([1, 12, 40, 100, 200, 400] if args.stub else [1, 12, 40, 100])
    return args


async def curve(label: str, run_one: Callable[[], Awaitable[RunResult]], counts: list[int]) -> None:
    for count in counts:
        async def timed() -> float:
            started = time.monotonic()
            await run_one()
            return time.monotonic() - started
        started = time.monotonic()
        outcomes = await asyncio.gather(*(timed() for _ in range(count)), return_exceptions=True)
        wall = time.monotonic() - started
        seconds = [o for o in outcomes if isinstance(o, float)]
        failed = [o for o in outcomes if not isinstance(o, float)]
        print(f"{label:<22} {count:4d} at once: wall {wall:6.2f} s   each: {summary(seconds)}"
              + (f"   {len(failed)} failed, e.g. {failed[0]!r}" if failed else ""), flush=True)


def summary(seconds: list[float]) -> str:
    if not seconds:
        return "no run finished"
    ms = sorted(s * 1000 for s in seconds)
    p99 = ms[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))]
    return f"p50 {statistics.median(ms):7.0f} ms  p99 {p99:7.0f} ms"


async def on_stub(args: argparse.Namespace) -> None:
    stub = await StubApi().start()
    loop = asyncio.get_running_loop()
    stub.on_create = lambda name: loop.call_later(args.run_seconds, lambda: loop.create_task(stub.finish(name)))
    with tempfile.TemporaryDirectory() as scratch:
        kubeconfig = str(stub.kubeconfig(Path(scratch) / "kubeconfig"))
        print(f"stub API server, each run finished {args.run_seconds:.1f} s after its create "
              f"(the ideal: every level takes {args.run_seconds:.1f} s)")
        try:
            async with AsyncCodeRunClient(kubeconfig=kubeconfig) as client:
                await curve("AsyncCodeRunClient", lambda: client.run(CODE), args.levels)
            if args.threads:
                sync = CodeRunClient(kubeconfig=kubeconfig)
                await curve("sync in to_thread", lambda: asyncio.to_thread(sync.run, CODE), args.levels)
        finally:
            await stub.stop()


async def on_cluster(args: argparse.Namespace) -> None:
    from kubernetes import client, config
    from latency import new_namespace  # the bench's namespace, as `make bench` makes it

    config.load_kube_config(str(KUBECONFIG))
    core = client.CoreV1Api()
    namespace = new_namespace(core)
    print(f"local cluster, namespace {namespace}: run({CODE!r}), cold, the policy's defaults")
    try:
        async with AsyncCodeRunClient(namespace, kubeconfig=str(KUBECONFIG), client_name="bench") as sdk:
            await curve("AsyncCodeRunClient", lambda: sdk.run(CODE, wait_timeout=args.wait_timeout), args.levels)
    finally:
        core.delete_namespace(namespace)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    asyncio.run(on_stub(args) if args.stub else on_cluster(args))


if __name__ == "__main__":
    main()
