"""Snapshot parts that refer to overflowed bodies (issue 26 step 3), with real files in a tmp
folder: the part holds REFS rows and the segments linked beside it; a worker with overflow on
loads the references (its own segment numbers, the files linked into its folder), one with
overflow off reads the bodies back; both hold what was stored, in order."""
from __future__ import annotations

import os

from queue_server.protocol.origin import Origin
from queue_server.protocol.snapshot_frames import REFS, ROWS, read_rows, rebase_refs, rows_frames
from queue_server.replication.snapshot import iter_frames, read_end
from queue_server.server.overflow_files import DiskSegments, PartSegments, link_segments
from queue_server.server.snapshot_child import part_name, write_part_inline
from queue_server.workers.body_budget import BodyBudget
from queue_server.workers.overflow import Overflow, ref, unpack
from queue_server.workers.service import PartitionService
from tests.unit.service_replies import take_replies

T0 = 1_000.0


def _service(folder: str, share: int) -> PartitionService:
    ov = Overflow(BodyBudget(share), DiskSegments(folder), segment_size=4096)
    return PartitionService(node_id=1, queue_size=10_000, overflow=ov)


def _consume_all(s: PartitionService, queue: str) -> list[str]:
    s.handle({"action": "consume", "queue": queue, "count": 1000}, Origin(1), 9, T0)
    (_, _, reply), = take_replies(s)
    return [m["data"] for m in reply.get("messages", [])]


def test_refs_rows_round_trip_in_order_with_ROWS_and_are_renumbered():
    rows = [[1, "a", 1.0, 2.0, 0.0, 0, 0], [2, ref(3, 100, 7), 1.0, 2.0, 0.0, 1, 2, 9.0, "tok"],
            [3, ref(4, 0, 5), 1.0, 2.0, 0.0, 0, 0], [4, "é", 1.0, 2.0, 0.0, 0, 0]]
    frames = list(rows_frames(rows))
    assert [k for k, _ in frames] == [ROWS, REFS, ROWS]
    assert [list(r) for k, b in frames for r in read_rows(b, k)] == rows
    moved = read_rows(rebase_refs(frames[1][1], 10), REFS)
    assert [unpack(r[1]) for r in moved] == [(13, 100, 7), (14, 0, 5)]


def test_a_part_refers_to_linked_segments_and_loads_with_overflow_on_or_off(tmp_path):
    s = _service(str(tmp_path / "w0"), share=50)
    bodies = [f"{i:04d}-" + "x" * (20 + i % 7) + "é" for i in range(300)]
    for k in range(0, 300, 30):
        s.handle({"action": "produce", "queue": "q", "data": bodies[k:k + 30]}, Origin(1), k, T0)
    take_replies(s)
    ov = s.overflow
    assert ov.segments >= 3
    tmp = str(tmp_path / "cut")
    segments = link_segments(ov, tmp, part_name(0))
    write_part_inline(s, tmp, 0)
    part = os.path.join(tmp, part_name(0))
    kinds = [kind for kind, _, _ in iter_frames(part)]
    assert REFS in kinds and read_end(part)["messages"] == 300
    assert [seg for seg, _ in segments] == sorted(ov.live)
    # The worker deletes its segments (consumed, a reset): the snapshot's links keep the bodies.
    ov.reset()
    assert not [n for n in os.listdir(tmp_path / "w0") if n.startswith("seg-")]

    on = _service(str(tmp_path / "w1"), share=50)
    on.overflow.seg = 7  # segments used before the load
    loading = PartSegments(on.overflow)
    on.load_frames(loading.frames(part, iter_frames(part)))
    loading.adopt()
    assert min(on.overflow.live) > 8 and on.overflow.seg > max(on.overflow.live)
    assert _consume_all(on, "q") == bodies
    off = PartitionService(node_id=1, queue_size=10_000)
    off.load_frames(PartSegments(None).frames(part, iter_frames(part)))
    assert _consume_all(off, "q") == bodies


def test_refs_load_by_columns_with_the_load_time_as_rows_do(tmp_path, monkeypatch):
    """REFS frames go through the columnar load (Queue._load_rows) as ROWS frames do: with the
    load's `now`, the unleased messages are in the ready ordering at once, leases and priorities
    kept, and the state is the one snapshotted (the bodies read back from the adopted segments)."""
    s = _service(str(tmp_path / "w0"), share=50)
    bodies = [f"{i:04d}-" + "y" * (10 + i % 5) for i in range(200)]
    for k in range(0, 200, 20):
        s.handle({"action": "produce", "queue": "q", "data": bodies[k:k + 20], "priority": k // 100}, Origin(1), k, T0)
    s.handle({"action": "consume", "queue": "q", "count": 5, "lease": 60}, Origin(1), 500, T0)
    take_replies(s)
    before = s.queues["q"].snapshot()
    tmp = str(tmp_path / "cut")
    link_segments(s.overflow, tmp, part_name(0))
    write_part_inline(s, tmp, 0)
    part = os.path.join(tmp, part_name(0))
    assert {kind for kind, _, _ in iter_frames(part)} >= {ROWS, REFS}

    monkeypatch.setattr("queue_server.workers.queue.Queue.from_snapshot",
                        classmethod(lambda cls, snap: (_ for _ in ()).throw(AssertionError("row by row"))))
    on = _service(str(tmp_path / "w1"), share=50)
    loading = PartSegments(on.overflow)
    on.load_frames(loading.frames(part, iter_frames(part)), now=T0 + 1)
    loading.adopt()
    q = on.queues["q"]
    assert q.overflowed() > 0 and len(q._ready) == 195 and not len(q._delayed)
    assert q.snapshot() == before
    rest = _consume_all(on, "q")
    assert rest == bodies[105:] + bodies[:100]  # priority 1 first; 100-104 stay leased
