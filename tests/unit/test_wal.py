import errno
import os

import orjson
import pytest

from queue_server.replication import wal
from queue_server.replication.wal import (
    HEADER_SIZE,
    CorruptLog,
    StorageError,
    SyncPolicy,
    WalWriter,
    encode_record,
    list_segments,
    read_wal,
    segment_name,
)
from tests.unit.faulty_disk import Faults


def payload(trans_id: int) -> bytes:
    return orjson.dumps({"op": "produce", "queue": "q", "msg_id": trans_id, "data": "x" * (trans_id % 7)})


def records(first: int, last: int, vote_id: int = 1) -> list[tuple[int, int, bytes]]:
    return [(t, vote_id, payload(t)) for t in range(first, last + 1)]


def write(directory, first: int, last: int, **kw) -> None:
    with WalWriter(str(directory), **kw) as w:
        w.append(records(first, last))
        w.flush(sync=True)


class Warnings(list):
    def __call__(self, message: str) -> None:
        self.append(message)


def read(directory, **kw) -> list[tuple[int, int, bytes]]:
    return list(read_wal(str(directory), **kw))


def only_segment(directory) -> str:
    (seg,) = list_segments(str(directory))
    return seg[1]


# ---------------------------------------------------------------------- round trip


def test_round_trip_in_batches(tmp_path):
    w = WalWriter(str(tmp_path))
    assert w.last_trans_id == 0
    w.append(records(1, 10))
    w.append(records(11, 11))
    w.flush(sync=False)
    w.append(records(12, 30, vote_id=2))
    w.flush(sync=True)
    w.close()
    assert read(tmp_path) == records(1, 11) + records(12, 30, vote_id=2)
    assert [r[0] for r in read(tmp_path, after=25)] == [26, 27, 28, 29, 30]
    assert read(tmp_path, after=30) == []
    assert os.path.basename(only_segment(tmp_path)) == segment_name(1) == "wal-00000000000000000001.log"


def test_empty_or_missing_directory_reads_nothing(tmp_path):
    assert read(tmp_path) == []
    assert read(tmp_path / "nope") == []


def test_append_needs_consecutive_trans_ids_and_is_all_or_none(tmp_path):
    w = WalWriter(str(tmp_path))
    with pytest.raises(ValueError):
        w.append([(2, 1, b"x")])
    w.append(records(1, 3))
    with pytest.raises(ValueError):
        w.append([(4, 1, b"a"), (6, 1, b"b")])
    with pytest.raises(ValueError):
        w.append([(3, 1, b"again")])
    assert w.last_trans_id == 3 and w.pending_count == 3
    w.close()
    assert read(tmp_path) == records(1, 3)


def test_flush_positions_and_pending(tmp_path):
    w = WalWriter(str(tmp_path))
    w.append(records(1, 5))
    assert (w.last_trans_id, w.flushed_trans_id, w.synced_trans_id) == (5, 0, 0)
    assert read(tmp_path) == []  # queued only
    w.flush(sync=False)
    assert (w.flushed_trans_id, w.synced_trans_id) == (5, 0)
    assert read(tmp_path) == records(1, 5)  # in the OS: safe from a process crash
    w.flush(sync=True)
    assert w.synced_trans_id == 5
    w.append(records(6, 6))
    w.close()  # close writes and syncs what is queued
    assert read(tmp_path) == records(1, 6)


def test_reopen_continues_after_last_record(tmp_path):
    write(tmp_path, 1, 10)
    w = WalWriter(str(tmp_path))
    assert w.last_trans_id == w.synced_trans_id == 10
    with pytest.raises(ValueError):
        w.append(records(10, 10))
    w.append(records(11, 20))
    w.close()
    assert read(tmp_path) == records(1, 20)
    assert len(list_segments(str(tmp_path))) == 1


def test_segment_rollover(tmp_path):
    frame = len(encode_record(1, 1, payload(1)))
    write(tmp_path, 1, 40, segment_bytes=4 * frame)
    segments = list_segments(str(tmp_path))
    assert len(segments) > 5
    firsts = [first for first, _ in segments]
    assert firsts[0] == 1 and firsts == sorted(firsts)
    for (first, path), (next_first, _) in zip(segments, segments[1:]):
        recs = list(read_wal(str(tmp_path), after=first - 1))
        assert recs[0][0] == first  # each segment starts with the trans_id in its name
        assert os.path.getsize(path) < 4 * frame + 2 * frame
    assert read(tmp_path) == records(1, 40)
    # a reopened writer continues in the last segment and rolls over again
    w = WalWriter(str(tmp_path), segment_bytes=4 * frame)
    assert w.size_bytes == sum(os.path.getsize(p) for _, p in segments)
    w.append(records(41, 60))
    w.close()
    assert read(tmp_path) == records(1, 60)
    assert len(list_segments(str(tmp_path))) > len(segments)


def test_a_record_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path):
    with WalWriter(str(tmp_path), segment_bytes=50) as w:
        w.append([(1, 1, b"a" * 100), (2, 1, b"b" * 100), (3, 1, b"c")])
    assert [first for first, _ in list_segments(str(tmp_path))] == [1, 2, 3]
    assert [r[2] for r in read(tmp_path)] == [b"a" * 100, b"b" * 100, b"c"]


# ---------------------------------------------------------------------- cutting


def test_truncate_after_drops_queued_records_only(tmp_path):
    w = WalWriter(str(tmp_path))
    w.append(records(1, 5))
    w.flush(sync=True)
    w.append(records(6, 9))
    w.truncate_after(7)
    assert w.last_trans_id == 7 and w.pending_count == 2
    w.append([(8, 2, b"new 8")])
    w.close()
    assert read(tmp_path) == records(1, 7) + [(8, 2, b"new 8")]


def test_truncate_after_within_a_segment(tmp_path):
    write(tmp_path, 1, 10)
    w = WalWriter(str(tmp_path))
    w.append(records(11, 12))  # queued records go too
    w.truncate_after(6)
    assert (w.last_trans_id, w.flushed_trans_id, w.synced_trans_id, w.pending_count) == (6, 6, 6, 0)
    assert read(tmp_path) == records(1, 6)
    w.append([(7, 3, b"leader 3")])
    w.close()
    assert read(tmp_path) == records(1, 6) + [(7, 3, b"leader 3")]


def test_truncate_after_across_segments(tmp_path):
    frame = len(encode_record(1, 1, payload(1)))
    write(tmp_path, 1, 30, segment_bytes=3 * frame)
    firsts = [first for first, _ in list_segments(str(tmp_path))]
    w = WalWriter(str(tmp_path), segment_bytes=3 * frame)
    boundary = firsts[2]  # cut exactly before a segment: that segment stays, empty
    w.truncate_after(boundary - 1)
    assert [f for f, _ in list_segments(str(tmp_path))] == firsts[:3]
    assert os.path.getsize(list_segments(str(tmp_path))[-1][1]) == 0
    assert read(tmp_path) == records(1, boundary - 1)
    w.truncate_after(2)  # inside the first segment: later ones are deleted
    assert [f for f, _ in list_segments(str(tmp_path))] == [1]
    assert read(tmp_path) == records(1, 2)
    w.append(records(3, 12, vote_id=4))
    w.close()
    assert read(tmp_path) == records(1, 2) + records(3, 12, vote_id=4)
    assert WalWriter(str(tmp_path)).last_trans_id == 12


def test_truncate_after_everything(tmp_path):
    write(tmp_path, 1, 5)
    w = WalWriter(str(tmp_path))
    w.truncate_after(0)
    assert w.last_trans_id == 0
    assert read(tmp_path) == []
    w.append(records(1, 2, vote_id=9))
    w.close()
    assert read(tmp_path) == records(1, 2, vote_id=9)


def test_remove_segments_before(tmp_path):
    frame = len(encode_record(1, 1, payload(1)))
    w = WalWriter(str(tmp_path), segment_bytes=3 * frame)
    w.append(records(1, 20))
    w.flush(sync=True)
    firsts = [first for first, _ in list_segments(str(tmp_path))]
    size = w.size_bytes
    assert w.remove_segments_before(firsts[1] - 2) == 0  # the first segment still holds a record above
    assert w.remove_segments_before(firsts[2] - 1) == 2
    assert [f for f, _ in list_segments(str(tmp_path))] == firsts[2:]
    assert w.size_bytes < size and w.first_trans_id == firsts[2]
    assert w.remove_segments_before(10**6) == len(firsts) - 3  # never the current segment
    assert len(list_segments(str(tmp_path))) == 1
    w.append(records(21, 22))
    w.close()
    last_first = list_segments(str(tmp_path))[0][0]
    assert read(tmp_path, after=last_first - 1) == records(last_first, 22)
    # records the caller asks for that are gone are never silently skipped
    with pytest.raises(CorruptLog, match="missing"):
        read(tmp_path, after=0)


def test_bytes_since(tmp_path):
    frame = len(encode_record(1, 1, payload(1)))
    w = WalWriter(str(tmp_path), segment_bytes=4 * frame)
    assert w.bytes_since(0) == 0
    w.append(records(1, 40))
    w.flush(sync=False)
    assert w.bytes_since(0) == w.size_bytes
    assert w.bytes_since(40) == 0
    assert 0 < w.bytes_since(30) < w.bytes_since(20) < w.size_bytes
    w.close()


def test_reset_starts_the_log_after_a_snapshot(tmp_path):
    write(tmp_path, 1, 10)
    w = WalWriter(str(tmp_path))
    w.reset(500)
    assert w.last_trans_id == 500
    w.close()
    w = WalWriter(str(tmp_path))  # the empty segment remembers where the log goes on
    assert w.last_trans_id == 500
    assert read(tmp_path, after=500) == []
    w.append(records(501, 503))
    w.close()
    assert read(tmp_path, after=500) == records(501, 503)
    with pytest.raises(CorruptLog):
        read(tmp_path, after=400)  # 401..500 are not in the log


# ---------------------------------------------------------------------- damage


def test_torn_tail_at_every_offset_of_the_last_record(tmp_path):
    source = tmp_path / "source"
    write(source, 1, 5)
    data = open(only_segment(source), "rb").read()
    last_start = len(data) - len(encode_record(5, 1, payload(5)))
    for cut in range(last_start, len(data)):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        path = d / segment_name(1)
        path.write_bytes(data[:cut])
        warnings = Warnings()
        assert read(d, warn=warnings) == records(1, 4), cut
        assert os.path.getsize(path) == last_start
        if cut == last_start:
            assert warnings == []
        else:
            assert len(warnings) == 1 and str(path) in warnings[0] and f"offset {last_start}" in warnings[0]
        w = WalWriter(str(d))
        assert w.last_trans_id == 4
        w.append([(5, 2, b"rewritten"), (6, 2, b"six")])
        w.close()
        warnings = Warnings()
        assert read(d, warn=warnings) == records(1, 4) + [(5, 2, b"rewritten"), (6, 2, b"six")]
        assert warnings == []


def test_torn_first_record_of_the_last_segment(tmp_path):
    frame = len(encode_record(1, 1, payload(1)))
    write(tmp_path, 1, 9, segment_bytes=3 * frame)
    first, path = list_segments(str(tmp_path))[-1]
    with open(path, "r+b") as f:
        f.truncate(HEADER_SIZE + 3)
    warnings = Warnings()
    assert read(tmp_path, warn=warnings) == records(1, first - 1)
    assert len(warnings) == 1 and os.path.getsize(path) == 0
    w = WalWriter(str(tmp_path), segment_bytes=3 * frame)
    assert w.last_trans_id == first - 1
    w.append(records(first, 12))
    w.close()
    assert read(tmp_path) == records(1, 12)


def test_torn_tail_followed_by_an_empty_segment(tmp_path):
    write(tmp_path, 1, 5)
    path = only_segment(tmp_path)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 1)
    (tmp_path / segment_name(6)).write_bytes(b"")  # created, never written
    warnings = Warnings()
    assert read(tmp_path, warn=warnings) == records(1, 4)
    assert len(warnings) == 1
    assert [f for f, _ in list_segments(str(tmp_path))] == [1]
    w = WalWriter(str(tmp_path))
    w.append(records(5, 7))
    w.close()
    assert read(tmp_path) == records(1, 7)


def flip(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def test_bad_checksum_in_the_last_record_is_cut_off(tmp_path):
    write(tmp_path, 1, 5)
    path = only_segment(tmp_path)
    size = os.path.getsize(path)
    last_start = size - len(encode_record(5, 1, payload(5)))
    flip(path, size - 2)
    warnings = Warnings()
    assert read(tmp_path, warn=warnings) == records(1, 4)
    assert "checksum" in warnings[0] and f"offset {last_start}" in warnings[0]
    assert os.path.getsize(path) == last_start


def test_zero_filled_tail_is_cut_off(tmp_path):
    write(tmp_path, 1, 5)
    path = only_segment(tmp_path)
    size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(b"\0" * 4096)
    warnings = Warnings()
    assert read(tmp_path, warn=warnings) == records(1, 5)
    assert len(warnings) == 1 and os.path.getsize(path) == size


def test_bad_checksum_in_the_middle_stops_with_file_and_offset(tmp_path):
    write(tmp_path, 1, 10)
    path = only_segment(tmp_path)
    before = open(path, "rb").read()
    offset = sum(len(encode_record(t, 1, payload(t))) for t in range(1, 5))  # record 5
    flip(path, offset + HEADER_SIZE + 3)
    seen = []
    with pytest.raises(CorruptLog) as e:
        for rec in read_wal(str(tmp_path)):
            seen.append(rec)
    assert (e.value.path, e.value.offset) == (path, offset)
    assert path in str(e.value) and f"offset {offset}" in str(e.value)
    assert seen == records(1, 4)
    assert os.path.getsize(path) == len(before)  # nothing cut
    with pytest.raises(CorruptLog):
        WalWriter(str(tmp_path)).close()  # a writer never writes after damage
    assert os.path.getsize(path) == len(before)


def test_bad_length_in_the_middle_is_not_mistaken_for_a_tail(tmp_path):
    write(tmp_path, 1, 10)
    path = only_segment(tmp_path)
    offset = sum(len(encode_record(t, 1, payload(t))) for t in range(1, 8))
    with open(path, "r+b") as f:
        f.seek(offset + 5)
        f.write((10**6).to_bytes(4, "little"))  # now "runs past the end of the file"
    with pytest.raises(CorruptLog) as e:
        read(tmp_path)
    assert e.value.offset == offset


def test_damage_at_the_end_of_a_non_last_segment_stops(tmp_path):
    frame = len(encode_record(1, 1, payload(1)))
    write(tmp_path, 1, 12, segment_bytes=4 * frame)
    path = list_segments(str(tmp_path))[0][1]
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 3)
    with pytest.raises(CorruptLog) as e:
        read(tmp_path)
    assert e.value.path == path


def test_gap_between_segments_stops(tmp_path):
    frame = len(encode_record(1, 1, payload(1)))
    write(tmp_path, 1, 12, segment_bytes=4 * frame)
    segments = list_segments(str(tmp_path))
    os.remove(segments[1][1])
    with pytest.raises(CorruptLog) as e:
        read(tmp_path)
    assert (e.value.path, e.value.offset) == (segments[2][1], 0)


def test_an_intact_record_out_of_sequence_stops(tmp_path):
    write(tmp_path, 1, 5)
    path = only_segment(tmp_path)
    with open(path, "ab") as f:
        f.write(encode_record(9, 1, b"stray"))
    with pytest.raises(CorruptLog, match="expected"):
        read(tmp_path)


def test_repair_cuts_at_the_damage_and_drops_later_segments(tmp_path):
    frame = len(encode_record(1, 1, payload(1)))
    write(tmp_path, 1, 20, segment_bytes=4 * frame)
    segments = list_segments(str(tmp_path))
    first, path = segments[1]
    kept = len(encode_record(first, 1, payload(first)))
    flip(path, kept + HEADER_SIZE + 1)  # the second record of the second segment
    warnings = Warnings()
    assert read(tmp_path, repair=True, warn=warnings) == records(1, first)
    assert len(warnings) == 1 and "REPAIR" in warnings[0] and path in warnings[0]
    assert [f for f, _ in list_segments(str(tmp_path))] == [1, first]
    assert os.path.getsize(path) == kept
    w = WalWriter(str(tmp_path), segment_bytes=4 * frame)
    assert w.last_trans_id == first
    w.append([(first + 1, 2, b"after repair")])
    w.close()
    warnings = Warnings()
    assert read(tmp_path, warn=warnings) == records(1, first) + [(first + 1, 2, b"after repair")]
    assert warnings == []


def test_writer_refuses_a_torn_tail_that_was_not_recovered(tmp_path):
    write(tmp_path, 1, 3)
    path = only_segment(tmp_path)
    with open(path, "ab") as f:
        f.write(b"\xd1partial")
    with pytest.raises(CorruptLog):
        WalWriter(str(tmp_path))


# ---------------------------------------------------------------------- faults


def test_disk_full_keeps_what_was_written_and_resumes(tmp_path):
    faults = Faults()
    w = WalWriter(str(tmp_path), opener=faults.opener, fsync=faults.fsync)
    w.append(records(1, 10))
    w.flush(sync=True)
    path = only_segment(tmp_path)

    # the disk fills in the middle of record 13: 11 and 12 get written, 13 only in part
    faults.write_error = errno.ENOSPC
    faults.partial = sum(len(encode_record(t, 1, payload(t))) for t in (11, 12)) + 7
    w.append(records(11, 20))
    with pytest.raises(StorageError, match="No space left"):
        w.flush(sync=True)
    assert (w.flushed_trans_id, w.synced_trans_id, w.pending_count) == (12, 10, 8)
    warnings = Warnings()
    assert read(tmp_path, warn=warnings) == records(1, 12)
    assert warnings == []  # the half record was cut off at once

    w.append(records(21, 25))  # appends go on queuing while the disk is full
    with pytest.raises(StorageError):
        w.flush(sync=False)
    assert read(tmp_path, warn=warnings) == records(1, 12) and warnings == []

    faults.write_error = None
    w.flush(sync=True)
    assert (w.flushed_trans_id, w.synced_trans_id, w.pending_count) == (25, 25, 0)
    w.append(records(26, 30))
    w.close()
    assert read(tmp_path, warn=warnings) == records(1, 30)
    assert warnings == []
    assert os.path.getsize(path) == sum(len(encode_record(t, 1, payload(t))) for t in range(1, 31))


def test_disk_full_when_the_half_record_cannot_be_cut_off_at_once(tmp_path):
    faults = Faults()
    w = WalWriter(str(tmp_path), opener=faults.opener, fsync=faults.fsync)
    w.append(records(1, 5))
    w.flush(sync=False)
    faults.write_error = faults.truncate_error = errno.EIO
    faults.partial = 9
    w.append(records(6, 8))
    with pytest.raises(StorageError):
        w.flush(sync=False)
    with pytest.raises(StorageError):  # still failing: nothing is written after the half record
        w.flush(sync=False)
    faults.write_error = faults.truncate_error = None
    w.flush(sync=True)
    w.close()
    warnings = Warnings()
    assert read(tmp_path, warn=warnings) == records(1, 8)
    assert warnings == []


def test_failed_fsync_writes_the_unsynced_records_again(tmp_path):
    faults = Faults()
    w = WalWriter(str(tmp_path), opener=faults.opener, fsync=faults.fsync)
    w.append(records(1, 5))
    w.flush(sync=True)
    w.append(records(6, 10))
    w.flush(sync=False)
    faults.fsync_errors = 1
    w.append(records(11, 12))
    with pytest.raises(StorageError, match="Input/output"):
        w.flush(sync=True)
    # 6..12 may be gone from the page cache: they count as unwritten until an fsync succeeds
    assert (w.flushed_trans_id, w.synced_trans_id, w.pending_count) == (5, 5, 7)
    w.flush(sync=True)
    assert (w.flushed_trans_id, w.synced_trans_id, w.pending_count) == (12, 12, 0)
    w.close()
    warnings = Warnings()
    assert read(tmp_path, warn=warnings) == records(1, 12)
    assert warnings == []


def test_the_bytes_written_since_an_fsync_are_bounded(tmp_path):
    # The writer keeps a copy of what it wrote since its last fsync (to write it again if the
    # fsync fails): past max_unsynced bytes it fsyncs, whatever the policy asked, so that copy
    # is bounded in bytes and not by the write rate times the sync interval.
    frame = len(encode_record(1, 1, payload(1)))
    faults = Faults()
    w = WalWriter(str(tmp_path), opener=faults.opener, fsync=faults.fsync, max_unsynced=3 * frame)
    fsyncs = faults.fsyncs  # the open's
    w.append(records(1, 2))
    w.flush(sync=False)
    assert (w.flushed_trans_id, w.synced_trans_id, faults.fsyncs - fsyncs) == (2, 0, 0)
    w.append(records(3, 4))
    w.flush(sync=False)
    assert (w.flushed_trans_id, w.synced_trans_id, faults.fsyncs - fsyncs) == (4, 4, 1)
    # what was written after that fsync is all that is written again when the next one fails
    w.append(records(5, 5))
    w.flush(sync=False)
    faults.fsync_errors = 1
    w.append(records(6, 7))
    with pytest.raises(StorageError, match="Input/output"):
        w.flush(sync=False)
    assert (w.flushed_trans_id, w.synced_trans_id, w.pending_count) == (4, 4, 3)
    w.flush(sync=True)
    w.close()
    assert read(tmp_path) == records(1, 7)
    with pytest.raises(ValueError):
        WalWriter(str(tmp_path), max_unsynced=0)


def test_failure_to_create_the_next_segment(tmp_path):
    frame = len(encode_record(1, 1, payload(1)))
    faults = Faults()
    w = WalWriter(str(tmp_path), segment_bytes=2 * frame, opener=faults.opener, fsync=faults.fsync)
    w.append(records(1, 2))
    w.flush(sync=False)
    faults.open_error = errno.ENOSPC
    w.append(records(3, 4))
    with pytest.raises(StorageError):
        w.flush(sync=False)
    assert w.synced_trans_id == 2  # the full segment was synced before the next was tried
    faults.open_error = None
    w.close()
    assert read(tmp_path) == records(1, 4)
    assert [f for f, _ in list_segments(str(tmp_path))] == [1, 3]


def test_fsync_failure_of_the_full_segment_keeps_writing_it(tmp_path):
    frame = len(encode_record(1, 1, payload(1)))
    faults = Faults()
    w = WalWriter(str(tmp_path), segment_bytes=2 * frame, opener=faults.opener, fsync=faults.fsync)
    w.append(records(1, 2))
    w.flush(sync=False)
    faults.fsync_errors = 1
    w.append(records(3, 3))
    with pytest.raises(StorageError):
        w.flush(sync=False)
    assert [f for f, _ in list_segments(str(tmp_path))] == [1]
    w.close()
    assert read(tmp_path) == records(1, 3)
    assert [f for f, _ in list_segments(str(tmp_path))] == [1, 3]


# ---------------------------------------------------------------------- fsync policy


def test_sync_policy_always():
    p = SyncPolicy("always")
    assert not p.due(0.0) and p.deadline() is None
    assert p.after_append(0.0)
    assert p.due(0.0) and p.deadline() == 0.0  # until a sync succeeds
    p.synced(0.0)
    assert not p.due(0.0)


def test_sync_policy_everysec():
    p = SyncPolicy("everysec")
    assert p.after_append(100.0)  # nothing synced yet
    p.synced(100.0)
    assert not p.after_append(100.5)
    assert not p.due(100.99)
    assert p.deadline() == 101.0
    assert p.due(101.0)  # a timer catches the last writes of a burst
    p.synced(101.0)
    assert not p.due(105.0) and p.deadline() is None  # nothing appended since
    assert p.after_append(105.0)


def test_sync_policy_no_and_bad_mode():
    p = SyncPolicy("no")
    assert not p.after_append(0.0) and not p.due(1e9) and p.deadline() is None
    with pytest.raises(ValueError):
        SyncPolicy("sometimes")


def test_an_exit_raised_during_a_write_never_writes_a_record_twice(tmp_path):
    """A signal handler's SystemExit can land after the OS took a write but before the writer
    learned how much it took: closing the log must not write those records again."""
    disk = Faults()
    w = WalWriter(str(tmp_path), opener=disk.opener, fsync=disk.fsync)
    w.append(records(1, 3))
    w.flush(sync=True)
    w.append(records(4, 6))
    disk.raise_after_write = SystemExit(0)
    with pytest.raises(SystemExit):
        w.flush(sync=False)
    w.close()  # what the process does on its way out
    assert [r[0] for r in read(tmp_path)] == [1, 2, 3, 4, 5, 6]
    w = WalWriter(str(tmp_path))  # and a restart writes on after them
    w.append(records(7, 7))
    w.close()
    assert [r[0] for r in read(tmp_path)] == list(range(1, 8))


# ---------------------------------------------------------------------- read_range


@pytest.fixture
def every4(monkeypatch):
    """A sparse index of every 4th record, so that small logs have several index points."""
    monkeypatch.setattr(wal, "INDEX_EVERY", 4)


def test_read_range_across_segments_with_the_frame_before(tmp_path, every4):
    frame = len(encode_record(1, 1, payload(1)))
    w = WalWriter(str(tmp_path), segment_bytes=10 * frame)
    w.append(records(1, 25))
    w.append(records(26, 60, vote_id=2))
    w.flush(sync=False)
    assert len(list_segments(str(tmp_path))) > 4
    assert w.read_range(0, 1 << 20, 1000) == records(1, 25) + records(26, 60, vote_id=2)
    assert w.read_range(17, 1 << 20, 20) == records(17, 25) + records(26, 37, vote_id=2)
    assert w.read_range(60, 1 << 20, 10) == [(60, 2, payload(60))]
    # about max_bytes (at least one record after `after`), the frame of `after` not counted
    assert [t for t, _, _ in w.read_range(30, 1, 100)] == [30, 31]
    assert [t for t, _, _ in w.read_range(30, 3 * len(payload(31)) - 1, 100)] == [30, 31, 32, 33]
    # what is only queued is not read
    w.append(records(61, 62, vote_id=2))
    assert w.read_range(58, 1 << 20, 100)[-1][0] == 60
    w.close()


def test_read_range_seeks_by_the_index(tmp_path, every4):
    """A read starts at the index point before it: a damaged record earlier in the segment is
    never read (and one inside the range is reported)."""
    frame = len(encode_record(1, 1, payload(1)))
    w = WalWriter(str(tmp_path), segment_bytes=100 * frame)
    w.append(records(1, 30))
    w.flush(sync=True)
    path = only_segment(tmp_path)
    index = w._index[1]
    with open(path, "rb") as f:
        data = f.read()
    assert index == [data.index(encode_record(t, 1, payload(t))) for t in (1, 5, 9, 13, 17, 21, 25, 29)]
    with open(path, "r+b") as f:  # rot the payload of record 3
        f.seek(index[0] + 2 * frame + HEADER_SIZE)
        f.write(b"#")
    assert w.read_range(13, 1 << 20, 5) == records(13, 18)
    with pytest.raises(CorruptLog):
        w.read_range(2, 1 << 20, 5)
    w.close()


def test_read_range_after_reopening_removal_and_truncation(tmp_path, every4):
    frame = len(encode_record(1, 1, payload(1)))
    write(tmp_path, 1, 50, segment_bytes=10 * frame)
    w = WalWriter(str(tmp_path), segment_bytes=10 * frame)
    assert list(w._index) == [list_segments(str(tmp_path))[-1][0]]  # the last one, built at opening
    assert w.read_range(3, 1 << 20, 45) == records(3, 48)  # older ones are indexed when read
    sizes = [len(encode_record(t, 1, payload(t))) for t in range(1, 10)]
    assert w._index[1][:3] == [0, sum(sizes[:4]), sum(sizes[:8])]
    w.remove_segments_before(25)
    first = w.first_trans_id
    assert 1 < first <= 26 and 1 not in w._index
    assert w.read_range(first - 1, 1 << 20, 3) == records(first, first + 2)
    assert w.read_range(0, 1 << 20, first + 1) == records(first, first + 1)  # before the log: what it has
    w.truncate_after(44)
    w.append(records(45, 47, vote_id=3))
    w.flush(sync=True)
    assert w.read_range(40, 1 << 20, 100) == records(40, 44) + records(45, 47, vote_id=3)
    w.reset(100)
    assert w.read_range(99, 1 << 20, 100) == []
    w.append(records(101, 110))
    w.flush(sync=True)
    assert w.read_range(100, 1 << 20, 100) == records(101, 110)
    w.close()


def test_read_range_reads_records_larger_than_its_reads(tmp_path, every4, monkeypatch):
    monkeypatch.setattr(wal, "_READ_BLOCK", 7)  # every record takes several reads
    frame = len(encode_record(1, 1, payload(1)))
    with WalWriter(str(tmp_path), segment_bytes=10 * frame) as w:
        w.append(records(1, 30))
        w.flush(sync=False)
        assert w.read_range(5, 1 << 20, 100) == records(5, 30)
