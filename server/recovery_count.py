"""The counts of a recovered node's recovery line, free of I/O: once the workers were sent all the
log recovered from disk, they are asked what they hold (an internal monitor gathered from every
worker, RECOVERY_ORIGIN, behind what they were sent on the same pipe); the answer waits until that
point of the log is committed, then is taken once. Owned by GroupNode (server/group_node.py)."""
from __future__ import annotations

from queue_server.protocol.origin import Origin

# The origin of the monitor a recovered node gathers from its workers for its recovery line
# (no client's: node -1 is no node); group 0's, and recovery_origin(g) group g's.
RECOVERY_ORIGIN = Origin(0, False, -1)


def recovery_origin(group: int) -> Origin:
    """The origin of the recovery monitor of queue group `group` (its number as the conn)."""
    return Origin(group, False, -1)


class RecoveryCount:
    """Where the recovered log ends, when the workers were asked, and what they said."""

    __slots__ = ("through", "asked_at", "_counted", "_replayed")

    def __init__(self, through: int | None) -> None:
        """through: the last trans_id recovered from disk (None: no disk, nothing to count)."""
        self.through = through
        self.asked_at: int | None = None  # where the workers were asked
        self._counted: tuple[int, int, int] | None = None  # (queues, messages, trans_id) gathered
        self._replayed: tuple[int, int, int] | None = None

    def ends_inside(self, first: int, last: int) -> int | None:
        """Where (how many entries in) the recovered log ends inside entries first..last that the
        workers are about to replay, so that they are asked right there; None if not inside."""
        through = self.through
        if through is not None and self._counted is None and first <= through < last:
            return through - first + 1
        return None

    def ask(self, workers_trans_id: int) -> bool:
        """Whether to ask the workers now, that they reflect the log up to workers_trans_id."""
        through = self.through
        if through is None or self.asked_at is not None or workers_trans_id < through:
            return False
        self.asked_at = workers_trans_id
        return True

    def counted(self, queues: int, messages: int, commit_trans_id: int) -> None:
        """What the workers said they hold."""
        self._counted = (queues, messages, self.asked_at or 0)
        self.note(commit_trans_id)

    def note(self, commit_trans_id: int) -> None:
        """The log is committed up to commit_trans_id."""
        counted = self._counted
        if counted is not None and commit_trans_id >= counted[2]:
            self.through = self._counted = None
            self._replayed = counted

    def take(self, commit_trans_id: int) -> tuple[int, int, int] | None:
        """(queues, messages, trans_id) once the workers' answer is in and its point committed;
        None before, and after it was taken once."""
        self.note(commit_trans_id)
        taken, self._replayed = self._replayed, None
        return taken
