import os

import pytest

from queue_server.replication import snapshot
from queue_server.replication.snapshot import (
    read_latest_snapshot,
    snapshot_name,
    snapshot_trans_ids,
    write_snapshot,
)
from queue_server.replication.wal import StorageError


def state(n: int) -> dict:
    """A small queue state in columns, as the coordinator might hand it over."""
    return {
        "queues": {
            "jobs": {
                "next_id": n + 1,
                "msg_id": list(range(1, n + 1)),
                "ready": [1_700_000_000.25 + i for i in range(n)],
                "lease": [None] * n,
                "priority": [i % 3 for i in range(n)],
                "data": [f"payload {i} \u00e9" for i in range(n)],
            }
        }
    }


class Warnings(list):
    def __call__(self, message: str) -> None:
        self.append(message)


def test_round_trip(tmp_path):
    path = write_snapshot(str(tmp_path), 42, 3, state(5))
    assert os.path.basename(path) == snapshot_name(42) == "snapshot-00000000000000000042.snap"
    assert read_latest_snapshot(str(tmp_path)) == (42, 3, state(5))


def test_no_snapshot(tmp_path):
    assert read_latest_snapshot(str(tmp_path)) is None
    assert read_latest_snapshot(str(tmp_path / "missing")) is None


def test_keeps_the_newest_two(tmp_path):
    for trans_id in (10, 20, 30, 40):
        write_snapshot(str(tmp_path), trans_id, 1, state(trans_id))
    assert snapshot_trans_ids(str(tmp_path)) == [30, 40]
    assert sorted(os.listdir(tmp_path)) == [snapshot_name(30), snapshot_name(40)]
    assert read_latest_snapshot(str(tmp_path)) == (40, 1, state(40))


@pytest.mark.parametrize("keep", [0, 1, 30, -5, -1])
def test_a_truncated_newest_snapshot_falls_back_to_the_previous(tmp_path, keep):
    write_snapshot(str(tmp_path), 10, 1, state(10))
    newest = write_snapshot(str(tmp_path), 20, 2, state(20))
    size = os.path.getsize(newest)
    with open(newest, "r+b") as f:
        f.truncate(keep % size)
    warnings = Warnings()
    assert read_latest_snapshot(str(tmp_path), warn=warnings) == (10, 1, state(10))
    assert len(warnings) == 1 and newest in warnings[0]


def test_a_flipped_bit_falls_back_to_the_previous(tmp_path):
    write_snapshot(str(tmp_path), 10, 1, state(10))
    newest = write_snapshot(str(tmp_path), 20, 2, state(20))
    with open(newest, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    warnings = Warnings()
    assert read_latest_snapshot(str(tmp_path), warn=warnings) == (10, 1, state(10))
    assert "checksum" in warnings[0]


def test_a_snapshot_under_another_name_is_refused(tmp_path):
    path = write_snapshot(str(tmp_path), 10, 1, state(1))
    os.rename(path, tmp_path / snapshot_name(99))
    warnings = Warnings()
    assert read_latest_snapshot(str(tmp_path), warn=warnings) is None
    assert "name" in warnings[0]


def test_a_leftover_temporary_file_is_ignored_then_deleted(tmp_path):
    write_snapshot(str(tmp_path), 10, 1, state(3))
    leftover = tmp_path / (snapshot_name(20) + ".tmp")  # a crash while writing snapshot 20
    leftover.write_bytes(b"QSNAP\0\0\1 half")
    warnings = Warnings()
    assert read_latest_snapshot(str(tmp_path), warn=warnings) == (10, 1, state(3))
    assert warnings == []
    write_snapshot(str(tmp_path), 30, 1, state(4))
    assert not leftover.exists()


def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    write_snapshot(str(tmp_path), 10, 1, state(3))

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(snapshot.os, "fsync", no_space)
    with pytest.raises(StorageError, match="No space"):
        write_snapshot(str(tmp_path), 20, 1, state(4))
    monkeypatch.undo()
    assert os.listdir(tmp_path) == [snapshot_name(10)]
    assert read_latest_snapshot(str(tmp_path)) == (10, 1, state(3))


def test_same_trans_id_replaces(tmp_path):
    write_snapshot(str(tmp_path), 10, 1, state(3))
    write_snapshot(str(tmp_path), 10, 2, state(4))
    assert snapshot_trans_ids(str(tmp_path)) == [10]
    assert read_latest_snapshot(str(tmp_path)) == (10, 2, state(4))
