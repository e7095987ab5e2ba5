"""The bodies of one worker's messages that overflowed to disk: `Overflow`, which the worker's
MessageStores (workers/store.py) ask where a new body goes, and which reads a body back (issue
26, docs/plans/overflow.md 2.2).

A store's body slot holds either the `str` (in memory) or a reference: an `int` packing the
segment number, the offset of the body's record in the segment, and the body's length in bytes
(`ref`; each below 2**32). A MessageStore keeps it packed in 8 B of its chunk's array, no
object (workers/store.py `Chunk.spill`; a body of 64 KiB or more stays an int there); the int
exists while a reference is handed about (a read, an undo image, a dead letter). The segment files are append-only;
each record is `u32 length | u32 crc32 | UTF-8 body`. The files themselves are a `SegmentFiles`
given to the Overflow (server/overflow_files.py on a node, a dict in the tests): this module
only decides which segment and offset each body gets, counts the live references per segment,
and says which segment can go.

Segment deletion and the undo journal (workers/undo.py): a before-image of a deleted message may
hold its reference until the record is committed, and a rollback stores it again. So a segment
whose last reference went is deleted only once the records that took its references away are
committed: `trimmed` (called when the journal is trimmed) stamps it with the newest record
number then, and deletes it at a later trim that commits that number. A service without a
journal calls `trimmed` after each record it replays: never at once, since a record may take a
message's reference out of one queue and give it to another (a dead letter).

Pure logic: no I/O (the SegmentFiles does it).
"""
from __future__ import annotations

import errno
import struct
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Protocol

from queue_server.workers.body_budget import BodyBudget, body_size

HEADER = struct.Struct("<II")  # body length, crc32 of the body
SEGMENT_SIZE = 64 << 20
_OFF_BITS = 32
_SEG_SHIFT = 64
_LOW = (1 << 32) - 1
# The current segment, once it holds no body, is closed (and goes) if it is at least this large;
# a smaller one is written on (a queue that drains as fast as it overflows makes no file per body).
ROTATE_EMPTY = 1 << 20
# The most bytes one read of a run of consecutive bodies takes (read_many).
READ_RUN = 4 << 20
# How far a sequential read reads ahead (read).
READ_AHEAD = 256 << 10
# While the disk refuses writes, produces that need it are refused; the disk is tried again at
# most this often (s).
RETRY_DISK = 1.0


class SegmentFiles(Protocol):
    """The segment files of one worker."""

    where: str  # the directory, as the refusals name it

    def write(self, seg: int, offset: int, data: bytes) -> None:
        """Write `data` at `offset` of segment `seg` (made if new); OSError if the disk refuses."""

    def read(self, seg: int, offset: int, size: int) -> bytes:
        """`size` bytes at `offset` of segment `seg`."""

    def delete(self, seg: int) -> None:
        """Remove segment `seg`."""

    def delete_all(self) -> None:
        """Remove every segment."""


class BodyUnreadable(ValueError):
    """A body read back does not match its record (torn or overwritten segment `seg`)."""

    def __init__(self, message: str, seg: int) -> None:
        super().__init__(message)
        self.seg = seg


def _split(datas: Iterable[str | int]) -> tuple[int, list[int]]:
    """The length of the in-memory bodies among store slots, and the references."""
    held = 0
    refs = []
    for d in datas:
        if type(d) is int:
            refs.append(d)
        else:
            held += body_size(d)
    return held, refs


def _body(seg: int, offset: int, blob: bytes, at: int, size: int) -> str:
    """The body of the record at `at` of `blob` (read from `offset` of segment `seg`), checked."""
    if len(blob) < at + HEADER.size + size:
        raise BodyUnreadable(f"overflow segment {seg}: record at {offset} is cut short", seg)
    length, crc = HEADER.unpack_from(blob, at)
    body = blob[at + HEADER.size:at + HEADER.size + size]
    if length != size or zlib.crc32(body) != crc:
        raise BodyUnreadable(f"overflow segment {seg}: record at {offset} does not match", seg)
    return body.decode("utf-8", "surrogatepass")


def ref(seg: int, offset: int, size: int) -> int:
    """The reference to the body of `size` bytes whose record is at `offset` of segment `seg`."""
    return (seg << _SEG_SHIFT) | (offset << _OFF_BITS) | size


def unpack(r: int) -> tuple[int, int, int]:
    """(segment, offset, size) of a reference."""
    return r >> _SEG_SHIFT, (r >> _OFF_BITS) & _LOW, r & _LOW


class Overflow:
    """Where one worker's bodies are: its budget, its segments and their live references."""

    __slots__ = ("budget", "files", "segment_size", "rotate_empty", "seg", "end", "live", "live_bytes",
                 "zero", "refused", "retry_at", "ahead", "after", "torn", "written")

    def __init__(self, budget: BodyBudget, files: SegmentFiles, segment_size: int = SEGMENT_SIZE,
                 rotate_empty: int = ROTATE_EMPTY) -> None:
        self.budget = budget
        self.files = files
        self.segment_size = segment_size
        self.rotate_empty = rotate_empty
        self.seg = 0  # the segment new bodies are written to
        self.end = 0  # its size
        self.live: dict[int, int] = {}  # segment -> live references (only segments with any)
        self.live_bytes = 0  # the bodies' bytes of all live references
        # Segments with no live reference, not deleted yet: -> the record number stamped by
        # `trimmed` (None: not stamped yet).
        self.zero: dict[int, int | None] = {}
        self.refused: str | None = None  # the reason, while the disk refuses writes
        self.retry_at: float | None = None
        self.ahead: tuple[int, int, bytes] | None = None  # read ahead: segment, offset, bytes
        self.after: tuple[int, int] | None = None  # where the last read ended
        # Bodies that failed their check on read, by segment (their messages were dead-lettered).
        self.torn: dict[int, int] = {}
        self.written: dict[int, int] = {}  # segment -> records written to it (compactable)

    # ------------------------------------------------------------------ storing
    def keep(self, data: str | int) -> str | int:
        """What a store keeps for a body it stores: the `str` itself while it fits the budget
        (or the disk refuses), else a reference to it on disk; a reference stays one."""
        if type(data) is int:
            self._up(data)
            return data
        if self.budget.take(body_size(data)):
            return data
        return self._spill([data])[0]

    def keep_many(self, datas: list[str]) -> tuple[list[str | int], int]:
        """keep() of each of new bodies (a produce's `str`s); and how many went to disk."""
        budget = self.budget
        total = sum(map(body_size, datas))
        if budget.take(total):
            return datas, 0
        out: list[str | int] = []
        spill: list[int] = []
        for i, d in enumerate(datas):
            if budget.take(body_size(d)):
                out.append(d)
            else:
                out.append(d)
                spill.append(i)
        refs = self._spill([datas[i] for i in spill])
        n = 0
        for i, r in zip(spill, refs):
            if type(r) is int:
                out[i] = r
                n += 1
        return out, n

    def _spill(self, bodies: list[str]) -> list[str | int]:
        """Write `bodies` to the current segment (a new one when it is full), one write per
        segment; their references. If the disk refuses, the bodies not written stay in memory
        (counted held: nothing is lost) and produces that need the disk are refused until it is
        tried again (`refuses`)."""
        out: list[str | int] = list(bodies)
        raws = [b.encode("utf-8", "surrogatepass") for b in bodies]
        records = [HEADER.pack(len(raw), zlib.crc32(raw)) + raw for raw in raws]
        size = self.segment_size
        i, n = 0, len(bodies)
        while i < n:
            if self.end and self.end + len(records[i]) > size:
                self._rotate()
            start = end = self.end
            j = i
            while j < n and (end == start or end + len(records[j]) <= size):
                end += len(records[j])
                j += 1
            try:
                self.files.write(self.seg, start, b"".join(records[i:j]))
            except OSError as exc:
                where = self.files.where
                self.refused = (f"overflow disk full: {where}" if exc.errno == errno.ENOSPC
                                else f"overflow disk unwritable: {where} ({exc.strerror or exc})")
                self.retry_at = None
                self.budget.hold(sum(map(body_size, bodies[i:])))
                return out
            pos = start
            base = self.seg << _SEG_SHIFT
            for k in range(i, j):
                out[k] = base | (pos << _OFF_BITS) | len(raws[k])
                pos += len(records[k])
            live = self.live.get(self.seg, 0)
            if not live:
                self.zero.pop(self.seg, None)
            self.live[self.seg] = live + j - i
            self.written[self.seg] = self.written.get(self.seg, 0) + j - i
            self.live_bytes += pos - start - (j - i) * HEADER.size
            self.end = end
            i = j
        self.refused = None
        return out

    def _rotate(self) -> None:
        """Start a new segment; the full one goes when it holds nothing."""
        old = self.seg
        self.seg += 1
        self.end = 0
        if old not in self.live:
            self._dead(old)

    def refuses(self, size: int, now: float) -> str | None:
        """Why a produce of `size` (bodies' length) must be refused: while the disk refuses
        writes, a produce that would need it (None: it may go). The disk is tried again every
        RETRY_DISK seconds: that produce goes, and if the disk still refuses, its bodies stay
        in memory."""
        if self.refused is None or self.budget.fits(size):
            return None
        if self.retry_at is None:
            self.retry_at = now + RETRY_DISK
        elif now >= self.retry_at:
            self.retry_at = None
            return None
        return self.refused

    # ------------------------------------------------------------------ reading
    def read(self, r: int) -> str:
        """The body a reference names (BodyUnreadable if its record does not match). A read
        that starts where the one before ended (single consumes of a FIFO queue) reads up to
        READ_AHEAD bytes ahead, and the next reads inside them are served from memory."""
        seg, offset, size = unpack(r)
        need = HEADER.size + size
        ahead = self.ahead
        if ahead is not None and ahead[0] == seg and ahead[1] <= offset:
            at = offset - ahead[1]
            if at + need <= len(ahead[2]):
                self.after = (seg, offset + need)
                return _body(seg, offset, ahead[2], at, size)
        length = need
        if self.after == (seg, offset):
            # Only what is written: the current segment grows past self.end later.
            limit = self.end if seg == self.seg else self.segment_size
            length = max(need, min(READ_AHEAD, limit - offset))
        blob = self.files.read(seg, offset, length)
        self.ahead = (seg, offset, blob) if length > need else None
        self.after = (seg, offset + need)
        return _body(seg, offset, blob, 0, size)

    def read_many(self, datas: list[str | int]) -> list[str]:
        """The bodies of store slots (`str` as it is, references read back): the references
        that follow one another in a segment (a batch produced together, consumed together)
        are read with one read each run, at most READ_RUN bytes."""
        refs = sorted((d >> _SEG_SHIFT, (d >> _OFF_BITS) & _LOW, d & _LOW, k)
                      for k, d in enumerate(datas) if type(d) is int)
        if len(refs) < 2:
            return [self.read(d) if type(d) is int else d for d in datas]
        out: list = list(datas)
        head = HEADER.size
        unpack_from = HEADER.unpack_from
        crc32 = zlib.crc32
        i, n = 0, len(refs)
        while i < n:
            seg, first, size, _ = refs[i]
            end = first + head + size
            j = i + 1
            while j < n:
                s2, o2, z2, _ = refs[j]
                e2 = o2 + head + z2
                if s2 != seg or o2 > end or e2 - first > READ_RUN:
                    break
                if e2 > end:
                    end = e2
                j += 1
            blob = self.files.read(seg, first, end - first)
            for _, offset, size, k in refs[i:j]:  # _body, inlined
                at = offset - first
                body = blob[at + head:at + head + size]
                length, crc = unpack_from(blob, at)
                if length != size or len(body) != size or crc32(body) != crc:
                    _body(seg, offset, blob, at, size)  # raises BodyUnreadable
                out[k] = body.decode("utf-8", "surrogatepass")
            i = j
        return out

    # ------------------------------------------------------------------ dropping
    def drop(self, data: str | int) -> None:
        """A store no longer holds this slot (its message was deleted or moved)."""
        if type(data) is int:
            self._down(data)
        else:
            self.budget.free(body_size(data))

    def drop_many(self, datas: Iterable[str | int]) -> None:
        """drop() of each slot."""
        held, refs = _split(datas)
        self.budget.free(held)
        if refs:
            self.drop_refs(Counter(r >> _SEG_SHIFT for r in refs), sum(r & _LOW for r in refs))

    def drop_refs(self, per_segment: Mapping[int, int], size: int) -> None:
        """References a store no longer holds, counted: how many per segment, and their bodies'
        bytes."""
        self.live_bytes -= size
        for seg, k in per_segment.items():
            self._release(seg, k)

    def hold_again(self, datas: Iterable[str | int]) -> None:
        """Slots a store held and dropped (a purge or delete_queue taken back) count again,
        where they are: no body moves."""
        held, refs = _split(datas)
        self.budget.hold(held)
        if refs:
            self.hold_refs(Counter(r >> _SEG_SHIFT for r in refs), sum(r & _LOW for r in refs))

    def hold_refs(self, per_segment: Mapping[int, int], size: int) -> None:
        """References a store holds (again, or loaded), counted: how many per segment, and
        their bodies' bytes."""
        live = self.live
        zero = self.zero
        for seg, k in per_segment.items():
            n = live.get(seg, 0)
            if not n:
                zero.pop(seg, None)
            live[seg] = n + k
        self.live_bytes += size

    def _up(self, r: int) -> None:
        seg = r >> _SEG_SHIFT
        live = self.live
        n = live.get(seg, 0)
        if not n:
            self.zero.pop(seg, None)
        live[seg] = n + 1
        self.live_bytes += r & _LOW

    def _down(self, r: int) -> None:
        self.live_bytes -= r & _LOW
        self._release(r >> _SEG_SHIFT, 1)

    def _release(self, seg: int, k: int) -> None:
        """`k` references into segment `seg` are gone."""
        live = self.live
        n = live[seg] - k
        if n:
            live[seg] = n
            return
        del live[seg]
        if seg != self.seg:
            self._dead(seg)
        elif self.end >= self.rotate_empty:  # the current one, emptied: its space goes too
            self._rotate()

    def _dead(self, seg: int) -> None:
        self.zero[seg] = None

    def _delete(self, seg: int) -> None:
        if self.ahead is not None and self.ahead[0] == seg:
            self.ahead = None
        self.written.pop(seg, None)
        self.files.delete(seg)

    def trimmed(self, committed: int, seq: int) -> None:
        """The undo journal was trimmed through record `committed`; `seq` is the newest record.
        Delete the segments emptied by committed records."""
        zero = self.zero
        if not zero:
            return
        for seg, stamp in list(zero.items()):
            if stamp is None:
                stamp = zero[seg] = seq
            if stamp <= committed:
                del zero[seg]
                self._delete(seg)

    def rolled_back(self, keep_through: int) -> None:
        """The records after `keep_through` were undone: a segment still empty was emptied by
        a record kept (or by the undo itself), so it may go once `keep_through` is committed."""
        zero = self.zero
        for seg, stamp in zero.items():
            if stamp is not None and stamp > keep_through:
                zero[seg] = keep_through

    # ------------------------------------------------------------------ compaction
    def compactable(self, below: float, skip: set[int]) -> int | None:
        """A closed segment (not in `skip`) whose live references are under `below` of the
        records written to it, fewest live first; None if there is none."""
        written = self.written
        best = None
        for seg, live in self.live.items():
            if seg != self.seg and seg not in skip and live < below * written.get(seg, live):
                if best is None or live < self.live[best]:
                    best = seg
        return best

    def move(self, r: int) -> int:
        """A reference to a copy of the body `r` names, written to the current segment (the
        count moves with it); `r` itself if the body cannot be read back or the disk refuses."""
        try:
            body = self.read(r)
        except (BodyUnreadable, OSError):
            return r
        new = self._spill([body])[0]
        if type(new) is not int:  # the disk refused it: counted held by _spill, it stays on disk
            self.budget.free(body_size(body))
            return r
        self._down(r)
        return new

    def adopted(self, segs: Iterable[int]) -> None:
        """Segments loaded from a snapshot: what they hold now counts as written to them."""
        for seg in segs:
            if seg in self.live:
                self.written[seg] = self.live[seg]

    def start_above(self, top: int) -> None:
        """Segments up to `top` hold bodies loaded from a snapshot: new bodies go above them."""
        if self.seg > top:
            return
        old = self.seg
        self.seg = top + 1
        self.end = 0
        if old not in self.live:
            self._dead(old)

    def reset(self) -> None:
        """Forget every body on disk and in memory (the stores are replaced, by a load)."""
        self.files.delete_all()
        self.ahead = self.after = None
        self.seg += 1
        self.end = 0
        self.live.clear()
        self.written.clear()
        self.live_bytes = 0
        self.zero.clear()
        self.budget.held = 0

    # ------------------------------------------------------------------ figures
    @property
    def segments(self) -> int:
        """Segments on disk (the current one included)."""
        return len(self.live) + len(self.zero) + (self.seg not in self.live)
