"""The program's uncaught error, read from its stderr as the frame's {type, message, line}: Python's traceback and
Node's report; and V8's word that its heap ran out."""

from __future__ import annotations

import re

from .protocol import (MAX_ERROR_MESSAGE_CHARS, MAX_ERROR_TYPE_CHARS, MAX_LINE_NUMBER, REDACTION_MARGIN_CHARS,
                       cap)

# What V8 prints when its heap is full, or memory for it cannot be had, before it aborts: the program ran out
# of memory, as an OOM kill says.
V8_HEAP_EXHAUSTED = re.compile(r"^(FATAL ERROR: .*JavaScript heap out of memory|# Fatal process out of memory)", re.M)


TRACEBACK_HEADER = "Traceback (most recent call last):"
FRAME_LINE = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+)(?:, in .*)?$')
EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::(?: (?P<message>.*))?)?$")


def _names_code_file(path: str, code_file: str) -> bool:
    return path == code_file or path.endswith("/" + code_file)


def parse_python_error(stderr_text: str, code_file: str) -> dict | None:
    """The last Python exception in stderr as {type, message, line}, or None.

    `line` is the last traceback frame inside the user's code file. A
    SyntaxError in the main script has no "Traceback" header: its block
    starts at the `File "...", line N` line instead.
    """
    lines = stderr_text.split("\n")  # not splitlines(): a message may hold U+2028 or U+0085
    starts = [i for i, line in enumerate(lines) if line == TRACEBACK_HEADER]
    if starts:
        start = starts[-1] + 1
    else:
        frames = [i for i, line in enumerate(lines) if FRAME_LINE.match(line)]
        if not frames:
            return None
        start = frames[0]
    user_line = None
    for line in lines[start:]:
        frame = FRAME_LINE.match(line)
        if frame:
            if _names_code_file(frame["file"], code_file):
                user_line = _line_number(frame["line"])
            continue
        if not line or line[0].isspace():
            continue  # source excerpt, caret markers, blank separators
        exception = EXCEPTION_LINE.match(line)
        if not exception:
            return None
        return {
            "type": cap(exception["type"], MAX_ERROR_TYPE_CHARS + REDACTION_MARGIN_CHARS),
            "message": cap((exception["message"] or "").strip(" \t\r"),
                           MAX_ERROR_MESSAGE_CHARS + REDACTION_MARGIN_CHARS),
            "line": user_line,
        }
    return None


NODE_HEADER = re.compile(r"^(?P<file>.+):(?P<line>\d{1,10})$")
NODE_CARET = re.compile(r"^[ \t]*\^+[ \t]*$")
NODE_FRAME = re.compile(r"^\s+at (?:.*\()?(?P<file>[^()\s]+):(?P<line>\d{1,10}):\d+\)?(?: \{)?$")
NODE_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_$][\w$]*)(?: \[[^\]]*\])?(?:: ?(?P<message>.*))?$")
NODE_END = re.compile(r"^(Node\.js v\d|\(Use `node )")


def parse_node_error(stderr_text: str, code_file: str) -> dict | None:
    """The last uncaught JavaScript value Node reported, as {type, message, line}, or None.

    Node prints `<file>:<line>` (the code's, or a Node internal's), the source line and a caret (both empty
    for a SyntaxError at the end of the input). An Error follows after a blank line: `Type: message` (the
    message may span lines, even blank ones) and its stack (`    at ...`), or `[Type: message]` if it has no
    stack. Any other thrown value (a string, a number, an object) follows as printed, with no blank line and
    no type: "Uncaught". `line` is the innermost stack frame in the code file, else the header's line when
    it names the code file (a SyntaxError's frames are all Node's own).
    """
    lines = stderr_text.split("\n")  # not splitlines(): a message may hold U+2028 or U+0085
    headers = [i for i in range(len(lines) - 4) if NODE_HEADER.match(lines[i]) and (
        NODE_CARET.match(lines[i + 2]) or lines[i + 1] == lines[i + 2] == lines[i + 3] == "" != lines[i + 4])]
    if not headers:
        return None
    header = NODE_HEADER.match(lines[headers[-1]])
    line = _line_number(header["line"]) if _names_code_file(header["file"], code_file) else None
    report = lines[headers[-1] + 3:]
    end = next((i for i, text in enumerate(report) if NODE_END.match(text)), len(report))
    hint = end < len(report) and report[end].startswith("(Use")  # after a thrown string, number, null
    if not hint and not any(report[:end]):
        return None
    thrown_error = report[0] == "" and not hint
    stack = next((i for i in range(end) if thrown_error and report[i].startswith("    at ")), end)
    for text in report[stack:end]:
        frame = NODE_FRAME.match(text)
        if frame and _names_code_file(frame["file"], code_file):
            line = _line_number(frame["line"])  # the innermost frame in the code
            break
    type_, message = "Uncaught", "\n".join(report[:stack]).strip("\n")
    if thrown_error:
        if message.startswith("["):  # its own properties may follow: "[Type: message] { code: 7 }"
            close = message.find("] {")
            message = message[1:close if close >= 0 else message.rfind("]")]
        exception = NODE_EXCEPTION.match(message.partition("\n")[0])
        if exception:
            type_, message = exception["type"], (exception["message"] or "") + message[exception.end():]
        else:
            type_ = "Error"  # an Error whose name is no identifier
    return {
        "type": cap(type_, MAX_ERROR_TYPE_CHARS + REDACTION_MARGIN_CHARS),
        "message": cap(message.strip(" \t\r\n"), MAX_ERROR_MESSAGE_CHARS + REDACTION_MARGIN_CHARS),
        "line": line,
    }


def _line_number(digits: str) -> int | None:
    """The program can print any number: int() refuses more than 4300 digits, the status wants int32."""
    return int(digits) if len(digits) <= 10 and 0 < int(digits) <= MAX_LINE_NUMBER else None


ERROR_PARSERS = {"python": parse_python_error, "javascript": parse_node_error}
