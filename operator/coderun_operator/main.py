"""`coderun-operator`: kopf with this package's handlers, every namespace, a liveness endpoint.

With CODERUN_LEADER_ELECTION=true (the Helm chart sets it, with POD_NAME and POD_NAMESPACE from the downward
API), replicas elect one leader through a Lease before kopf starts; the others wait as standbys that serve
their probes and metrics. Without it (the host-process mode for development) kopf starts at once.

kopf is embedded with `kopf.run(...)` (kopf's docs/embedding.rst): importing `handlers` registers them.
"""
import argparse
import logging
import os
import signal
import sys
import time

import kopf

from coderun import __version__

from . import handlers, health, leader, metrics


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="coderun-operator", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every event")
    parser.add_argument("-d", "--debug", action="store_true", help="log kopf's internals too")
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")
    # kopf's own logging flags, as `kopf run` took them (a deployment may set them).
    parser.add_argument("--log-format", choices=[f.name.lower() for f in kopf.LogFormat], default="full",
                        help="plain, full or json")
    parser.add_argument("--log-prefix", action=argparse.BooleanOptionalAction, default=None,
                        help="prefix kopf's lines about an object with its namespace/name (default: on, but json)")
    parser.add_argument("--log-refkey", default=None, help="the key of the object's reference in json lines")
    return parser.parse_args(argv)


def _run_kopf(liveness: str) -> None:
    kopf.run(clusterwide=True, standalone=True, liveness_endpoint=liveness)


def main() -> None:
    args = _arguments(sys.argv[1:])
    # Once, before the election: a standby's and the election's lines take the chosen format too (json for a log
    # pipeline), not only kopf's.
    kopf.configure(verbose=args.verbose, debug=args.debug, quiet=args.quiet,
                   log_format=kopf.LogFormat[args.log_format.upper()], log_prefix=args.log_prefix,
                   log_refkey=args.log_refkey)
    liveness = os.environ.get("CODERUN_LIVENESS", "http://0.0.0.0:8080/healthz")
    if os.environ.get("CODERUN_LEADER_ELECTION", "").lower() != "true":
        metrics.LEADER.set(1)  # the only replica
        _run_kopf(liveness)
        return
    namespace, pod = os.environ["POD_NAMESPACE"], os.environ["POD_NAME"]
    lease = os.environ.get("CODERUN_LEASE_NAME", "coderun-operator")
    # Before the probes answer: a replica that is ready has always said what it is (a rolling update can count a
    # standby ready before its first read of the Lease returns).
    logging.getLogger("coderun.leader").info("coderun-operator %s in pod %s: standby until it holds Lease %s/%s",
                                             __version__, pod, namespace, lease)
    metrics.serve(handlers.controller.store.active_by_namespace)  # the standby's too: a scrape of either replica answers
    probes = health.Health(liveness.replace("0.0.0.0", "127.0.0.1"))
    health.serve(int(os.environ.get("CODERUN_HEALTH_PORT", "8081")), probes)
    leader.mark_own_pod(namespace, pod, leading=False)  # a restarted leader's container starts as a standby
    elector = leader.LeaderElector(namespace, lease, pod,
                                   on_lost=leader.exit_now)
    # As PID 1 of its container the process ignores SIGTERM unless it handles it: a standby must stop at once
    # (kopf installs its own handlers once it runs).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    elector.acquire()
    metrics.LEADER.set(1)
    probes.lead()
    elector.renew_forever()
    leader.mark_own_pod(namespace, pod, leading=True)
    try:
        _run_kopf(liveness)
    finally:
        stopping = time.monotonic()
        logging.getLogger("coderun.leader").info("kopf has stopped; releasing the Lease")
        elector.release()  # a standby may take over now, not at the Lease's expiry
        logging.getLogger("coderun.leader").info("released in %.1f s", time.monotonic() - stopping)


if __name__ == "__main__":
    main()
