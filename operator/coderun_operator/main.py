"""`coderun-operator`: kopf with this package's handlers, every namespace, a liveness endpoint.

With CODERUN_LEADER_ELECTION=true (the Helm chart sets it, with POD_NAME and POD_NAMESPACE from the downward
API), replicas elect one leader through a Lease before kopf starts; the others wait as standbys that serve
their probes and metrics. Without it (the host-process mode for development) kopf starts at once.
"""
import logging
import os
import signal
import sys
import time

from kopf import cli

from . import health, leader, metrics


def main() -> None:
    liveness = os.environ.get("CODERUN_LIVENESS", "http://0.0.0.0:8080/healthz")
    sys.argv = ["kopf", "run", "--module", "coderun_operator.handlers", "--all-namespaces", "--standalone",
                "--liveness", liveness, *sys.argv[1:]]
    if os.environ.get("CODERUN_LEADER_ELECTION", "").lower() != "true":
        metrics.LEADER.set(1)  # the only replica
        cli.main()
        return
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(name)-20s [%(levelname)-8s] %(message)s")
    namespace, pod = os.environ["POD_NAMESPACE"], os.environ["POD_NAME"]
    from .handlers import controller  # the standby's metrics too: a scrape of either replica answers
    metrics.serve(controller.store.active_count)
    probes = health.Health(liveness.replace("0.0.0.0", "127.0.0.1"))
    health.serve(int(os.environ.get("CODERUN_HEALTH_PORT", "8081")), probes)
    leader.mark_own_pod(namespace, pod, leading=False)  # a restarted leader's container starts as a standby
    elector = leader.LeaderElector(namespace, os.environ.get("CODERUN_LEASE_NAME", "coderun-operator"), pod,
                                   on_lost=leader.exit_now)
    # As PID 1 of its container the process ignores SIGTERM unless it handles it: a standby must stop at once
    # (kopf installs its own handlers once it runs).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    elector.acquire()
    metrics.LEADER.set(1)
    probes.lead()
    elector.renew_forever()
    leader.mark_own_pod(namespace, pod, leading=True)
    logging.getLogger().handlers.clear()  # kopf installs its own; two would print every line twice
    try:
        cli.main()
    finally:
        stopping = time.monotonic()
        logging.getLogger("coderun.leader").info("kopf has stopped; releasing the Lease")
        elector.release()  # a standby may take over now, not at the Lease's expiry
        logging.getLogger("coderun.leader").info("released in %.1f s", time.monotonic() - stopping)


if __name__ == "__main__":
    main()
