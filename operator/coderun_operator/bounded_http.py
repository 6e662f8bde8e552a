"""One HTTP call to a pod of coderun's own (an egress proxy's admin endpoint, a node's audit agent), over by a
deadline whatever the pod does, reading no more than a cap of its answer. Standard library only; callers pass
their own transport in unit tests (a function of the same shape)."""
from __future__ import annotations

import socket
import time
import urllib.parse
from http.client import HTTPConnection, HTTPException
from typing import TYPE_CHECKING, Callable, Mapping

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

# (method, url, bearer, body, deadline) -> (status, body, headers). The deadline is a time.monotonic() value: the
# call is over by then, answered or not (an OSError).
Transport = Callable[[str, str, str, bytes | None, float], tuple[int, bytes, Mapping[str, str]]]


def call(method: str, url: str, bearer: str, body: bytes | None, deadline: float,
         max_bytes: int) -> tuple[int, bytes, Mapping[str, str]]:
    """One call, over by `deadline` whatever the pod does (a pod dripping its answer a byte at a time included),
    never through a proxy of the operator's own environment. An answer that is not HTTP, ends before its
    Content-Length (the pod went away), or is longer than `max_bytes` (read no further: memory stays bounded by
    that and http.client's limits on the head) is an OSError like no answer at all."""
    target = urllib.parse.urlsplit(url)
    connection = _DeadlineConnection(target.hostname or "", target.port, deadline)
    path = target.path + (f"?{target.query}" if target.query else "")
    try:
        connection.request(method, path, body=body, headers={
            "Authorization": f"Bearer {bearer}", "Content-Type": "application/json"})
        answer = connection.getresponse()
        if (answer.length or 0) > max_bytes:
            raise ConnectionError(f"the answer's Content-Length {answer.length} is over {max_bytes} bytes")
        data = answer.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ConnectionError(f"the answer is longer than {max_bytes} bytes: not read further")
        if answer.length:  # read() returns a body cut short without a word
            raise ConnectionError(f"the answer ended {answer.length} bytes before its Content-Length")
        return answer.status, data, dict(answer.headers)
    except HTTPException as e:  # BadStatusLine, LineTooLong ...: not OSErrors of their own
        raise ConnectionError(f"not an HTTP answer: {type(e).__name__}: {str(e)[:100]}") from e
    finally:
        connection.close()


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the pod did not answer in time")
    return left


class _DeadlineSocket(socket.socket):
    """A socket whose every send and receive waits only for what is left before its deadline: a socket timeout
    alone bounds each operation, so a peer sending a byte now and then could hold the call for hours."""
    deadline = 0.0

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        self.settimeout(_left(self.deadline))
        return super().recv_into(buffer, nbytes, flags)

    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:  # bounds the whole send since Python 3.5
        self.settimeout(_left(self.deadline))
        return super().sendall(data, flags)


class _DeadlineConnection(HTTPConnection):
    def __init__(self, host: str, port: int | None, deadline: float):
        super().__init__(host, port)
        self.deadline = deadline

    def connect(self) -> None:
        connected = socket.create_connection((self.host, self.port), _left(self.deadline))
        self.sock = _DeadlineSocket(fileno=connected.detach())
        self.sock.deadline = self.deadline
