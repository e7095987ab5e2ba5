"""Tests for protocol/framing.py: TCP stream -> JSON requests."""

from __future__ import annotations

import random

import orjson
import pytest

import queue_server.protocol.framing as framing
from queue_server.protocol.framing import FrameDecoder, FramingError

# Values chosen to stress the splitter: braces, brackets and quotes inside strings, escaped
# quotes and backslashes, escaped newlines, multi-byte UTF-8 (2, 3 and 4 bytes), nesting.
VALUES: list[object] = [
    {"action": 1, "queue": "q1", "data": "hello"},
    {"action": 1, "queue": "ünïcödé", "data": "€ 漢字 😀 {\"}[]"},
    {"action": 2, "queue": "braces", "data": "}{}{ ]] [[ \"{\" '}'"},
    {"action": 1, "queue": "esc", "data": 'quote \\" backslash \\\\ end\\', "seq": 7},
    {"action": 1, "queue": "nl", "data": "line1\nline2\r\n\ttab \u0000 \u001f"},
    {"nested": {"a": [1, 2, {"b": [None, True, False, -1.5e-3, {"c": {}}]}], "d": []}},
    {"action": 3, "queue": "q", "msg_id": 12345678901234, "data": ""},
    {"k": "\\"},
    {"k": "\\\\\"", "k2": "\"\\\""},
    {},
]


def _encode_ascii_escaped(v: object) -> bytes:
    """JSON with non-ASCII written as \\u escapes (a different byte layout from orjson's)."""
    import json

    return json.dumps(v, ensure_ascii=True, separators=(",", ":")).encode()


def _streams() -> dict[str, tuple[bytes, list[object]]]:
    enc = [orjson.dumps(v) for v in VALUES]
    esc = [_encode_ascii_escaped(v) for v in VALUES]
    ws_seps = [b"", b" ", b"\n", b"\r\n", b"\n\n", b" \t\r\n  ", b"\r\n\r\n"]
    mixed = b"".join(e + ws_seps[i % len(ws_seps)] for i, e in enumerate(enc))
    return {
        "ndjson": (b"\n".join(enc) + b"\n", VALUES),
        "crlf": (b"\r\n".join(enc) + b"\r\n", VALUES),
        "back_to_back": (b"".join(enc), VALUES),
        "back_to_back_escaped": (b"".join(esc), VALUES),
        "mixed_whitespace": (mixed, VALUES),
        "blank_lines": (b"\n\n" + b"\n \n\r\n".join(enc) + b"\n\n", VALUES),
        "pretty_spaces": (
            b"".join(orjson.dumps(v).replace(b'":', b'" : ').replace(b",", b" , ") + b"\n"
                     for v in VALUES[:3]),
            VALUES[:3],
        ),
    }


STREAMS = _streams()


def _decode_chunks(chunks: list[bytes], max_request_size: int = 1 << 20) -> list[tuple[object, bytes]]:
    d = FrameDecoder(max_request_size)
    items: list[tuple[object, bytes]] = []
    for c in chunks:
        items.extend(d.feed(c))
    assert d.buffered == 0
    assert not d.closed
    return items


def _check(items: list[tuple[object, bytes]], expected: list[object]) -> None:
    values = [v for v, _ in items]
    assert values == expected
    for v, raw in items:
        assert isinstance(raw, bytes)
        assert orjson.loads(raw) == v  # raw is exactly one request
        assert b"\n" not in raw


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_whole_stream(name: str) -> None:
    stream, expected = STREAMS[name]
    _check(_decode_chunks([stream]), expected)


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_split_at_every_byte_boundary(name: str) -> None:
    stream, expected = STREAMS[name]
    for k in range(len(stream) + 1):
        items = _decode_chunks([stream[:k], stream[k:]])
        assert [v for v, _ in items] == expected, f"split at byte {k}"
    _check(items, expected)


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_one_byte_at_a_time(name: str) -> None:
    stream, expected = STREAMS[name]
    _check(_decode_chunks([stream[k:k + 1] for k in range(len(stream))]), expected)


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_random_chunkings(name: str) -> None:
    stream, expected = STREAMS[name]
    rng = random.Random(1234)
    for _ in range(300):
        chunks, i = [], 0
        top = rng.choice([3, 16, 64, 400])
        while i < len(stream):
            n = rng.randint(1, top)
            chunks.append(stream[i:i + n])
            i += n
        _check(_decode_chunks(chunks), expected)


def test_values_returned_once_as_they_complete() -> None:
    d = FrameDecoder()
    assert d.feed(b'{"action":1}{"act') == [({"action": 1}, b'{"action":1}')]
    assert d.buffered == len(b'{"act')
    assert d.feed(b'ion":2}') == [({"action": 2}, b'{"action":2}')]
    assert d.feed(b"\n") == []
    assert d.buffered == 0


def test_back_to_back_in_one_chunk() -> None:
    items = FrameDecoder().feed(b'{"action":1}{"action":2}  {"action":3}\n{"action":4}{"action":5}')
    assert [v for v, _ in items] == [{"action": n} for n in range(1, 6)]


def test_bytearray_and_memoryview_accepted() -> None:
    d = FrameDecoder()
    assert [v for v, _ in d.feed(bytearray(b'{"a":1}\n'))] == [{"a": 1}]
    assert [v for v, _ in d.feed(memoryview(b'{"b":2}'))] == [{"b": 2}]


def test_empty_and_whitespace_feeds() -> None:
    d = FrameDecoder()
    assert d.feed(b"") == []
    assert d.feed(b"\n\r\n  \t \n") == []
    assert d.feed(b"   ") == []
    assert d.feed(b'{"a":1}') == [({"a": 1}, b'{"a":1}')]


def test_non_object_values_are_returned() -> None:
    items = FrameDecoder().feed(b'123\n[1]\n"s"\nnull\ntrue\n{"a":1}[2]"x"false\n')
    assert [v for v, _ in items] == [123, [1], "s", None, True, {"a": 1}, [2], "x", False]


def test_number_at_end_of_stream_is_held_until_delimited() -> None:
    d = FrameDecoder()
    assert d.feed(b"12") == []
    assert d.feed(b"3") == []
    assert d.feed(b"4\n") == [(1234, b"1234")]
    assert d.feed(b"5") == []
    assert d.feed(b' {"a":1}') == [(5, b"5 "), ({"a": 1}, b'{"a":1}')]


# -- errors -------------------------------------------------------------------------------


def _errors(items: list[tuple[object, bytes]]) -> list[FramingError]:
    return [v for v, _ in items if isinstance(v, FramingError)]


def test_malformed_line_is_not_fatal() -> None:
    d = FrameDecoder()
    items = d.feed(b'{"a":1}\n{"b":x}\n{"c":3}\n')
    assert [v for v, _ in items][0] == {"a": 1}
    err, raw = items[1]
    assert isinstance(err, FramingError) and not err.fatal
    assert err.reason.startswith("malformed JSON:") and "at byte 5" in err.reason
    assert raw == b'{"b":x}'
    assert items[2] == ({"c": 3}, b'{"c":3}')
    assert not d.closed


def test_malformed_value_inside_a_line_of_back_to_back_values() -> None:
    items = FrameDecoder().feed(b'{"a":1}{"b":x}{"c":2}\n{"d":3}\n')
    assert items[0][0] == {"a": 1}
    assert isinstance(items[1][0], FramingError) and not items[1][0].fatal
    assert items[1][1] == b'{"b":x}{"c":2}'  # the rest of the line is skipped with it
    assert items[2][0] == {"d": 3}
    assert len(items) == 3


def test_line_ending_inside_a_value_is_an_error_not_a_continuation() -> None:
    d = FrameDecoder()
    items = d.feed(b'{"action":1\n{"action":2}\n')
    err = items[0][0]
    assert isinstance(err, FramingError) and not err.fatal and "incomplete" in err.reason
    assert items[0][1] == b'{"action":1'
    assert items[1][0] == {"action": 2}


def test_garbage_line_and_bom() -> None:
    items = FrameDecoder().feed(b'hello\n\xef\xbb\xbf{"a":1}\n}\n{"ok":1}\n')
    assert [isinstance(v, FramingError) and not v.fatal for v, _ in items[:3]] == [True] * 3
    assert items[3][0] == {"ok": 1}


def test_malformed_without_newline_is_fatal_and_closes() -> None:
    d = FrameDecoder()
    items = d.feed(b'{"a":1}{"b":x')
    assert items[0][0] == {"a": 1}
    err, raw = items[1]
    assert isinstance(err, FramingError) and err.fatal
    assert raw == b'{"b":x'
    assert d.closed
    assert d.feed(b'}\n{"c":1}\n') == []
    assert d.finish() == []


def test_malformed_line_split_before_its_newline_is_fatal() -> None:
    # The decoder cannot know a newline is coming: framing is judged on what has arrived.
    d = FrameDecoder()
    assert _errors(d.feed(b'{"b":x}'))[0].fatal
    assert d.closed


def test_malformed_detected_in_a_later_chunk_of_a_pending_value() -> None:
    d = FrameDecoder()
    assert d.feed(b'{"a":"' + b"x" * 100) == []
    items = d.feed(b'"]')  # brackets do not match
    assert len(items) == 1 and isinstance(items[0][0], FramingError) and items[0][0].fatal


def test_pending_larger_than_max_request_size_is_fatal() -> None:
    d = FrameDecoder(max_request_size=100)
    assert d.feed(b'{"data":"' + b"x" * 80) == []
    items = d.feed(b"x" * 30)
    assert len(items) == 1
    err, raw = items[0]
    assert isinstance(err, FramingError) and err.fatal
    assert err.reason == "request exceeds max_request_size (100 bytes)"
    assert d.closed


def test_pending_larger_than_max_request_size_in_one_chunk_is_fatal() -> None:
    d = FrameDecoder(max_request_size=100)
    items = d.feed(b'{"a":1}{"data":"' + b"x" * 200)
    assert items[0][0] == {"a": 1}
    assert isinstance(items[1][0], FramingError) and items[1][0].fatal
    assert "max_request_size" in items[1][0].reason


def test_complete_line_larger_than_max_is_fatal() -> None:
    """The issue: a request over max_request_size gets its reply, then the connection closes."""
    big = orjson.dumps({"data": "x" * 200})
    d = FrameDecoder(max_request_size=100)
    items = d.feed(b'{"a":1}\n' + big + b'\n{"b":2}\n')
    assert items[0][0] == {"a": 1}
    err, raw = items[1]
    assert isinstance(err, FramingError) and err.fatal
    assert err.reason == "request exceeds max_request_size (100 bytes)"
    assert raw == big
    assert len(items) == 2
    assert d.closed


def test_complete_value_larger_than_max_without_newline_is_fatal() -> None:
    big = orjson.dumps({"data": "x" * 200})
    d = FrameDecoder(max_request_size=100)
    items = d.feed(b'{"a":1}' + big)
    assert items[0][0] == {"a": 1}
    assert isinstance(items[1][0], FramingError) and items[1][0].fatal
    assert "max_request_size" in items[1][0].reason
    d = FrameDecoder(max_request_size=100)
    assert _errors(d.feed(big))[0].fatal  # a chunk that is exactly one bare oversized object


def test_value_of_exactly_max_request_size_is_accepted() -> None:
    v = {"data": "x" * 90}
    raw = orjson.dumps(v)
    d = FrameDecoder(max_request_size=len(raw))
    assert d.feed(raw) == [(v, raw)]
    assert d.feed(raw + b"\n" + raw + raw) == [(v, raw)] * 3
    assert d.feed(raw[:50]) == []
    assert d.feed(raw[50:]) == [(v, raw)]


def test_small_values_on_a_chunk_larger_than_max_are_fine() -> None:
    d = FrameDecoder(max_request_size=64)
    stream = b"".join(orjson.dumps({"i": i}) + b"\n" for i in range(100))
    assert [v for v, _ in d.feed(stream)] == [{"i": i} for i in range(100)]
    stream = b"".join(orjson.dumps({"i": i}) for i in range(100))  # back to back
    assert [v for v, _ in d.feed(stream)] == [{"i": i} for i in range(100)]


def test_invalid_utf8_on_a_line_is_not_fatal() -> None:
    d = FrameDecoder()
    items = d.feed(b'{"a":"\xff"}\n{"b":"\xc3\xa9"}\n')
    err, raw = items[0]
    assert isinstance(err, FramingError) and not err.fatal
    assert "UTF-8" in err.reason and "at byte 6" in err.reason
    assert raw == b'{"a":"\xff"}'
    assert items[1][0] == {"b": "é"}


def test_invalid_utf8_kinds() -> None:
    for bad in (b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\xe2\x82"):
        items = FrameDecoder().feed(b'{"a":"' + bad + b'"}\n{"ok":1}\n')
        assert isinstance(items[0][0], FramingError), bad
        assert "UTF-8" in items[0][0].reason and not items[0][0].fatal, bad
        assert items[1][0] == {"ok": 1}, bad


def test_invalid_utf8_after_a_valid_value_on_the_same_line() -> None:
    items = FrameDecoder().feed(b'{"a":"\xc3\xa9"}\xff{"b":1}\n{"c":1}\n')
    assert items[0] == ({"a": "é"}, b'{"a":"\xc3\xa9"}')
    assert isinstance(items[1][0], FramingError) and "UTF-8 at byte 0" in items[1][0].reason
    assert items[1][1] == b'\xff{"b":1}'
    assert items[2][0] == {"c": 1}


def test_invalid_utf8_without_newline_is_fatal() -> None:
    d = FrameDecoder()
    items = d.feed(b'{"a":1}\n{"b":"\xff')
    assert items[0][0] == {"a": 1}
    assert isinstance(items[1][0], FramingError) and items[1][0].fatal
    assert "UTF-8" in items[1][0].reason
    assert d.closed


def test_character_split_across_chunks_waits() -> None:
    d = FrameDecoder()
    assert d.feed(b'{"a":"\xf0\x9f') == []
    assert d.feed(b'\x98') == []
    assert d.feed(b'\x80"}') == [({"a": "😀"}, b'{"a":"\xf0\x9f\x98\x80"}')]
    # a cut character right after a complete value is held with nothing else
    assert d.feed(b'{"b":1}\xc3') == [({"b": 1}, b'{"b":1}')]
    assert d.buffered == 1


def test_too_deep_on_a_line_is_not_fatal() -> None:
    deep = b"[" * 2000 + b"]" * 2000
    d = FrameDecoder()
    items = d.feed(b'{"a":' + deep + b"}\n" + b'{"b":1}\n')
    err = items[0][0]
    assert isinstance(err, FramingError) and not err.fatal
    assert "depth" in err.reason or "recursion" in err.reason
    assert items[1][0] == {"b": 1}


def test_other_errors_are_reported_with_orjson_reason() -> None:
    items = FrameDecoder().feed(b'{"a":1,}\n{"a" 1}\n{"a":NaN}\n{"a":1e400}\n{"a":"\\ud800"}\n')
    assert len(items) == 5
    for err, _ in items:
        assert isinstance(err, FramingError) and not err.fatal
        assert err.reason.startswith("malformed JSON: ")


def test_finish_settles_held_bytes() -> None:
    d = FrameDecoder()
    assert d.feed(b"42") == []
    assert d.finish() == [(42, b"42")]
    assert d.closed and d.feed(b'{"a":1}\n') == []
    d = FrameDecoder()
    d.feed(b'{"a":')
    items = d.finish()
    assert isinstance(items[0][0], FramingError) and "incomplete" in items[0][0].reason
    assert FrameDecoder().finish() == []


def test_error_is_a_plain_value() -> None:
    e = FramingError("x", True)
    assert e == FramingError(reason="x", fatal=True)
    assert not isinstance(e, BaseException)
    with pytest.raises(ValueError):
        FrameDecoder(0)


# -- cost: a large value sent in small pieces must not be reparsed on every piece ---------


class _CountingOrjson:
    """Stands in for the orjson module inside server.framing, counting the bytes parsed."""

    JSONDecodeError = orjson.JSONDecodeError

    def __init__(self) -> None:
        self.parsed = 0

    def loads(self, b):  # noqa: ANN001, ANN201
        self.parsed += len(b)
        return orjson.loads(b)


@pytest.mark.parametrize("value", [
    {"data": "x" * 200_000},
    {"data": "}]" * 100_000},  # closing brackets inside a string must not trigger parses
    {"data": "\\\"" * 60_000},  # escaped quotes
    {"list": [{"a": "b"}] * 20_000},
])
def test_slow_drip_is_linear(monkeypatch: pytest.MonkeyPatch, value: object) -> None:
    counter = _CountingOrjson()
    monkeypatch.setattr(framing, "orjson", counter)
    raw = orjson.dumps(value)
    d = FrameDecoder()
    items = []
    for i in range(0, len(raw), 7):
        items.extend(d.feed(raw[i:i + 7]))
    assert items == [(value, raw)]
    assert counter.parsed < 8 * len(raw)


def test_many_back_to_back_values_in_one_chunk_is_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    counter = _CountingOrjson()
    monkeypatch.setattr(framing, "orjson", counter)
    stream = b"".join(orjson.dumps({"i": i, "d": "y" * (i % 50)}) for i in range(5000))
    items = FrameDecoder().feed(stream)
    assert [v["i"] for v, _ in items] == list(range(5000))
    assert counter.parsed < 12 * len(stream)


def _nested(depth: int) -> bytes:
    return b'{"action":1,"queue":"q","data":"x","extra":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def test_a_request_nested_deeper_than_max_depth_is_malformed_and_not_fatal() -> None:
    """The node re-encodes every request (orjson writes at most 254 levels, and the node wraps a
    request in a few more): one nested deeper once wedged the acceptor that read it."""
    d = FrameDecoder()
    deep, ok = _nested(framing.MAX_DEPTH + 1), _nested(framing.MAX_DEPTH)
    out = d.feed(deep + b"\n" + ok + b"\n" + _nested(300) + b"\n" + _nested(1000) + b"\n")
    reasons = [v.reason if isinstance(v, FramingError) else None for v, _ in out]
    too_deep = f"malformed JSON: nests deeper than {framing.MAX_DEPTH} levels"
    assert reasons == [too_deep, None, too_deep, too_deep]
    assert not d.closed and orjson.dumps(out[1][0])
    assert [type(v) for v, _ in FrameDecoder().feed(deep)] == [FramingError]  # a bare object too


def test_too_deep_counts_containers_not_brackets_in_strings() -> None:
    flat = {"data": "[" * 1000}
    assert not framing.too_deep(flat, orjson.dumps(flat))
    nested = orjson.loads(_nested(framing.MAX_DEPTH + 1))
    assert framing.too_deep(nested, _nested(framing.MAX_DEPTH + 1))
    assert not framing.too_deep(orjson.loads(_nested(framing.MAX_DEPTH)), _nested(framing.MAX_DEPTH))
