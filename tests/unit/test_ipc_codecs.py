"""The codecs between a node's processes (protocol/replies.py, protocol/ipc_frames.py,
protocol/origin.py): every field survives the round trip, and joining batches keeps every reply
whole and in order."""
from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from queue_server.protocol import ipc_frames, records, replies
from queue_server.protocol.origin import Origin
from tests.unit.test_records import EVERY_FIELD

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
def test_joined_reps_keep_every_reply_in_order(batches):
    encoded = [replies.encode(items) for items in batches]
    frames = ipc_frames.join_reps([ipc_frames.rep_frames(*batch) for batch in encoded])
    assert frames[0] == ipc_frames.REP and ipc_frames.read_rep(frames) == encoded
    flat = [item for items in batches for item in items]
    decoded = [item for header, blob in ipc_frames.read_rep(frames) for item in replies.decode(header, blob)]
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


groups = st.integers(0, 1023)
batch_parts = st.tuples(groups, st.binary(max_size=30), st.binary(max_size=30), st.binary(max_size=30),
                        st.binary(max_size=30), st.integers(0, 2**62))


@given(batch_parts, st.integers(0, 255))
def test_batch_frames_round_trip(part, index):
    group, records, header, blob, partials, epoch = part
    frames = ipc_frames.batch_frames(records, header, blob, partials, epoch, index, group)
    assert frames[0] == ipc_frames.BATCH
    assert ipc_frames.read_batch(frames) == [part]
    assert ipc_frames.batch_index(frames) == index
    assert ipc_frames.batch_frames(records, header, blob, partials, epoch, index) == \
        ipc_frames.batches_frames(index, [(0, records, header, blob, partials, epoch)])  # group 0 by default


@given(st.lists(batch_parts, min_size=1, max_size=5), st.integers(0, 255))
def test_a_batch_of_several_groups_is_one_message_of_their_parts_in_order(parts, index):
    frames = ipc_frames.batches_frames(index, parts)
    assert frames[0] == ipc_frames.BATCH and len(frames) == 2 + 6 * len(parts)
    assert ipc_frames.read_batch(frames) == parts
    assert ipc_frames.batch_index(frames) == index


@given(groups, st.integers(0, 2**62))
def test_every_message_of_a_group_carries_it_last(group, epoch):
    """REQ, MODE, FENCE, FENCED, APPLY, COMMITTED, LOAD and UNDELIVER name their queue group in
    their last frame (group_of), and each reader reads the rest as it did."""
    messages = [
        (ipc_frames.req_frames([], epoch, group), ipc_frames.req_epoch, epoch),
        (ipc_frames.mode_frames(True, epoch, 3, 4, group), ipc_frames.read_mode, (True, epoch, 3, 4)),
        (ipc_frames.fence_frames(epoch, ipc_frames.FROM_ACCEPTOR, group), ipc_frames.read_fence,
         (epoch, ipc_frames.FROM_ACCEPTOR)),
        (ipc_frames.fenced_frames(epoch, 3, group), ipc_frames.read_fenced, (epoch, 3)),
        (ipc_frames.apply_frames([], False, group), ipc_frames.read_apply, []),
        (ipc_frames.committed_frames(epoch, 9, group), ipc_frames.read_committed, (epoch, 9)),
        (ipc_frames.load_frames(epoch, ["p"], group), ipc_frames.read_load, (epoch, ["p"])),
        (ipc_frames.undeliver_frames("q", [[1, 2]], group), ipc_frames.read_undeliver, ("q", [[1, 2]])),
    ]
    for frames, read, expected in messages:
        assert ipc_frames.group_of(frames) == group, frames[0]
        assert read(frames) == expected, frames[0]
    assert not ipc_frames.apply_committed(messages[4][0])


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


# ----------------------------------------------------------------- every other kind
requests = st.dictionaries(st.text(max_size=8), json_values, max_size=5)
tags = st.lists(json_values, max_size=5)
epochs = st.integers(0, 2**62)


@given(st.lists(st.tuples(origins, st.integers(0, 2**40), requests, st.none() | tags), max_size=6), epochs)
def test_req_round_trip(items, epoch):
    frames = ipc_frames.req_frames([ipc_frames.req_item(*item) for item in items], epoch)
    assert frames[0] == ipc_frames.REQ
    assert ipc_frames.req_epoch(frames) == epoch
    got = ipc_frames.read_req(frames)
    assert got == items
    assert all(type(origin) is Origin for origin, *_ in got)


@given(st.lists(st.lists(st.tuples(origins, st.integers(0, 2**40), requests, st.none() | tags), max_size=3),
                min_size=1, max_size=4), epochs)
def test_joined_reqs_hold_every_item_in_order(runs, epoch):
    reqs = [ipc_frames.req_frames([ipc_frames.req_item(*item) for item in run], epoch) for run in runs]
    assert all(ipc_frames.same_mode_reqs(reqs[0], other) for other in reqs)
    joined = ipc_frames.join_reqs(reqs)
    assert ipc_frames.req_epoch(joined) == epoch
    assert ipc_frames.read_req(joined) == [item for run in runs for item in run]


def test_only_reqs_of_one_mode_are_the_same_mode():
    req = ipc_frames.req_frames([], 3)
    assert not ipc_frames.same_mode_reqs(req, ipc_frames.req_frames([], 4))
    assert not ipc_frames.same_mode_reqs(req, ipc_frames.req_frames([], 3, 1))  # another group's mode 3
    assert ipc_frames.group_of(ipc_frames.join_reqs([ipc_frames.req_frames([], 3, 2)] * 2)) == 2
    assert not ipc_frames.same_mode_reqs(req, ipc_frames.fence_frames(3, ipc_frames.FROM_COORDINATOR))


@given(st.lists(st.tuples(origins, st.integers(0, 2**40), requests), max_size=6))
def test_forward_round_trip(items):
    frames = ipc_frames.forward_frames([ipc_frames.req_item(*item) for item in items])
    assert frames[0] == ipc_frames.FORWARD
    got = ipc_frames.read_forward(frames)
    assert got == items
    assert all(type(origin) is Origin for origin, *_ in got)


@given(st.integers(0, 2**62))
def test_close_round_trip(conn):
    frames = ipc_frames.close_frames(conn)
    assert frames[0] == ipc_frames.CLOSE and ipc_frames.read_close(frames) == conn


@given(st.text(max_size=20), st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 1000)).map(list), max_size=6))
def test_undeliver_round_trip(queue, given_back):
    frames = ipc_frames.undeliver_frames(queue, given_back)
    assert frames[0] == ipc_frames.UNDELIVER
    assert ipc_frames.read_undeliver(frames) == (queue, given_back)


@given(st.lists(st.sampled_from(EVERY_FIELD), max_size=6), st.booleans())
def test_apply_round_trip(changes, committed):
    frames = ipc_frames.apply_frames(changes, committed)
    assert frames[0] == ipc_frames.APPLY and ipc_frames.read_apply(frames) == changes
    assert ipc_frames.apply_committed(frames) is committed


@given(st.lists(st.sampled_from(EVERY_FIELD), max_size=6))
def test_a_batch_s_records_round_trip_and_mark_empty_without_decoding(changes):
    data = ipc_frames.records_list(changes)
    assert records.decode_many(data) == changes
    assert (data == ipc_frames.EMPTY_LIST) == (not changes)


@given(st.booleans(), epochs, st.none() | st.integers(0, 2**62), st.none() | st.integers(0, 2**62))
def test_mode_round_trip(accepting, epoch, keep_through, trans_id):
    frames = ipc_frames.mode_frames(accepting, epoch, keep_through, trans_id)
    assert frames[0] == ipc_frames.MODE
    assert ipc_frames.read_mode(frames) == (accepting, epoch, keep_through, trans_id)


@given(epochs, st.integers(0, 2**62))
def test_committed_round_trip(epoch, seq):
    frames = ipc_frames.committed_frames(epoch, seq)
    assert frames[0] == ipc_frames.COMMITTED and ipc_frames.read_committed(frames) == (epoch, seq)


@given(triples)
def test_rep_round_trip(items):
    header, blob = replies.encode(items)
    frames = ipc_frames.rep_frames(header, blob)
    assert frames[0] == ipc_frames.REP and ipc_frames.read_rep(frames) == [(header, blob)]


@given(st.sampled_from(["leader", "follower", "none"]), st.integers(0, 1000), st.text(max_size=15),
       st.integers(0, 65535), epochs, st.dictionaries(st.integers(1, 1000), st.integers(0, 65535), max_size=5))
def test_status_round_trip(role, node_id, host, port, epoch, http_ports):
    status = {"role": role, "leader_node_id": node_id, "leader_host": host, "leader_port": port, "epoch": epoch,
              "http_ports": http_ports}
    frames = ipc_frames.status_frames(status)
    assert frames[0] == ipc_frames.STATUS and ipc_frames.read_status(frames) == status


def test_drain_is_its_kind_alone():
    assert ipc_frames.DRAIN_FRAMES == [ipc_frames.DRAIN]


@given(st.lists(reply_dicts, max_size=4))
def test_json_list_of_a_batch_marks_empty_without_decoding(values):
    data = ipc_frames.json_list(values)
    assert orjson.loads(data) == values
    assert (data == ipc_frames.EMPTY_LIST) == (not values)


def test_the_byte_layouts_are_the_ones_docs_architecture_md_documents():
    """The bytes on the pipes did not change shape: a node of this version runs with its own
    processes only, but the layout is documented and the tests of other files build it."""
    item = ipc_frames.req_item(Origin(5, True, 2), 7, {"action": 1})
    assert ipc_frames.req_frames([item], 3) == [b"req", b'[[[5,true,2],7,{"action":1}]]', b"3", b"0"]
    assert ipc_frames.close_frames(5) == [b"close", b"5"]
    assert ipc_frames.undeliver_frames("q", [[1, 2]], 2) == [b"undeliver", b'["q",[[1,2]]]', b"2"]
    assert ipc_frames.mode_frames(True, 4, 9, 12) == [b"mode", b"[true,4,9,12]", b"0"]
    assert ipc_frames.mode_frames(False, 4) == [b"mode", b"[false,4,null,null]", b"0"]
    assert ipc_frames.committed_frames(4, 9) == [b"committed", b"4", b"9", b"0"]
    assert ipc_frames.apply_frames([], committed=False) == [b"apply", b"[]", b"0", b"0"]
    assert ipc_frames.fence_frames(4, ipc_frames.FROM_ACCEPTOR, 1) == [b"fence", b"4", b"acceptor", b"1"]
    assert ipc_frames.fenced_frames(4, 2) == [b"fenced", b"4", b"2", b"0"]
    assert ipc_frames.load_frames(7, ["a"]) == [b"load", b'[7,["a"]]', b"0"]
    assert ipc_frames.batches_frames(3, [(0, b"[]", b"h", b"b", b"[]", 4), (2, b"[1]", b"h2", b"b2", b"[]", 5)]) == [
        b"batch", b"3", b"0", b"[]", b"h", b"b", b"[]", b"4", b"2", b"[1]", b"h2", b"b2", b"[]", b"5"]


def test_every_kind_has_its_codec():
    kinds = {v for k, v in vars(ipc_frames).items() if k.isupper() and type(v) is bytes
             and k not in ("FROM_ACCEPTOR", "FROM_COORDINATOR", "EMPTY_LIST")}
    encoders = {name[:-len("_frames")] for name in vars(ipc_frames) if name.endswith("_frames")}
    readers = {name[len("read_"):] for name in vars(ipc_frames) if name.startswith("read_")}
    names = {kind.decode() for kind in kinds}
    assert names - {"drain", "wake"} <= encoders & readers, names - (encoders & readers)  # they carry nothing
