"""Run Python in coderun's sandbox from the SDK: one program that works, one that fails, and what each returned.

    pip install .                                  # from a checkout: the SDK and the coderun CLI
    python examples/sdk_sync.py                    # the kubeconfig's namespace (KUBECONFIG, or ~/.kube/config)
    python examples/sdk_sync.py -n agents          # or a namespace of your choice

A program that fails is a normal result (its reason, exit code and error line); a run the policy refuses, or an
API that cannot be reached, is an exception, printed here as one line. Exits 0 when both runs ended as expected.
"""
import argparse
import sys

from coderun.client import CodeRunClient, CodeRunError

FAILING = "rows = [1, 2]\ntotal = sum(rows)\nprint(total / 0)\n"   # ZeroDivisionError at line 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run two programs with CodeRunClient and print their results.")
    parser.add_argument("-n", "--namespace", help="where the runs go (default: the kubeconfig's namespace)")
    args = parser.parse_args(argv)
    try:
        client = CodeRunClient(namespace=args.namespace)
        print(f"namespace: {client.namespace}")
        ok = client.run("print(6*7)")
        print(f"{ok.name}: {ok.phase} ({ok.reason}), exit code {ok.exit_code}, stdout {ok.stdout!r}")
        failed = client.run(FAILING)
        error = f"{failed.error.type} at line {failed.error.line}" if failed.error else "none"
        print(f"{failed.name}: {failed.phase} ({failed.reason}), exit code {failed.exit_code}, error {error}")
    except CodeRunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0 if ok.succeeded and failed.error is not None else 1


if __name__ == "__main__":
    sys.exit(main())
