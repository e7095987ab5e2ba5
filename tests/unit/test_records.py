"""protocol/records.py: every record kind round-trips, JSON written by the dict-based code before
the types decodes to the same JSON, and bytes that are not a record are a clean error."""

import orjson
import pytest

from queue_server.replication import wire
from queue_server.replication.log import Entry
from queue_server.replication.messages import AppendEntries
from queue_server.protocol import records as r

T = 1_700_000_000.5

# One record of every kind with every field set (and the single and list forms).
EVERY_FIELD = [
    r.Produce(queue="q", msg_id=1, ready=T, ttl=T + 60, retry=30.0, priority=2, data="é",
              delivery_count=0, producer="p", sequence=7, max_deliveries=3),
    r.Restore(queue="q", msg_id=2, ready=T, ttl=T + 60, retry=0.0, priority=-1, data="",
              delivery_count=4, producer="p", sequence=8, max_deliveries=0),
    r.Consume(queue="q", msg_id=3, lease=T + 30, delivery_count=1, token="t"),
    r.Consume(queue="q", msg_id=3, lease=None, delivery_count=1),
    r.Consume(queue="q", msg_ids=[4, 5], lease=T + 30, delivery_counts=[1, 2], token="t"),
    r.Confirm(queue="q", msg_id=6),
    r.Confirm(queue="q", msg_ids=[6, 7]),
    r.Release(queue="q", msg_id=8, ready=T, delivery_count=2),
    r.Release(queue="q", msg_ids=[8, 9], ready=T),
    r.Expire(queue="q", msg_id=10, reason="max_deliveries"),
    r.Expire(queue="q", msg_ids=[10, 11]),
    r.DeadLetter(queue="q", msg_id=12, reason="ttl", dlq="q.dlq", dlq_msg_id=1, ready=T),
    r.Pause(queue="q", paused=True),
    r.Purge(queue="q", count=9),
    r.DlqReplay(queue="q", dlq="q.dlq", moves=[(1, 13, T + 60), (2, 14, T + 61)], ready=T),
    r.DeleteQueue(queue="q"),
    r.Noop(),
]

# JSON as the dict literals of workers/queue.py, workers/admin.py and server/cluster.py wrote it
# before protocol/records.py existed (WAL files, snapshots' logs, peers of that version).
OLD_JSON = [
    {"op": "produce", "queue": "q", "msg_id": 1, "ready": T, "ttl": T + 60, "retry": 0.0,
     "priority": 0, "data": "x", "delivery_count": 0},
    {"op": "produce", "queue": "q", "msg_id": 2, "ready": T, "ttl": T + 60, "retry": 5,
     "priority": 1, "data": "y", "delivery_count": 0, "producer": "p", "sequence": 3,
     "max_deliveries": 2},
    {"op": "restore", "queue": "q", "msg_id": 1, "ready": T, "ttl": T + 60, "retry": 0.0,
     "priority": 0, "data": "x", "delivery_count": 0},
    {"op": "consume", "queue": "q", "msg_id": 1, "lease": None, "delivery_count": 1},
    {"op": "consume", "queue": "q", "msg_id": 2, "lease": T + 5, "delivery_count": 1, "token": "t"},
    {"op": "consume", "queue": "q", "msg_ids": [1, 2], "lease": T + 5,
     "delivery_counts": [1, 1]},
    {"op": "confirm", "queue": "q", "msg_id": 1},
    {"op": "confirm", "queue": "q", "msg_ids": [1, 2]},
    {"op": "release", "queue": "q", "msg_id": 1, "ready": T, "delivery_count": 1},
    {"op": "release", "queue": "q", "msg_ids": [1, 2], "ready": T},
    {"op": "expire", "queue": "q", "msg_id": 1},
    {"op": "expire", "queue": "q", "msg_id": 1, "reason": "max_deliveries"},
    {"op": "dead_letter", "queue": "q", "msg_id": 1, "reason": "ttl", "dlq": "q.dlq",
     "dlq_msg_id": 4, "ready": T},
    {"op": "pause", "queue": "q", "paused": False},
    {"op": "purge", "queue": "q", "count": 3},
    {"op": "dlq_replay", "queue": "q", "dlq": "q.dlq", "moves": [[1, 5, T + 60]], "ready": T},
    {"op": "delete_queue", "queue": "q"},
    {"op": "noop"},
]


def test_every_kind_is_covered():
    kinds = {type(x) for x in EVERY_FIELD}
    assert kinds == set(r.Record.__args__)
    assert {orjson.loads(r.encode(x))["op"] for x in EVERY_FIELD} == {d["op"] for d in OLD_JSON}


@pytest.mark.parametrize("record", EVERY_FIELD, ids=lambda x: type(x).__name__)
def test_round_trip_with_every_field(record):
    assert r.decode(r.encode(record)) == record
    assert r.decode_many(r.encode_many([record, record])) == [record, record]


@pytest.mark.parametrize("old", OLD_JSON, ids=lambda d: d["op"])
def test_json_of_the_dict_records_decodes_and_encodes_the_same(old):
    record = r.decode(orjson.dumps(old))
    assert orjson.loads(r.encode(record)) == old


def test_none_fields_are_left_out_but_a_deleting_lease_is_null():
    assert orjson.loads(r.encode(r.Confirm(queue="q", msg_id=1))) == {
        "op": "confirm", "queue": "q", "msg_id": 1}
    assert orjson.loads(r.encode(r.Consume(queue="q", msg_id=1, lease=None, delivery_count=1))) \
        == {"op": "consume", "queue": "q", "msg_id": 1, "lease": None, "delivery_count": 1}


def test_count_names_the_messages_of_either_form():
    assert r.count(r.Confirm(queue="q", msg_id=1)) == 1
    assert r.count(r.Confirm(queue="q", msg_ids=[1, 2, 3])) == 3


@pytest.mark.parametrize("bad, says", [
    (b'{"op": "produce", "queue": "q", "msg_id": 1}', "`ready`"),
    (b'{"op": "launch", "queue": "q"}', "$.op"),
    (b'{"queue": "q", "msg_id": 1}', "`op`"),
    (b'{"op": "confirm", "queue": "q", "msg_id": "1"}', "$.msg_id"),
    (b'{"op": "confirm", "queue": "q"}', "msg_id and msg_ids"),
    (b'{"op": "confirm", "queue": "q", "msg_id": 1, "msg_ids": [1]}', "msg_id and msg_ids"),
    (b'{"op": "consume", "queue": "q", "msg_ids": [1, 2], "lease": 1.0, "delivery_counts": [1]}',
     "one delivery_count each"),
    (b'{"op": "consume", "queue": "q", "msg_ids": [1], "lease": null, "delivery_counts": [1]}',
     "a lease"),
    (b'{"op": "consume", "queue": "q", "msg_id": 1, "lease": null}', "delivery_count"),
    (b'{"op": "noop"', "bad record"),
    (b"[]", "object"),
])
def test_a_bad_record_is_one_clean_error_naming_what_is_wrong(bad, says):
    with pytest.raises(r.RecordError) as err:
        r.decode(bad)
    message = str(err.value)
    assert message.startswith("bad record: ") and says in message and "\n" not in message
    with pytest.raises(r.RecordError):
        r.decode_many(b"[" + bad + b"]")


def test_a_peer_message_with_a_bad_record_is_refused_as_a_value_error():
    """The coordinator drops a peer message wire.decode refuses; a bad record inside is one."""
    good = wire.encode(AppendEntries(3, 1, 0, 0, (Entry(1, 3, r.Noop()),), 0), "h", 1)
    assert wire.decode(good).msg.entries[0].record == r.Noop()
    broken = good.replace(b'{"op":"noop"}', b'{"op":"nope"}')
    with pytest.raises(ValueError, match="bad peer message"):
        wire.decode(broken)


def test_each_record_of_an_array_is_the_bytes_encode_gives_it():
    """The coordinator keeps each record of a worker's array as it came (each_encoded) and
    writes those bytes to disk and to peers: they must be what encode gives the record, and
    join_encoded must give the array back."""
    array = r.encode_many(EVERY_FIELD)
    encoded = r.each_encoded(array)
    assert [bytes(e) for e in encoded] == [r.encode(record) for record in EVERY_FIELD]
    assert [r.decode(e) for e in encoded] == EVERY_FIELD
    assert r.join_encoded(encoded) == array
    assert r.join_encoded([]) == r.encode_many([]) and r.each_encoded(b"[]") == []
    with pytest.raises(r.RecordError):
        r.each_encoded(b"[{")
