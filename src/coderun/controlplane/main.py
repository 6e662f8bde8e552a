"""`coderun-operator`: kopf with this package's handlers, every namespace, a liveness endpoint."""
import os
import sys

from kopf import cli


def main() -> None:
    liveness = os.environ.get("CODERUN_LIVENESS", "http://0.0.0.0:8080/healthz")
    sys.argv = ["kopf", "run", "--module", "coderun.controlplane.handlers", "--all-namespaces", "--liveness", liveness,
                *sys.argv[1:]]
    cli.main()


if __name__ == "__main__":
    main()
