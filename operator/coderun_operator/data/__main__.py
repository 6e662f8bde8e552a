"""`python -m coderun_operator.data`: the data service (service.py), configured by its environment:

    CODERUN_DATA_PORT            8080
    CODERUN_DATA_KEYS_DIR        the grant signing keys (Secret coderun-data-keys mounted), re-read as they change
    CODERUN_STORE_DIR            the store's Secret mounted: endpoint, region, access-key-id, secret-access-key
    CODERUN_STORE_BUCKET         coderun; created when missing (the embedded store)
    CODERUN_DATA_MAX_TRANSFERS   16 at once; beyond, 503 Busy
"""
from __future__ import annotations

import logging
import os
import sys

from coderun.egress.files import keys_in

from .service import MAX_TRANSFERS, DataServer, Service
from .store import StoreMisconfigured, StoreSettings, StoreUnavailable, client, ensure_bucket

log = logging.getLogger("coderun.data")

HEALTH_READ_TIMEOUT = 5.0


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    env = os.environ
    try:
        port = int(env.get("CODERUN_DATA_PORT", "8080"))
        max_transfers = int(env.get("CODERUN_DATA_MAX_TRANSFERS", str(MAX_TRANSFERS)))
        settings = StoreSettings.from_dir(env.get("CODERUN_STORE_DIR", "/etc/coderun/store"))
    except (ValueError, StoreMisconfigured) as e:
        print(f"coderun-data: {e}", file=sys.stderr)
        return 2
    bucket = env.get("CODERUN_STORE_BUCKET", "coderun")
    keys = keys_in(env.get("CODERUN_DATA_KEYS_DIR", "/etc/coderun/data-keys"))
    service = Service(client(settings, max_pool_connections=max_transfers + 4), keys.current, bucket,
                      health_s3=client(settings, read_timeout=HEALTH_READ_TIMEOUT), max_transfers=max(1, max_transfers))
    try:
        if ensure_bucket(service.s3, bucket):
            log.info("bucket %s created", bucket)
    except Exception as e:  # the store may start after us: /healthz says so and creates it later
        log.warning("the store is not ready yet: %s", e if isinstance(e, StoreUnavailable) else type(e).__name__)
    server = DataServer(("", port), service)
    log.info("data service on port %d, store %s, bucket %s, at most %d transfers", port, settings.endpoint, bucket,
             service.max_transfers)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
