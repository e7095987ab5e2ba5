"""Bodies that overflow to disk (issue 26; workers/overflow.py, workers/body_budget.py, the
store's reference slot), differentially: the same random traffic (test_rollback's: produce
single, batch and idempotent, consume at most once and leased, confirm, release, extend, ttl
and lease expiry, priorities, dead letters and their replay, purge, delete_queue, pause,
subscribe, virtual queues, undeliver; with commits and rollbacks of the undo journal) on a
service whose bodies overflow past a budget of 0 B to 2 KB to an in-memory fake of the segment
files, and on one without overflow: the same replies and records, the same state, and the
overflow's counts always equal to what the stores hold. OVERFLOW_SEEDS (default 300) sets how
many runs."""
from __future__ import annotations

import errno
import os
from collections import Counter

import pytest

from queue_server.protocol import vocabulary as p
from queue_server.protocol.origin import Origin
from queue_server.workers.body_budget import BodyBudget, body_size, worker_share
from queue_server.workers.compaction import Compaction
from queue_server.workers.overflow import HEADER, BodyUnreadable, Overflow, ref, unpack
from queue_server.workers.service import PartitionService
from queue_server.workers.store import SPILLED, MessageStore
from tests.unit.service_replies import take_replies
from tests.unit.test_rollback import Run, assert_same, service
from tests.unit.test_store import tiny_chunks

SEEDS = int(os.environ.get("OVERFLOW_SEEDS", "300"))
T0 = 1_700_000_000.0


class FakeFiles:
    """Segment files in memory; a deleted segment cannot be read (a KeyError shows a reference
    that outlived its segment). `full`: every write fails as on a full disk."""

    where = "/fake/overflow"

    def __init__(self) -> None:
        self.segs: dict[int, bytearray] = {}
        self.full = False
        self.writes = 0
        self.reads = 0

    def write(self, seg: int, offset: int, data: bytes) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        buf = self.segs.setdefault(seg, bytearray())
        assert offset <= len(buf), "a write past the end of its segment"
        buf[offset:offset + len(data)] = data
        self.writes += 1

    def read(self, seg: int, offset: int, size: int) -> bytes:
        self.reads += 1
        return bytes(self.segs[seg][offset:offset + size])

    def delete(self, seg: int) -> None:
        del self.segs[seg]

    def delete_all(self) -> None:
        self.segs.clear()


def overflowing(share: int, segment_size: int, rotate_empty: int,
                run: Run) -> tuple[PartitionService, Overflow]:
    ov = Overflow(BodyBudget(share), FakeFiles(), segment_size, rotate_empty=rotate_empty)
    s = service(10**6, run.restore_cache, run.suffix, run.queue_class)
    s.overflow = ov
    s.compaction = Compaction(ov, check_every=0)  # segments compacted as the traffic goes (service.tick)
    return s, ov


class BodiesRun(Run):
    """test_rollback's traffic with bodies of many sizes, some not ASCII."""

    def request(self) -> dict:
        req = super().request()
        data = req.get("data")
        if data is not None:
            rng = self.rng
            grow = (lambda d: d * rng.choice((1, 1, 3, 12)) + rng.choice(("", "", "é", "日本")))
            req["data"] = [grow(d) for d in data] if type(data) is list else grow(data)
        return req


def check_counts(s: PartitionService, ov: Overflow, where: str) -> None:
    """The overflow counts exactly what the service's stores hold."""
    held = 0
    live: Counter = Counter()
    for q in s.queues.values():
        store = q._index
        assert store.ov is ov, where
        slots = list(store._slots())
        refs = [d for d in slots if type(d) is int]
        assert store.spilled == len(refs), f"{where}: queue {q.name}"
        held += sum(body_size(d) for d in slots if type(d) is str)
        live.update(r >> 64 for r in refs)
    assert ov.budget.held == held, where
    assert ov.live == dict(live), where
    assert ov.live_bytes == sum(unpack(r)[2] for q in s.queues.values()
                                for r in q._index._slots() if type(r) is int), where
    on_disk = set(ov.files.segs)
    assert set(ov.live) <= on_disk, where
    assert on_disk <= set(ov.live) | set(ov.zero) | {ov.seg}, f"{where}: a segment leaked"


def run_seed(seed: int) -> int:
    """One seed: the two services take the same traffic; how many bodies went to disk."""
    run = BodiesRun(seed)
    rng = run.rng
    plain = run.leader
    share = rng.choice((0, 8, 40, 200, 1000, 2048))  # bytes: every body, some, a few KB
    over, ov = overflowing(share, rng.choice((64, 300, 4096)), rng.choice((0, 100, 1 << 20)), run)
    spilled = 0
    for phase in range(rng.randint(2, 4)):
        for i in range(rng.randint(20, 150)):
            before = ov.files.writes
            (r1, rec1), (r2, rec2) = run.step([plain, over])
            where = f"seed {seed}, phase {phase}, step {i}"
            assert r1 == r2, where
            assert rec1 == rec2, where
            run.log.extend(rec1)
            spilled += ov.files.writes - before
            if rng.random() < 0.1:  # a commit watermark, the same on both
                k = rng.randint(plain.journal.base, plain.seq)
                plain.trim(k)
                over.trim(k)
            check_counts(over, ov, where)
        where = f"seed {seed}, phase {phase}"
        assert_same(plain, over, run.now, where)
        k = rng.randint(plain.journal.base, plain.seq)
        assert plain.rollback(k) == over.rollback(k), where
        del run.log[k:]
        assert take_replies(plain) == take_replies(over), where
        check_counts(over, ov, where + ", rolled back")
        assert_same(plain, over, run.now, where + ", rolled back")
    # Everything committed: every segment left with no body is deleted.
    over.trim(over.seq)
    over.trim(over.seq)
    assert not ov.zero
    check_counts(over, ov, f"seed {seed}, all committed")
    assert set(ov.files.segs) <= set(ov.live) | {ov.seg}
    # A replica replays the log with its own budget: with no undo journal, or as a follower's
    # worker does (a journal, the committed records in batches that journal nothing).
    committed = rng.random() < 0.5
    replica = service(10**6 if committed else None, run.restore_cache, run.suffix, run.queue_class)
    rov = replica.overflow = Overflow(BodyBudget(rng.choice((0, 30))), FakeFiles(), 128, rotate_empty=0)
    done = 0
    while done < len(run.log):
        n = rng.randint(1, 20)
        if committed:
            replica.apply_committed(run.log[done:done + n])
        else:
            for record in run.log[done:done + n]:
                replica.apply(record)
        done += n
    where = f"seed {seed}, a replica ({'apply_committed' if committed else 'no journal'})"
    check_counts(replica, rov, where)
    assert set(rov.files.segs) <= set(rov.live) | {rov.seg}, where  # emptied segments went
    assert_same(run.replay(len(run.log)), replica, run.now, where)
    return spilled


@pytest.mark.parametrize("chunk", range(10))
def test_overflow_delivers_the_same_messages_as_memory(chunk):
    spilled = sum(run_seed(seed) for seed in range(chunk, SEEDS, 10))
    assert spilled > 0


@pytest.mark.parametrize("chunk", range(5))
def test_overflow_with_tiny_chunks_delivers_the_same_messages_as_memory(chunk):
    """The same with chunks of 8: chunks are made, join their bodies, are joined again, thinned
    and freed within a few steps, and a rollback of produces crosses them."""
    with tiny_chunks():
        spilled = sum(run_seed(seed) for seed in range(chunk, SEEDS, 10))
    assert spilled > 0


def test_the_differential_check_catches_a_wrong_body(monkeypatch):
    real = Overflow.read

    def off_by_one(self, r):
        body = real(self, r)
        return body[:-1] + "!" if body else body
    monkeypatch.setattr(Overflow, "read", off_by_one)
    with pytest.raises(AssertionError):
        for seed in range(20):
            run_seed(seed)


def test_the_count_check_catches_a_lost_drop(monkeypatch):
    monkeypatch.setattr(MessageStore, "detach", lambda self: None)  # a purge forgets its bodies
    with pytest.raises(AssertionError):
        for seed in range(40):
            run_seed(seed)


# ------------------------------------------------------------------------------- the rule

def test_bodies_past_the_share_go_to_disk_and_memory_is_used_again_when_freed():
    ov = Overflow(BodyBudget(10), FakeFiles())
    store = MessageStore(ov)
    state = (0.0, 1.0, 0.0, 0, 0, None, None, None)
    store.add_run(1, ["aaaa", "bbbb", "cccc", "dd"], [state] * 4)
    assert [type(store.data(i)) for i in range(1, 5)] == [str, str, int, str]
    assert store.chunks[0].data[3] is SPILLED  # no int object kept: the reference is packed
    assert ov.budget.held == 10 and store.spilled == 1
    assert store.get(3).data == "cccc"  # read back
    store.pop(1)
    store.add(5, "eeee", state)  # back under the share: in memory again
    assert type(store.data(5)) is str
    assert type(store.data(3)) is int  # no promotion
    assert [m.data for m in store.get_many([2, 3, 4, 5])] == ["bbbb", "cccc", "dd", "eeee"]


def test_a_segment_goes_once_its_last_body_is_gone_and_committed():
    ov = Overflow(BodyBudget(0), FakeFiles(), segment_size=2 * (HEADER.size + 3))
    store = MessageStore(ov)
    state = (0.0, 1.0, 0.0, 0, 0, None, None, None)
    store.add_run(1, ["aaa", "bbb", "ccc"], [state] * 3)  # segment 0 holds 2, segment 1 one
    assert sorted(ov.files.segs) == [0, 1]
    store.delete_many([1, 2])
    assert 0 in ov.files.segs and ov.zero == {0: None}  # a rollback could want them back
    ov.trimmed(committed=5, seq=7)
    assert 0 in ov.files.segs
    ov.trimmed(committed=7, seq=9)
    assert sorted(ov.files.segs) == [1]
    store.add(4, "ddd", state)
    store.add(5, "eee", state)
    store.delete_many([3, 4])
    ov.trimmed(committed=9, seq=9)  # everything committed (or no journal): at once
    assert sorted(ov.files.segs) == [2]


def test_a_batch_consume_reads_each_run_of_bodies_at_once():
    ov = Overflow(BodyBudget(0), FakeFiles(), segment_size=10 * (HEADER.size + 5))
    store = MessageStore(ov)
    state = (0.0, 1.0, 0.0, 0, 0, None, None, None)
    bodies = [f"b{i:04d}" for i in range(25)]  # segments 0 and 1 hold 10 each, 2 holds 5
    store.add_run(1, bodies, [state] * 25)
    store.pop(13)  # a gap in segment 1
    ov.files.reads = 0
    got = store.get_many([i for i in range(1, 26) if i != 13])
    assert [m.data for m in got] == [b for i, b in enumerate(bodies, 1) if i != 13]
    assert ov.files.reads == 4  # segment 0, segment 1 before and after the gap, segment 2
    assert ov.read_many([store.data(5), "mem", store.data(2)]) == ["b0004", "mem", "b0001"]


def test_a_chunk_packs_references_at_their_limits():
    """A reference is kept packed in 8 B of its chunk's array('Q') (segment, offset and length
    in 22, 26 and 16 bits) and one that does not fit stays an int in the payload list; both
    come out as the same int through every raw read and the side dict."""
    top = (1 << 32) - 1
    packed = [ref(0, 0, 0), ref((1 << 22) - 1, (1 << 26) - 1, 65_535), ref(7, 4096, 100)]
    unpacked = [ref(top, top, top), ref(1 << 22, 0, 1), ref(1, 1 << 26, 1), ref(3, 0, 65_536)]
    assert [unpack(r) for r in unpacked[:2]] == [(top, top, top), (1 << 22, 0, 1)]
    refs = [packed[0], unpacked[0], packed[1], unpacked[1], unpacked[2], packed[2], unpacked[3]]
    state = (0.0, 1.0, 0.0, 0, 0, None, None, None)
    store = MessageStore()  # no overflow: slots are stored as given (a snapshot's REFS, loaded)
    store.add_ascending([1, 2, 3, 5, 6, 7, 8], refs, [state] * 7)
    store.add(4, "in memory", state)
    c = store.chunks[0]
    assert c.data[1:9] == [SPILLED, refs[1], SPILLED, "in memory", refs[3], refs[4], SPILLED, refs[6]]
    assert len(c.at) == 256 and c.at.itemsize == 8
    everything = refs[:3] + ["in memory"] + refs[3:]
    ids = [1, 2, 3, 4, 5, 6, 7, 8]
    assert [store.data(i) for i in ids] == everything
    assert store._columns(ids, True)[0] == everything
    assert store._columns([7, 1, 4, 2], True)[0] == [refs[5], refs[0], "in memory", refs[1]]
    assert [d for _, d, _ in store.entries(raw=True)] == everything
    assert list(store._slots()) == everything
    assert store.pop(3) == (refs[2], state)
    store.add(3, packed[2], state)  # a position used again (an undo) keeps the new reference
    assert store.data(3) == packed[2]
    store.add(300, "x", state)  # chunk 1 made: chunk 0 thinned below SPARSE goes to the side dict
    store.delete_many([1, 2])
    store.pop(4)
    assert 0 not in store.chunks
    assert store.side == {3: (packed[2], state), 5: (refs[3], state), 6: (refs[4], state),
                          7: (refs[5], state), 8: (refs[6], state)}


def test_a_body_over_64_kb_goes_to_disk_and_back():
    ov = Overflow(BodyBudget(0), FakeFiles())
    store = MessageStore(ov)
    state = (0.0, 1.0, 0.0, 0, 0, None, None, None)
    big, wide = "b" * 70_000, "\u00e9" * 40_000  # 70,000 and 80,000 bytes
    store.add_run(1, ["s", big, wide], [state] * 3)
    assert store.spilled == 3 and [unpack(store.data(i))[2] for i in (1, 2, 3)] == [1, 70_000, 80_000]
    assert store.get(2).data == big and store.get(3).data == wide
    assert [m.data for m in store.get_many([1, 2, 3])] == ["s", big, wide]
    assert ov.live_bytes == 150_001
    store.delete_many([1, 2, 3])
    assert ov.live_bytes == 0 and store.spilled == 0


def test_single_consumes_of_a_fifo_queue_read_ahead():
    ov = Overflow(BodyBudget(0), FakeFiles())
    store = MessageStore(ov)
    state = (0.0, 1.0, 0.0, 0, 0, None, None, None)
    store.add_run(1, [f"b{i:04d}" for i in range(200)], [state] * 100 + [state] * 100)
    ov.files.reads = 0
    got = [store.get(i).data for i in range(1, 101)]
    store.add_run(201, ["late"], [state])  # written after the read ahead began
    got += [store.get(i).data for i in range(101, 202)]
    assert got == [f"b{i:04d}" for i in range(200)] + ["late"]
    assert ov.files.reads == 3  # the first, the one that starts reading ahead, "late"
    ov.files.reads = 0
    assert [store.get(i).data for i in (150, 20, 90)] == ["b0149", "b0019", "b0089"]
    assert ov.files.reads == 3  # out of order: no read ahead


def test_a_torn_body_is_never_delivered():
    ov = Overflow(BodyBudget(0), FakeFiles())
    store = MessageStore(ov)
    store.add(1, "hello", (0.0, 1.0, 0.0, 0, 0, None, None, None))
    ov.files.segs[0][HEADER.size] ^= 1
    with pytest.raises(BodyUnreadable):
        store.get(1)


def test_the_share_is_the_nodes_budget_split_over_its_workers():
    assert worker_share(1024, 4) == 256 << 20
    assert worker_share(1, 3) == (1 << 20) // 3


# ------------------------------------------------------------------------------- disk full

def produce(s: PartitionService, data: str, now: float) -> dict:
    s.handle({"action": "produce", "queue": "q", "data": data}, Origin(1), 1, now)
    (_, _, reply), = take_replies(s)
    return reply


def test_a_full_disk_refuses_produces_that_need_it_and_loses_nothing():
    files = FakeFiles()
    ov = Overflow(BodyBudget(10), files)
    s = PartitionService(node_id=1, queue_size=100, overflow=ov, undo_limit=10**6)
    assert produce(s, "x" * 8, T0)["code"] == p.CODE_OK  # in memory
    assert produce(s, "on disk", T0)["code"] == p.CODE_OK
    files.full = True
    # Accepted before the disk was known full: kept in memory, nothing lost.
    assert produce(s, "kept", T0)["code"] == p.CODE_OK
    refused = produce(s, "refused", T0)
    assert refused["code"] == -1 and refused["reason"] == "overflow disk full: /fake/overflow"
    assert s.limit_refusals == {"overflow_mb": 1}
    s.handle({"action": "consume", "queue": "q", "count": 10}, Origin(1), 2, T0)
    (_, _, got), = take_replies(s)
    assert [m["data"] for m in got["messages"]] == ["x" * 8, "on disk", "kept"]
    # Room in memory again: produces that fit go, though the disk still refuses.
    assert produce(s, "fits", T0)["code"] == p.CODE_OK
    assert produce(s, "needs the disk", T0 + 0.5)["code"] == -1
    files.full = False  # the disk is tried again after RETRY_DISK
    assert produce(s, "needs the disk", T0 + 2)["code"] == p.CODE_OK
    assert ov.refused is None and produce(s, "and again", T0 + 2)["code"] == p.CODE_OK
    assert ov.live_bytes == len("needs the disk") + len("and again")


# ------------------------------------------------------------------------------- torn bodies

@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("dlq", [False, True])
def test_a_torn_body_is_never_delivered_its_message_goes_the_dead_letter_way(count, dlq):
    files = FakeFiles()
    ov = Overflow(BodyBudget(0), files)
    s = PartitionService(node_id=1, queue_size=100, overflow=ov, undo_limit=10**6,
                         dead_letter_suffix=".dlq" if dlq else None)
    for body in ("one", "two", "three", "four"):
        assert produce(s, body, T0)["code"] == p.CODE_OK
    files.segs[0][HEADER.size + len("one") + HEADER.size] ^= 0xFF  # "two" torn on disk
    got = []
    for req_no in range(10):
        s.handle({"action": "consume", "queue": "q", "count": count}, Origin(1), 10 + req_no, T0)
        (_, _, reply), = take_replies(s)
        assert reply["code"] == p.CODE_OK, reply
        got += [m["data"] for m in reply.get("messages", [])]
    assert got == ["one", "three", "four"]
    assert ov.torn == {0: 1}
    kinds = [type(r).__name__ for r in s.records] if s.records else []
    assert not kinds or "Expire" in kinds or "DeadLetter" in kinds
    if dlq:  # there, it is not readable either: removed when it comes up
        s.handle({"action": "consume", "queue": "q.dlq", "count": 1}, Origin(1), 99, T0)
        (_, _, reply), = take_replies(s)
        assert reply["code"] == p.CODE_OK and not reply.get("messages"), reply
        assert ov.torn == {0: 2}
    assert s.queues["q"].stats(T0)["size"] == 0


def test_a_peek_leaves_a_torn_body_out_and_changes_nothing():
    files = FakeFiles()
    ov = Overflow(BodyBudget(0), files)
    s = PartitionService(node_id=1, queue_size=100, overflow=ov, undo_limit=10**6)
    for body in ("one", "two", "three"):
        assert produce(s, body, T0)["code"] == p.CODE_OK
    files.segs[0][HEADER.size + len("one") + HEADER.size] ^= 0xFF  # "two" torn on disk
    s.handle({"action": "peek", "queue": "q", "count": 3}, Origin(1), 50, T0)
    (_, _, reply), = take_replies(s)
    assert reply["code"] == p.CODE_OK and [m["data"] for m in reply["messages"]] == ["one", "three"], reply
    assert ov.torn == {} and s.queues["q"].stats(T0)["size"] == 3  # the consume that meets it ends it


def test_the_budget_counts_utf8_bytes_not_characters():
    ov = Overflow(BodyBudget(15), FakeFiles())
    assert type(ov.keep("é" * 10)) is int  # 10 characters, 20 bytes: past 15
    assert ov.keep("e" * 10) == "e" * 10 and ov.budget.held == 10
    assert ov.keep("€") == "€" and ov.budget.held == 13  # 3 bytes
    assert type(ov.keep("€€")) is int and ov.budget.held == 13  # 6 more: past 15
    ov.drop("€")
    assert ov.budget.held == 10


# ------------------------------------------------------------------------------- compaction

@pytest.mark.parametrize("journal", [True, False])
def test_segments_mostly_dead_are_compacted_and_disk_use_tracks_what_is_stored(journal):
    files = FakeFiles()
    ov = Overflow(BodyBudget(0), files, segment_size=10 * (HEADER.size + 10))
    s = PartitionService(node_id=1, queue_size=1000, overflow=ov, undo_limit=10**6 if journal else None)
    names = ["a", "b", "c", "d", "e"]
    for i in range(200):  # each segment holds bodies of every queue
        q = names[i % 5]
        s.handle({"action": "produce", "queue": q, "data": f"{q}-{i:08d}"}, Origin(1), i, T0)
    for q in names[1:]:
        s.handle({"action": "purge", "queue": q}, Origin(1), 900, T0)
    take_replies(s)
    s.trim(s.seq)
    before = sum(map(len, files.segs.values()))
    now = T0
    for _ in range(100):
        now += 1
        s.tick(now)
        s.trim(s.seq)
        check_counts(s, ov, f"at {now}")
    after = sum(map(len, files.segs.values()))
    assert s.compaction.moved >= 30 * 10  # bytes: the 40 of "a" (a few were in the current segment)
    assert after <= before / 5 + 2 * ov.segment_size, (before, after)
    s.handle({"action": "consume", "queue": "a", "count": 100}, Origin(1), 1000, T0)
    (_, _, reply), = take_replies(s)
    assert [m["data"] for m in reply["messages"]] == [f"a-{i:08d}" for i in range(0, 200, 5)]


def test_a_chunk_moves_out_its_packed_and_its_unpacked_references():
    """Compaction's walk of a chunk (MessageStore.move_out) moves the references packed in its
    array and the ones kept as ints (a body of 64 KiB or more) that name the segment, and only
    those."""
    ov = Overflow(BodyBudget(0), FakeFiles(), segment_size=1 << 20)
    store = MessageStore(ov)
    state = (0.0, 1.0, 0.0, 0, 0, None, None, None)
    bodies = ["small", "b" * 70_000, "small2"]
    store.add_run(1, bodies, [state] * 3)  # segment 0
    ov._rotate()
    store.add_run(4, ["other"], [state])  # segment 1 (the current one)
    assert store.chunks[0].data[1:5] == [SPILLED, store.data(2), SPILLED, SPILLED]
    ov._rotate()  # the current segment is 2: segments 0 and 1 are closed
    moved = store.move_out(0, 0)
    assert moved == 5 + 70_000 + 6
    assert [unpack(store.data(i))[0] for i in (1, 2, 3, 4)] == [2, 2, 2, 1]
    assert [m.data for m in store.get_many([1, 2, 3, 4])] == bodies + ["other"]
    assert ov.live == {1: 1, 2: 3} and ov.zero == {0: None}
