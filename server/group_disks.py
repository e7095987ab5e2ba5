"""Each queue group's files on one node, as the coordinator (server/coordinator.py) uses them: its
Storage (replication/storage.py: the WAL, the vote, the snapshots) and its snapshot Transfers
(server/transfers.py). Group 0's Storage is the data dir's own, opened by the caller under the
data dir's lock; group g's lives in the data dir's group-<g>/ folder (replication/datadir.py).
On an in_memory node no group has a Storage, and the snapshots a follower needs are cut into the
run dir."""
from __future__ import annotations

import logging
import os
import time

from queue_server.config.loader import NodeConfig
from queue_server.replication.messages import ReadLog, Recovered
from queue_server.replication.storage import Storage, StorageError
from queue_server.server.cluster import ClusterNode
from queue_server.server.group_node import GroupNode
from queue_server.server.metrics import CoordinatorMetrics
from queue_server.server.ready import GroupPart, Ready
from queue_server.server.snapshots import Clear, Failed, Publish
from queue_server.server.transfers import Transfers, convert_v1


class GroupDisks:
    """The Storage (None: in_memory) and Transfers of every group this node is a replica of."""

    def __init__(self, storages: dict[int, Storage | None], snapshot_dirs: dict[int, str],
                 log: logging.Logger) -> None:
        self.storages = storages
        self.snapshot_dirs = snapshot_dirs
        self.log = log
        self.transfers: dict[int, Transfers] = {}
        self.grouped = False  # a node of several queue groups: its lines name the group (attach)

    @classmethod
    def open(cls, config: NodeConfig, storage: Storage | None, run_dir: str,
             log: logging.Logger) -> tuple["GroupDisks", dict[int, Recovered | None]]:
        """Open every group's Storage beside group 0's `storage` (None: an in_memory node) and
        recover each: the disks, and what each group's disk held (None: in_memory)."""
        storages: dict[int, Storage | None] = {}
        for g in config.placement().groups_of(config.node_id):
            if g == 0:
                storages[g] = storage
            else:
                storages[g] = None if storage is None else Storage(
                    config.queue_data_dir, config.fsync, repair=config.repair, log=log,
                    segment_bytes=config.wal_segment_bytes, group=g)
        found: dict[int, Recovered | None] = {}
        dirs: dict[int, str] = {}
        for g, group_storage in storages.items():
            recovered = group_storage.recover() if group_storage is not None else None
            if group_storage is not None and recovered is not None and recovered.state:
                convert_v1(group_storage, recovered)  # the workers LOAD v2 parts only
            found[g] = recovered
            dirs[g] = group_storage.snapshot_dir if group_storage is not None else os.path.join(
                run_dir, "snapshots" if g == 0 else f"group-{g}-snapshots")
        return cls(storages, dirs, log), found

    @classmethod
    def without_storage(cls, node: ClusterNode, directory: str, log: logging.Logger) -> "GroupDisks":
        """Disks of an in_memory node around `node`, staging snapshots in `directory` (tests)."""
        disks = cls(dict.fromkeys(node.groups), dict.fromkeys(node.groups, directory), log)
        disks.attach(node)
        return disks

    def attach(self, node: ClusterNode) -> None:
        """Start each group's transfers, and tell each group where its WAL can be read from."""
        self.grouped = node.grouped
        for g, storage in self.storages.items():
            if storage is not None:
                storage.prefix = of_group(g, self.grouped)
                node.set_wal_from(storage.wal_from, g)  # a follower behind the log is fed from the WAL
            self.transfers[g] = Transfers(node.groups[g], storage, self.snapshot_dirs[g], self.log)

    def sync_deadline(self) -> float | None:
        """When the earliest group's log is due for an fsync (None: none is)."""
        deadlines = [d for s in self.storages.values() if s is not None and (d := s.sync_deadline()) is not None]
        return min(deadlines, default=None)

    def persist(self, group: GroupNode, piece: Ready | GroupPart, write: bool) -> tuple[int | None, bool, bool]:
        """Write `group`'s log and vote of a Ready to its disk (nothing on an in_memory node, or
        when told there is nothing to write): (durable trans_id or None, log stored, vote stored)."""
        storage = self.storages[group.group]
        if storage is None or not write:
            return None, True, True
        durable = None
        log_stored = vote_stored = True
        try:
            durable = storage.write(group.log, piece.truncate_after, time.time())
        except StorageError:
            log_stored = False
        group.set_wal_from(storage.wal_from)
        if piece.vote is not None:
            try:
                storage.save_vote(*piece.vote)
            except StorageError as exc:
                self.log.error("%scould not store the vote: %s", of_group(group.group, self.grouped), exc)
                vote_stored = False
        return durable, log_stored, vote_stored

    def read_logs(self, node: ClusterNode) -> None:
        """Carry out the WAL reads the groups asked for: the batch a follower behind the log needs
        (at most read.max_bytes, 1 MiB), or a snapshot for it when the disk fails to give it."""
        for g, storage in self.storages.items():
            if storage is None:
                continue
            for read in node.take_log_reads(g):
                self._read_log(node, storage, read, g)

    def _read_log(self, node: ClusterNode, storage: Storage, read: ReadLog, group: int) -> None:
        try:
            frames = storage.read_log(read.after, read.max_bytes, read.limit)
        except StorageError as exc:
            self.log.warning("%scannot read the log after trans_id %d for node %d, sending it a snapshot: %s",
                             of_group(group, self.grouped), read.after, read.to, exc)
            node.on_log_unreadable(read, time.time(), group)
            return
        node.on_log_read(read, frames, time.time(), group)

    def carry_files(self, node: ClusterNode, group: int, piece: Ready | GroupPart,
                    metrics: CoordinatorMetrics) -> None:
        """After a Ready is sent: install the snapshots streamed to `group`, and publish (or clear
        away) the cuts its workers made."""
        storage, transfers = self.storages[group], self.transfers[group]
        for staged in piece.staged:
            transfers.install(staged, time.time())
        for cut in piece.snapshots:
            if storage is not None:
                self._publish(node, storage, cut, group, metrics)
            else:
                transfers.transient(cut, time.time())

    def _publish(self, node: ClusterNode, storage: Storage, cut: Publish | Failed | Clear, group: int,
                 metrics: CoordinatorMetrics) -> None:
        """Publish a cut the workers wrote, or clear one away, saying why in one line."""
        if type(cut) is Clear:
            storage.abort_snapshot(cut.tmp)
            return
        if type(cut) is Publish:
            try:
                storage.finish_snapshot(cut.trans_id, cut.vote_id, cut.tmp, list(cut.parts),
                                        f"workers held {cut.held * 1000:.0f} ms, written in {cut.took:.1f} s")
                metrics.snapshot("written")
                node.set_wal_from(storage.wal_from, group)  # old segments may be gone
                self.transfers[group].source_changed(time.time())
                return
            except StorageError as exc:
                cut = Failed(cut.trans_id, cut.tmp, str(exc))
        storage.abort_snapshot(cut.tmp)
        metrics.snapshot("failed")
        at = f" at trans_id {cut.trans_id}" if cut.trans_id is not None else ""
        self.log.warning("%ssnapshot%s failed: %s; keeping the snapshot at trans_id %d and the log",
                         of_group(group, self.grouped), at, cut.reason, storage.valid_at)

    def close(self) -> None:
        """Close the transfers' files, and every group's Storage but group 0's (the caller's)."""
        for transfers in self.transfers.values():
            transfers.close()
        for g, storage in self.storages.items():
            if g != 0 and storage is not None:
                storage.close()


def of_group(group: int, grouped: bool) -> str:
    """The start of a log line about queue group `group` on a node of several groups (`grouped`);
    "" on a node of one group, whose lines stay as they always were."""
    return f"group {group}: " if grouped else ""
