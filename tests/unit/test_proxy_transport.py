"""The operator's call to a proxy pod's admin endpoint (proxy.http) against a real socket: whatever the pod does
wrong is an OSError, the one failure `end_run` counts as a pod not asked (the run's log incomplete, the run not
failed); a body cut short is never taken for the whole log; and the call is over by its deadline, whatever the pod
does, having read no more than MAX_LOG_BYTES of its answer."""
import socket
import threading
import time
import tracemalloc
from typing import Callable

import pytest

from coderun_operator import proxy

DEADLINE_SECONDS = 0.5
MARGIN_SECONDS = 0.5  # the call's own work on a loaded machine
HEAD = b"HTTP/1.1 200 OK\r\nX-Coderun-Requests: 1\r\n"


@pytest.fixture
def pod():
    """pod(talk) -> the URL of a one-shot pod on loopback that reads the request, then talk(conn, stop); `stop`
    is set when the test ends, so a pod that never answers or drips forever lets go then."""
    stop, threads = threading.Event(), []

    def start(talk: Callable[[socket.socket, threading.Event], None]) -> str:
        server = socket.create_server(("127.0.0.1", 0))

        def once():
            with server:
                conn, _ = server.accept()
                with conn:
                    conn.recv(65536)
                    try:
                        talk(conn, stop)
                    except OSError:  # the operator hung up: what a call past its deadline or cap does
                        pass

        threads.append(threading.Thread(target=once, daemon=True))
        threads[-1].start()
        return f"http://127.0.0.1:{server.getsockname()[1]}/runs/uid-1/log"

    yield start
    stop.set()
    for thread in threads:
        thread.join(5)


def replying(reply: bytes):
    return lambda conn, stop: conn.sendall(reply)


def call(url: str, deadline_seconds: float = DEADLINE_SECONDS):
    return proxy.http("GET", url, "bearer", None, time.monotonic() + deadline_seconds)


def test_a_whole_answer_is_returned_with_its_headers(pod):
    body = b'{"host": "a.example.org"}\n'
    status, got, headers = call(pod(replying(HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))), 5)
    assert (status, got, headers["X-Coderun-Requests"]) == (200, body, "1")


@pytest.mark.parametrize("reply", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{\"host\": \"a.example.org\"}\n",  # the pod went away
    b"SSH-2.0-OpenSSH_9.2\r\n\r\n",  # not HTTP: http.client's BadStatusLine, no OSError of its own
    b"",  # closed before answering
], ids=["cut-short", "not-http", "closed"])
def test_an_answer_that_is_not_a_whole_http_answer_is_an_os_error(pod, reply):
    with pytest.raises(OSError):
        call(pod(replying(reply)), 5)


def dripping(first: bytes):
    """A pod that sends `first`, then a byte every 20 ms (each well within a socket timeout) for 10 s."""
    def talk(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(first)
        for _ in range(500):
            if stop.wait(0.02):
                return
            conn.sendall(b"a")
    return talk


def silent(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait(10)


@pytest.mark.parametrize("talk", [
    dripping(HEAD + b"X-Slow: "),  # a header that never ends
    silent,
    dripping(HEAD + b"Content-Length: 1000\r\n\r\n"),
], ids=["drips-its-head", "never-answers", "drips-its-body"])
def test_a_pod_that_drips_or_never_answers_is_given_up_at_the_deadline(pod, talk):
    url = pod(talk)
    started = time.monotonic()
    with pytest.raises(OSError):
        call(url)
    assert time.monotonic() - started < DEADLINE_SECONDS + MARGIN_SECONDS


def streaming(head: bytes):
    """A pod that sends `head`, then its body's bytes until the operator hangs up."""
    def talk(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head)
        chunk = b"x" * 65536
        while not stop.is_set():
            conn.sendall(chunk)
    return talk


@pytest.mark.parametrize("talk", [
    streaming(HEAD + b"\r\n"),  # no Content-Length: the body would end with the connection
    streaming(HEAD + b"Content-Length: %d\r\n\r\n" % (64 << 20)),
], ids=["never-ends", "announces-64-MiB"])
def test_an_answer_longer_than_the_cap_is_refused_having_read_no_more_than_the_cap(pod, talk):
    url = pod(talk)
    tracemalloc.start()
    try:
        with pytest.raises(ConnectionError, match=f"{proxy.MAX_LOG_BYTES} bytes"):
            call(url, 10)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * proxy.MAX_LOG_BYTES + (1 << 20)
