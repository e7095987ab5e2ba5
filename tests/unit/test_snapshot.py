"""Snapshots on disk (replication/snapshot.py) and the frames queues make of themselves
(protocol/snapshot_frames.py, Queue/PartitionService snapshot_frames and load_frames): round
trips of every message state, a damaged newest snapshot falling back to the older one with one
warning line, leftovers deleted, format 1 still read."""

import os
import struct
import zlib

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queue_server.protocol import snapshot_frames
from queue_server.protocol.snapshot_frames import QUEUE, ROWS, read_rows, rows_bodies
from queue_server.replication import snapshot
from queue_server.replication.snapshot import (
    PartWriter,
    clean,
    iter_frames,
    latest_manifest,
    read_manifest,
    read_parts,
    read_v1,
    snapshot_name,
    snapshot_trans_ids,
    write_snapshot,
)
from queue_server.replication.wal import StorageError
from queue_server.workers.queue import Queue
from queue_server.workers.service import PartitionService

T0 = 1_700_000_000.0


def filled(queue_class: type[Queue] = Queue, n: int = 12) -> PartitionService:
    """A service whose queues hold every kind of message state: ready and delayed, priorities,
    leased with and without a token, per-message max_deliveries, dead letters, a paused queue,
    the dedupe window, payloads beyond ASCII, an empty queue."""
    s = PartitionService(1, 1000, queue_class=queue_class, dead_letter_suffix=".dlq", max_deliveries=2,
                         restore_cache=0)
    jobs = s._queue("jobs")
    jobs.produce_many([(f"job {i} \u00e9\u4e2d", T0 + (i % 3) * 100, T0 + 1000, 5.0, i % 4) for i in range(n)], T0,
                      producer="p1", sequence=7)
    jobs.produce("own max_deliveries \u00e9", T0, T0 + 1000, 7.0, 0, T0, max_deliveries=9)
    jobs.produce("plain", T0, T0 + 1000, 10.0, 0, T0, producer="p2", sequence=1)
    jobs.consume(T0 + 1, 2, lease=30, token="tok-a")
    jobs.consume(T0 + 1, 1)
    jobs.consume(T0 + 1, 1, lease=5)
    # both leases end: delivered twice then (max_deliveries 2) one goes to jobs.dlq
    jobs.consume(T0 + 7, 1, lease=1, token="tok-b")
    jobs.expire_due(T0 + 9)
    jobs.consume(T0 + 9.5, 1)  # leased by its own retry, no token
    ascii_only = s._queue("ascii")
    ascii_only.produce_many([("x" * (i % 50), T0, T0 + 60, 1.0, 0) for i in range(n * 3)], T0)
    ascii_only.set_paused(True)
    s._queue("empty")
    return s


def on_disk(tmp_path, trans_id: int, s: PartitionService, vote_id: int = 1) -> str:
    return write_snapshot(str(tmp_path), trans_id, vote_id, s.snapshot_frames())


def loaded(frames, queue_class: type[Queue] = Queue, keep=None) -> PartitionService:
    s = PartitionService(1, 1000, queue_class=queue_class, dead_letter_suffix=".dlq", max_deliveries=2)
    s.load_frames(frames, keep)
    return s


class Warnings(list):
    def __call__(self, message: str) -> None:
        self.append(message)


# ---------------------------------------------------------------------- round trips


def test_the_fill_has_every_kind_of_state():
    state = filled().snapshot()
    rows = state["jobs"]["messages"]
    assert {len(r) for r in rows} == {8, 9, 10}  # unleased, leased under a token, extra settings
    assert any(r[7] is not None and r[8:9] in ([], [None]) for r in rows)  # leased without a token
    assert state["jobs.dlq"]["messages"][0][9]["dead"]["reason"] == "max_deliveries"
    assert state["jobs"]["dedupe"] and state["ascii"]["paused"] and state["empty"]["messages"] == []


def test_frames_round_trip_every_message_state(monkeypatch):
    queue_class = Queue
    monkeypatch.setattr(snapshot_frames, "ROWS_MAX", 5)  # several ROWS frames per queue
    s = filled(queue_class)
    frames = list(s.snapshot_frames())
    assert [k for k, name, _ in frames if name == "jobs"] == [QUEUE, ROWS, ROWS, ROWS]
    assert loaded(frames, queue_class).snapshot() == s.snapshot()


def test_a_loaded_queue_serves_as_the_original_does():
    s, t = filled(), loaded(filled().snapshot_frames())
    for service in (s, t):
        service.queues["ascii"].set_paused(False)
    for name in ("jobs", "jobs.dlq", "ascii"):
        for at in (T0 + 10, T0 + 50, T0 + 200, T0 + 2000):
            got = [[m.msg_id, m.data, m.delivery_count] for m in t.queues[name].consume(at, 3, lease=1)[0]]
            assert got == [[m.msg_id, m.data, m.delivery_count] for m in s.queues[name].consume(at, 3, lease=1)[0]]
    assert t.queues["jobs"].held("tok-a") == s.queues["jobs"].held("tok-a")


def test_keep_loads_only_the_queues_it_accepts():
    t = loaded(filled().snapshot_frames(), keep=lambda name: name.startswith("jobs"))
    assert sorted(t.queues) == ["jobs", "jobs.dlq"]


def test_loading_answers_parked_waiters_as_load_snapshot_does():
    s = filled()
    s.waiters["x"] = []
    s.load_frames(iter(()))
    assert s.queues == {} and s.waiters == {}


def test_rows_are_cut_by_payload_bytes_too(monkeypatch):
    monkeypatch.setattr(snapshot_frames, "ROWS_BYTES", 100)
    rows = [[i, "y" * 40, 1.0, 2.0, 3.0, 0, 0, None] for i in range(1, 8)]
    bodies = list(rows_bodies(rows))
    assert [len(read_rows(b)) for b in bodies] == [3, 3, 1]
    assert [list(r) for b in bodies for r in read_rows(b)] == [r[:7] for r in rows]


def test_malformed_frames_are_refused():
    with pytest.raises(ValueError, match="do not start with QUEUE"):
        Queue.load_frames("q", [(ROWS, "q", next(rows_bodies([[1, "a", 1.0, 1.0, 0.0, 0, 0, None]])))])
    queues = filled().queues
    empty, paused = list(queues["empty"].snapshot_frames()), list(queues["ascii"].snapshot_frames())
    with pytest.raises(ValueError, match="twice"):
        loaded(empty + paused + empty)
    body = next(rows_bodies([[1, "a", 1.0, 1.0, 0.0, 0, 0, None]]))
    with pytest.raises(ValueError, match="do not fill"):
        read_rows(body + b"!")


# ---------------------------------------------------------------------- files


def test_a_snapshot_on_disk_round_trips(tmp_path):
    s = filled()
    path = on_disk(tmp_path, 42, s, vote_id=3)
    assert os.path.basename(path) == snapshot_name(42) == "snapshot-00000000000000000042.snap"
    found = latest_manifest(str(tmp_path))
    assert (found.trans_id, found.vote_id, found.path, len(found.parts)) == (42, 3, path, 1)
    manifest = orjson.loads(open(path, "rb").read())
    assert manifest == found.as_dict()
    part = manifest["parts"][0]
    assert (part["queues"], part["messages"]) == (len(s.queues), sum(len(q) for q in s.queues.values()))
    assert part["bytes"] == os.path.getsize(found.parts[0])
    assert loaded(read_parts(found)).snapshot() == s.snapshot()


def test_the_writer_streams_frames_to_the_file(tmp_path):
    """Each frame reaches the file before the next is asked for (nothing whole in memory)."""
    path = str(tmp_path / "part")
    writer = PartWriter(path, 1)
    sizes = []
    for kind, name, body in filled().snapshot_frames():
        writer.write(kind, name, body)
        writer._file.flush()
        sizes.append(os.path.getsize(path))
    writer.finish()
    assert sizes == sorted(set(sizes))
    assert [k for k, _, _ in iter_frames(path, 1)] == [k for k, _, _ in filled().snapshot_frames()]


def test_no_snapshot(tmp_path):
    assert latest_manifest(str(tmp_path)) is None
    assert latest_manifest(str(tmp_path / "missing")) is None


def test_keeps_the_newest_two(tmp_path):
    s = filled()
    for trans_id in (10, 20, 30, 40):
        on_disk(tmp_path, trans_id, s)
    assert snapshot_trans_ids(str(tmp_path)) == [30, 40]
    names = sorted(os.listdir(tmp_path))
    assert names[2:] == [snapshot_name(30), snapshot_name(40)]
    assert [n.split("-")[1] for n in names[:2]] == [f"{30:020d}", f"{40:020d}"]  # their parts only
    assert latest_manifest(str(tmp_path)).trans_id == 40


def _part(tmp_path, trans_id: int) -> str:
    return read_manifest(str(tmp_path / snapshot_name(trans_id))).parts[0]


def _frame_offsets(path: str) -> list[int]:
    """Where each frame of a part starts, END's last."""
    data = open(path, "rb").read()
    at, found = 16, []
    while at < len(data):
        found.append(at)
        at += 8 + struct.unpack_from("<I", data, at)[0]
    return found


def _torn(path):  # cut in the middle of a ROWS frame
    offsets = _frame_offsets(path)
    os.truncate(path, offsets[2] + 30)
    return "where the manifest says"


def _no_end(path):  # cut just before END
    os.truncate(path, _frame_offsets(path)[-1])
    return "where the manifest says"


def _missing(path):
    os.remove(path)
    return "No such file"


def _flipped(path):  # one bit of a payload
    with open(path, "r+b") as f:
        at = _frame_offsets(path)[2] + 200
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 1]))
    return "checksum mismatch"


def _manifest_cut(path):
    manifest = os.path.join(os.path.dirname(os.path.dirname(path)), snapshot_name(20))
    os.truncate(manifest, 30)
    return "not valid JSON"


def _end_lies(path):  # a whole part, every crc right, whose END counts one message too many
    offsets = _frame_offsets(path)
    data = open(path, "rb").read()[:offsets[-1]]
    length, _ = struct.unpack_from("<II", open(path, "rb").read(), offsets[-1])
    end = orjson.loads(open(path, "rb").read()[offsets[-1] + 8 + 3:])
    end["messages"] += 1
    body = struct.pack("<BH", 3, 0) + orjson.dumps(end)
    open(path, "wb").write(data + struct.pack("<II", len(body), zlib.crc32(body)) + body)
    return "END says"


@pytest.mark.parametrize("damage", [_torn, _no_end, _missing, _flipped, _manifest_cut, _end_lies])
def test_a_damaged_newest_snapshot_falls_back_to_the_older_one(tmp_path, damage):
    older, newer = filled(n=5), filled(n=40)
    on_disk(tmp_path, 10, older)
    newest = on_disk(tmp_path, 20, newer)
    reason = damage(_part(tmp_path, 20))
    warnings = Warnings()
    found = latest_manifest(str(tmp_path), warn=warnings)
    assert found.trans_id == 10
    assert loaded(read_parts(found)).snapshot() == older.snapshot()
    assert len(warnings) == 1 and newest in warnings[0] and reason in warnings[0], warnings


@pytest.mark.parametrize("cut, reason", [(lambda offsets: offsets[2] + 30, "torn frame at offset"),
                                         (lambda offsets: offsets[-1], "no END frame"),
                                         (lambda offsets: offsets[2] + 3, "torn frame at offset")])
def test_a_cut_part_says_where(tmp_path, cut, reason):
    on_disk(tmp_path, 10, filled(n=40))
    path = _part(tmp_path, 10)
    os.truncate(path, cut(_frame_offsets(path)))
    with pytest.raises(ValueError, match=reason):
        list(iter_frames(path, 10))


def test_rows_keep_payloads_that_are_not_valid_utf8_text():
    rows = [[1, "lone \ud800", 1.0, 2.0, 0.0, 0, 0, None], [2, "\u00e9", 1.0, 2.0, 0.0, 0, 0, None]]
    assert [list(r) for r in read_rows(next(rows_bodies(rows)))] == [r[:7] for r in rows]


def test_a_part_of_another_trans_id_is_refused(tmp_path):
    on_disk(tmp_path, 10, filled(n=3))
    with pytest.raises(ValueError, match="holds trans_id 10, not 11"):
        list(iter_frames(_part(tmp_path, 10), 11))


def test_leftovers_are_deleted(tmp_path):
    s = filled(n=3)
    on_disk(tmp_path, 10, s)
    leftovers = [tmp_path / "tmp-00000000000000000020-1", tmp_path / "parts-00000000000000000020-1",
                 tmp_path / (snapshot_name(20) + ".tmp")]
    for d in leftovers[:2]:  # a crash while writing parts, or before the manifest was written
        d.mkdir()
        (d / "part-0.qsp").write_bytes(b"QSPART\0\2 half")
    leftovers[2].write_bytes(b"{")
    warnings = Warnings()
    assert latest_manifest(str(tmp_path), warn=warnings).trans_id == 10 and warnings == []
    clean(str(tmp_path))
    assert not any(p.exists() for p in leftovers)
    assert latest_manifest(str(tmp_path)).trans_id == 10  # its own parts stay


def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    s = filled(n=3)
    on_disk(tmp_path, 10, s)
    before = sorted(os.listdir(tmp_path))

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(snapshot.os, "fsync", no_space)
    with pytest.raises(StorageError, match="No space"):
        on_disk(tmp_path, 20, s)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == before
    assert latest_manifest(str(tmp_path)).trans_id == 10


def test_a_failing_frame_source_leaves_nothing_behind(tmp_path):
    def frames():
        yield from filled(n=3).snapshot_frames()
        raise OverflowError("a value that does not fit")

    with pytest.raises(OverflowError):
        write_snapshot(str(tmp_path), 10, 1, frames())
    assert os.listdir(tmp_path) == []


def test_same_trans_id_replaces(tmp_path):
    on_disk(tmp_path, 10, filled(n=3), vote_id=1)
    on_disk(tmp_path, 10, filled(n=4), vote_id=2)
    assert snapshot_trans_ids(str(tmp_path)) == [10]
    found = latest_manifest(str(tmp_path))
    assert found.vote_id == 2 and len(os.listdir(tmp_path)) == 2
    assert loaded(read_parts(found)).snapshot() == filled(n=4).snapshot()


# ---------------------------------------------------------------------- format 1


def write_v1(directory, trans_id: int, vote_id: int, state: dict) -> str:
    """A format 1 snapshot file, as nodes before format 2 wrote them."""
    body = orjson.dumps(state)
    header = struct.pack("<8sQQQ", b"QSNAP\x00\x00\x01", trans_id, vote_id, len(body))
    path = os.path.join(str(directory), snapshot_name(trans_id))
    with open(path, "wb") as f:
        f.write(header + body + struct.pack("<I", zlib.crc32(body, zlib.crc32(header))))
    return path


def test_a_v1_snapshot_is_read(tmp_path):
    state = filled().snapshot()
    path = write_v1(tmp_path, 7, 2, state)
    assert read_v1(path) == (7, 2, state)
    found = latest_manifest(str(tmp_path))
    assert (found.trans_id, found.vote_id, found.parts, found.state) == (7, 2, (), state)
    assert found.as_dict()["format"] == 1


def test_a_damaged_v2_falls_back_to_a_v1_and_a_damaged_v1_is_skipped(tmp_path):
    path = write_v1(tmp_path, 7, 2, {"q": {"name": "q", "max_size": 5, "next_id": 1, "messages": []}})
    on_disk(tmp_path, 20, filled(n=3))
    _missing(_part(tmp_path, 20))
    warnings = Warnings()
    assert latest_manifest(str(tmp_path), warn=warnings).trans_id == 7 and len(warnings) == 1
    with open(path, "r+b") as f:
        f.seek(40)
        f.write(b"#")
    warnings = Warnings()
    assert latest_manifest(str(tmp_path), warn=warnings) is None
    assert "checksum mismatch" in warnings[1]


def test_a_snapshot_under_another_name_is_refused(tmp_path):
    path = on_disk(tmp_path, 10, filled(n=1))
    os.rename(path, tmp_path / snapshot_name(99))
    warnings = Warnings()
    assert latest_manifest(str(tmp_path), warn=warnings) is None
    assert "name" in warnings[0]


# One step of a random history: (kind, a, b). Batches of up to 40 produces, so that a few
# hundred messages span several store chunks (workers/store.py CHUNK), and consumes and
# confirms that leave gaps and leases behind.
_STEPS = st.lists(st.tuples(st.sampled_from(["produce", "produce", "consume", "confirm", "expire", "wait"]),
                            st.integers(1, 40), st.integers(0, 7)), min_size=1, max_size=60)


def _history(steps: list) -> tuple[Queue, float]:
    """A queue after `steps` (ready times now and later, priorities, ttl, per-message
    max_deliveries, leases with and without a token, gaps by confirms and expiries), and the
    time it got to."""
    q = Queue("q", 10_000)
    now = T0
    for kind, a, b in steps:
        if kind == "produce":
            q.produce_many([(f"m{i}\u00e9" if b == 5 else "x" * (i % 7), now + (b % 3) * 10 * (i % 2), now + 50 + b,
                             float(b % 4), b % 2) for i in range(a)], now,
                           max_deliveries=b if b > 5 else None)
        elif kind == "consume":
            q.consume(now, a % 9, lease=float(b) or None, token=f"t{b}" if b % 3 == 1 else None)
        elif kind == "confirm":
            ids = list(q._index)[b::3][:a]
            for msg_id in ids:
                if q._index.state(msg_id)[5] is not None:  # leased
                    q.confirm(msg_id)
        elif kind == "expire":
            q.expire_due(now)
        else:
            now += a / 4
    return q, now


def _serves(q: Queue, now: float) -> list:
    """What `q` answers from `now` on: stats, peeks, and consumes (with leases) as time goes."""
    out = []
    for step in range(8):
        at = now + step * 7.5
        out.append(q.stats(at))
        out.append([(m.msg_id, m.data, m.delivery_count) for m in q.peek(at, 5)])
        out.append([(m.msg_id, m.data, m.delivery_count) for m in q.consume(at, 6, lease=3.0)[0]])
        out.append([r.msg_id for r in q.expire_due(at) if hasattr(r, "msg_id")])
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_STEPS, rows_max=st.sampled_from([3, 64, 16_384]), offset=st.sampled_from([-100.0, 0.0, 5.0, 1e9]))
def test_a_queue_loaded_by_columns_equals_one_rebuilt_from_its_rows(monkeypatch, steps, rows_max, offset):
    """Queue.load_frames (columns, a frame at a time, ready messages straight to the ready
    ordering when given the time) against Queue.from_snapshot of the same rows: the same
    snapshot, the same store, the same answers afterwards (from the time of the load on)."""
    monkeypatch.setattr(snapshot_frames, "ROWS_MAX", rows_max)
    q, now = _history(steps)
    reference = Queue.from_snapshot(q.snapshot())
    for at in (None, now + offset):
        got = Queue.load_frames("q", q.snapshot_frames(), at)
        assert got.snapshot() == q.snapshot()
        assert list(got._index.entries()) == list(reference._index.entries())
        assert sorted(got._index.chunks) == sorted(reference._index.chunks)
        assert got._index.side == reference._index.side and got._tokens == reference._tokens
        assert got._leased == reference._leased and got._n_leased == reference._n_leased
        served_from = now if at is None else max(now, at)
        assert _serves(got, served_from) == _serves(Queue.from_snapshot(q.snapshot()), served_from)


def test_rows_that_do_not_ascend_or_pass_next_id_are_refused(monkeypatch):
    def frames(ids, next_id=1000, tail=()):
        rows = [[i, "a", 1.0, 2.0, 0.0, 0, 0, None] for i in ids]
        for i, lease, token in tail:
            rows[i][7:] = [lease, token]
        meta = snapshot_frames.queue_body(1000, next_id, False, [])
        return [(QUEUE, "q", meta), *((ROWS, "q", body) for body in rows_bodies(rows))]
    assert len(Queue.load_frames("q", frames([1, 5, 300, 301]))) == 4
    for bad in ([2, 1], [3, 3], [0, 1], [5, 1000]):
        with pytest.raises(ValueError, match="bad msg_ids"):
            Queue.load_frames("q", frames(bad))
    monkeypatch.setattr(snapshot_frames, "ROWS_MAX", 2)  # each frame ascends, but not the second after the first
    with pytest.raises(ValueError, match="bad msg_ids"):
        Queue.load_frames("q", frames([1, 5, 3, 7]))
    with pytest.raises(ValueError, match="token without a lease"):
        Queue.load_frames("q", frames([1, 2], tail=[(1, None, "tok")]))
    body = next(rows_bodies([[1, "a", 1.0, 1.0, 0.0, 0, 0, 5.0]]))
    with pytest.raises(ValueError, match="tail"):
        snapshot_frames.read_columns(body.replace(b"[[0,5.0]]", b"[[3,5.0]]"))
