"""The operator's call to a proxy pod's admin endpoint (proxy.http) against a real socket: whatever the pod does
wrong is an OSError, the one failure `end_run` counts as a pod not asked (the run's log incomplete, the run not
failed), and a body cut short is never taken for the whole log."""
import socket
import threading

import pytest

from coderun_operator import proxy


def pod_answering(reply: bytes) -> str:
    """A one-shot pod on loopback that reads the request, sends `reply` and closes; its URL."""
    server = socket.create_server(("127.0.0.1", 0))

    def once():
        with server:
            conn, _ = server.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(reply)

    threading.Thread(target=once, daemon=True).start()
    return f"http://127.0.0.1:{server.getsockname()[1]}/runs/uid-1/log"


def test_a_whole_answer_is_returned_with_its_headers():
    body = b'{"host": "a.example.org"}\n'
    url = pod_answering(b"HTTP/1.1 200 OK\r\nX-Coderun-Requests: 1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    status, got, headers = proxy.http("GET", url, "bearer", None)
    assert (status, got, headers["X-Coderun-Requests"]) == (200, body, "1")


@pytest.mark.parametrize("reply", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{\"host\": \"a.example.org\"}\n",  # the pod went away
    b"SSH-2.0-OpenSSH_9.2\r\n\r\n",  # not HTTP: http.client's BadStatusLine, no OSError of its own
    b"",  # closed before answering
], ids=["cut-short", "not-http", "closed"])
def test_an_answer_that_is_not_a_whole_http_answer_is_an_os_error(reply):
    with pytest.raises(OSError):
        proxy.http("GET", pod_answering(reply), "bearer", None)
