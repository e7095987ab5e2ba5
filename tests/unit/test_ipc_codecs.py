"""The codecs between a node's processes (server/replies.py, server/ipc_frames.py,
server/origin.py): every field survives the round trip, and joining batches keeps every reply
whole and in order."""
from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from queue_server.server import ipc_frames, replies
from queue_server.server.origin import Origin

origins = st.builds(Origin, st.integers(-(2**62), 2**62), st.booleans(), st.integers(0, 1000))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
reply_dicts = st.dictionaries(st.text(max_size=8), json_values, max_size=5)
triples = st.lists(st.tuples(origins, st.integers(0, 2**40), reply_dicts), max_size=8)


@given(origins)
def test_origin_wire_round_trip(origin):
    assert Origin.from_wire(orjson.loads(orjson.dumps(origin.wire()))) == origin
    assert origin.forwarded == (origin.node != 0)


@given(triples)
def test_reply_batch_round_trip(items):
    header, blob = replies.encode(items)
    decoded = list(replies.decode(header, blob))
    assert [(o, n) for o, n, _ in decoded] == [(o, n) for o, n, _ in items]
    for (_, _, data), (_, _, reply) in zip(decoded, items):
        assert data.endswith(b"\n")  # one reply per line, ready for a TCP stream
        assert orjson.loads(data) == reply
        assert replies.decoded(data) == reply


@given(st.lists(triples, max_size=4))
def test_joined_batches_keep_every_reply_in_order(batches):
    encoded = [replies.encode(items) for items in batches]
    header, blob = replies.join(encoded)
    flat = [item for items in batches for item in items]
    decoded = list(replies.decode(header, blob))
    assert [(o, n, orjson.loads(d)) for o, n, d in decoded] == flat


def test_decode_slices_a_memoryview_without_copying_the_blob():
    header, blob = replies.encode([(Origin(1), 1, {"code": 0}), (Origin(2, True), 2, {"code": -1})])
    view = memoryview(blob)
    parts = [data for _, _, data in replies.decode(header, view)]
    assert all(type(p) is memoryview for p in parts)
    assert b"".join(parts) == blob


def test_decoded_and_naming_of_what_does_not_parse():
    assert replies.decoded(b"{not json") is None
    assert replies.naming(None) == {}
    assert replies.naming({"action": 2, "queue": "q", "seq": 7, "data": "x"}) == {
        "action": 2, "queue": "q", "seq": 7}


@given(st.binary(max_size=30), st.binary(max_size=30), st.binary(max_size=30), st.binary(max_size=30),
       st.integers(0, 2**62))
def test_batch_frames_round_trip(records, header, blob, partials, epoch):
    frames = ipc_frames.batch_frames(records, header, blob, partials, epoch)
    assert frames[0] == ipc_frames.BATCH
    assert ipc_frames.read_batch(frames) == (records, header, blob, partials, epoch)


@given(st.integers(0, 2**62), st.sampled_from(sorted(ipc_frames.FENCE_SENDERS)))
def test_fence_frames_round_trip(epoch, sender):
    frames = ipc_frames.fence_frames(epoch, sender)
    assert frames[0] == ipc_frames.FENCE
    assert ipc_frames.read_fence(frames) == (epoch, sender)


@given(st.integers(0, 2**62), st.integers(0, 1023))
def test_fenced_frames_round_trip(epoch, index):
    frames = ipc_frames.fenced_frames(epoch, index)
    assert frames[0] == ipc_frames.FENCED
    assert ipc_frames.read_fenced(frames) == (epoch, index)
