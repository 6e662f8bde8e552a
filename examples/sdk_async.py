"""Many runs at once from one event loop: AsyncCodeRunClient with asyncio.gather.

    pip install .                                  # from a checkout: the SDK and the coderun CLI
    python examples/sdk_async.py                   # 5 runs in the kubeconfig's namespace
    python examples/sdk_async.py -n agents --runs 20

Each wait holds one watch connection and no thread, so the runs are in flight together and the whole takes about
as long as the slowest run. Prints each run's stdout and the time taken; exits 0 when every run succeeded.
"""
import argparse
import asyncio
import sys
import time

from coderun.client import AsyncCodeRunClient, CodeRunError


async def squares(namespace: str | None, runs: int) -> int:
    async with AsyncCodeRunClient(namespace=namespace) as client:      # closes its HTTP session on the way out
        print(f"namespace: {client.namespace}")
        started = time.monotonic()
        results = await asyncio.gather(*(client.run(f"print({n} ** 2)") for n in range(runs)))
        for n, result in enumerate(results):
            print(f"{n} ** 2 = {(result.stdout or '').strip()} ({result.name}: {result.phase})")
        print(f"{runs} runs in {time.monotonic() - started:.1f} s")
        return 0 if all(r.succeeded for r in results) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run several programs at once with AsyncCodeRunClient.")
    parser.add_argument("-n", "--namespace", help="where the runs go (default: the kubeconfig's namespace)")
    parser.add_argument("--runs", type=int, default=5, help="how many programs to run at once (default 5)")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(squares(args.namespace, args.runs))
    except CodeRunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
