"""An MCP streamable-HTTP server the e2e tests start."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path
from conftest import KUBECONFIG, wait_for


CODERUN = str(Path(sys.executable).parent / "coderun")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def streamable_http_server(namespace: str):
    """`coderun mcp --transport streamable-http` for the namespace, listening: (the server, its /mcp URL)."""
    port = _free_port()
    server = subprocess.Popen([CODERUN, "mcp", "-n", namespace, "--transport", "streamable-http", "--port", str(port)],
                              env={**os.environ, "KUBECONFIG": str(KUBECONFIG)}, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: _listening(port) or server.poll() is not None, 30, "coderun mcp to listen")
        assert server.poll() is None, server.stderr.read()
        yield server, f"http://127.0.0.1:{port}/mcp"
    finally:
        server.terminate()
        server.wait(timeout=30)
