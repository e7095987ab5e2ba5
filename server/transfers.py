"""The coordinator's file I/O for snapshots streamed between nodes (replication/transfer.py
decides what to send and take): a leader reads each chunk with a pread when it encodes the
message, from descriptors kept open so that pruning cannot pull a file away mid-transfer (those
of the newest snapshots, and of any snapshot a transfer still streams), and a snapshot whose
files cannot be read is given up (its transfers start again from the newest one); a
follower writes each chunk into ``<snapshots>/tmp-recv-<T>/`` before its ack leaves, then checks
every part and installs them as its own newest snapshot (an in_memory node keeps them in the run
dir, where its workers load them). An in_memory leader's workers cut a snapshot for a follower
into the run dir too; it is deleted as soon as its files are open (transient)."""
from __future__ import annotations

import logging
import os
import shutil
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import replace

import orjson

from queue_server.protocol.snapshot_frames import Frame
from queue_server.replication.messages import (
    ApplySnapshot, FileRange, Recovered, SnapshotChunk, SnapshotStaged, WriteChunk,
)
from queue_server.replication.snapshot import (
    check_segments, file_entries, iter_frames, manifest_files, publish, read_manifest, write_part, write_snapshot,
)
from queue_server.replication.storage import Storage, StorageError
from queue_server.replication.transfer import MANIFEST, SnapshotSource
from queue_server.server.snapshots import Clear, Failed, Publish
from queue_server.workers.queue import Queue

RECV_PREFIX = "tmp-recv-"  # a tmp- name: deleted at start (snapshot.clean) if a transfer was cut short
HELD_SOURCES = 2  # the sources whose files stay open: the newest, and the one before (and any still streamed)


class ChunkReader:
    """A leader's reads of the snapshot files it streams."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._held: deque[SnapshotSource] = deque(maxlen=HELD_SOURCES)

    def hold(self, source: SnapshotSource, streaming: Iterable[SnapshotSource] = ()) -> None:
        """Open the files of `source` now (a file deleted later stays readable through its
        descriptor); close those of sources held before the last HELD_SOURCES, but not those of
        the sources still `streaming` to a follower (pruned, they could not be opened again)."""
        self._held.append(source)
        keep = {path for s in (*self._held, *streaming) for path, _ in s.files}
        for path in list(self._fds):
            if path not in keep:
                os.close(self._fds.pop(path))
        for path, _ in source.files:
            if path not in self._fds:
                try:
                    self._fds[path] = os.open(path, os.O_RDONLY)
                except OSError:
                    pass  # read() says so, if it is ever asked for

    def filled(self, msg: SnapshotChunk) -> SnapshotChunk:
        """The chunk with its bytes read. Raises OSError."""
        r = msg.data
        if type(r) is not FileRange:
            return msg
        fd = self._fds.get(r.path)
        if fd is None:
            fd = self._fds[r.path] = os.open(r.path, os.O_RDONLY)
        data = os.pread(fd, r.length, r.offset)
        if len(data) != r.length:
            raise OSError(f"{r.path}: {len(data)} bytes at {r.offset} where {r.length} were expected")
        return replace(msg, data=data)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class Staging:
    """A follower's files of the snapshot being received, in `directory`."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path: str | None = None  # tmp-recv-<T>/ of the snapshot being received
        self._fds: dict[int, int] = {}
        self._manifest = bytearray()  # its manifest's bytes
        self._names: list[str] | None = None  # its files' names, by index

    def write(self, w: WriteChunk) -> None:
        """Write one chunk (the manifest is kept by the follower's core: its first chunk starts
        the staging again, and its bytes name the files after it). Raises OSError."""
        if w.part == MANIFEST:
            if w.offset == 0:
                self.restart(w.trans_id)
            self._manifest += w.data
            return
        fd = self._fds.get(w.part)
        if fd is None:
            assert self.path is not None
            if self._names is None:
                self._names = _staged_names(bytes(self._manifest))
            name = self._names[w.part] if w.part < len(self._names) else _part_name(w.part)
            fd = self._fds[w.part] = os.open(os.path.join(self.path, name), os.O_WRONLY | os.O_CREAT, 0o600)
        view = memoryview(w.data)
        offset = w.offset
        while view:
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n

    def check(self, staged: SnapshotStaged) -> list[dict]:
        """Every part of the staged snapshot read and checked (replication/snapshot.py
        iter_frames); their manifest entries, named as staged. ValueError or OSError says what
        is wrong."""
        self._close()
        if self.path is None:
            raise ValueError("nothing staged")
        entries = [{**e, "file": _part_name(i)} for i, e in enumerate(staged.manifest["parts"])]
        for e in entries:
            check_segments(os.path.join(self.path, e["file"]), e)
            for _ in iter_frames(os.path.join(self.path, e["file"]), staged.trans_id, e):
                pass
        return entries

    def drop(self) -> None:
        """Forget what is staged (it is deleted when the next transfer starts, or at start)."""
        self._close()
        self.path = None

    def restart(self, trans_id: int) -> None:
        """Start staging the snapshot at trans_id in a fresh directory."""
        self._close()
        os.makedirs(self.directory, exist_ok=True)
        for name in os.listdir(self.directory):
            if name.startswith(RECV_PREFIX):
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        self.path = os.path.join(self.directory, f"{RECV_PREFIX}{trans_id:020d}")
        os.mkdir(self.path)
        self._manifest = bytearray()
        self._names = None

    def _close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def v1_frames(state: dict) -> Iterator[Frame]:
    """A v1 snapshot's state ({queue name: Queue.snapshot()}) as v2 frames, one queue at a time."""
    for name, snap in state.items():
        yield from Queue.from_snapshot({**snap, "name": name}).snapshot_frames()


def convert_v1(storage: Storage, found: Recovered) -> None:
    """A v1 snapshot found at start (one whole state) is written once as a v2 snapshot at the
    same point, which replaces it; `found` then names its part, for the workers to LOAD. Raises
    StorageError."""
    path = write_snapshot(storage.snapshot_dir, found.trans_id, found.vote_id, v1_frames(found.state),
                          keep_from=storage.valid_at)
    try:
        snapshot = read_manifest(path)
    except (OSError, ValueError) as exc:
        raise StorageError(f"cannot read {path} back: {exc}") from exc
    found.state, found.parts, found.manifest = {}, snapshot.parts, snapshot.as_dict()


def _part_name(index: int) -> str:
    return f"part-{index}.qsp"


def _staged_names(manifest: bytes) -> list[str]:
    """The names a follower gives the files of a streamed snapshot after its manifest: the
    parts by their index, then their overflow segments beside them (none named: a manifest
    that does not say)."""
    try:
        parts = orjson.loads(manifest)["parts"]
        return [e["file"] for e in file_entries({"parts": [{**e, "file": _part_name(i)} for i, e in enumerate(parts)]})]
    except (ValueError, KeyError, TypeError):
        return []


class Transfers:
    """Both sides of a node's snapshot transfers, around the coordinator's ClusterNode."""

    def __init__(self, node, storage: Storage | None, directory: str, log: logging.Logger) -> None:
        """directory: where snapshots are staged (and on an in_memory node, cut)."""
        self.node = node
        self.storage = storage
        self.log = log
        self.reader = ChunkReader()
        self.staging = Staging(directory)
        self.source_changed()

    def source_changed(self, now: float = 0.0) -> None:
        """A snapshot was found at start or published: the one to stream from now on."""
        source = self.storage.snapshot_source() if self.storage is not None else None
        if source is not None:
            self._hold(source)
            self.node.on_snapshot_source(source, now)

    def _hold(self, source: SnapshotSource) -> None:
        """Hold the files of `source`, and still those of the snapshots streamed now."""
        self.reader.hold(source, self.node.streaming())

    def transient(self, cut: Publish | Failed | Clear, now: float) -> None:
        """An in_memory node's cut for a follower: once published, its files are opened and
        deleted (the descriptors keep them readable until two newer ones are held and no transfer
        streams it), and it is the one to stream; one that failed is deleted, saying why in one
        line."""
        if type(cut) is Publish:
            try:
                path = publish(self.staging.directory, cut.tmp, cut.trans_id, cut.vote_id, list(cut.parts))
                source = SnapshotSource(*manifest_files(path))
            except (OSError, ValueError) as exc:  # StorageError is an OSError
                cut = Failed(cut.trans_id, cut.tmp, str(exc))
            else:
                self._hold(source)
                os.remove(path)
                for part, _ in source.files[1:2]:
                    shutil.rmtree(os.path.dirname(part), ignore_errors=True)
                self.node.on_snapshot_source(source, now)
                return
        shutil.rmtree(cut.tmp, ignore_errors=True)
        if type(cut) is Failed:
            self.log.warning("snapshot for a follower%s failed: %s", "" if cut.trans_id is None else
                             f" at trans_id {cut.trans_id}", cut.reason)

    def write(self, writes: tuple[WriteChunk, ...]) -> bool:
        """Write the chunks of a Ready; False if one failed (its acks must not leave: the
        reception starts again when the leader resends)."""
        try:
            for w in writes:
                self.staging.write(w)
        except OSError as exc:
            self.log.warning("cannot write the snapshot streamed from the leader: %s", exc)
            self.node.follower.receiving = None
            self.staging.drop()
            return False
        return True

    def filled(self, msg: object, now: float) -> object | None:
        """A peer message ready to encode: a chunk's bytes read (None: they cannot be; the
        transfers of that snapshot start again from the newest one)."""
        if type(msg) is not SnapshotChunk:
            return msg
        try:
            return self.reader.filled(msg)
        except OSError as exc:
            self.log.warning("cannot read the snapshot at trans_id %d to stream it, starting again from the newest: %s",
                             msg.trans_id, exc)
            self.node.on_snapshot_unreadable(msg.trans_id, now)
            return None

    def install(self, staged: SnapshotStaged | ApplySnapshot, now: float) -> None:
        """Check the received snapshot and make it this node's: published on its disk (an
        in_memory node loads it from the run dir), then the node loads it. An old leader's whole
        snapshot (ApplySnapshot) is written as one part first."""
        node = self.node
        if type(staged) is ApplySnapshot:
            self._install_whole(staged)
            return
        if not node.needs_snapshot(staged.trans_id):
            self.staging.drop()
            return
        try:
            entries = self.staging.check(staged)
        except (OSError, ValueError) as exc:
            self.log.warning("the snapshot at trans_id %d streamed from the leader is damaged: %s; asking again",
                             staged.trans_id, exc)
            self.staging.drop()
            return
        tmp = self.staging.path
        assert tmp is not None
        self.staging.drop()
        parts = [os.path.join(tmp, e["file"]) for e in entries]
        source = None
        if self.storage is not None:
            try:
                self.storage.finish_snapshot(staged.trans_id, staged.vote_id, tmp, entries, "streamed from the leader")
            except StorageError as exc:
                self.log.warning("cannot install the snapshot at trans_id %d streamed from the leader: %s",
                                 staged.trans_id, exc)
                return
            source = self.storage.snapshot_source()
            if source is None:
                return
            self._hold(source)
            parts = [path for path, _ in source.files[1:1 + len(entries)]]  # not the segments after them
        node.on_snapshot_installed(staged, parts, now)
        if source is not None:
            node.on_snapshot_source(source, now)
        self.log.info("installed a snapshot from the leader at trans_id %d (%d parts, %d messages)", staged.trans_id,
                      len(entries), sum(e.get("messages", 0) for e in entries))

    def _install_whole(self, a: ApplySnapshot) -> None:
        """Write an old leader's InstallSnapshot (its state as one v1 dict) as a part, publish it
        as this node's snapshot (on an in_memory node, keep it in the run dir), and have the
        workers load it (on_whole_snapshot)."""
        parts: list[str] | None = None
        try:
            self.staging.restart(a.trans_id)
            tmp = self.staging.path
            assert tmp is not None
            self.staging.drop()
            entry = write_part(os.path.join(tmp, _part_name(0)), v1_frames(a.data), a.trans_id)
            parts = [os.path.join(tmp, _part_name(0))]
            if self.storage is not None:
                self.storage.finish_snapshot(a.trans_id, a.vote_id, tmp, [entry], "sent whole by the leader")
                source = self.storage.snapshot_source()
                if source is not None:
                    self._hold(source)
                    parts = [path for path, _ in source.files[1:2]]
                    self.node.on_snapshot_source(source, 0.0)
        except (OSError, ValueError) as exc:  # StorageError is an OSError
            self.log.error("cannot write the snapshot at trans_id %d the leader sent: %s", a.trans_id, exc)
            parts = None
        self.node.on_whole_snapshot(a.trans_id, parts)

    def close(self) -> None:
        self.reader.close()
        self.staging.drop()

