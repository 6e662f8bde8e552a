"""Starting the proxy and telling when it is ready: the image's entrypoint and readiness probe, and what the local
test tier calls to start squid the same way.

    coderun-egress-proxy start   render squid.conf from the environment, make the TLS pair, exec squid
    coderun-egress-proxy ready   exit 0 once both of squid's stages answer (the readiness probe)
    coderun-egress-proxy admin   the operator's admin endpoint (admin.py) and the tunnel relay (relay.py), the
                                 pod's second container
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from . import admin
from .files import keys_in, revocations_in
from .relay import Relay
from .run_logs import RunLogs
from .squid_config import WARMUP_HOST, Settings, Upstream, render

# The pod's paths (the chart mounts these; see docs/egress.md).
DEFAULTS = {
    "CODERUN_EGRESS_LISTEN": "0.0.0.0:3128",
    "CODERUN_EGRESS_TLS_STAGE_PORT": "3129",
    "CODERUN_EGRESS_STATE": "/run/coderun-egress",             # emptyDir
    "CODERUN_EGRESS_KEYS": "/etc/coderun-egress/keys",         # Secret
    "CODERUN_EGRESS_REVOCATIONS": "/run/coderun-egress/revoked",  # written by the admin container
    "CODERUN_EGRESS_ADMIN_LISTEN": "0.0.0.0:3130",
    "CODERUN_EGRESS_RELAY_PORT": "3131",  # on 127.0.0.1: the tunnel relay, in the admin container
    "CODERUN_EGRESS_LAUNCHERS": "/usr/local/lib/coderun-egress/bin",
    "CODERUN_EGRESS_ERRORS": "/usr/local/lib/coderun-egress/errors",
    "CODERUN_EGRESS_POD_NAME": "",  # the downward API's metadata.name: credentials name the pod they are for
    # A corporate proxy every request leaves through (egressProxy.upstream): its host and port, and the directory
    # of a mounted kubernetes.io/basic-auth Secret (files `username`, `password`) when it asks for a login.
    "CODERUN_EGRESS_UPSTREAM_HOST": "",
    "CODERUN_EGRESS_UPSTREAM_PORT": "3128",
    "CODERUN_EGRESS_UPSTREAM_LOGIN": "",
}
POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def settings_from(env: Mapping[str, str]) -> Settings:
    value = {k: env.get(k) or default for k, default in DEFAULTS.items()}
    if value["CODERUN_EGRESS_POD_NAME"] and not POD_NAME.fullmatch(value["CODERUN_EGRESS_POD_NAME"]):
        raise ValueError(f"CODERUN_EGRESS_POD_NAME is not a pod's name: {value['CODERUN_EGRESS_POD_NAME'][:80]!r}")
    return Settings(listen=value["CODERUN_EGRESS_LISTEN"], tls_stage_port=int(value["CODERUN_EGRESS_TLS_STAGE_PORT"]),
                    state_dir=value["CODERUN_EGRESS_STATE"], launchers=value["CODERUN_EGRESS_LAUNCHERS"],
                    keys_dir=value["CODERUN_EGRESS_KEYS"], revocations=value["CODERUN_EGRESS_REVOCATIONS"],
                    error_dir=value["CODERUN_EGRESS_ERRORS"], admin_listen=value["CODERUN_EGRESS_ADMIN_LISTEN"],
                    env=dict(env), pod_name=value["CODERUN_EGRESS_POD_NAME"],
                    relay_port=int(value["CODERUN_EGRESS_RELAY_PORT"]), upstream=upstream_from(value))


def upstream_from(value: Mapping[str, str]) -> Upstream | None:
    """The upstream proxy the environment names, its login read from the mounted Secret's files (None: none)."""
    if not value["CODERUN_EGRESS_UPSTREAM_HOST"]:
        return None
    username = password = ""
    if value["CODERUN_EGRESS_UPSTREAM_LOGIN"]:
        login = Path(value["CODERUN_EGRESS_UPSTREAM_LOGIN"])
        try:
            username, password = ((login / name).read_text().strip("\r\n") for name in ("username", "password"))
        except OSError as e:
            raise ValueError(f"the upstream proxy's login Secret has no {Path(e.filename).name} "
                             "(a kubernetes.io/basic-auth Secret has the keys username and password)") from None
    port = value["CODERUN_EGRESS_UPSTREAM_PORT"]
    if not port.isdigit():
        raise ValueError(f"CODERUN_EGRESS_UPSTREAM_PORT is not a port: {port[:20]!r}")
    return Upstream(value["CODERUN_EGRESS_UPSTREAM_HOST"], int(port), username, password)


def prepare(s: Settings) -> str:
    """squid.conf and the TLS pair in the state directory; returns the config's path."""
    state = Path(s.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    if not Path(s.tls_pair).exists():
        make_tls_pair(s.tls_pair)
    config = state / "squid.conf"
    # The owner's alone: it may hold the upstream proxy's password.
    with os.fdopen(os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(render(s))
    os.chmod(config, 0o600)  # an older file kept its mode
    return str(config)


def make_tls_pair(path: str) -> None:
    """A throwaway self-signed pair: squid wants one on a port that peeks at TLS, and never shows it (it splices or
    closes; it never bumps)."""
    key, cert = f"{path}.key", f"{path}.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "3650", "-subj", "/CN=coderun-egress-tls-stage"], check=True, capture_output=True)
    Path(path).write_bytes(Path(cert).read_bytes() + Path(key).read_bytes())
    os.chmod(path, 0o600)
    for leftover in (key, cert):
        os.unlink(leftover)


def answers(listen: str, timeout: float = 2.0) -> int | None:
    """The status of one warm-up request through the policy stage: 407 means the TLS stage answered (it asks for a
    credential), 5xx that the policy stage could not reach it (yet)."""
    host, _, port = listen.rpartition(":")
    host = "127.0.0.1" if host in ("", "0.0.0.0", "[::]") else host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as conn:
            conn.sendall(f"GET http://{WARMUP_HOST}/ HTTP/1.1\r\nHost: {WARMUP_HOST}\r\n"
                         "Connection: close\r\n\r\n".encode())
            status_line = conn.makefile("rb").readline(256).split()
    except OSError:
        return None
    return int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else None


def wait_ready(listen: str, deadline_seconds: float = 20.0) -> bool:
    """Wake the TLS stage up and wait until both stages answer (squid_config.WARMUP_HOST says why)."""
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        if answers(listen) == 407:
            return True
        time.sleep(0.1)
    return False


def not_ready(s: Settings) -> str | None:
    """Why the pod should not take runs yet, or None: without a signing key it could verify no run's credential
    (the Secret is the operator's to create at its start, and mounted optional: see the chart)."""
    if not keys_in(s.keys_dir).current():
        secret = s.env.get("CODERUN_EGRESS_KEYS_SECRET") or "its Secret"
        return (f"no signing key in {s.keys_dir} yet from {secret}: the operator creates it at its start (unless "
                "egressProxy.existingSecret names one of yours: it must exist, one entry per key id)")
    if not wait_ready(s.listen, deadline_seconds=5):
        return f"squid does not answer on {s.listen} yet"
    return None


def start_relay(s: Settings, keys: Callable[[], Mapping[str, bytes]]) -> Relay:
    """The tunnel relay between squid's two stages, serving in a thread of its own."""
    runs = RunLogs(s.runs_dir)
    tunnels = Relay(("127.0.0.1", s.tls_stage_port), keys, revocations_in(s.revocations, interval=0.0).current,
                    s.runs_dir, s.pod_name or None, runs.usage)
    tunnels.start(("127.0.0.1", s.relay_port))
    return tunnels


def main(argv: Sequence[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    settings = settings_from(os.environ)
    if args == ["start"]:
        config = prepare(settings)
        os.execvp("squid", ["squid", "-N", "-d", "1", "-f", config])
    elif args == ["ready"]:
        why = not_ready(settings)
        sys.exit(f"not ready: {why}" if why else 0)
    elif args == ["admin"]:
        keys = keys_in(settings.keys_dir)
        admin.make_server(settings.admin_listen, keys.current, settings.revocations, settings.runs_dir,
                          start_relay(settings, keys.current).revoke).serve_forever()
    else:
        sys.exit("usage: coderun-egress-proxy start|ready|admin")


if __name__ == "__main__":
    main()
