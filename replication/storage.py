"""A node's disk as the coordinator sees it: the Storage object. It holds the data dir lock
and the vote (datadir.py), writes the change log ahead to segment files (wal.py: group commit,
fsync by the SyncPolicy "always", "everysec" or "no"), publishes the snapshots the workers' children
wrote (snapshot.py; server/snapshots.py decides when), and recovers from the newest valid snapshot
plus the log after it. Used by the coordinator only."""
from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable


from queue_server.replication.datadir import DataDir
from queue_server.replication.log import ChangeLog, Entry
from queue_server.replication.messages import Recovered
from queue_server.replication.snapshot import (
    clean, latest_manifest, manifest_files, publish, read_parts, snapshot_name, snapshot_trans_ids,
)
from queue_server.replication.transfer import SnapshotSource
from queue_server.replication.wal import CorruptLog, Opener, StorageError, SyncPolicy, WalWriter, read_wal
from queue_server.protocol.records import Record, decode

__all__ = ["Recovered", "Storage", "StorageError"]


def _decoded_with_bytes(payload: bytes) -> tuple[Record, bytes]:
    """A record read from the log, and its bytes (they go to peers as they are)."""
    return decode(payload), payload


class Storage:
    """The coordinator's disk."""

    def __init__(self, path: str, fsync: str = "everysec", *, repair: bool = False,
                 log: logging.Logger | None = None, segment_bytes: int = 64 << 20,
                 wal_opener: Opener | None = None, wal_fsync: Callable[[int], None] | None = None,
                 group: int = 0) -> None:
        """Lock the data dir at path (group 0), or open queue group `group`'s part of it (whose
        owner holds group 0's Storage). `fsync` is the policy (always, everysec, no);
        wal_opener and wal_fsync stand in for the log's file and os.fsync (tests, faults)."""
        self.log = log or logging.getLogger(__name__)
        self.prefix = ""  # of its lines: "group g: " on a node of several groups (GroupDisks.attach)
        self.datadir = DataDir(path, group)
        self.repair = repair
        self.policy = SyncPolicy(fsync)
        self.segment_bytes = segment_bytes
        self._wal_opener = wal_opener
        self._wal_fsync = wal_fsync
        self.wal: WalWriter | None = None
        self.valid_at = 0  # trans_id of the newest snapshot known valid (recovered from, or written)
        self.failed = False
        self.last_fsync: float | None = None  # seconds the last flush with an fsync took

    # ----------------------------------------------------------------- start
    def recover(self) -> Recovered:
        """Delete what a snapshot cut short left; find the newest valid snapshot (every part
        checked; an invalid newer one is skipped with a warning) and read the log after it; open
        the log for writing. A v2 snapshot's frames are read from its parts as they are consumed
        (Recovered.frames), a v1 snapshot whole (Recovered.state)."""
        found = Recovered(vote=self.datadir.load_vote_state())
        clean(self.datadir.snapshot_dir)
        latest = latest_manifest(self.datadir.snapshot_dir, warn=self.log.warning)
        if latest is not None:
            found.trans_id, found.vote_id = latest.trans_id, latest.vote_id
            if latest.state is not None:
                found.state = latest.state
            else:
                found.manifest = latest.as_dict()
                found.frames = read_parts(latest)
                found.parts = latest.parts
        for trans_id, vote_id, (record, data) in read_wal(self.datadir.wal_dir, after=found.trans_id,
                                                          repair=self.repair, warn=self.log.warning,
                                                          decode=_decoded_with_bytes):
            found.entries.append(Entry(trans_id, vote_id, record, data))
        self.wal = WalWriter(self.datadir.wal_dir, segment_bytes=self.segment_bytes,
                             opener=self._wal_opener, fsync=self._wal_fsync)
        if self.wal.last_trans_id < found.trans_id:
            self.wal.reset(found.trans_id)  # the snapshot is newer than what the log kept
        self.valid_at = found.trans_id
        return found

    # ----------------------------------------------------------------- the log
    def write(self, log: ChangeLog, truncated_to: int | None, now: float) -> int:
        """Bring the log on disk in line with `log` (dropping a discarded tail first), write it to
        the OS and fsync by policy. Returns the trans_id up to which records are safe from a
        process crash ("always": from power loss). Raises StorageError; a later call retries."""
        wal = self.wal
        assert wal is not None
        try:
            if truncated_to is not None:
                if truncated_to < log.base_trans_id or log.last_trans_id < truncated_to:
                    wal.reset(log.base_trans_id)  # a snapshot was installed in place of the log
                elif truncated_to < wal.last_trans_id:
                    wal.truncate_after(truncated_to)
            if log.last_trans_id > wal.last_trans_id:
                entries = log.encoded_after(wal.last_trans_id, 1 << 62)
                if entries is None:  # what the disk lacks fell off the log: start after a snapshot
                    wal.reset(log.base_trans_id)
                    entries = log.encoded_after(log.base_trans_id, 1 << 62) or []
                wal.append(entries)
                sync = self.policy.after_append(now)
            else:
                sync = self.policy.due(now)
            if sync or wal.pending_count:
                started = time.perf_counter()
                wal.flush(sync)
                if sync:
                    self.last_fsync = time.perf_counter() - started
                    self.policy.synced(now)
        except StorageError as exc:
            if not self.failed:
                self.log.error("%sstorage unavailable: %s", self.prefix, exc)
            self.failed = True
            raise
        if self.failed:
            self.log.warning("%sstorage available again", self.prefix)
            self.failed = False
        return wal.synced_trans_id if self.policy.mode == "always" else wal.flushed_trans_id

    def read_log(self, after: int, max_bytes: int, limit: int = 1 << 62) -> list[tuple[int, int, bytes]]:
        """The log's records after `after` from disk as (trans_id, vote_id, record JSON), the
        shape ChangeLog.encoded_after gives, preceded by the record `after` itself (for its
        vote_id) when the log holds it: at most `limit` of them and about `max_bytes` (at least
        one). For a follower the log in memory no longer reaches. Raises StorageError."""
        assert self.wal is not None
        try:
            return self.wal.read_range(after, max_bytes, limit)
        except CorruptLog as exc:
            raise StorageError(f"reading the log: {exc}") from exc

    @property
    def wal_from(self) -> int | None:
        """The oldest `after` for which read_log gives the record `after` (or 0: none needed),
        so a batch from there can be sent; None before recover."""
        if self.wal is None:
            return None
        first = self.wal.first_trans_id
        return 0 if first <= 1 else first

    def sync_deadline(self) -> float | None:
        """When the log next needs an fsync if nothing else happens."""
        return self.policy.deadline()

    def save_vote(self, vote_id: int, voted_for: int | None) -> None:
        """Store the election's durable state (before any message that depends on it)."""
        self.datadir.save_vote_state(vote_id, voted_for)

    # ----------------------------------------------------------------- snapshots
    @property
    def snapshot_dir(self) -> str:
        """Where snapshots (manifests, parts, and the workers' tmp directories) are."""
        return self.datadir.snapshot_dir

    def finish_snapshot(self, trans_id: int, vote_id: int, tmp: str, parts: list[dict], how: str = "") -> None:
        """Publish the parts the workers wrote into `tmp` as the snapshot at trans_id (snapshot.py
        publish), keeping the newest ones and the newest known valid; then drop the log segments
        before the oldest kept snapshot (in case the newer ones prove bad); `how` goes into the log
        line. Raises StorageError."""
        publish(self.snapshot_dir, tmp, trans_id, vote_id, parts, keep_from=self.valid_at)
        self.valid_at = trans_id
        kept = snapshot_trans_ids(self.snapshot_dir)
        removed = self.wal.remove_segments_before(kept[0]) if kept and self.wal is not None else 0
        self.log.info("%ssnapshot at trans_id %d written (%d parts, %d messages%s); %d old log segments removed",
                      self.prefix, trans_id, len(parts), sum(p.get("messages", 0) for p in parts), f"; {how}" if how else "",
                      removed)

    def snapshot_source(self) -> SnapshotSource | None:
        """The newest snapshot known valid as files to stream to a follower (None: none, or a
        v1 one, or it cannot be read)."""
        if not self.valid_at:
            return None
        try:
            return SnapshotSource(*manifest_files(os.path.join(self.snapshot_dir, snapshot_name(self.valid_at))))
        except (OSError, ValueError) as exc:
            self.log.warning("%scannot stream the snapshot at trans_id %d to followers: %s", self.prefix, self.valid_at, exc)
            return None

    def abort_snapshot(self, tmp: str) -> None:
        """Delete what a cut that will not be published wrote."""
        shutil.rmtree(tmp, ignore_errors=True)

    def close(self) -> None:
        """Write the log's last records, unlock."""
        if self.wal is not None:
            try:
                self.wal.close()
            except StorageError as exc:
                self.log.error("%scould not write the log's last records: %s", self.prefix, exc)
        self.datadir.close()
