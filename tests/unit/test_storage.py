"""Storage (replication/storage.py) without processes: recovery of a torn or damaged log, the
fsync policy with a fake clock and a fake file, a full disk, recovery from snapshots, and the
publishing of the parts the workers wrote."""

import errno
import logging
import os

import pytest

from queue_server.replication.log import ChangeLog, Entry
from queue_server.replication.snapshot import read_manifest, snapshot_name, snapshot_trans_ids, write_part, write_snapshot
from queue_server.replication.storage import Storage, StorageError
from queue_server.replication.wal import CorruptLog, encode_record, list_segments, scan
from queue_server.protocol.records import Produce, encode
from queue_server.workers.service import PartitionService
from tests.unit.faulty_disk import Faults


def record(n: int) -> Produce:
    return Produce(queue="q", msg_id=n, ready=1.0, ttl=2.0, retry=0.0, priority=0,
                   data="x" * (n % 5), delivery_count=0)


class Messages(logging.Handler):
    """A logger's records as (level name, message)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []
        self.log = logging.getLogger(f"test_storage.{id(self)}")
        self.log.propagate = False
        self.log.setLevel(logging.DEBUG)
        self.log.addHandler(self)

    def emit(self, r: logging.LogRecord) -> None:
        self.seen.append((r.levelname, r.getMessage()))


def open_storage(path, fsync: str = "everysec", disk: Faults | None = None, **kw) -> Storage:
    disk = disk or Faults()
    return Storage(str(path), fsync, wal_opener=disk.opener, wal_fsync=disk.fsync, **kw)


def write_log(path, last: int, fsync: str = "always") -> None:
    """A data dir whose log holds records 1..last (vote_id 1)."""
    s = open_storage(path, fsync)
    s.recover()
    log = ChangeLog(1000)
    log.append(1, [record(n) for n in range(1, last + 1)])
    s.write(log, None, 0.0)
    s.close()


def entries(first: int, last: int, vote_id: int = 1) -> list[Entry]:
    return [Entry(n, vote_id, record(n)) for n in range(first, last + 1)]


def last_segment(path) -> str:
    return list_segments(os.path.join(str(path), "wal"))[-1][1]


# ---------------------------------------------------------------------- recovery


def test_a_new_data_dir_recovers_nothing(tmp_path):
    s = open_storage(tmp_path)
    found = s.recover()
    assert (found.trans_id, found.vote_id, found.state, found.entries, found.vote) == (0, 0, {}, [], (0, None))
    assert (found.manifest, found.frames) == (None, None)
    s.close()


def test_written_records_and_the_vote_come_back(tmp_path):
    write_log(tmp_path, 6)
    s = open_storage(tmp_path)
    s.recover()
    s.save_vote(4, 2)
    s.close()
    s = open_storage(tmp_path)
    found = s.recover()
    assert found.entries == entries(1, 6) and found.vote == (4, 2)
    s.close()


def test_a_torn_tail_is_cut_on_recovery_and_writing_goes_on_after_it(tmp_path):
    write_log(tmp_path, 5)
    segment = last_segment(tmp_path)
    os.truncate(segment, os.path.getsize(segment) - 3)  # record 5 written only in part

    messages = Messages()
    s = open_storage(tmp_path, log=messages.log)
    found = s.recover()
    assert found.entries == entries(1, 4)
    assert [level for level, _ in messages.seen] == ["WARNING"]
    assert "cutting off" in messages.seen[0][1] and "ends at trans_id 4" in messages.seen[0][1]

    log = ChangeLog(1000, 4, 1)
    log.append(2, [record(5), record(6)])
    assert s.write(log, None, 0.0) == 6
    s.close()
    s = open_storage(tmp_path)
    assert s.recover().entries == entries(1, 4) + entries(5, 6, vote_id=2)
    s.close()


def damage_record(path, trans_id: int) -> int:
    """Flip the last byte of record trans_id's payload; returns the record's offset."""
    segment = last_segment(path)
    data = bytearray(open(segment, "rb").read())
    _, _, offset, end = list(scan(bytes(data), 1))[trans_id - 1]
    data[end - 1] ^= 0xFF
    with open(segment, "wb") as f:
        f.write(data)
    return offset


def test_damage_in_the_middle_stops_the_start_naming_file_and_offset(tmp_path):
    write_log(tmp_path, 5)
    offset = damage_record(tmp_path, 2)
    s = open_storage(tmp_path)
    with pytest.raises(CorruptLog) as e:
        s.recover()
    s.close()
    assert (e.value.path, e.value.offset, e.value.reason) == (last_segment(tmp_path), offset, "a checksum mismatch")
    s = open_storage(tmp_path)  # the refusal changed nothing on disk
    with pytest.raises(CorruptLog):
        s.recover()
    s.close()


def test_repair_cuts_the_log_at_the_damage(tmp_path):
    write_log(tmp_path, 5)
    damage_record(tmp_path, 2)
    messages = Messages()
    s = open_storage(tmp_path, repair=True, log=messages.log)
    assert s.recover().entries == entries(1, 1)
    assert len(messages.seen) == 1 and messages.seen[0][1].startswith("REPAIR: ")
    s.close()
    s = open_storage(tmp_path)  # repaired for good: a start without --repair works
    assert s.recover().entries == entries(1, 1)
    s.close()


def log_with_a_foreign_record(path, last: int, foreign: int) -> None:
    """A log of records 1..last whose record `foreign` has a valid checksum but is no record
    this version reads (a newer version's kind, or a bug's)."""
    write_log(path, 1)
    with open(last_segment(path), "wb") as f:
        for n in range(1, last + 1):
            payload = b'{"op":"from_the_future","queue":"q"}' if n == foreign else encode(record(n))
            f.write(encode_record(n, 1, payload))


@pytest.mark.parametrize("foreign", [3, 5])
def test_a_checksummed_record_that_does_not_decode_stops_the_start_naming_it(tmp_path, foreign):
    log_with_a_foreign_record(tmp_path, 5, foreign)
    s = open_storage(tmp_path)
    with pytest.raises(CorruptLog) as e:
        s.recover()
    s.close()
    assert e.value.path == last_segment(tmp_path)
    assert f"trans_id {foreign} is not a record this version reads" in e.value.reason
    assert "\n" not in str(e.value)


def test_repair_cuts_the_log_before_a_record_that_does_not_decode(tmp_path):
    log_with_a_foreign_record(tmp_path, 5, 3)
    messages = Messages()
    s = open_storage(tmp_path, repair=True, log=messages.log)
    assert s.recover().entries == entries(1, 2)
    assert len(messages.seen) == 1 and messages.seen[0][1].startswith("REPAIR: ")
    s.close()


# ---------------------------------------------------------------------- fsync policy


def started(path, fsync: str) -> tuple[Storage, Faults, ChangeLog]:
    disk = Faults()
    s = open_storage(path, fsync, disk)
    s.recover()
    return s, disk, ChangeLog(1000)


def test_fsync_always_syncs_every_write_and_reports_synced_records(tmp_path):
    s, disk, log = started(tmp_path, "always")
    assert s.sync_deadline() is None
    for n in range(1, 4):
        log.append(1, [record(n)])
        assert s.write(log, None, 100.0) == n
        assert disk.fsyncs == n and s.wal.synced_trans_id == n
    assert s.write(log, None, 100.0) == 3 and disk.fsyncs == 3  # nothing new: no fsync
    s.close()


def test_fsync_everysec_syncs_at_most_once_a_second_and_on_the_deadline(tmp_path):
    s, disk, log = started(tmp_path, "everysec")
    log.append(1, [record(1)])
    assert s.write(log, None, 100.0) == 1 and disk.fsyncs == 1  # nothing was synced before
    log.append(1, [record(2)])
    assert s.write(log, None, 100.4) == 2  # handed to the OS, not fsync'd yet
    assert disk.fsyncs == 1 and s.wal.synced_trans_id == 1
    assert s.sync_deadline() == 101.0
    assert s.write(log, None, 100.9) == 2 and disk.fsyncs == 1
    assert s.write(log, None, 101.0) == 2 and disk.fsyncs == 2  # the timer's turn, no new records
    assert s.wal.synced_trans_id == 2 and s.sync_deadline() is None
    log.append(1, [record(3)])
    assert s.write(log, None, 105.0) == 3 and disk.fsyncs == 3  # a second has passed since
    s.close()


def test_fsync_no_leaves_it_to_the_os(tmp_path):
    s, disk, log = started(tmp_path, "no")
    for n in range(1, 4):
        log.append(1, [record(n)])
        assert s.write(log, None, float(n)) == n
    assert disk.fsyncs == 0 and s.sync_deadline() is None
    assert s.wal.flushed_trans_id == 3 and s.wal.synced_trans_id == 0
    s.close()


# ---------------------------------------------------------------------- full disk


def test_a_full_disk_fails_writes_until_space_returns(tmp_path):
    disk = Faults()
    messages = Messages()
    s = open_storage(tmp_path, "always", disk, log=messages.log)
    s.recover()
    log = ChangeLog(1000)
    log.append(1, [record(1), record(2)])
    assert s.write(log, None, 0.0) == 2

    disk.write_error = errno.ENOSPC
    log.append(1, [record(3)])
    with pytest.raises(StorageError, match="No space left"):
        s.write(log, None, 1.0)
    log.append(1, [record(4)])
    with pytest.raises(StorageError):
        s.write(log, None, 2.0)
    assert s.failed and s.wal.synced_trans_id == 2
    assert [level for level, _ in messages.seen] == ["ERROR"]  # said once, not per write
    assert messages.seen[0][1].startswith("storage unavailable: ")

    disk.write_error = None
    assert s.write(log, None, 3.0) == 4
    assert not s.failed and messages.seen[-1] == ("WARNING", "storage available again")
    s.close()
    s = open_storage(tmp_path)
    assert s.recover().entries == entries(1, 4)
    s.close()


# ---------------------------------------------------------------------- cutting the log


def test_a_discarded_tail_is_cut_from_the_disk(tmp_path):
    s, _, log = started(tmp_path, "always")
    log.append(1, [record(n) for n in range(1, 6)])
    s.write(log, None, 0.0)
    log.truncate_after(3)
    log.append(2, [record(40)])
    assert s.write(log, 3, 1.0) == 4
    s.close()
    s = open_storage(tmp_path)
    assert s.recover().entries == entries(1, 3) + [Entry(4, 2, record(40))]
    s.close()


def test_a_log_reset_to_an_installed_snapshot_starts_after_it(tmp_path):
    s, _, log = started(tmp_path, "always")
    log.append(1, [record(1), record(2)])
    s.write(log, None, 0.0)
    write_snapshot(s.datadir.snapshot_dir, 10, 3, [])  # what the leader sent
    log.reset(10, 3)
    log.append(3, [record(11)])
    assert s.write(log, 2, 1.0) == 11
    s.close()
    s = open_storage(tmp_path)
    found = s.recover()
    assert (found.trans_id, found.vote_id, found.entries) == (10, 3, [Entry(11, 3, record(11))])
    s.close()


# ---------------------------------------------------------------------- snapshots


def queues(n: int) -> PartitionService:
    """The committed state of a node: a queue of n messages."""
    state = PartitionService(1, 100)
    for i in range(1, n + 1):
        state.apply(record(i))
    return state


def loaded(found) -> dict:
    state = PartitionService(1, 100)
    state.load_frames(found.frames)
    return state.snapshot()


def test_recovery_starts_from_the_newest_valid_snapshot(tmp_path):
    write_log(tmp_path, 8)
    snapshots = os.path.join(str(tmp_path), "snapshots")
    write_snapshot(snapshots, 3, 1, queues(3).snapshot_frames())
    newest = write_snapshot(snapshots, 6, 1, queues(6).snapshot_frames())

    s = open_storage(tmp_path)
    found = s.recover()
    assert (found.trans_id, found.vote_id, found.state, found.entries) == (6, 1, {}, entries(7, 8))
    assert found.manifest == read_manifest(newest).as_dict()
    assert found.manifest["parts"][0]["messages"] == 6
    assert loaded(found) == queues(6).snapshot()
    s.close()

    part = read_manifest(newest).parts[0]
    data = bytearray(open(part, "rb").read())
    data[-3] ^= 0x01  # in END
    open(part, "wb").write(data)

    messages = Messages()
    s = open_storage(tmp_path, log=messages.log)
    found = s.recover()
    assert (found.trans_id, found.entries) == (3, entries(4, 8))
    assert loaded(found) == queues(3).snapshot()
    [(level, line)] = messages.seen
    assert level == "WARNING" and line.startswith(f"skipping snapshot {newest}: {part}: checksum mismatch in the frame")
    s.close()


def test_recovery_reads_a_v1_snapshot(tmp_path):
    from tests.unit.test_snapshot import write_v1

    write_log(tmp_path, 8)
    snapshots = os.path.join(str(tmp_path), "snapshots")
    os.makedirs(snapshots, exist_ok=True)
    write_v1(snapshots, 5, 1, queues(5).snapshot())
    s = open_storage(tmp_path)
    found = s.recover()
    assert (found.trans_id, found.state, found.manifest, found.frames, found.entries) == (
        5, queues(5).snapshot(), None, None, entries(6, 8))
    s.close()


def test_recovery_deletes_what_a_snapshot_cut_short_left(tmp_path):
    write_log(tmp_path, 4)
    snapshots = os.path.join(str(tmp_path), "snapshots")
    write_snapshot(snapshots, 2, 1, queues(2).snapshot_frames())
    kept = sorted(os.listdir(snapshots))
    for name in ("tmp-00000000000000000004-1", "parts-00000000000000000004-1"):
        os.makedirs(os.path.join(snapshots, name))
        open(os.path.join(snapshots, name, "part-0.qsp"), "wb").write(b"QSPART\0\2")
    open(os.path.join(snapshots, snapshot_name(4) + ".tmp"), "wb").write(b"{")
    s = open_storage(tmp_path)
    assert s.recover().trans_id == 2
    assert sorted(os.listdir(snapshots)) == kept
    s.close()


def test_the_log_behind_the_older_snapshot_stays_so_a_damaged_newest_one_falls_back_to_it(tmp_path):
    """Snapshots published as the coordinator does: after two snapshots, log segments are removed
    only up to the older one, so when the newest proves damaged at start the older one and the
    whole log after it are still there."""
    messages = Messages()
    s = open_storage(tmp_path, "always", segment_bytes=200, log=messages.log)
    s.recover()
    log = ChangeLog(1000)
    state = queues(0)

    def commit(first: int, last: int) -> None:
        records = [record(n) for n in range(first, last + 1)]
        log.append(1, records)
        s.write(log, None, 0.0)
        for r in records:
            state.apply(r)

    def snapshot_at(trans_id: int) -> dict:
        # As the workers' writers leave it: parts in a tmp dir, T not stamped yet.
        tmp = os.path.join(s.snapshot_dir, f"tmp-cut-{trans_id}")
        os.makedirs(tmp)
        frames = list(state.snapshot_frames())
        parts = [write_part(os.path.join(tmp, f"part-{i}.qsp"), frames[i::2]) for i in range(2)]
        s.finish_snapshot(trans_id, 1, tmp, parts)
        return state.snapshot()

    commit(1, 10)
    at_10 = snapshot_at(10)
    commit(11, 20)
    snapshot_at(20)
    commit(21, 25)
    s.close()
    wal = os.path.join(str(tmp_path), "wal")
    assert 1 < list_segments(wal)[0][0] <= 11  # segments went, but none after the older snapshot
    assert [m for m in messages.seen if m[0] != "INFO"] == []

    os.remove(read_manifest(os.path.join(str(tmp_path), "snapshots", snapshot_name(20))).parts[0])
    messages = Messages()
    s = open_storage(tmp_path, "always", segment_bytes=200, log=messages.log)
    found = s.recover()
    assert (found.trans_id, found.entries) == (10, entries(11, 25))
    assert loaded(found) == at_10
    assert len(messages.seen) == 1 and messages.seen[0][0] == "WARNING"

    # The node goes on from there. Its next snapshot does not push the one it came back from out
    # for the damaged one: should the new one prove damaged too, the one at 10 still serves.
    commit(26, 30)
    snapshot_at(30)
    assert snapshot_trans_ids(os.path.join(str(tmp_path), "snapshots")) == [10, 20, 30]
    commit(31, 35)
    s.close()
    os.remove(read_manifest(os.path.join(str(tmp_path), "snapshots", snapshot_name(30))).parts[0])
    messages = Messages()
    s = open_storage(tmp_path, log=messages.log)
    found = s.recover()
    assert (found.trans_id, found.entries) == (10, entries(11, 35))
    assert len(messages.seen) == 2
    s.close()


def test_a_published_snapshot_names_every_part_with_its_counts_and_a_failed_one_leaves_nothing(tmp_path):
    s = open_storage(tmp_path)
    s.recover()
    state = queues(6)
    tmp = os.path.join(s.snapshot_dir, "tmp-cut-1")
    os.makedirs(tmp)
    frames = list(state.snapshot_frames())
    parts = [write_part(os.path.join(tmp, f"part-{i}.qsp"), frames[i::2]) for i in range(2)]
    following = os.path.join(s.snapshot_dir, "tmp-cut-next")  # the next cut, started already
    os.makedirs(following)
    s.finish_snapshot(6, 1, tmp, parts)
    assert os.path.isdir(following)  # its workers may be writing into it: only a start deletes it
    os.rmdir(following)
    snapshot = read_manifest(os.path.join(s.snapshot_dir, snapshot_name(6)))  # every part checked
    assert [e["messages"] for e in snapshot.entries] == [p["messages"] for p in parts]
    assert (s.valid_at, os.path.exists(tmp)) == (6, False)
    tmp = os.path.join(s.snapshot_dir, "tmp-cut-2")
    os.makedirs(tmp)
    with pytest.raises(StorageError):
        s.finish_snapshot(7, 1, tmp, [{"file": "part-0.qsp"}])  # the worker's part is not there
    assert (s.valid_at, sorted(os.listdir(s.snapshot_dir))) == (6, sorted(os.listdir(s.snapshot_dir)))
    assert not os.path.exists(tmp) and snapshot_trans_ids(s.snapshot_dir) == [6]
    s.close()


def test_the_log_on_disk_is_the_same_whether_entries_carry_their_bytes(tmp_path):
    """The coordinator writes the bytes a record came in (Entry.data) instead of encoding it
    again: the files are byte for byte those written from the records (so logs written before,
    and after, read the same), and recovery keeps each record's bytes."""
    records = [record(n) for n in range(1, 4)]
    for name, encoded in (("plain", None), ("carried", [encode(r) for r in records])):
        s = open_storage(tmp_path / name)
        s.recover()
        log = ChangeLog(1000)
        log.append(1, records, encoded)
        s.write(log, None, 0.0)
        s.close()
    with open(last_segment(tmp_path / "plain"), "rb") as f, open(last_segment(tmp_path / "carried"), "rb") as g:
        assert f.read() == g.read()
    s = open_storage(tmp_path / "carried")
    found = s.recover()
    assert found.entries == entries(1, 3) and [e.data for e in found.entries] == [encode(r) for r in records]
    s.close()


def test_an_entry_s_bytes_are_written_as_they_are(tmp_path):
    """What goes to disk is Entry.data, not the record encoded again."""
    s = open_storage(tmp_path)
    s.recover()
    log = ChangeLog(1000)
    log.append(1, [record(1)], [encode(record(2))])
    s.write(log, None, 0.0)
    s.close()
    s = open_storage(tmp_path)
    assert s.recover().entries[0].record == record(2)
    s.close()


# ---------------------------------------------------------------------- reading the log back


def test_read_log_gives_what_the_window_gave_with_the_frame_before_across_segments(tmp_path):
    """A follower the log in memory left behind is fed from the WAL: read_log gives the
    (trans_id, vote_id, JSON) tuples ChangeLog.encoded_after gave, led by the record `after`
    itself for its vote_id; wal_from follows the segments that are removed."""
    s = open_storage(tmp_path, "always", segment_bytes=300)
    s.recover()
    assert s.wal_from == 0
    log = ChangeLog(10, stable_trans_id=0)
    everything = []
    for vote_id, first in ((1, 1), (2, 31)):
        log.append(vote_id, [record(n) for n in range(first, first + 30)])
        everything += log.encoded_after(first - 1, 30)
        s.write(log, None, 0.0)
        log.mark_stable(log.last_trans_id)
        log.commit_to(log.last_trans_id)
    assert log.base_trans_id > 40 and len(list_segments(os.path.join(str(tmp_path), "wal"))) > 3
    assert s.read_log(0, 1 << 20) == everything
    assert s.read_log(25, 1 << 20, 10) == everything[24:35]  # 25's own frame, then 26..35
    assert [t for t, _, _ in s.read_log(25, 1)] == [25, 26]  # at least one past `after`
    removed = s.wal.remove_segments_before(30)
    assert removed and s.wal_from == s.wal.first_trans_id > 1
    after = s.wal_from
    assert s.read_log(after, 1 << 20, 5) == everything[after - 1:after + 5]
    with open(last_segment(tmp_path), "r+b") as f:  # rot the last byte of record 60
        f.seek(-1, os.SEEK_END)
        f.write(b"#")
    with pytest.raises(StorageError):
        s.read_log(55, 1 << 20)
    s.close()
