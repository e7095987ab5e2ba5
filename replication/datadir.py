"""The node's data directory (queue_data_dir): layout, the one-node lock, the vote state, and
the placement of queue groups the data was written with.

    <path>/LOCK          flock'd by the node that owns the directory; holds its pid
    <path>/wal/          queue group 0's log segments (replication.wal)
    <path>/snapshots/    group 0's snapshots (replication.snapshot)
    <path>/vote.json     group 0's {"vote_id": n, "voted_for": node id or null}, replaced atomically
    <path>/group-<g>/    group g >= 1's wal/, snapshots/ and vote.json (docs/plans/queue-groups.md 2.4)
    <path>/groups.json   the placement (queue_groups, group_replicas, queue_group_list, and the
                         replica sets when they are not every node) the data was written with

One group (the default) is the layout of a node before queue groups, plus groups.json. Each group
has a WAL of its own because a group's log is truncated, reset and trimmed on its own.

The lock is an flock on an open file description, so it lasts while any process holds a copy of
that descriptor: open the DataDir in the process that owns the data (after forking others), and
it goes away by itself when that process dies. The LOCK file is never deleted (deleting it would
let two nodes lock two different files of the same name).
"""

from __future__ import annotations

import fcntl
import os

import orjson

from queue_server.replication.disk import StorageError, read_file, replace_file

_VOTE_FILE = "vote.json"
GROUPS_FILE = "groups.json"


class DataDirLocked(Exception):
    """Another node (process) holds the data directory."""


class DamagedVoteState(ValueError):
    """vote.json cannot be read: the node cannot know its term and vote."""


def _locked(path: str, fd: int) -> DataDirLocked:
    holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
    return DataDirLocked(f"queue data dir {path} is in use by another node (pid {holder})")


def holder(path: str) -> str | None:
    """The pid (as it wrote it) of the process that holds `path`/LOCK now, or None; takes and
    keeps nothing."""
    try:
        fd = os.open(os.path.join(path, "LOCK"), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
    finally:
        os.close(fd)  # releases the flock if it was taken
    return None


def check_free(path: str) -> None:
    """Raise DataDirLocked if a node holds the directory now; takes and keeps nothing."""
    pid = holder(path)
    if pid is not None:
        raise DataDirLocked(f"queue data dir {path} is in use by another node (pid {pid})")


def group_path(path: str, group: int) -> str:
    """The directory of queue group `group`'s log, snapshots and vote in the data dir `path`."""
    return path if group == 0 else os.path.join(path, f"group-{group}")


class DataDir:
    """Owns a queue data directory for the lifetime of the process (or until close): one queue
    group's part of it. Group 0's takes the node's lock; a DataDir of another group is opened by
    the process that holds group 0's, and takes none."""

    def __init__(self, path: str, group: int = 0) -> None:
        self.path = group_path(path, group)
        self.wal_dir = os.path.join(self.path, "wal")
        self.snapshot_dir = os.path.join(self.path, "snapshots")
        self._vote_path = os.path.join(self.path, _VOTE_FILE)
        self._lock_fd: int | None = None
        if group != 0:
            os.makedirs(self.wal_dir, exist_ok=True)
            os.makedirs(self.snapshot_dir, exist_ok=True)
            return
        os.makedirs(path, exist_ok=True)
        fd = os.open(os.path.join(path, "LOCK"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            exc = _locked(path, fd)
            os.close(fd)
            raise exc from None
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            os.makedirs(self.wal_dir, exist_ok=True)
            os.makedirs(self.snapshot_dir, exist_ok=True)
        except BaseException:
            self.close()
            raise

    def release_in_child(self) -> None:
        """In a forked child: drop this process's reference to the lock without unlocking it, so
        the lock goes with the parent and never outlives it in the child."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def load_vote_state(self) -> tuple[int, int | None]:
        """(vote_id, voted_for) last saved; (0, None) for a new directory. A damaged file raises
        DamagedVoteState rather than forgetting a vote."""
        try:
            data = read_file(self._vote_path)
        except FileNotFoundError:
            return 0, None
        try:
            obj = orjson.loads(data)
            vote_id, voted_for = obj["vote_id"], obj["voted_for"]
        except (orjson.JSONDecodeError, TypeError, KeyError) as e:
            raise DamagedVoteState(f"{self._vote_path} is not a vote state file: {e}") from None
        if (
            type(vote_id) is not int
            or vote_id < 0
            or not (voted_for is None or type(voted_for) is int)
        ):
            raise DamagedVoteState(f"{self._vote_path} holds a bad vote state: {data[:200]!r}")
        return vote_id, voted_for

    def save_vote_state(self, vote_id: int, voted_for: int | None) -> None:
        """Durably record the vote state before this returns; raises StorageError if it can't."""
        try:
            replace_file(self._vote_path, (orjson.dumps({"vote_id": vote_id, "voted_for": voted_for}),))
        except OSError as e:
            raise StorageError(f"cannot save the vote state in {self.path}: {e}") from e

    def close(self) -> None:
        """Release the lock."""
        if self._lock_fd is not None:
            fd, self._lock_fd = self._lock_fd, None
            os.close(fd)  # closing the only descriptor releases the flock

    def __enter__(self) -> DataDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
