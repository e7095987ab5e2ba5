"""Split a TCP byte stream into JSON requests (pure: bytes in, values out, no sockets).

Two framings are accepted on the same connection, freely mixed:

* newline-delimited JSON: one value per line, ``\\r\\n`` accepted, blank lines ignored;
* the original clients' style: bare values back to back with no separator
  (``{"action":1}{"action":2}``), with or without whitespace or newlines between them.

A newline always ends a request: a value cannot span lines (pretty-printed JSON is not
accepted), which is what lets a bad line be reported and skipped without losing the stream.

Errors are values (:class:`FramingError`), never raised. An error is *fatal* when the stream
can no longer be split reliably (a bad value with no newline after it), and for any request
over max_request_size: the decoder is then ``closed`` and the acceptor replies with the error
and closes the connection. A bad newline-terminated line (malformed JSON, invalid UTF-8, too
deep) is not fatal: parsing resumes at the next line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

__all__ = ["FramingError", "FrameDecoder", "DEFAULT_MAX_REQUEST_SIZE", "MAX_DEPTH", "TOO_DEEP", "too_deep"]

DEFAULT_MAX_REQUEST_SIZE = 1 << 20
# The deepest nesting a request may have. The node encodes every request again, inside a few
# levels of its own (a worker's batch, a forward, a gather tag), and orjson writes at most 254
# levels: a deeper request could not be passed on, and stopped the process that read it.
MAX_DEPTH = 128
TOO_DEEP = f"malformed JSON: nests deeper than {MAX_DEPTH} levels"

_JSONDecodeError = orjson.JSONDecodeError
_LOADS = orjson.loads
_AFTER = "unexpected content after document"
_INCOMPLETE = "unexpected end of data"
_UTF8_TRUNCATED = "unexpected end of data"  # UnicodeDecodeError.reason for a cut character

_WS_BYTES = re.compile(rb"[ \t\r\n]*")
_WS_STR = re.compile(r"[ \t\r\n]*")
_WS_CHARS = frozenset(b" \t\r\n") | frozenset(" \t\r\n")  # last item of a bytes or a str
# Inside a JSON string: everything up to the closing quote (stops early at a final lone backslash).
_STRING_BODY = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*', re.S)
# Outside strings: the next byte that changes nesting.
_STRUCTURAL = re.compile(rb'["{}\[\]]')
_WINDOW = 4096  # first guess at a value's length when several share one segment


@dataclass(frozen=True, slots=True)
class FramingError:
    """A request the decoder could not turn into a JSON value (returned, not raised)."""

    reason: str
    fatal: bool  # framing is lost: reply with the reason, then close the connection


class FrameDecoder:
    """Incremental splitter of one connection's byte stream into parsed JSON requests."""

    __slots__ = ("max_request_size", "closed", "_pending", "_checked", "_scan_pos",
                 "_scan_depth", "_scan_in_string")

    def __init__(self, max_request_size: int = DEFAULT_MAX_REQUEST_SIZE) -> None:
        if max_request_size < 1:
            raise ValueError("max_request_size must be >= 1")
        self.max_request_size = max_request_size
        self.closed = False
        self._pending = bytearray()  # start of an incomplete value (never contains a newline)
        self._checked = 0  # len(_pending) when orjson last looked at it
        self._scan_pos = 0  # resumable bracket scan over _pending (see _maybe_complete)
        self._scan_depth = 0
        self._scan_in_string = False

    @property
    def buffered(self) -> int:
        """Bytes held back as the start of an incomplete request."""
        return len(self._pending)

    def feed(self, data: bytes) -> list[tuple[object, bytes]]:
        """Add received bytes; return each request completed by them, in stream order.

        Each item is ``(value, raw)`` where value is the parsed JSON (any JSON type: the caller
        rejects non-objects) or a :class:`FramingError`, and raw is that request's bytes
        (without the terminating newline; surrounding blanks or ``\\r`` may remain). A value
        nested deeper than MAX_DEPTH is a (non-fatal) FramingError.
        """
        if data and not self._pending and not self.closed and type(data) is bytes:
            # The most common case, when a client waits for each reply: the chunk is one whole
            # line (checked here, with its depth, without the general path's lists).
            end = len(data) - 1
            if data[end] == 10 and data.find(b"\n") == end and end < self.max_request_size:
                line = data[:end]
                try:
                    value = _LOADS(line)
                except _JSONDecodeError:
                    pass
                else:
                    if end > MAX_DEPTH and too_deep(value, line):
                        return [(FramingError(TOO_DEEP, False), line)]
                    return [(value, line)]
        return _depth_checked(self._feed(data))

    def _feed(self, data: bytes) -> list[tuple[object, bytes]]:
        if self.closed or not data:
            return []
        if type(data) is not bytes:
            data = bytes(data)
        pending = self._pending
        if not pending:
            # Common case for the original clients: the chunk is exactly one bare object (one
            # whole line is feed's).
            if data[-1] == 125 and len(data) <= self.max_request_size and b"\n" not in data:
                try:
                    value = orjson.loads(data)
                    if type(value) is dict:
                        return [(value, data)]
                except _JSONDecodeError:
                    pass
        out: list[tuple[object, bytes]] = []
        if pending:
            if b"\n" not in data:
                pending += data  # in place: a value arriving in many small pieces stays linear
                return self._grow(pending, out)
            buf = b"".join((pending, data))
            self._set_pending(b"")
        else:
            buf = data

        if b"\n" in buf:
            lines = buf.split(b"\n")
            tail = lines.pop()
            loads = orjson.loads
            append = out.append
            if len(buf) <= self.max_request_size:
                for line in lines:
                    try:
                        append((loads(line), line))
                    except _JSONDecodeError:
                        self._segment(line, True, out)
            else:
                limit = self.max_request_size
                for line in lines:
                    if len(line) <= limit:
                        try:
                            append((loads(line), line))
                            continue
                        except _JSONDecodeError:
                            pass
                    self._segment(line, True, out)
                    if self.closed:
                        return out
        else:
            tail = buf

        if tail:
            # Common case for the original clients: the chunk is exactly one bare object.
            try:
                value = orjson.loads(tail)
            except _JSONDecodeError:
                value = None
            if type(value) is dict and len(tail) <= self.max_request_size:
                out.append((value, tail))
            else:
                self._set_pending(self._segment(tail, False, out))
        return out

    def finish(self) -> list[tuple[object, bytes]]:
        """End of stream: settle the held bytes as if a newline followed, then close."""
        out: list[tuple[object, bytes]] = []
        if not self.closed and self._pending:
            self._segment(bytes(self._pending), True, out)
        self._set_pending(b"")
        self.closed = True
        return _depth_checked(out)

    # -- slow paths ------------------------------------------------------------------------

    def _set_pending(self, pending: bytes) -> None:
        self._pending = bytearray(pending)
        self._checked = len(pending)
        self._scan_pos = 0
        self._scan_depth = 0
        self._scan_in_string = False

    def _grow(self, buf: bytearray, out: list) -> list:
        """Pending value continues and no newline arrived: reparse only when it may be complete.

        Reparsing on every chunk would be quadratic for a large value sent in small pieces; a
        bracket scan over the new bytes says when the top-level value may have closed, and a
        full parse is also forced each time the held data doubles (so garbage is caught) or
        passes max_request_size.
        """
        if (len(buf) > self.max_request_size or len(buf) >= 2 * self._checked
                or self._maybe_complete(buf)):
            self._set_pending(self._segment(bytes(buf), False, out))
        return out

    def _maybe_complete(self, buf: bytearray) -> bool:
        """Advance the bracket scan over buf; True when the top-level value may have ended."""
        pos, depth, in_string = self._scan_pos, self._scan_depth, self._scan_in_string
        n = len(buf)
        found = False
        while pos < n:
            if in_string:
                pos = _STRING_BODY.match(buf, pos).end()
                if pos >= n or buf[pos] != 0x22:  # open string, or a final lone backslash
                    break
                pos += 1
                in_string = False
                if depth <= 0:
                    found = True
                    break
            else:
                m = _STRUCTURAL.search(buf, pos)
                if m is None:
                    pos = n
                    break
                pos = m.end()
                c = buf[pos - 1]
                if c == 0x22:
                    in_string = True
                elif c == 0x7B or c == 0x5B:
                    depth += 1
                else:
                    depth -= 1
                    if depth <= 0:
                        found = True
                        break
        self._scan_pos, self._scan_depth, self._scan_in_string = pos, depth, in_string
        return found

    def _segment(self, seg: bytes, terminated: bool, out: list) -> bytes:
        """Parse the values in seg: a whole line (terminated) or the stream's tail.

        Appends items to out and returns the bytes to hold (the tail's incomplete value);
        on a fatal error sets closed and returns b"".
        """
        limit = self.max_request_size
        bad = -1  # byte index in seg of the first invalid UTF-8 byte
        keep = b""  # a character cut at the end of the tail, held with the pending value
        if seg.isascii():
            text: bytes | str = seg
        else:
            try:
                text = seg.decode()
            except UnicodeDecodeError as e:
                if not terminated and e.reason == _UTF8_TRUNCATED:
                    keep = seg[e.start:]
                else:
                    bad = e.start
                good = seg[: e.start]
                text = good if good.isascii() else good.decode()
        is_bytes = type(text) is bytes
        ws = _WS_BYTES if is_bytes else _WS_STR
        loads = orjson.loads
        n = len(text)
        i = 0  # index in text
        bi = 0  # the same position as a byte index in seg
        window = _WINDOW
        while True:
            j = ws.match(text, i).end()
            bi += j - i  # whitespace is ASCII
            i = j
            if i >= n:
                if bad >= 0:  # the invalid byte starts a request of its own
                    return self._fail(f"invalid UTF-8 at byte {bad - bi}", seg[bi:], terminated,
                                      out)
                if keep and len(keep) > limit:
                    return self._fail(_too_big(limit), keep, False, out)
                return keep
            j = n if n - i <= window else i + window
            cand = text[i:j]
            try:
                value = loads(cand)
            except _JSONDecodeError as e:
                msg, p = e.msg, e.pos
                if msg == _AFTER:  # a complete value, then the next one at p
                    try:
                        value = loads(cand[:p])
                    except _JSONDecodeError as e2:  # should not happen; treat as malformed
                        msg, p = e2.msg, e2.pos
                    else:
                        raw = cand[:p] if is_bytes else cand[:p].encode()
                        self._emit(value, raw, terminated, out)
                        if self.closed:
                            return b""
                        i += p
                        bi += len(raw)
                        window = 2 * p + 64  # the next value is likely of similar size
                        continue
                if j < n and (msg == _INCOMPLETE or p >= len(cand) - 16):
                    window *= 8  # the window cut the value: look further
                    continue
                if msg == _INCOMPLETE:
                    if bad >= 0:
                        return self._fail(f"invalid UTF-8 at byte {bad - bi}", seg[bi:],
                                          terminated, out)
                    if terminated:
                        return self._fail(f"malformed JSON: incomplete value at byte {len(seg) - bi}",
                                          seg[bi:], True, out)
                    pending = seg[bi:]
                    if len(pending) > limit:
                        return self._fail(_too_big(limit), pending, False, out)
                    return pending
                at = p if is_bytes else len(cand[:p].encode())
                return self._fail(f"malformed JSON: {msg} at byte {at}", seg[bi:], terminated, out)
            # Parsed. A number may continue past the window or the end of the tail.
            if type(value) is int or type(value) is float:
                if j < n:
                    window *= 8
                    continue
                if not terminated and bad < 0 and not keep and text[-1] not in _WS_CHARS:
                    return seg[bi:]
            raw = cand if is_bytes else cand.encode()
            self._emit(value, raw, terminated, out)
            if self.closed:
                return b""
            i = j
            bi += len(raw)

    def _emit(self, value: object, raw: bytes, terminated: bool, out: list) -> None:
        # The limit is on the request, not on the blanks after it (a "\r\n" line end).
        if len(raw) > self.max_request_size and len(raw.rstrip(b" \t\r\n")) > self.max_request_size:
            # Always fatal: a client that sends oversized requests is not one to keep reading.
            self._fail(_too_big(self.max_request_size), raw, False, out)
        else:
            out.append((value, raw))

    def _fail(self, reason: str, raw: bytes, terminated: bool, out: list) -> bytes:
        out.append((FramingError(reason, not terminated), raw))
        if not terminated:
            self.closed = True
        return b""


def too_deep(value: object, raw: bytes | bytearray | memoryview | str) -> bool:
    """Whether a parsed request (`raw`, its bytes or text) nests containers deeper than MAX_DEPTH."""
    # Nesting deeper than MAX_DEPTH takes more than MAX_DEPTH characters: most requests are shorter.
    if len(raw) <= MAX_DEPTH or not (type(value) is dict or type(value) is list):
        return False
    raw = raw.encode() if type(raw) is str else bytes(raw) if type(raw) is memoryview else raw
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:  # the usual case, without a walk
        return False
    level = [(value, 1)]
    while level:
        node, depth = level.pop()
        if depth > MAX_DEPTH:
            return True
        if type(node) is dict:
            level.extend((v, depth + 1) for v in node.values() if type(v) is dict or type(v) is list)
        elif type(node) is list:
            level.extend((v, depth + 1) for v in node if type(v) is dict or type(v) is list)
    return False


def _depth_checked(out: list[tuple[object, bytes]]) -> list[tuple[object, bytes]]:
    for i, (value, raw) in enumerate(out):
        if len(raw) > MAX_DEPTH and too_deep(value, raw):  # the length test inline: once per request
            out[i] = (FramingError(TOO_DEEP, False), raw)
    return out


def _too_big(limit: int) -> str:
    return f"request exceeds max_request_size ({limit} bytes)"
