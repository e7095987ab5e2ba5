"""The coordinator's file I/O of streamed snapshots (server/transfers.py): a leader reads chunks
of files it holds open, a follower stages chunks, checks the parts and installs them as its own
newest snapshot."""
import logging
import os

import pytest

from queue_server.replication.messages import ApplySnapshot, FileRange, SnapshotChunk, SnapshotStaged, WriteChunk
from queue_server.replication.snapshot import iter_frames, read_manifest, snapshot_trans_ids, write_part
from queue_server.replication.storage import Storage
from queue_server.replication.transfer import MANIFEST, SnapshotSource
from queue_server.server.snapshots import Failed, Publish
from queue_server.server.transfers import RECV_PREFIX, ChunkReader, Staging, Transfers, convert_v1
from queue_server.workers.service import PartitionService
from queue_server.protocol.origin import Origin

T = 9


def _part(path: str, queues: int = 2) -> tuple[dict, bytes]:
    s = PartitionService(1, 100)
    for i in range(queues):
        s.handle({"action": 1, "queue": f"q{i}", "data": "x" * i}, Origin(7), i, 1.0)
    entry = write_part(path, s.snapshot_frames(), T)
    with open(path, "rb") as f:
        return entry, f.read()


def _stage(staging: Staging, parts: list[bytes], chunk: int = 100) -> None:
    staging.write(WriteChunk(T, MANIFEST, 0, b"{}"))
    for i, data in enumerate(parts):
        for offset in range(0, len(data), chunk):
            staging.write(WriteChunk(T, i, offset, data[offset:offset + chunk]))


def test_a_chunk_is_read_from_a_file_held_open_even_once_deleted(tmp_path):
    path = str(tmp_path / "p")
    with open(path, "wb") as f:
        f.write(b"0123456789")
    reader = ChunkReader()
    reader.hold(SnapshotSource(T, 1, ((path, 10),)))
    os.remove(path)  # pruned meanwhile
    chunk = reader.filled(SnapshotChunk(3, 1, T, 1, 0, 4, 10, FileRange(path, 4, 3)))
    assert chunk.data == b"456"
    with pytest.raises(OSError):
        reader.filled(SnapshotChunk(3, 1, T, 1, 0, 8, 10, FileRange(path, 8, 3)))  # past its end
    reader.close()


def test_the_files_of_a_snapshot_still_streamed_stay_open_after_newer_ones_are_held(tmp_path):
    sources = []
    for t in (T, T + 1, T + 2):
        path = str(tmp_path / f"p{t}")
        with open(path, "wb") as f:
            f.write(b"0123456789")
        sources.append(SnapshotSource(t, 1, ((path, 10),)))
    reader = ChunkReader()
    reader.hold(sources[0])
    reader.hold(sources[1], [sources[0]])
    reader.hold(sources[2], [sources[0]])  # two newer ones held, but a follower still gets the first
    os.remove(sources[0].files[0][0])  # pruned meanwhile
    chunk = reader.filled(SnapshotChunk(3, 1, T, 1, 0, 0, 10, FileRange(sources[0].files[0][0], 0, 10)))
    assert chunk.data == b"0123456789"
    reader.hold(sources[2], [])  # its transfer ended: closed
    with pytest.raises(OSError):
        reader.filled(SnapshotChunk(3, 1, T, 1, 0, 0, 10, FileRange(sources[0].files[0][0], 0, 10)))
    reader.close()


def test_a_chunk_that_cannot_be_read_tells_the_node_to_give_its_snapshot_up(tmp_path):
    node = _Node()
    transfers = Transfers(node, None, str(tmp_path), logging.getLogger("t"))
    gone = str(tmp_path / "gone.qsp")
    assert transfers.filled(SnapshotChunk(3, 1, T, 1, 0, 0, 10, FileRange(gone, 0, 10)), 2.0) is None
    assert node.unreadable == [T]
    transfers.close()


def test_staged_parts_are_checked_and_a_new_snapshot_starts_the_staging_again(tmp_path):
    entry, data = _part(str(tmp_path / "src.qsp"))
    staging = Staging(str(tmp_path / "snaps"))
    _stage(staging, [data])
    staged = SnapshotStaged(T, 1, {"trans_id": T, "parts": [entry]})
    assert staging.check(staged) == [dict(entry, file="part-0.qsp")]
    first = staging.path
    staging.write(WriteChunk(T + 1, MANIFEST, 0, b"{}"))  # another snapshot: what was staged goes
    assert not os.path.exists(first) and os.listdir(tmp_path / "snaps") == [f"{RECV_PREFIX}{T + 1:020d}"]
    _stage(staging, [data[:50] + bytes([data[50] ^ 1]) + data[51:]])  # one bit flipped
    with pytest.raises(ValueError, match="checksum"):
        staging.check(staged)


class _Node:
    """What Transfers asks of ClusterNode."""

    def __init__(self, needs: bool = True) -> None:
        self.needs = needs
        self.installed: list = []
        self.sources: list = []
        self.unreadable: list = []
        self.streamed: list = []  # the sources its leader streams

    def needs_snapshot(self, trans_id: int) -> bool:
        return self.needs

    def on_snapshot_installed(self, staged, parts, now) -> bool:
        self.installed.append((staged.trans_id, parts))
        return True

    def on_whole_snapshot(self, trans_id, parts) -> None:
        self.whole = (trans_id, parts)

    def on_snapshot_source(self, source, now) -> None:
        self.sources.append(source)

    def on_snapshot_unreadable(self, trans_id, now) -> None:
        self.unreadable.append(trans_id)

    def streaming(self) -> list:
        return self.streamed


def test_a_received_snapshot_becomes_the_node_s_own_newest_one(tmp_path):
    entries, datas = zip(*(_part(str(tmp_path / f"src{i}.qsp"), queues=i + 1) for i in range(2)))
    storage = Storage(str(tmp_path / "data"))
    storage.recover()
    node = _Node()
    transfers = Transfers(node, storage, storage.snapshot_dir, logging.getLogger("t"))
    _stage(transfers.staging, list(datas))
    transfers.install(SnapshotStaged(T, 1, {"trans_id": T, "parts": list(entries)}), 1.0)
    assert snapshot_trans_ids(storage.snapshot_dir) == [T] and storage.valid_at == T
    snapshot = read_manifest(os.path.join(storage.snapshot_dir, f"snapshot-{T:020d}.snap"))  # every part checked
    ((trans_id, parts),) = node.installed
    assert (trans_id, tuple(parts)) == (T, snapshot.parts)
    frames = [f for path in parts for f in iter_frames(path, T)]
    assert [name for kind, name, _ in frames if kind == 1] == ["q0", "q0", "q1"]
    assert node.sources[-1].trans_id == T and [p for p, _ in node.sources[-1].files[1:]] == list(snapshot.parts)
    assert not [n for n in os.listdir(storage.snapshot_dir) if n.startswith(RECV_PREFIX)]
    transfers.close()
    storage.close()


def test_an_in_memory_node_loads_the_received_parts_from_its_run_dir(tmp_path):
    entry, data = _part(str(tmp_path / "src.qsp"))
    node = _Node()
    transfers = Transfers(node, None, str(tmp_path / "run" / "snapshots"), logging.getLogger("t"))
    _stage(transfers.staging, [data])
    transfers.install(SnapshotStaged(T, 1, {"trans_id": T, "parts": [entry]}), 1.0)
    ((_, parts),) = node.installed
    assert parts == [str(tmp_path / "run" / "snapshots" / f"{RECV_PREFIX}{T:020d}" / "part-0.qsp")]
    assert os.path.exists(parts[0]) and node.sources == []


def test_a_damaged_or_unneeded_snapshot_is_not_installed(tmp_path):
    entry, data = _part(str(tmp_path / "src.qsp"))
    storage = Storage(str(tmp_path / "data"))
    storage.recover()
    for node, part in ((_Node(), data[:-1] + b"\0"), (_Node(needs=False), data)):
        transfers = Transfers(node, storage, storage.snapshot_dir, logging.getLogger("t"))
        _stage(transfers.staging, [part])
        transfers.install(SnapshotStaged(T, 1, {"trans_id": T, "parts": [entry]}), 1.0)
        assert node.installed == [] and snapshot_trans_ids(storage.snapshot_dir) == []
    storage.close()


def test_an_in_memory_leader_s_cut_is_streamed_from_files_deleted_once_open(tmp_path):
    run = tmp_path / "run" / "snapshots"
    tmp = run / "tmp-cut-1"
    os.makedirs(tmp)
    entry, data = _part(str(tmp / "part-0.qsp"))
    node = _Node()
    transfers = Transfers(node, None, str(run), logging.getLogger("t"))
    transfers.transient(Publish(T, 1, str(tmp), (entry,)), 1.0)
    (source,) = node.sources
    assert source.trans_id == T and os.listdir(run) == []  # deleted at once
    path, size = source.files[1]
    chunk = transfers.filled(SnapshotChunk(3, 1, T, 1, 0, 0, size, FileRange(path, 0, size)), 1.5)
    assert chunk.data == data  # still readable through the open descriptor
    os.makedirs(tmp)
    transfers.transient(Failed(None, str(tmp), "not every worker forked within 0.5 s"), 2.0)
    assert os.listdir(run) == [] and len(node.sources) == 1
    transfers.close()


def _state(queues: int = 2) -> dict:
    """A v1 snapshot's state ({queue: Queue.snapshot()})."""
    s = PartitionService(1, 100)
    for i in range(queues):
        s.handle({"action": 1, "queue": f"q{i}", "data": "x" * (i + 1)}, Origin(7), i, 1.0)
    return s.snapshot()


def _loaded(parts: list[str], trans_id: int) -> dict:
    s = PartitionService(1, 100)
    s.load_frames(f for path in parts for f in iter_frames(path, trans_id))
    return s.snapshot()


def test_an_old_leaders_whole_snapshot_is_written_as_a_part_then_loaded(tmp_path):
    storage = Storage(str(tmp_path / "data"))
    storage.recover()
    node = _Node()
    transfers = Transfers(node, storage, storage.snapshot_dir, logging.getLogger("t"))
    transfers.install(ApplySnapshot(T, 1, _state()), 1.0)
    trans_id, parts = node.whole
    assert trans_id == T and snapshot_trans_ids(storage.snapshot_dir) == [T] and storage.valid_at == T
    assert _loaded(parts, T) == _state()  # what the workers LOAD
    assert node.sources[-1].trans_id == T  # and what this node streams from now on
    transfers.close()
    storage.close()


def test_an_old_leaders_whole_snapshot_that_cannot_be_written_stops_the_load(tmp_path):
    node = _Node()
    blocked = tmp_path / "file"
    blocked.write_text("")
    transfers = Transfers(node, None, str(blocked / "snapshots"), logging.getLogger("t"))
    transfers.install(ApplySnapshot(T, 1, _state()), 1.0)
    assert node.whole == (T, None)


def test_a_v1_snapshot_found_at_start_is_converted_once_to_a_part(tmp_path):
    from tests.unit.test_snapshot import write_v1

    storage = Storage(str(tmp_path / "data"))
    os.makedirs(storage.snapshot_dir, exist_ok=True)
    write_v1(storage.snapshot_dir, T, 1, _state(3))
    found = storage.recover()
    assert found.state == _state(3)
    convert_v1(storage, found)
    assert found.state == {} and len(found.parts) == 1 and found.manifest["format"] == 2
    assert _loaded(list(found.parts), T) == _state(3)
    storage.close()
    again = Storage(str(tmp_path / "data"))
    found = again.recover()  # converted once: a v2 snapshot from now on
    assert found.state == {} and found.manifest is not None and found.trans_id == T
    again.close()
