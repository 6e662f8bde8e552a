"""The line protocol squid speaks with its helpers (auth_param and external_acl_type, both with `concurrency=`),
treating every line as hostile: bounded length, any bytes, no crash.

    request:  <channel> <field> <field> ...\\n     (each field URL-escaped by squid; "-" when squid has none)
    reply:    <channel> OK|ERR key="value" ...\\n  (values quoted, \\ and " escaped; keys become the request's
                                                    annotations, `message` is %o on squid's error page)

Channels let squid send the next request before the last is answered; with more than one worker the answers
come back in any order (a slow name lookup does not hold up the requests behind it).
"""
from __future__ import annotations

import sys
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, Callable
from urllib.parse import unquote

MAX_LINE = 32 * 1024  # the longest token, its user name and a long host name fit with room to spare
MAX_VALUE = 1024


def reply(ok: bool, **notes: str | None) -> str:
    """OK or ERR with key="value" pairs (None values left out)."""
    words = ["OK" if ok else "ERR"]
    for key, value in notes.items():
        if value is not None:
            words.append(f'{key}="{_quoted(value)}"')
    return " ".join(words)


def fields(line: str) -> list[str]:
    return [unquote(word, errors="replace") for word in line.split(" ") if word]


def serve(answer: Callable[[list[str]], str], *, workers: int = 1, stdin: BinaryIO | None = None,
          stdout: BinaryIO | None = None, max_line: int = MAX_LINE) -> None:
    """Answer squid until it closes stdin. `answer` gets one request's fields (URL-decoded) and returns the reply
    (reply()); an exception in it is answered with ERR and written to stderr (squid's cache.log), never fatal."""
    source = stdin or sys.stdin.buffer
    sink = stdout or sys.stdout.buffer
    lock = threading.Lock()

    def send(channel: str, text: str) -> None:
        with lock:
            sink.write(f"{channel} {text}\n".encode())
            sink.flush()

    def handle(channel: str, rest: list[str]) -> None:
        try:
            send(channel, answer(rest))
        except Exception:  # noqa: BLE001 - one bad request must not take the helper (and squid's ACL) down
            traceback.print_exc(limit=4, file=sys.stderr)
            send(channel, reply(False, message="the egress proxy's helper failed on this request"))

    pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None
    try:
        while True:
            raw = source.readline(max_line + 1)
            if not raw:
                return
            too_long = len(raw) > max_line and not raw.endswith(b"\n")
            if too_long:
                _drop_rest_of_line(source, max_line)
            channel, _, rest = raw.decode("utf-8", errors="replace").rstrip("\r\n").partition(" ")
            if not channel.isdigit() or len(channel) > 9:
                continue  # not a request of squid's: nothing to answer it on
            if too_long:
                send(channel, reply(False, message="request too long for the egress proxy"))
            elif pool is not None:
                pool.submit(handle, channel, fields(rest))
            else:
                handle(channel, fields(rest))
    finally:
        if pool is not None:
            pool.shutdown(wait=True)


def _drop_rest_of_line(source: BinaryIO, chunk: int) -> None:
    while True:
        more = source.readline(chunk)
        if not more or more.endswith(b"\n"):
            return


def _quoted(value: str) -> str:
    text = "".join(c if c >= " " and c != "\x7f" else " " for c in value[:MAX_VALUE])
    return text.replace("\\", "\\\\").replace('"', '\\"')
