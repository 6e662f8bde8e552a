"""A program that draws a plot in the sandbox; the SDK brings the PNG back and saves it here.

    pip install .                                  # from a checkout: the SDK and the coderun CLI
    python examples/plot_artifact.py               # the kubeconfig's namespace; writes ./plot.png
    python examples/plot_artifact.py -n agents -o /tmp/plot.png

Files the program writes to $CODERUN_OUTPUT_DIR come back as the run's artifacts (name, size, sha256, kept in a
ConfigMap the run owns); `client.artifact(result, name)` reads one in full. The Python sandbox image has numpy,
pandas and matplotlib. Prints the saved file's path and size; exits 0 when a PNG came back.
"""
import argparse
import sys
from pathlib import Path

from coderun.client import CodeRunClient, CodeRunError

PLOT = """\
import os
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

days = [1, 2, 3, 4, 5, 6, 7]
visits = [1200, 1350, 1280, 1410, 1390, 980, 860]
plt.plot(days, visits, marker="o")
plt.title("visits per day")
plt.savefig(os.path.join(os.environ["CODERUN_OUTPUT_DIR"], "plot.png"))
print("plotted", len(days), "days")
"""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Plot in the sandbox and save the PNG artifact locally.")
    parser.add_argument("-n", "--namespace", help="where the run goes (default: the kubeconfig's namespace)")
    parser.add_argument("-o", "--output", default="plot.png", help="where to save the plot (default ./plot.png)")
    args = parser.parse_args(argv)
    try:
        client = CodeRunClient(namespace=args.namespace)
        print(f"namespace: {client.namespace}")
        result = client.run(PLOT, timeout=60)
        print(f"{result.name}: {result.phase} ({result.reason}), stdout {result.stdout!r}")
        if not result.succeeded:
            print(f"error: the program failed: {result.message}\n{result.stderr or ''}", file=sys.stderr)
            return 1
        png = client.artifact(result, "plot.png")
    except (CodeRunError, KeyError) as e:          # KeyError: the run has no artifact of that name
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not png.startswith(PNG_SIGNATURE):
        print("error: plot.png is not a PNG", file=sys.stderr)
        return 1
    saved = Path(args.output).resolve()
    saved.write_bytes(png)
    print(f"saved {saved} ({len(png)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
