"""The program's stdout and stderr as the frame keeps them: the head up to the cap, the tail for the error parsers,
and the count and digest of every byte."""

from __future__ import annotations

import hashlib

READ_CHUNK = 65536
TAIL_BYTES = 16384


def trim_partial_utf8(data: bytes) -> bytes:
    """Drop a multi-byte UTF-8 character cut in half at the end of data."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead
            continue
        sequence_length = 1 if byte < 0x80 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
        return data[:-back] if sequence_length > back else data
    return data


class StreamCapture:
    """Keeps the first `limit` bytes of a stream but counts and hashes all of it.

    It also keeps the last TAIL_BYTES, so a traceback at the end of a long
    stderr can still be parsed when the kept head is truncated.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.kept = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.digest = hashlib.sha256()

    def feed(self, chunk: bytes) -> None:
        room = self.limit - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]
        self.tail += chunk[-TAIL_BYTES:]
        del self.tail[:-TAIL_BYTES]
        self.total += len(chunk)
        self.digest.update(chunk)

    @property
    def truncated(self) -> bool:
        return self.total > len(self.kept)

    def text(self) -> str:
        data = bytes(self.kept)
        if self.truncated:
            data = trim_partial_utf8(data)
        return data.decode("utf-8", errors="replace")

    def text_for_parsing(self) -> str:
        """The end of the stream, where an error report is."""
        data = self.tail if self.truncated else self.kept
        return bytes(data).decode("utf-8", errors="replace")
