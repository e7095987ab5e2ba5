"""Unit tests for replication/log.py (the change log)."""

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from queue_server.protocol.records import DeleteQueue, decode, encode
from queue_server.replication import log as log_module
from queue_server.replication.log import ChangeLog, Entry


def recs(n: int, tag: str = "r") -> list[DeleteQueue]:
    return [DeleteQueue(queue=f"{tag}{i}") for i in range(n)]


def entries(first: int, vote_id: int, n: int, tag: str = "e") -> list[Entry]:
    return [Entry(first + i, vote_id, DeleteQueue(queue=f"{tag}{first + i}")) for i in range(n)]


# ------------------------------------------------------------------ empty log and base


def test_empty_log_positions():
    log = ChangeLog(10)
    assert len(log) == 0
    assert log.last_trans_id == 0 and log.last_vote_id == 0
    assert log.first_trans_id == 1
    assert log.commit_trans_id == 0
    assert log.term_at(0) == 0
    assert log.term_at(1) is None
    assert log.entries_after(0, 10) == []


def test_log_starting_after_snapshot():
    log = ChangeLog(10, last_trans_id=50, last_vote_id=3)
    assert log.last_trans_id == 50 and log.last_vote_id == 3
    assert log.first_trans_id == 51
    assert log.commit_trans_id == 50
    assert log.term_at(50) == 3
    assert log.term_at(49) is None
    assert log.entries_after(49, 10) is None
    assert log.append(3, recs(2)) == (51, 52)


def test_bad_arguments():
    with pytest.raises(ValueError):
        ChangeLog(0)
    with pytest.raises(ValueError):
        ChangeLog(5, last_trans_id=-1)


# ------------------------------------------------------------------ leader append


def test_append_assigns_consecutive_trans_ids():
    log = ChangeLog(100)
    assert log.append(1, recs(3)) == (1, 3)
    assert log.append(1, recs(2)) == (4, 5)
    assert log.append(2, recs(1)) == (6, 6)
    assert len(log) == 6
    assert log.last_trans_id == 6 and log.last_vote_id == 2
    assert [log.term_at(t) for t in range(7)] == [0, 1, 1, 1, 1, 1, 2]
    assert log.entry_at(4).record == DeleteQueue(queue="r0")


def test_append_empty_batch():
    log = ChangeLog(100)
    log.append(1, recs(2))
    assert log.append(1, []) == (3, 2)
    assert log.last_trans_id == 2


def test_append_vote_id_never_decreases():
    log = ChangeLog(100)
    log.append(5, recs(1))
    with pytest.raises(ValueError):
        log.append(4, recs(1))
    assert log.last_trans_id == 1


def test_entries_after():
    log = ChangeLog(100)
    log.append(1, recs(5))
    got = log.entries_after(0, 3)
    assert [e.trans_id for e in got] == [1, 2, 3]
    assert [e.trans_id for e in log.entries_after(3, 10)] == [4, 5]
    assert log.entries_after(5, 10) == []
    assert log.entries_after(9, 10) == []
    assert log.entries_after(2, 0) == []


# ------------------------------------------------------------------ commit and capacity


def test_commit_never_moves_back_nor_past_last():
    log = ChangeLog(100)
    log.append(1, recs(5))
    log.commit_to(3)
    assert log.commit_trans_id == 3
    log.commit_to(2)
    assert log.commit_trans_id == 3
    log.commit_to(99)
    assert log.commit_trans_id == 5


def test_capacity_drops_committed_entries_from_the_front():
    log = ChangeLog(3)
    log.append(1, recs(5))
    # nothing committed: nothing may fall off
    assert len(log) == 5 and log.first_trans_id == 1
    log.commit_to(4)
    assert len(log) == 3
    assert log.first_trans_id == 3
    assert log.term_at(2) == 1  # the new base is still known
    assert log.term_at(1) is None
    assert log.entries_after(1, 10) is None  # too old: snapshot
    assert [e.trans_id for e in log.entries_after(2, 10)] == [3, 4, 5]
    log.append(2, recs(2))
    log.commit_to(7)
    assert len(log) == 3 and log.first_trans_id == 5
    assert log.last_trans_id == 7 and log.last_vote_id == 2


def test_capacity_long_run_stays_bounded_and_indexable():
    log = ChangeLog(50)
    for i in range(1, 5001):
        log.append(1 + i // 1000, [DeleteQueue(queue=f"{i}")])
        log.commit_to(i)
        assert len(log) <= 50
    assert log.first_trans_id == 4951
    assert log.entry_at(4951).record == DeleteQueue(queue="4951")
    assert [int(e.record.queue) for e in log.entries_after(4990, 100)] == list(range(4991, 5001))
    assert log.term_at(4950) == 5


# ------------------------------------------------------------------ follower accept


def test_accept_continuing_entries():
    log = ChangeLog(100)
    assert log.accept(0, 0, entries(1, 1, 3))
    assert log.last_trans_id == 3
    assert log.accept(3, 1, entries(4, 1, 2))
    assert log.last_trans_id == 5


def test_accept_rejects_gap_and_term_mismatch():
    log = ChangeLog(100)
    log.accept(0, 0, entries(1, 1, 3))
    assert not log.accept(5, 1, entries(6, 1, 1))  # gap
    assert not log.accept(3, 2, entries(4, 2, 1))  # prev term differs
    assert log.last_trans_id == 3


def test_accept_is_idempotent_and_keeps_longer_matching_log():
    log = ChangeLog(100)
    log.accept(0, 0, entries(1, 1, 5))
    # an old, duplicated push: entries already held, nothing truncated
    assert log.accept(1, 1, entries(2, 1, 2))
    assert log.last_trans_id == 5
    assert log.accept(0, 0, [])
    assert log.last_trans_id == 5


def test_accept_truncates_conflicting_suffix():
    log = ChangeLog(100)
    log.accept(0, 0, entries(1, 1, 2))
    log.accept(2, 1, entries(3, 2, 3, tag="old"))  # 3..5 from a deposed leader (term 2)
    log.commit_to(2)
    new = entries(3, 3, 2, tag="new")  # the term 3 leader's 3..4
    assert log.accept(2, 1, new)
    assert log.last_trans_id == 4
    assert [log.term_at(t) for t in (1, 2, 3, 4)] == [1, 1, 3, 3]
    assert log.entry_at(3).record == DeleteQueue(queue="new3")
    assert log.entry_at(5) is None


def test_accept_conflict_in_the_middle_of_the_batch():
    log = ChangeLog(100)
    log.accept(0, 0, entries(1, 1, 3))
    log.accept(3, 1, entries(4, 2, 2, tag="old"))
    batch = entries(2, 1, 2) + entries(4, 3, 1, tag="new")
    assert log.accept(1, 1, batch)
    assert [log.term_at(t) for t in (1, 2, 3, 4)] == [1, 1, 1, 3]
    assert log.last_trans_id == 4


def test_accept_before_commit_point_skips_committed_part():
    log = ChangeLog(3)
    log.accept(0, 0, entries(1, 1, 6))
    log.commit_to(6)
    assert log.first_trans_id == 4
    # a retransmission that starts before our window
    assert log.accept(1, 1, entries(2, 1, 7))
    assert log.last_trans_id == 8
    assert log.entry_at(8).record == DeleteQueue(queue="e8")
    # entirely old: accepted as a no-op
    assert log.accept(0, 0, entries(1, 1, 3))
    assert log.last_trans_id == 8


def test_accept_validates_batches():
    log = ChangeLog(100)
    with pytest.raises(ValueError):
        log.accept(0, 0, [Entry(2, 1, DeleteQueue(queue="q"))])
    with pytest.raises(ValueError):
        log.accept(0, 0, [Entry(1, 2, DeleteQueue(queue="q")), Entry(2, 1, DeleteQueue(queue="q"))])


def test_accept_copies_entries():
    log = ChangeLog(100)
    batch = entries(1, 1, 1)
    log.accept(0, 0, batch)
    batch[0].vote_id = 9
    assert log.term_at(1) == 1


def test_accept_keeps_each_entrys_bytes():
    """A follower's entries keep the bytes they came in, for its WAL."""
    log = ChangeLog(100)
    log.accept(0, 0, [Entry(1, 1, {"a": 1}, b'{"a": 1}')])
    assert log.entry_at(1).data == b'{"a": 1}'


# ------------------------------------------------------------------ truncate and reset


def test_truncate_after_returns_dropped():
    log = ChangeLog(100)
    log.append(1, recs(5))
    log.commit_to(2)
    dropped = log.truncate_after(3)
    assert [e.trans_id for e in dropped] == [4, 5]
    assert log.last_trans_id == 3
    assert log.truncate_after(3) == []
    assert log.append(2, recs(1)) == (4, 4)


def test_truncate_never_drops_committed():
    log = ChangeLog(100)
    log.append(1, recs(5))
    log.commit_to(3)
    with pytest.raises(AssertionError):
        log.truncate_after(2)
    assert log.last_trans_id == 5


def test_reset_after_snapshot():
    log = ChangeLog(100)
    log.append(1, recs(5))
    log.reset(100, 4)
    assert len(log) == 0
    assert log.last_trans_id == 100 and log.last_vote_id == 4
    assert log.first_trans_id == 101
    assert log.commit_trans_id == 100
    assert log.term_at(100) == 4
    assert log.entries_after(5, 1) is None
    assert log.accept(100, 4, entries(101, 4, 2))
    assert log.last_trans_id == 102


# ------------------------------------------------------------------ where the log ends, on every path
# ChangeLog keeps last_trans_id / last_vote_id instead of reading them off its entries each time;
# each path that changes the entries must leave them equal to what the entries say.


def _end_from_entries(log: ChangeLog) -> tuple[int, int]:
    kept = log.entries_after(log.base_trans_id, 1 << 30)
    last = kept[-1] if kept else None
    return (last.trans_id, last.vote_id) if last else (log.base_trans_id, log.base_vote_id)


def _end(log: ChangeLog) -> tuple[int, int]:
    assert (log.last_trans_id, log.last_vote_id) == _end_from_entries(log)
    return log.last_trans_id, log.last_vote_id


def test_the_end_after_a_truncate_into_an_earlier_term():
    log = ChangeLog(100)
    log.append(1, recs(2))
    log.append(2, recs(2))
    log.truncate_after(2)
    assert _end(log) == (2, 1)


def test_the_end_after_a_truncate_of_every_kept_entry_is_the_base():
    log = ChangeLog(2)
    log.append(1, recs(3))
    log.commit_to(3)
    log.append(2, recs(2))  # 2 and 3 fall off: the base is (3, 1), 4..5 are kept
    assert (log.base_trans_id, log.base_vote_id) == (3, 1)
    log.truncate_after(3)
    assert _end(log) == (3, 1)


def test_the_end_after_compaction_of_the_backing_list():
    log = ChangeLog(3)
    for i in range(1, 3001):  # past _COMPACT_MIN dropped entries: the backing list is compacted
        log.append(1 + i // 1000, [DeleteQueue(queue=f"{i}")])
        log.commit_to(i - 1)
        assert _end(log) == (i, 1 + i // 1000)
    log.truncate_after(2999)
    assert _end(log) == (2999, 3)


def test_the_end_after_installing_a_snapshot():
    log = ChangeLog(100)
    log.append(1, recs(2))
    log.append(5, recs(3))
    log.reset(3, 2)  # a snapshot behind this log's (uncommitted) end, in an earlier term
    assert _end(log) == (3, 2)
    log.append(6, recs(1))
    assert _end(log) == (4, 6)


def test_the_end_after_accepting_over_a_conflicting_suffix():
    log = ChangeLog(100)
    log.accept(0, 0, entries(1, 1, 2))
    log.accept(2, 1, entries(3, 2, 3))
    assert log.accept(2, 1, entries(3, 3, 1, tag="new"))
    assert _end(log) == (3, 3)


def test_append_keeps_each_records_bytes_and_refuses_a_count_mismatch():
    log = ChangeLog(100)
    log.append(1, recs(2), [b'{"a":1}', b'{"b":2}'])
    log.append(1, recs(1))
    assert [e.data for e in log.entries_after(0, 10)] == [b'{"a":1}', b'{"b":2}', encode(recs(1)[0])]
    with pytest.raises(ValueError, match="differ in number"):
        log.append(1, recs(2), [b"{}"])
    assert _end(log) == (3, 1) and len(log) == 3


# ------------------------------------------------------------------ the compact window


def test_records_are_decoded_once_and_committed_ones_only_when_read(monkeypatch):
    """Entries not both committed and on disk keep the record they came with (a commit hands it
    on without decoding again); the others are kept as bytes, and decode when read."""
    monkeypatch.setattr(log_module, "_RUN", 1)  # move each settled entry at once
    log = ChangeLog(100, stable_trans_id=0)
    given = recs(3)
    log.append(1, given)
    assert all(e._record is r for e, r in zip(log.entries_after(0, 3), given))
    log.commit_to(2)
    assert all(e._record is r for e, r in zip(log.entries_after(0, 3), given))  # not on disk
    log.mark_stable(3)
    got = log.entries_after(0, 3)
    assert [e._record for e in got[:2]] == [None, None] and got[2]._record is given[2]
    assert [e.record for e in got] == given  # decoded from the bytes
    log.append(1, None, [encode(DeleteQueue(queue="bare"))])  # bytes only
    assert log.entry_at(4).record == DeleteQueue(queue="bare")
    with pytest.raises(ValueError):
        log.append(1, None)


def test_entries_read_back_across_chunks():
    """Committed entries are kept as bytes in chunks (an entry's in one; many committed at once
    are cut into several chunks); reads that span chunks, the chunk still taking entries, and the
    uncommitted tail give each entry's bytes exactly."""
    log = ChangeLog(10_000, max_bytes=1 << 30)
    big = [DeleteQueue(queue=f"{i}" + "x" * (i * 37 % 3000)) for i in range(400)]
    log.append(1, big[:3])
    log.commit_to(3)
    log.append(1, big[3:])
    log.commit_to(250)  # ~370 KB at once
    assert len(log._chunks) > 3
    assert [e.record for e in log.entries_after(0, 1000)] == big
    assert [d for _, _, d in log.encoded_after(100, 1000)] == [encode(r) for r in big[100:]]
    assert log.entry_at(250).record == big[249] and log.entry_at(251).record is big[250]
    log.truncate_after(300)
    log.append(2, big[:10])
    log.commit_to(305)
    assert [e.record for e in log.entries_after(240, 100)] == big[240:300] + big[:10]
    assert log.byte_size == sum(len(encode(r)) for r in big[:300] + big[:10])


def test_max_bytes_drops_committed_entries_from_the_front():
    size = len(encode(DeleteQueue(queue="r0")))  # recs' records are all this long
    log = ChangeLog(1000, max_bytes=3 * size)
    log.append(1, recs(5))
    assert len(log) == 5  # nothing committed: nothing may fall off
    log.commit_to(4)
    assert len(log) == 3 and log.first_trans_id == 3 and log.byte_size == 3 * size
    assert log.entries_after(1, 10) is None and log.term_at(2) == 1
    log.append(1, [DeleteQueue(queue="x" * 100)])  # one record over max_bytes on its own
    log.commit_to(6)
    assert len(log) == 0 and (log.base_trans_id, log.last_trans_id) == (6, 6)
    assert log.entries_after(6, 10) == []
    with pytest.raises(ValueError):
        ChangeLog(10, max_bytes=0)


def test_eviction_never_passes_commit_nor_what_the_disk_holds():
    """Byte and count bounds alike: an entry falls off only once committed and, for a log that
    waits for its disk, once mark_stable says it is there. A truncate or reset moves the stable
    point back with the log."""
    log = ChangeLog(2, max_bytes=1, stable_trans_id=0)
    log.append(1, recs(6))
    log.commit_to(5)
    assert log.first_trans_id == 1  # committed, but not on disk
    log.mark_stable(3)
    assert (log.base_trans_id, log.stable_trans_id) == (3, 3)
    log.mark_stable(9)  # never past the last entry
    assert log.stable_trans_id == 6 and log.base_trans_id == 5  # commit stops it now
    log.append(1, recs(3))  # 7..9
    log.truncate_after(7)
    log.mark_stable(7)
    log.commit_to(7)
    assert log.base_trans_id == 7
    log.append(1, recs(2))  # 8..9 again: not on disk
    log.truncate_after(8)
    assert log.stable_trans_id == 7
    log.commit_to(8)
    assert log.base_trans_id == 7  # 8 is committed, but the disk has not had it
    log.reset(20, 2)
    assert log.stable_trans_id == 20
    log.append(2, recs(2))
    log.commit_to(22)
    assert log.base_trans_id == 20
    free = ChangeLog(2, max_bytes=1)  # no disk to wait for
    free.append(1, recs(3))
    free.commit_to(3)
    free.mark_stable(1)
    assert (free.base_trans_id, free.stable_trans_id) == (3, None)


def test_a_long_run_keeps_memory_bounded():
    """The arrays and the chunks shrink as entries fall off (no dead head kept)."""
    log = ChangeLog(100_000, max_bytes=20_000)
    for i in range(1, 20_001):
        log.append(1, [DeleteQueue(queue=f"{i:08}")])
        log.commit_to(i)
    assert log.byte_size <= 20_000 and len(log._votes) < 2 * len(log) + 1024
    assert sum(map(len, log._chunks)) < 20_000 + 2 * (1 << 16)
    assert log.entry_at(20_000).record == DeleteQueue(queue="00020000")


class LogModel(RuleBasedStateMachine):
    """The compact log against a plain list of (trans_id, vote_id, bytes): the same answers to
    every read after random appends, accepts, commits, truncates, resets and disk progress."""

    def __init__(self) -> None:
        super().__init__()
        # small chunks and runs: many chunks are closed and freed, many runs moved
        self.saved = log_module._CHUNK, log_module._RUN
        log_module._CHUNK, log_module._RUN = 128, 3
        self.log = ChangeLog(7, max_bytes=400, stable_trans_id=0)
        self.kept: list[tuple[int, int, bytes]] = []
        self.base = (0, 0)
        self.commit = self.stable = 0
        self.n = 0

    def last(self) -> tuple[int, int]:
        return self.kept[-1][:2] if self.kept else self.base

    def record(self, size: int) -> DeleteQueue:
        self.n += 1
        return DeleteQueue(queue=f"{self.n}" + "y" * size)

    def evict(self) -> None:
        while self.kept and (len(self.kept) > 7 or sum(len(d) for *_, d in self.kept) > 400) \
                and self.kept[0][0] <= min(self.commit, self.stable):
            self.base = self.kept.pop(0)[:2]

    @rule(sizes=st.lists(st.integers(0, 150), max_size=6), bump=st.booleans(), bare=st.booleans())
    def append(self, sizes: list[int], bump: bool, bare: bool) -> None:
        vote = self.last()[1] + bump
        records = [self.record(s) for s in sizes]
        first, _ = self.log.append(vote, None if bare else records, [encode(r) for r in records])
        assert first == self.last()[0] + 1
        self.kept += [(first + i, vote, encode(r)) for i, r in enumerate(records)]
        self.evict()

    @rule(back=st.integers(0, 5), sizes=st.lists(st.integers(0, 150), min_size=1, max_size=5),
          bump=st.integers(0, 1))
    def accept(self, back: int, sizes: list[int], bump: int) -> None:
        """A leader's batch that overwrites the uncommitted tail from some point."""
        prev = max(self.commit, self.last()[0] - back)
        prev_vote = self.log.term_at(prev)
        vote = self.last()[1] + bump
        batch = [Entry(prev + 1 + i, vote, self.record(s)) for i, s in enumerate(sizes)]
        assert self.log.accept(prev, prev_vote, batch)
        keep = [k for k in self.kept if k[0] <= prev]
        tail = [k for k in self.kept if k[0] > prev]
        new = [(e.trans_id, e.vote_id, encode(e.record)) for e in batch]
        if tail and all(k[:2] == n[:2] for k, n in zip(tail, new)) and len(tail) >= len(new):
            pass  # nothing conflicts: what is held stays
        else:
            same = 0
            while same < min(len(tail), len(new)) and tail[same][:2] == new[same][:2]:
                same += 1
            self.kept = keep + tail[:same] + new[same:]
            self.stable = min(self.stable, prev + same)
        self.evict()

    @rule(ahead=st.integers(0, 8))
    def commit_to(self, ahead: int) -> None:
        self.log.commit_to(self.commit + ahead)
        self.commit = min(self.commit + ahead, self.last()[0])
        self.evict()

    @rule(ahead=st.integers(0, 8))
    def mark_stable(self, ahead: int) -> None:
        self.log.mark_stable(self.stable + ahead)
        self.stable = max(self.stable, min(self.stable + ahead, self.last()[0]))
        self.evict()

    @rule(back=st.integers(0, 8))
    def truncate(self, back: int) -> None:
        point = max(self.commit, self.last()[0] - back)
        dropped = self.log.truncate_after(point)
        assert [(e.trans_id, e.vote_id, e.encoded()) for e in dropped] == [k for k in self.kept if k[0] > point]
        self.kept = [k for k in self.kept if k[0] <= point]
        self.stable = min(self.stable, point)

    @rule(ahead=st.integers(0, 20), vote=st.integers(0, 3))
    def reset(self, ahead: int, vote: int) -> None:
        point = (self.last()[0] + ahead - 10 if self.last()[0] >= 10 else ahead, self.last()[1] + vote)
        point = (max(point[0], 0), point[1])
        self.log.reset(*point)
        self.kept, self.base = [], point
        self.commit = self.stable = point[0]

    def teardown(self) -> None:
        log_module._CHUNK, log_module._RUN = self.saved

    @invariant()
    def same(self) -> None:
        log = self.log
        assert (log.base_trans_id, log.base_vote_id) == self.base
        assert (log.last_trans_id, log.last_vote_id) == self.last()
        assert (log.commit_trans_id, log.stable_trans_id) == (self.commit, self.stable)
        assert len(log) == len(self.kept) and log.byte_size == sum(len(d) for *_, d in self.kept)
        got = log.entries_after(self.base[0], 1 << 30)
        assert [(e.trans_id, e.vote_id, e.encoded()) for e in got] == self.kept
        assert [e.record for e in got] == [decode(d) for *_, d in self.kept]
        assert log.encoded_after(self.base[0], 1 << 30) == self.kept
        for t in range(self.base[0] - 1, self.last()[0] + 2):
            held = [k[1] for k in self.kept if k[0] == t]
            assert log.term_at(t) == (self.base[1] if t == self.base[0] else held[0] if held else None)
        if self.base[0] > 0:
            assert log.entries_after(self.base[0] - 1, 1) is None


TestLogModel = LogModel.TestCase
TestLogModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                 suppress_health_check=[HealthCheck.too_slow])
