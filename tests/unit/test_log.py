"""Unit tests for replication/log.py (the change log)."""

import pytest

from queue_server.replication.log import ChangeLog, Entry


def recs(n: int, tag: str = "r") -> list[dict]:
    return [{"op": "produce", "tag": f"{tag}{i}"} for i in range(n)]


def entries(first: int, vote_id: int, n: int, tag: str = "e") -> list[Entry]:
    return [Entry(first + i, vote_id, {"tag": f"{tag}{first + i}"}) for i in range(n)]


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
    assert log.entry_at(4).record == {"op": "produce", "tag": "r0"}


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
        log.append(1 + i // 1000, [{"i": i}])
        log.commit_to(i)
        assert len(log) <= 50
    assert log.first_trans_id == 4951
    assert log.entry_at(4951).record == {"i": 4951}
    assert [e.record["i"] for e in log.entries_after(4990, 100)] == list(range(4991, 5001))
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
    assert log.entry_at(3).record == {"tag": "new3"}
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
    assert log.entry_at(8).record == {"tag": "e8"}
    # entirely old: accepted as a no-op
    assert log.accept(0, 0, entries(1, 1, 3))
    assert log.last_trans_id == 8


def test_accept_validates_batches():
    log = ChangeLog(100)
    with pytest.raises(ValueError):
        log.accept(0, 0, [Entry(2, 1, {})])
    with pytest.raises(ValueError):
        log.accept(0, 0, [Entry(1, 2, {}), Entry(2, 1, {})])


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
        log.append(1 + i // 1000, [{"i": i}])
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
    assert [e.data for e in log.entries_after(0, 10)] == [b'{"a":1}', b'{"b":2}', None]
    with pytest.raises(ValueError, match="differ in number"):
        log.append(1, recs(2), [b"{}"])
    assert _end(log) == (3, 1) and len(log) == 3


def test_only_the_newest_entries_keep_their_bytes():
    """Bytes kept for the log's whole capacity would cost the coordinator tens of bytes per stored
    message: only the newest keep_bytes entries hold them, whatever path changed the log."""
    log = ChangeLog(100, keep_bytes=3)
    data = [f'{{"n":{i}}}'.encode() for i in range(1, 8)]
    log.append(1, recs(5), data[:5])
    assert [e.data for e in log.entries_after(0, 10)] == [None, None, *data[2:5]]
    log.commit_to(3)
    log.truncate_after(3)  # 4 and 5 go; 1..3 keep what they had
    log.append(2, recs(2), data[5:7])  # 4 and 5 again: 3..5 are the newest three
    assert [e.data for e in log.entries_after(0, 10)] == [None, None, data[2], *data[5:7]]
    log.accept(5, 2, [Entry(6, 2, {"a": 6}, b"6"), Entry(7, 2, {"a": 7}, b"7")])
    assert [e.data for e in log.entries_after(0, 10)] == [None] * 4 + [data[6], b"6", b"7"]
    log.reset(20, 3)
    log.append(3, recs(4), [b"21", b"22", b"23", b"24"])
    assert [e.data for e in log.entries_after(20, 10)] == [None, b"22", b"23", b"24"]
