"""How many bytes of message bodies one worker keeps in memory: `BodyBudget` (issue 26,
docs/plans/overflow.md 2.1).

A worker's share is the node's `overflow_mb` split evenly over its workers: each decides alone,
with no coordination per produce. A new body stays in memory while the bodies held, it
included, fit the share; past it the body goes to disk. Bodies already on disk stay there until
they are consumed (no promotion back), so nothing thrashes; when consumes bring the bodies held
back under the share, new bodies stay in memory again.

A body's size is its length in UTF-8 bytes (`body_size`: what it takes on disk, and what the
issue's "bytes of message bodies" counts); an ASCII body's is its `len()`, known without encoding
it.

Pure logic: no I/O.
"""
from __future__ import annotations

# What a stored message costs a worker beside its body's length, for `memory_bytes`: its share of
# the store (state, orderings: ~35 B) and the body's str header (49 B); a body on disk costs less
# (its reference is 8 B packed in its chunk: ~43 B a message in all).
# Measured by load/queue_memory.py (183 B a message of 100 B).
PER_MESSAGE = 85


def memory_bytes(held: int, messages: int) -> int:
    """What a worker holds for `messages` stored messages whose bodies in memory take `held`
    bytes: the `memory_bytes` it reports, and counts against its share of max_memory_mb."""
    return held + PER_MESSAGE * messages


def body_size(body: str) -> int:
    """The bytes of a body: its UTF-8 length (lone surrogates as the snapshot codec writes them)."""
    return len(body) if body.isascii() else len(body.encode("utf-8", "surrogatepass"))


class BodyBudget:
    """The bodies one worker holds in memory (`held`, in bytes) against its `share`."""

    __slots__ = ("share", "held")

    def __init__(self, share: int) -> None:
        if share < 0:
            raise ValueError(f"share must be >= 0, got {share}")
        self.share = share
        self.held = 0

    def take(self, size: int) -> bool:
        """Count a new body of `size` as held if it fits the share (True), else nothing
        (False: it goes to disk)."""
        held = self.held + size
        if held > self.share:
            return False
        self.held = held
        return True

    def hold(self, size: int) -> None:
        """Count a body held whatever the share (one given back, or kept because the disk
        refused it)."""
        self.held += size

    def free(self, size: int) -> None:
        """A held body of `size` is gone."""
        self.held -= size

    def fits(self, size: int) -> bool:
        """Whether a new body of `size` would stay in memory."""
        return self.held + size <= self.share


def worker_share(overflow_mb: int, workers: int) -> int:
    """One worker's share (bytes) of the node's overflow_mb (MiB)."""
    return (overflow_mb << 20) // max(workers, 1)
