"""Property tests (hypothesis) of the pure request path: protocol/framing.py's FrameDecoder fed
random bytes and random splits of valid streams, protocol/vocabulary.py's request parsing, and
workers/service.py's PartitionService fed random, plausible-but-wrong requests.

What they hold the code to (docs/protocol.md, docs/architecture.md): every request gets exactly
one reply (one decoded item per request); a bad one gets code -1 with a reason naming the field;
nothing raises on client input; a rejected request changes nothing stored."""
from __future__ import annotations

import json
import re

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queue_server.protocol import vocabulary as p
from queue_server.protocol.framing import FrameDecoder, FramingError
from queue_server.protocol.origin import Origin
from queue_server.workers.service import UDP_TOO_LARGE, PartitionService
from tests.unit.service_replies import take_replies

# -- strategies -------------------------------------------------------------------------------

WS = b" \t\r\n"
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)  # orjson refuses surrogates
SCALARS = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
           | st.floats(allow_nan=False, allow_infinity=False) | TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(TEXT, inner, max_size=4), max_leaves=10)
OBJECTS = st.dictionaries(TEXT, JSON, max_size=5)
# Between requests: nothing (the original's clients), blanks, newlines, CRLF, blank lines.
SEPARATORS = st.sampled_from([b"", b" ", b"\t", b"\n", b"\r\n", b"\n\n", b" \r\n", b"\r\n\r\n", b"  \n "])


def _encodings(value: object) -> st.SearchStrategy[bytes]:
    """One-line JSON encodings of value with different byte layouts."""
    return st.sampled_from([
        orjson.dumps(value),
        json.dumps(value, ensure_ascii=True, separators=(",", ":")).encode(),
        json.dumps(value, ensure_ascii=False).encode(),  # ", " and ": " separators
    ])


@st.composite
def request_streams(draw: st.DrawFn, objects: st.SearchStrategy = OBJECTS, min_size: int = 0
                    ) -> tuple[bytes, list[object], list[bytes]]:
    """A valid stream of requests (JSON objects), newline-delimited or back to back, mixed:
    (stream, the objects, their encodings)."""
    values = draw(st.lists(objects, min_size=min_size, max_size=8))
    encodings = [draw(_encodings(v)) for v in values]
    parts = [draw(SEPARATORS)]
    for e in encodings:
        parts += [e, draw(SEPARATORS)]
    return b"".join(parts), values, encodings


@st.composite
def splits(draw: st.DrawFn, stream: bytes) -> list[bytes]:
    """stream cut into chunks at random places (sometimes one byte at a time)."""
    if len(stream) > 1 and draw(st.integers(0, 9)) == 0:
        return [stream[i:i + 1] for i in range(len(stream))]
    cuts = sorted(set(draw(st.lists(st.integers(0, len(stream)), max_size=12))))
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in zip(bounds, bounds[1:])]


# Byte soup that is likely to confuse a JSON splitter: structural bytes, escapes, cut UTF-8,
# number pieces, literals, whole and broken requests.
FRAGMENTS = st.one_of(
    st.sampled_from([b"{", b"}", b"[", b"]", b'"', b"\\", b'\\"', b":", b",", b"\n", b"\r\n", b" ",
                     b"\xff", b"\xc3", b"\xc3\xa9", b"\xf0\x9f", b"\xf0\x9f\x98\x80", b"\xed\xa0\x80",
                     b"1", b"-", b".", b"e", b"0", b"tru", b"true", b"null", b"nul", b"NaN",
                     b'{"action":1,"queue":"q","data":"x"}', b'{"a":', b'"\\u00', b"\xef\xbb\xbf"]),
    st.binary(max_size=12),
    OBJECTS.map(orjson.dumps),
)
SOUP = st.lists(FRAGMENTS, max_size=25).map(b"".join) | st.binary(max_size=200)


def _decode(chunks: list[bytes], limit: int = 1 << 20, finish: bool = True) -> tuple[list, FrameDecoder]:
    d = FrameDecoder(limit)
    items: list = []
    for c in chunks:
        items += d.feed(c)
        assert d.buffered <= limit
    if finish:
        items += d.finish()
    return items, d


def _check_item(value: object, raw: bytes, limit: int) -> None:
    """What every decoded item must look like."""
    assert type(raw) is bytes and b"\n" not in raw
    if isinstance(value, FramingError):
        assert isinstance(value.reason, str) and value.reason
        return
    assert orjson.loads(raw) == value  # raw is exactly this one value (blanks around it allowed)
    assert len(raw.strip(WS)) <= limit


def _key(item: tuple[object, bytes]) -> tuple:
    """An item as compared across splits. Whether an error is fatal is left out: a split may
    defer judging bytes until more arrive, and at finish() every error ends the stream anyway."""
    value, raw = item
    if isinstance(value, FramingError):
        return ("error", value.reason)
    return ("value", orjson.dumps(value), raw.strip(WS))


# -- FrameDecoder ------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), request_streams())
def test_any_split_of_a_valid_stream_decodes_like_the_whole(data: st.DataObject, case) -> None:
    stream, values, encodings = case
    whole, d = _decode([stream], finish=False)
    assert [v for v, _ in whole] == values  # one item per request, in order
    assert d.buffered == 0 and not d.closed
    chunks = data.draw(splits(stream))
    split, d = _decode(chunks, finish=False)
    assert [_key(i) for i in split] == [_key(i) for i in whole]
    assert d.buffered == 0 and not d.closed
    for (value, raw), encoding in zip(split, encodings):
        _check_item(value, raw, 1 << 20)
        assert raw.strip(WS) == encoding


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), SOUP)
def test_random_bytes_never_raise_and_splits_only_lose_framing_earlier(data: st.DataObject,
                                                                       stream: bytes) -> None:
    """Whatever arrives: no exception, well-formed items, a fatal error is the last item and
    closes the decoder. A split may only make the decoder give up sooner (a bad value with no
    newline after it *yet* is fatal: the framing is judged on what has arrived), never decode
    differently before that."""
    limit = data.draw(st.sampled_from([1 << 20, 64, 7]))
    whole, _ = _decode([stream], limit)
    split, d = _decode(data.draw(splits(stream)), limit)
    for items in (whole, split):
        for i, (value, raw) in enumerate(items):
            _check_item(value, raw, limit)
            if isinstance(value, FramingError) and value.fatal:
                assert i == len(items) - 1, "items after a fatal error"
    assert d.closed  # finish() closes
    assert d.feed(b'{"action":1}\n') == [] and d.finish() == []
    if [_key(i) for i in split] != [_key(i) for i in whole]:
        last, _ = split[-1]
        assert isinstance(last, FramingError) and last.fatal, (split, whole)
        assert [_key(i) for i in split[:-1]] == [_key(i) for i in whole[:len(split) - 1]]


LINE_KINDS = st.sampled_from(["request", "broken", "garbage", "blank"])


@st.composite
def lines(draw: st.DrawFn) -> tuple[str, bytes, object]:
    """One line of a newline-delimited stream: (kind, bytes without the newline, value)."""
    kind = draw(LINE_KINDS)
    if kind == "request":
        value = draw(OBJECTS)
        enc = draw(_encodings(value))
        before, after = draw(st.sampled_from([b"", b" ", b"\t"])), draw(st.sampled_from([b"", b"\r", b" "]))
        return kind, before + enc + after, value
    if kind == "broken":  # a request cut short: JSON that never completes on its line
        enc = draw(_encodings(draw(OBJECTS)))
        return kind, enc[:draw(st.integers(1, len(enc) - 1))], None
    if kind == "garbage":
        return kind, draw(SOUP).replace(b"\n", b""), None
    return kind, draw(st.sampled_from([b"", b" ", b"\r", b" \t\r"])), None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lines(), max_size=8))
def test_every_line_yields_its_requests_once_and_at_most_one_error(case) -> None:
    """A newline ends a request: each line's items cover exactly its non-blank bytes, in order
    (nothing dropped, nothing read twice); a bad line costs one non-fatal error, at its end, and
    the next line decodes normally."""
    d = FrameDecoder()
    for kind, line, value in case:
        items = d.feed(line + b"\n")
        assert not d.closed and d.buffered == 0
        pos = 0
        for i, (item, raw) in enumerate(items):
            _check_item(item, raw, 1 << 20)
            at = line.find(raw, pos)
            assert at >= 0 and not line[pos:at].strip(WS), (line, items)
            pos = at + len(raw)
            if isinstance(item, FramingError):
                assert not item.fatal and i == len(items) - 1
        assert not line[pos:].strip(WS), (line, items)
        if kind == "request":
            assert [v for v, _ in items] == [value]
        elif kind == "broken":
            assert len(items) == 1 and isinstance(items[0][0], FramingError), items
        elif kind == "blank":
            assert items == []
        else:
            assert bool(items) == bool(line.strip(WS))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.integers(8, 300),
       request_streams(OBJECTS | st.builds(lambda n: {"data": "x" * n}, st.integers(0, 400)), min_size=1))
def test_max_request_size(data: st.DataObject, limit: int, case) -> None:
    """Requests within the limit are decoded; the first one over it is answered with a fatal
    error naming the limit (blanks after a request do not count), and nothing after it is read."""
    stream, values, encodings = case
    items, d = _decode(data.draw(splits(stream)), limit, finish=False)
    big = next((i for i, e in enumerate(encodings) if len(e) > limit), None)
    if big is None:
        assert [v for v, _ in items] == values and not d.closed
        return
    assert [v for v, _ in items[:big]] == values[:big]
    assert len(items) == big + 1, items
    err = items[big][0]
    assert isinstance(err, FramingError) and err.fatal
    assert err.reason == f"request exceeds max_request_size ({limit} bytes)"
    assert d.closed and d.buffered == 0


@pytest.mark.parametrize("after", [b"\r\n", b" \n", b" ", b"\t{}"])
def test_request_of_exactly_max_request_size_followed_by_blanks(after: bytes) -> None:
    raw = b'{"action":1,"queue":"q","data":"x"}'
    items = FrameDecoder(len(raw)).feed(raw + after)
    assert items[0][0] == orjson.loads(raw), items


# -- request parsing (protocol/vocabulary.py) ------------------------------------------------------


@given(JSON)
def test_request_action_is_an_action_or_a_reason(value: object) -> None:
    action = p.request_action(value)
    if type(action) is int:
        assert action in p.ACTIONS and isinstance(value, dict)
        raw = value["action"]
        assert raw == action if type(raw) is int else p.ACTION_NAMES[raw] == action
    elif not isinstance(value, dict):
        assert action == "request: must be a JSON object"
    else:
        assert action == ("action: missing" if value.get("action") is None else "action: unknown")


@given(st.dictionaries(TEXT, JSON, max_size=3),
       st.sampled_from(sorted(p.ACTION_NAMES.items())), st.booleans())
def test_request_action_by_number_or_name(other: dict, named: tuple[str, int], by_name: bool) -> None:
    name, number = named
    req = {**other, "action": name if by_name else number}
    assert p.request_action(req) == number
    assert p.request_action({**other, "action": float(number)}) == "action: unknown"
    assert p.request_action({**other, "action": name.upper()}) == "action: unknown"


QUEUE_NAMES = st.one_of(JSON, st.text(max_size=300), st.text(st.characters(), min_size=1, max_size=3),
                        st.integers(0, 300).map(lambda n: "é" * n))


@given(QUEUE_NAMES)
def test_queue_name_error(name: object) -> None:
    reason = p.queue_name_error(name)
    ok = (isinstance(name, str) and 1 <= len(name.encode("utf-8", "surrogatepass")) <= 256
          and not re.search("[\x00-\x1f\x7f-\x9f]", name)
          and not any(0xD800 <= ord(c) <= 0xDFFF for c in name))
    if ok:
        assert reason is None
    else:
        assert isinstance(reason, str) and reason.startswith("queue: "), (name, reason)


# -- PartitionService ----------------------------------------------------------------------------

T0 = 1_700_000_000.0
QUEUES = ["q1", "q2", "fan", "fan_a"]  # "fan" is a virtual queue of fan_a and fan_b
KEEP = "keep-out"  # stored before every example; no generated request names it
MAX_WAIT = 5.0

WRONG = st.one_of(st.none(), st.booleans(), st.just([]), st.just({}), st.just("1"), JSON)
NUMBERS = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**63), 2**64 - 1),
                    st.sampled_from([-1, -0.5, -1e9, 2**63, 2**64 - 1, 1e308, -1e308, 5e-324]))
INTS = st.one_of(st.integers(-(2**63), 2**64 - 1),
                 st.sampled_from([0, -1, 1001, 2**31, -(2**31) - 1, 2**63, -(2**63), 2**64 - 1]))
BAD_NAMES = st.sampled_from(["", "x" * 257, "é" * 129])
TOKENS = st.sampled_from(["t1", "t2", "t/3"])

# Per field: values a client would plausibly send, and plausible-but-wrong ones (wrong type,
# out of range, or something else entirely).
RIGHT = {
    "queue": st.sampled_from(QUEUES),
    "data": TEXT | st.lists(TEXT, min_size=1, max_size=4),
    "delay": st.sampled_from([0, 0.5, 2, T0 - 10, T0 + 10]) | st.floats(0, 10),
    "ttl": st.sampled_from([1, 60, T0 + 100]) | st.floats(1, 100),
    "retry": st.sampled_from([0, 0.5, 30]) | st.floats(0, 60),
    "wait": st.sampled_from([0, 1, 3.5, 60]),
    "lease": st.floats(0.1, 60),
    "count": st.integers(1, 10) | st.just(p.MAX_BATCH),
    "priority": st.integers(-3, 3) | st.sampled_from([2**31 - 1, -(2**31)]),
    "producer": st.sampled_from(["p1", "p2"]),
    "sequence": st.integers(0, 5) | st.just(2**63 - 1),
    "msg_id": st.integers(1, 8),
    "msg_ids": st.lists(st.integers(1, 8), max_size=4),
    "delivery_count": st.integers(0, 3),
    "delivery_counts": st.lists(st.integers(0, 3), max_size=4),
    "token": TOKENS,
    "tokens": st.lists(TOKENS, max_size=3),
    "token_prefix": st.sampled_from(["t", "", "x"]),
    "times": st.booleans(),
    "seq": JSON,
    "pattern": TEXT,
    "unknown_field": JSON,
}
BAD = {
    "queue": st.sampled_from(["", "x" * 257, "a\nb", "\x7f", "é" * 200, KEEP + "\x00"]) | st.just("fan"),
    "data": st.just([]) | st.lists(SCALARS, min_size=1, max_size=3),
    "delay": NUMBERS, "ttl": NUMBERS, "retry": NUMBERS, "wait": NUMBERS, "lease": NUMBERS,
    "count": INTS, "priority": INTS, "sequence": INTS, "msg_id": INTS, "delivery_count": INTS,
    "msg_ids": st.lists(SCALARS | INTS, min_size=1, max_size=3),
    "delivery_counts": st.lists(INTS, max_size=5),
    "producer": BAD_NAMES, "token": BAD_NAMES, "token_prefix": BAD_NAMES,
    "tokens": st.lists(BAD_NAMES | SCALARS, min_size=1, max_size=3),
    "times": SCALARS,
    "seq": JSON, "pattern": JSON, "unknown_field": JSON,
}
FIELDS = sorted(RIGHT)
QUEUE_ACTIONS = st.sampled_from([1, 2, 3, 5, 6, "produce", "consume", "confirm", "release", "extend"])
BAD_ACTIONS = st.sampled_from([0, 4, 7, 8, 9, 104, 107, -1, 2**64 - 1, 1.0, True, "PRODUCE", "", "list"])
# Fields each action needs (extend: a retry), added more often than the rest.
NEEDED = {p.PRODUCE: ["data"], p.CONSUME: [], p.CONFIRM: ["msg_id"], p.RELEASE: ["msg_id"],
          p.EXTEND: ["msg_id", "retry"]}


@st.composite
def requests(draw: st.DrawFn) -> dict:
    """A request object. Most are a queue action on a known queue with the fields it needs
    and a few more, then one or more fields made wrong (or none: a valid request); the rest are
    anything at all."""
    if draw(st.integers(0, 4)) == 0:  # wild: any keys, any values
        keys = draw(st.lists(st.sampled_from(["action", *FIELDS]), max_size=6, unique=True))
        return {k: draw(st.one_of(WRONG, BAD.get(k, WRONG), RIGHT.get(k, WRONG))) for k in keys}
    req: dict = {"action": draw(QUEUE_ACTIONS), "queue": draw(RIGHT["queue"])}
    needed = NEEDED[p.resolve_action(req["action"])]
    for name in needed + draw(st.lists(st.sampled_from(FIELDS), max_size=3, unique=True)):
        req[name] = draw(RIGHT[name])
    for name in draw(st.lists(st.sampled_from(["action", *sorted(req)]), max_size=2, unique=True)):
        if name == "action":
            req["action"] = draw(BAD_ACTIONS | WRONG)
        elif draw(st.booleans()):
            del req[name]
        else:
            req[name] = draw(BAD[name] | WRONG)
    return req


REQUESTS = requests()
ANY_REQUEST = st.one_of(*[REQUESTS] * 6, JSON)  # a few are any JSON at all, objects or not
FIELD_NAMES = set(FIELDS) | {"action", "request"}
OTHER_REASONS = {"queue full", UDP_TOO_LARGE}


def _service(accepting: bool = True) -> PartitionService:
    s = PartitionService(node_id=7, queue_size=6, virtual_queues={"fan": ("fan_a", "fan_b")},
                         max_wait=MAX_WAIT, udp_max_response=400)
    s.handle({"action": 1, "queue": KEEP, "data": ["a", "b", "c"], "retry": 30}, Origin(1), 0, T0)
    s.handle({"action": 2, "queue": KEEP, "count": 1}, Origin(1), 1, T0)  # one leased, two ready
    s.handle({"action": 1, "queue": "q1", "data": ["m1", "m2"]}, Origin(1), 2, T0)
    s.replies.clear()
    s.records.clear()
    s.accepting = accepting
    return s


def _names_a_field(reason: str, req: object) -> bool:
    if reason in OTHER_REASONS or reason.startswith("not leader: "):
        return True
    field, sep, _ = reason.partition(": ")
    if not sep or field not in FIELD_NAMES:
        return False
    return (field == "request" or "missing" in reason
            or any(k.startswith(field) for k in (req if isinstance(req, dict) else {})))


def _drive(s: PartitionService, requests: list, udp: list[bool], steps: list[float]) -> None:
    """Run requests through s as a worker does, checking each reply as it comes and that a
    rejected request changed nothing; then time out the long polls. Every request must end with
    exactly one reply."""
    keep_before = s.queues[KEEP].snapshot()
    answered: dict[int, dict] = {}
    parked: set[int] = set()
    now = T0
    for no, (req, over_udp, step) in enumerate(zip(requests, udp, steps), start=100):
        req = orjson.loads(orjson.dumps(req))  # what a worker gets: JSON, through ZeroMQ
        before = {name: q.snapshot() for name, q in s.queues.items()}
        now += step
        s.handle(req, Origin(1, over_udp), no, now)
        assert not s.errors, f"internal error on {req!r}: {s.errors!r}"
        # A reply that skips the coordinator rests on no record: a refusal or an empty consume.
        for _, n, reply in s.direct:
            assert not s.records, f"{req!r} wrote {s.records!r} but its reply skips the coordinator"
            assert reply["code"] == p.CODE_ERROR or not (reply.get("messages") or "msg_id" in reply)
        taken = take_replies(s)
        mine = [r for _, n, r in taken if n == no]
        for _, n, reply in taken:
            assert n not in answered, f"request {n} answered twice"
            answered[n] = reply
            parked.discard(n)
            assert reply["code"] in (p.CODE_OK, p.CODE_ERROR) and reply["node_id"] == 7
        if mine:
            (reply,) = mine
            if isinstance(req, dict) and "seq" in req:
                assert reply.get("seq") == req["seq"]
            if reply["code"] == p.CODE_ERROR:
                assert isinstance(reply["reason"], str) and _names_a_field(reply["reason"], req), (req, reply)
                after = {name: q.snapshot() for name, q in s.queues.items()}
                kept = {k: v for k, v in after.items() if k in before}
                assert kept == before, f"{req!r} was refused but changed a queue"
                assert all(not v["messages"] for k, v in after.items() if k not in before)
                assert not s.records, f"{req!r} was refused but wrote {s.records!r}"
        else:  # only a long poll over TCP that found nothing may wait for its reply
            assert isinstance(req, dict) and p.resolve_action(req.get("action")) == p.CONSUME, req
            assert not over_udp and isinstance(req.get("wait"), (int, float)) and req["wait"] > 0
            assert any(w.req_no == no for ws in s.waiters.values() for w in ws)
            parked.add(no)
        s.records.clear()
    s.tick(now + MAX_WAIT + 1)
    assert not s.errors
    for _, n, reply in s.replies:
        assert n in parked and n not in answered
        answered[n] = reply
    assert sorted(answered) == list(range(100, 100 + len(requests)))
    assert not s.waiters
    # Nothing asked for KEEP's messages: all there, with their data (time may end a lease).
    keep = s.queues[KEEP].snapshot()
    assert [m[:2] for m in keep["messages"]] == [m[:2] for m in keep_before["messages"]]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.lists(ANY_REQUEST, min_size=1, max_size=8))
def test_service_answers_every_request_once(data: st.DataObject, requests: list) -> None:
    n = len(requests)
    udp = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    steps = data.draw(st.lists(st.sampled_from([0.0, 0.001, 0.5, 31.0]), min_size=n, max_size=n))
    _drive(_service(), requests, udp, steps)


@settings(max_examples=50, deadline=None)
@given(st.lists(ANY_REQUEST, min_size=1, max_size=5))
def test_service_not_accepting_refuses_everything_and_changes_nothing(requests: list) -> None:
    s = _service(accepting=False)
    state = s.snapshot()
    for no, req in enumerate(requests):
        s.handle(req, Origin(1), no, T0)
        (reply,) = [r for _, n, r in s.replies if n == no]
        assert reply["code"] == p.CODE_ERROR and _names_a_field(reply["reason"], req)
    assert s.snapshot() == state and not s.records and not s.errors and not s.waiters
