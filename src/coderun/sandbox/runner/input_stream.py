"""A session pod's input: one length-prefixed document per run on stdin, for as long as the session lives.

Each document is the warm pool's (inputs.read_stdin_input): an ASCII decimal length, a newline, then that many
bytes of JSON {"nonce", "data", "binaryData"} with the input ConfigMap's keys and that run's own nonce. A bad
document costs its run an InvalidInput, never the session: its bytes are consumed whatever they hold (a garbage
length line up to its newline), so the next document is read in step. The stream ending between documents ends
the session; ending inside one, or announcing one larger than any run's input, breaks it (InputIncomplete,
raised: nothing after can be trusted to be in step).

Once the runner has the session's key (from the first document, which the claim vouches for as the warm pool's
input), every later document's length line also carries an HMAC-SHA256 under that key of the document's
sequence number (1, 2, ...) and its body: `<length> <mac hex>`. A document without the right MAC is dropped
unread and does not take a sequence number: another client of the pod's stdin cannot run code as the session's
caller, nor replay or reorder the operator's documents.
"""

from __future__ import annotations

import collections
import hmac
import json

from .capture import READ_CHUNK
from .inputs import NONCE, InputIncomplete, InvalidInput, parse_input_document, read_exactly
from .protocol import session_document_mac as mac

# One run's input: code, stdin and files (768 KiB of spec), in base64 and JSON, with room to spare.
MAX_SESSION_DOCUMENT_BYTES = 4 * 1024 * 1024
MAX_LENGTH_LINE_BYTES = 96  # 20 digits, a space and 64 hex digits of MAC, with room

# One document as read: the run's nonce and input keys, or why it could not be read. `nonce` is set whenever the
# document had a well-formed one, so the runner can still answer that run with a frame the operator trusts.
SessionInput = collections.namedtuple("SessionInput", ["nonce", "entries", "error"])


def _skip_line(stream) -> None:
    """Consume up to and including the next newline (or the end of the stream)."""
    while True:
        chunk = stream.readline(READ_CHUNK)
        if not chunk or chunk.endswith(b"\n"):
            return


def _nonce_of(body: bytes) -> str | None:
    """The nonce of a document that is otherwise bad, when it has a well-formed one."""
    try:
        nonce = json.loads(body).get("nonce")
    except (ValueError, UnicodeDecodeError, RecursionError, AttributeError):
        return None
    return nonce if isinstance(nonce, str) and NONCE.match(nonce) else None


class SessionInputs:
    """The documents on `stream` (a binary stream), one SessionInput each, until the stream ends between
    documents. Set `key` once the session has one: from then on only documents with its MAC are read."""

    def __init__(self, stream, max_document_bytes: int = MAX_SESSION_DOCUMENT_BYTES):
        self.stream, self.max_document_bytes = stream, max_document_bytes
        self.key: bytes | None = None
        self.sequence = 0  # the sequence number of the last authenticated document read

    def __iter__(self):
        while True:
            header = self.stream.readline(MAX_LENGTH_LINE_BYTES)
            if header == b"":
                return  # the stream ended between documents: the session is over
            if not header.endswith(b"\n"):
                if len(header) < MAX_LENGTH_LINE_BYTES:
                    raise InputIncomplete("the input stream ended inside a length line")
                _skip_line(self.stream)
                yield SessionInput(None, None, "the input's length line is longer than a length")
                continue
            length_text, _, signature = header[:-1].partition(b" ")
            if not length_text.isdigit():
                yield SessionInput(None, None, "the input's length line is not a decimal number")
                continue
            length = int(length_text)
            if length > self.max_document_bytes:
                raise InputIncomplete(f"a document of {length} bytes announced, more than any run's input "
                                      f"({self.max_document_bytes}): the stream is out of step")
            if length == 0:
                yield SessionInput(None, None, "the input's length must be more than 0")
                continue
            body = read_exactly(self.stream, length)  # InputIncomplete if the stream ends inside it
            if self.key is not None:
                # "<sequence> <mac>": any sequence past the last one read (a document the operator numbered but
                # never sent leaves a gap, harmlessly); one at or before it is a replay or out of order
                sequence_text, _, mac_text = signature.partition(b" ")
                sequence = int(sequence_text) if sequence_text.isdigit() and len(sequence_text) <= 18 else 0
                if sequence <= self.sequence or not hmac.compare_digest(mac_text, mac(self.key, sequence, body).encode()):
                    yield SessionInput(None, None, "the document is not the session's (no valid MAC, or a sequence "
                                                   "number already used): dropped")
                    continue
                self.sequence = sequence
            try:
                nonce, entries = parse_input_document(body)
            except InvalidInput as exc:
                yield SessionInput(_nonce_of(body), None, str(exc))
                continue
            yield SessionInput(nonce, entries, None)


def read_session_inputs(stream, max_document_bytes: int = MAX_SESSION_DOCUMENT_BYTES):
    """The documents of a stream read without a key (a session's first document, and the tests)."""
    return iter(SessionInputs(stream, max_document_bytes))
