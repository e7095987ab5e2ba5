"""A queue's stored messages by msg_id, with no object per message: `MessageStore`, and
`Message`, the copy of one stored message that a queue hands out.

A queue holds millions of messages (docs/plans/one-copy.md §2). A dict of message objects cost
~140 B per message beside the payload: the `Message` (56), its msg_id `int` (32) and the dict
entry (~52). The store keeps each queue's messages in chunks of CHUNK consecutive msg_ids: per
chunk a list of payloads (the `str` each produce brought, kept as it is until the chunk is no
longer the newest, then joined with the others: `Chunk.join_bodies`) and a list of state
tuples, 16 B a message. Messages stored together with the same settings share one state tuple
(Queue._stored), so the common case costs no tuple per message either. A batch of
consecutive msg_ids (what one consume delivers, most often) is read, set or deleted a chunk
slice at a time.

The newest chunk (the one new msg_ids go to) is kept even when empty, so a queue that is
emptied as fast as it is filled does not make a chunk per message. Any other chunk with fewer
than SPARSE live messages gives them to a small side dict ({msg_id: (data, state)}) and is
freed, so a few long-lived messages cannot pin whole chunks; a msg_id whose chunk is gone
(a restore of an old message) goes to the side dict too. A msg_id is in its chunk or in the
side dict, never both: a chunk is only made for msg_ids above every chunk made before.

With overflow on (issue 26), `ov` is the worker's `Overflow` (workers/overflow.py): a message's
body is the `str` or a reference to it on disk, as `ov.keep` decides. The reads that hand a
message out (get, get_many, entries) read it back; the raw slot (`pop`, `data`, `_columns`:
undo images, dead letters) is the reference as an `int` (workers/overflow.py `ref`). A chunk
keeps no object per reference: its payload list holds the shared sentinel SPILLED, and the
reference lives packed in 8 B of the chunk's array `Chunk.at` (segment, offset and length in
22, 26 and 16 bits), made the first time one of its bodies goes to disk; the int is built only
when a slot is handed out. A reference that does not fit (a body of 64 KiB or more, a segment
past 2**22 or an offset past 64 MiB) stays an int in the payload list. Else `ov` is None.

One file, over 600 lines, because every method reads or writes the chunk layout (positions,
sparse chunks, the side dict) and the overflow's counts of what it holds, which must not drift.

Pure logic: no I/O.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left
from itertools import accumulate
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from queue_server.workers.body_budget import body_size

if TYPE_CHECKING:
    from queue_server.workers.overflow import Overflow

BITS = 8
CHUNK = 1 << BITS  # msg_ids per chunk
MASK = CHUNK - 1
# A chunk other than the newest with fewer live messages than this moves them to the side dict.
SPARSE = 8

# A reference int (workers/overflow.py `ref`: segment << 64 | offset << 32 | length) packed in
# a chunk's array('Q') (Chunk.at): segment << _SEG_AT | offset << _SIZE_BITS | length, when each
# fits its bits (SEGMENT_SIZE is 64 MiB: every offset fits).
_SIZE_BITS = 16
_OFF_BITS = 26
_SEG_BITS = 64 - _OFF_BITS - _SIZE_BITS
_SEG_AT = _OFF_BITS + _SIZE_BITS
_SIZE_MASK = (1 << _SIZE_BITS) - 1
_OFF_MASK = (1 << _OFF_BITS) - 1
_LOW = (1 << 32) - 1
# The bits of a reference int that must be 0 for it to be packed.
_UNPACKABLE = ~(((1 << _SEG_BITS) - 1) << 64 | _OFF_MASK << 32 | _SIZE_MASK)
_NO_AT = bytes(8 * CHUNK)


class _Spilled:
    """The payload list's mark of a body on disk (its reference is in the chunk's arrays)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SPILLED"


SPILLED = _Spilled()


class _Joined:
    """The payload list's mark of a body joined into its chunk's `blob`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "JOINED"


JOINED = _Joined()


def _tally(packed: list[int], per_segment: Counter) -> int:
    """Count packed references by segment into `per_segment`; their bodies' bytes."""
    per_segment.update([a >> _SEG_AT for a in packed])
    return sum([a & _SIZE_MASK for a in packed])

# Positions in a state tuple (Message._state).
_READY, _TTL, _RETRY, _PRIORITY, _DELIVERY_COUNT, _LEASE, _TOKEN, _EXTRA = range(8)


def _field(i: int) -> property:
    """A read-only Message attribute kept at position `i` of its (shared, immutable) state
    tuple."""
    def get(m: Message) -> object:
        return m._state[i]
    return property(get)


class Message:
    """One stored message and its delivery state.

    Fields: msg_id, data, ready (absolute time it becomes ready; after a lease ends, the lease
    deadline), ttl (absolute time after which it is no longer retried), retry (seconds; 0 = at
    most once), priority (higher first among ready messages), delivery_count, lease (deadline
    while in flight, else None), token (the lease token it is leased under, else None), extra
    (rare settings, None for most messages: {"max_deliveries": n} from its produce, and for a
    dead letter {"dead": {"queue", "reason", "retry", "ttl"[, "max_deliveries"]}}).

    Everything but msg_id and data lives in one immutable tuple (`_state`) that messages stored
    together share. A queue hands out Messages built from its store: copies, read only.
    """

    __slots__ = ("msg_id", "data", "_state")

    def __init__(self, msg_id: int, data: str, ready: float, ttl: float, retry: float,
                 priority: int = 0, delivery_count: int = 0, lease: float | None = None,
                 token: str | None = None, extra: dict | None = None) -> None:
        self.msg_id = msg_id
        self.data = data
        self._state = (ready, ttl, retry, priority, delivery_count, lease, token, extra)

    ready = _field(_READY)
    ttl = _field(_TTL)
    retry = _field(_RETRY)
    priority = _field(_PRIORITY)
    delivery_count = _field(_DELIVERY_COUNT)
    lease = _field(_LEASE)
    token = _field(_TOKEN)
    extra = _field(_EXTRA)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return (self.msg_id == other.msg_id and self.data == other.data
                and self._state == other._state)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        names = ("msg_id", "data", "ready", "ttl", "retry", "priority", "delivery_count", "lease",
                 "token", "extra")
        values = (self.msg_id, self.data, *self._state)
        return "Message(" + ", ".join(f"{n}={v!r}" for n, v in zip(names, values)) + ")"


_new_message = object.__new__


def message(msg_id: int, data: str, state: tuple) -> Message:
    """A Message holding `state` itself (not a copy: state tuples are immutable)."""
    m = _new_message(Message)
    m.msg_id = msg_id
    m.data = data
    m._state = state
    return m


def delivered_once(m: Message, delivery_count: int) -> Message:
    """`m` as an at-most-once delivery numbered `delivery_count` leaves it: unleased, no token."""
    s = m._state
    return message(m.msg_id, m.data, (s[_READY], s[_TTL], s[_RETRY], s[_PRIORITY], delivery_count,
                                      None, None, s[_EXTRA]))


class Chunk:
    """The messages of msg_ids n*CHUNK .. n*CHUNK + CHUNK - 1: payload and state at position
    msg_id & MASK (None where no message is stored), and how many are stored. The two lists
    grow to a position when a message is stored there (a small queue keeps small lists); past
    their end nothing is stored. A payload SPILLED is a body on disk: its reference is packed
    in `at` at the same position (None until a body of the chunk goes to disk); a payload that
    is an int is a reference too big to pack.

    A chunk no longer the newest joins its bodies in memory into one `str`, `blob`
    (`join_bodies`), when they are all ASCII: a payload JOINED is
    blob[offs[p] - base:offs[p + 1] - base]. A body then costs its characters and 4 B, not a
    `str` object (~50 B more, rounded up to 16 B), and a snapshot's forked writer reads one
    object a chunk instead of touching (copying the page of) every body. Once fewer than half
    the messages it was joined with remain, the blob is cut to the span of its live bodies (one
    copy: a queue consumed in order), or joined again without the bodies gone when that span is
    mostly holes; so it holds at most about twice what its live bodies need."""

    __slots__ = ("data", "states", "live", "at", "blob", "offs", "base", "trim_below")

    def __init__(self) -> None:
        self.data: list[str | _Spilled | _Joined | None] = []
        self.states: list[tuple | None] = []
        self.live = 0
        self.at: array | None = None  # 'Q': the packed reference of each SPILLED position
        self.blob: str | None = None  # the JOINED bodies, end to end
        self.offs: array | None = None  # 'I': where each position's body starts (and ends), + base
        self.base = 0  # the offset (in offs) of blob's first character
        self.trim_below = 0  # `live` under which blob is trimmed: half what it last had (0: no blob)

    def join_bodies(self) -> None:
        """Join the bodies in memory (loose or JOINED) into `blob`, leaving out those gone; when
        they are not all ASCII (or past 4 GiB), keep each as its own `str`."""
        data = self.data
        if self.blob is not None:
            data[:] = self._bodies(0, len(data))
            self.blob = self.offs = None
            self.base = self.trim_below = 0
        try:
            joined = "".join(data)  # type: ignore[arg-type]
            whole = True  # the common chunk: a body at every position
        except TypeError:  # holes, or bodies on disk
            whole = False
            bodies = [d for d in data if type(d) is str]
            if not bodies:
                return
            joined = "".join(bodies)
        if not joined.isascii() or len(joined) >> 32:
            return
        if whole:
            self.offs = array("I", accumulate(map(len, data), initial=0))  # type: ignore[arg-type]
            data[:] = [JOINED] * len(data)
        else:
            self.offs = array("I", accumulate([len(d) if type(d) is str else 0 for d in data], initial=0))
            data[:] = [JOINED if type(d) is str else d for d in data]
        self.blob = joined
        self.trim_below = (self.live + 1) // 2

    def trim_bodies(self) -> None:
        """After messages left: cut `blob` to the span from its first to its last live body,
        or join again when that span is mostly holes."""
        data = self.data
        if JOINED not in data:
            self.blob = self.offs = None
            self.base = self.trim_below = 0
            return
        first = data.index(JOINED)
        end = len(data) - data[::-1].index(JOINED)
        if 2 * data[first:end].count(JOINED) < end - first:
            self.join_bodies()
            return
        offs, base = self.offs, self.base
        self.blob = self.blob[offs[first] - base:offs[end] - base]  # type: ignore[index]
        self.base = offs[first]  # type: ignore[index]
        self.trim_below = (self.live + 1) // 2

    def held(self) -> int:
        """The bytes of the bodies in memory (loose or JOINED: ASCII, a byte a character)."""
        data = self.data
        return sum(map(body_size, [d for d in data if type(d) is str])) + self.joined_size(0, len(data))

    def joined_size(self, p: int, k: int) -> int:
        """The bytes of the JOINED bodies among positions p .. p + k - 1."""
        offs = self.offs
        if offs is None:
            return 0
        data = self.data
        if data[p:p + k].count(JOINED) == k:
            return offs[p + k] - offs[p]
        return sum([offs[q + 1] - offs[q] for q in range(p, p + k) if data[q] is JOINED])

    def loose(self, p: int, k: int) -> list:
        """The payloads among positions p .. p + k - 1 that are neither JOINED nor SPILLED
        (bodies as their own `str`, references too big to pack)."""
        return [d for d in self.data[p:p + k] if d is not SPILLED and d is not JOINED]

    def spill(self, p: int, r: int) -> None:
        """Keep the reference `r` (an int, workers/overflow.py `ref`) at position p: packed when
        it fits, else as it is."""
        size = r & _LOW
        offset = (r >> 32) & _LOW
        seg = r >> 64
        if size > _SIZE_MASK or offset > _OFF_MASK or seg >> _SEG_BITS:
            self.data[p] = r
            return
        at = self.at
        if at is None:
            at = self.at = array("Q", _NO_AT)
        at[p] = seg << _SEG_AT | offset << _SIZE_BITS | size
        self.data[p] = SPILLED

    def ref(self, p: int) -> int:
        """The reference (an int) kept at position p (its payload is SPILLED)."""
        a = self.at[p]  # type: ignore[index]
        return (a >> _SEG_AT) << 64 | ((a >> _SIZE_BITS) & _OFF_MASK) << 32 | a & _SIZE_MASK

    def slot(self, p: int) -> str | int | None:
        """The payload at position p, a body on disk as its reference int."""
        d = self.data[p]
        if d is JOINED:
            offs, base = self.offs, self.base
            return self.blob[offs[p] - base:offs[p + 1] - base]  # type: ignore[index]
        return self.ref(p) if d is SPILLED else d  # type: ignore[return-value]

    def _bodies(self, p: int, k: int) -> list:
        """The payloads of positions p .. p + k - 1, each JOINED one sliced out of blob."""
        out = self.data[p:p + k]
        if self.blob is None or JOINED not in out:
            return out
        blob, offs, base = self.blob, self.offs, self.base
        if out.count(JOINED) == len(out):  # the common run: every body joined
            o = offs[p:p + len(out) + 1].tolist()  # type: ignore[index]
            if base:
                o = [x - base for x in o]
            return [blob[x:y] for x, y in zip(o, o[1:])]
        return [blob[offs[q] - base:offs[q + 1] - base] if d is JOINED else d  # type: ignore[index]
                for q, d in enumerate(out, p)]

    def slots(self, p: int, k: int) -> list:
        """slot() of positions p .. p + k - 1."""
        out = self._bodies(p, k)
        if self.at is not None and SPILLED in out:  # ref(), inlined
            out = [(a >> _SEG_AT) << 64 | ((a >> _SIZE_BITS) & _OFF_MASK) << 32 | a & _SIZE_MASK
                   if d is SPILLED else d for d, a in zip(out, self.at[p:p + k])]
        return out

    def spill_run(self, p: int, refs: list[int]) -> None:
        """spill() of each reference of `refs` at positions p, p + 1, ... (a REFS frame loaded:
        packed a run at a time)."""
        if any(map(_UNPACKABLE.__and__, refs)):
            for k, r in enumerate(refs):
                self.spill(p + k, r)
            return
        if self.at is None:
            self.at = array("Q", _NO_AT)
        self.at[p:p + len(refs)] = array("Q", [(r >> 64) << _SEG_AT | ((r >> 32) & _OFF_MASK) << _SIZE_BITS
                                               | r & _SIZE_MASK for r in refs])
        self.data[p:p + len(refs)] = [SPILLED] * len(refs)

    def packed(self, p: int = 0, k: int = CHUNK) -> list[int]:
        """The packed references of the SPILLED positions among p .. p + k - 1."""
        at = self.at
        if at is None:
            return []
        data = self.data[p:p + k]
        if SPILLED not in data:  # a C scan: most runs of a chunk that spilled hold bodies only
            return []
        return [a for a, d in zip(at[p:p + k], data) if d is SPILLED]

    def store(self, p: int, data: str | int) -> None:
        """Keep a payload (a `str`, or a reference int: packed) at position p."""
        if type(data) is int:
            self.spill(p, data)
        else:
            self.data[p] = data

    def reach(self, end: int) -> None:
        """Make positions up to end - 1 exist (doubling, at most CHUNK; exact-size lists)."""
        have = len(self.states)
        if end > have:
            more = [None] * (min(CHUNK, max(end, 2 * have, 16)) - have)
            self.data = self.data + more
            self.states = self.states + more


class MessageStore:
    """msg_id -> (payload, state tuple) of one queue's stored messages; reads as a mapping of
    msg_id -> Message (built on read), iterated in msg_id order.

    Queue.consume reads `chunks` directly for one message (a call saved on the hottest read);
    every change goes through the methods."""

    __slots__ = ("chunks", "side", "top", "n", "ov", "spilled")

    def __init__(self, ov: Overflow | None = None) -> None:
        self.chunks: dict[int, Chunk] = {}  # chunk number (msg_id >> BITS) -> Chunk
        self.side: dict[int, tuple[str, tuple]] = {}  # msg_id -> (data, state): ids with no chunk
        self.top = -1  # the highest chunk number made since the last clear; never freed
        self.n = 0
        self.ov = ov  # the worker's Overflow (None: overflow off, every payload a str)
        self.spilled = 0  # payload slots that are references to a body on disk

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n != 0

    def __contains__(self, msg_id: object) -> bool:
        return type(msg_id) is int and self.state(msg_id) is not None

    def state(self, msg_id: int) -> tuple | None:
        """The state tuple of a stored message, or None."""
        c = self.chunks.get(msg_id >> BITS)
        if c is not None:
            try:
                return c.states[msg_id & MASK]
            except IndexError:
                return None
        entry = self.side.get(msg_id)
        return None if entry is None else entry[1]

    def _run(self, ids: list[int]) -> list[tuple[Chunk, int, int]] | None:
        """When `ids` are consecutive ascending msg_ids (a batch delivered together, most often)
        all in chunks: (chunk, first position, count) for each chunk they are in. Else None."""
        first = ids[0]
        last = ids[-1]
        if last - first != len(ids) - 1 or (last != first and ids != list(range(first, last + 1))):
            return None
        chunks = self.chunks
        out = []
        i = first
        while i <= last:
            c = chunks.get(i >> BITS)
            if c is None:
                return None
            p = i & MASK
            k = min(CHUNK - p, last - i + 1)
            if p + k > len(c.states):
                return None
            out.append((c, p, k))
            i += k
        return out

    def states(self, ids: list[int]) -> list[tuple | None]:
        """state() of each msg_id, in order."""
        return self._columns(ids, False)[1]

    def _columns(self, ids: list[int], with_data: bool) -> tuple[list, list]:
        """The payloads (when `with_data`, else an empty list) and the states of msg_ids, in
        order, None for a msg_id not stored."""
        datas: list[str | None] = []
        states: list[tuple | None] = []
        run = self._run(ids) if ids else None
        if run is not None:
            for c, p, k in run:
                if with_data:
                    datas += c.slots(p, k)
                states += c.states[p:p + k]
            return datas, states
        chunks = self.chunks
        side = self.side
        last = -1
        c = None
        for i in ids:
            n = i >> BITS
            if n != last:
                c = chunks.get(n)
                last = n
            p = i & MASK
            if c is not None and p < len(c.states):
                d, s = c.slot(p), c.states[p]
            elif c is not None:
                d = s = None
            else:
                d, s = side.get(i, (None, None))
            if with_data:
                datas.append(d)
            states.append(s)
        return datas, states

    def body(self, c: Chunk, p: int) -> str:
        """The body of the message at position p of chunk c (read back when on disk)."""
        d = c.slot(p)
        return self.ov.read(d) if type(d) is int else d  # type: ignore[return-value]

    def data(self, msg_id: int) -> str:
        """The payload of a stored message (KeyError if none)."""
        c = self.chunks.get(msg_id >> BITS)
        if c is None:
            return self.side[msg_id][0]
        p = msg_id & MASK
        data = c.slot(p) if p < len(c.data) else None
        if data is None:
            raise KeyError(msg_id)
        return data

    def get(self, msg_id: int) -> Message | None:
        """The message (a copy), or None."""
        c = self.chunks.get(msg_id >> BITS)
        if c is not None:
            p = msg_id & MASK
            s = c.states[p] if p < len(c.states) else None
            if s is None:
                return None
            m = _new_message(Message)
            m.msg_id = msg_id
            m.data = c.slot(p)
            m._state = s
        else:
            entry = self.side.get(msg_id)
            if entry is None:
                return None
            m = message(msg_id, *entry)
        if type(m.data) is int:
            m.data = self.ov.read(m.data)
        return m

    def get_many(self, ids: list[int]) -> list[Message]:
        """The messages (copies) of stored msg_ids, in order (KeyError if one is not stored)."""
        datas, states = self._columns(ids, True)
        if None in states:
            raise KeyError(ids[states.index(None)])
        if self.spilled:
            datas = self.ov.read_many(datas)
        out = []
        append = out.append
        new = _new_message
        for i, d, s in zip(ids, datas, states):
            m = new(Message)
            m.msg_id = i
            m.data = d
            m._state = s
            append(m)
        return out

    def __getitem__(self, msg_id: int) -> Message:
        m = self.get(msg_id)
        if m is None:
            raise KeyError(msg_id)
        return m

    def __iter__(self) -> Iterator[int]:
        """Stored msg_ids, ascending."""
        side = self.side
        if not side:
            return self._chunk_ids()
        return heapq.merge(self._chunk_ids(), sorted(side))

    def _chunk_ids(self) -> Iterator[int]:
        chunks = self.chunks
        for n in sorted(chunks):
            base = n << BITS
            for p, s in enumerate(chunks[n].states):
                if s is not None:
                    yield base + p

    keys = __iter__

    def entries(self, raw: bool = False) -> Iterator[tuple[int, str | int, tuple]]:
        """(msg_id, data, state) of every stored message, msg_id ascending; with `raw`, data is
        the slot (a body on disk is its reference, not read back)."""
        side = self.side
        chunked = self._chunk_entries()
        if side:
            chunked = heapq.merge(chunked, ((i, *side[i]) for i in sorted(side)))
        if raw or not self.spilled:
            return chunked
        read = self.ov.read
        return ((i, read(d) if type(d) is int else d, s) for i, d, s in chunked)

    def _chunk_entries(self) -> Iterator[tuple[int, str, tuple]]:
        chunks = self.chunks
        for n in sorted(chunks):
            base = n << BITS
            c = chunks[n]
            for p, s in enumerate(c.states):
                if s is not None:
                    yield base + p, c.slot(p), s

    def items(self) -> Iterator[tuple[int, Message]]:
        """(msg_id, Message) pairs, msg_id ascending."""
        get = self.get
        return ((i, get(i)) for i in self)

    def add(self, msg_id: int, data: str | int, state: tuple) -> None:
        """Store a message under a msg_id not stored (ValueError if it is). `data`: its body,
        or a slot `pop` gave (with overflow on, maybe a reference)."""
        n = msg_id >> BITS
        c = self.chunks.get(n)
        if c is None:
            if n <= self.top:  # its chunk was freed (or never made): keep it aside
                if msg_id in self.side:
                    raise ValueError(f"msg_id {msg_id} is stored already")
                if self.ov is not None:
                    data = self._kept(data)
                self.side[msg_id] = (data, state)
                self.n += 1
                return
            c = self._new_chunk(n)
        p = msg_id & MASK
        if p >= len(c.states):
            c.reach(p + 1)
        elif c.states[p] is not None:
            raise ValueError(f"msg_id {msg_id} is stored already")
        ov = self.ov
        if ov is not None:
            budget = ov.budget
            if type(data) is str and budget.held + (size := body_size(data)) <= budget.share:
                budget.held += size
            else:
                data = self._kept(data)
        if type(data) is int:  # c.store, inlined: a produce's path
            c.spill(p, data)
        else:
            c.data[p] = data
        c.states[p] = state
        c.live += 1
        self.n += 1

    def _kept(self, data: str | int) -> str | int:
        """What the overflow keeps for a slot stored (Overflow.keep), counted."""
        data = self.ov.keep(data)
        if type(data) is int:
            self.spilled += 1
        return data

    def add_run(self, first: int, datas: list[str], states: list[tuple]) -> None:
        """Store messages under consecutive msg_ids from `first`, every one above all stored
        (so none is stored: a produce's new ids; after a rollback of produces, ids the store had
        before, whose chunk may be gone)."""
        self.add_ascending(range(first, first + len(datas)), datas, states, bodies=True)

    def add_ascending(self, ids: Sequence[int], datas: list[str] | list[int], states: list[tuple],
                      bodies: bool = False) -> None:
        """Store messages under ascending msg_ids, every one above all stored (a snapshot's
        rows, loaded a frame at a time): a chunk's share is stored with a slice when its msg_ids
        are consecutive. A REFS frame's references (`int`s) come only to a store with no overflow
        yet (a load: `attach` counts them); `bodies`: every data is a `str` (a produce's)."""
        if self.ov is not None:
            datas, spilled = self.ov.keep_many(datas)
            self.spilled += spilled
            refs = spilled != 0 or (not bodies and bool(datas) and int in map(type, datas))
        else:
            refs = not bodies and bool(datas) and int in map(type, datas)
        chunks = self.chunks
        i = 0
        total = len(ids)
        while i < total:
            n = ids[i] >> BITS
            j = bisect_left(ids, (n + 1) << BITS, i)
            c = chunks.get(n)
            if c is None:
                if n <= self.top:  # its chunk was freed: a rollback undid the ids above, kept aside
                    side = self.side
                    for k in range(i, j):
                        if ids[k] in side:
                            raise ValueError(f"msg_id {ids[k]} is stored already")
                        side[ids[k]] = (datas[k], states[k])
                    i = j
                    continue
                c = self._new_chunk(n)
            p = ids[i] & MASK
            last = ids[j - 1] & MASK
            if last >= len(c.states):
                c.reach(last + 1)
            if last - p == j - i - 1:
                c.data[p:last + 1] = datas[i:j]
                c.states[p:last + 1] = states[i:j]
                if refs:  # the references among them, packed
                    run = datas[i:j]
                    if str in map(type, run):
                        for k, d in enumerate(run):
                            if type(d) is int:
                                c.spill(p + k, d)
                    else:
                        c.spill_run(p, run)
            else:
                cstates = c.states
                for k in range(i, j):
                    p = ids[k] & MASK
                    c.store(p, datas[k])
                    cstates[p] = states[k]
            c.live += j - i
            i = j
        self.n += total

    def _new_chunk(self, n: int) -> Chunk:
        """Make chunk `n` (above every chunk made before); the newest before it is thinned
        now if it is sparse, else its bodies are joined."""
        old = self.chunks.get(self.top)
        if old is not None:
            if old.live < SPARSE:
                self.thin(self.top)
            else:
                old.join_bodies()
        c = self.chunks[n] = Chunk()
        self.top = n
        return c

    def set_state(self, msg_id: int, state: tuple) -> None:
        """Replace the state of a stored message."""
        c = self.chunks.get(msg_id >> BITS)
        if c is None:
            self.side[msg_id] = (self.side[msg_id][0], state)
        else:
            c.states[msg_id & MASK] = state

    def pop(self, msg_id: int, keep: bool = True) -> tuple[str | None, tuple]:
        """Take a stored message out: its (data, state); data None when not `keep` (the caller
        needs only the state) and overflow is off. KeyError if not stored."""
        n = msg_id >> BITS
        c = self.chunks.get(n)
        if c is None:
            entry = self.side.pop(msg_id)
            self.n -= 1
            if self.ov is not None:
                self._dropped(entry[0])
            return entry
        p = msg_id & MASK
        states = c.states
        s = states[p] if p < len(states) else None
        if s is None:
            raise KeyError(msg_id)
        data = c.slot(p) if keep or self.ov is not None else None
        c.data[p] = states[p] = None
        self.n -= 1
        live = c.live = c.live - 1
        if n != self.top and (live < SPARSE or live < c.trim_below):
            self._shrunk(n, c)
        if self.ov is not None:
            self._dropped(data)  # type: ignore[arg-type]
        return data, s

    def _dropped(self, data: str | int) -> None:
        """The overflow's count of a slot taken out."""
        if type(data) is int:
            self.spilled -= 1
            self.ov.drop(data)
        else:
            self.ov.budget.held -= body_size(data)

    def _dropped_many(self, datas: list[str | int]) -> None:
        """_dropped() of each slot."""
        if not self.spilled:  # every slot a str
            self.ov.budget.held -= sum(map(body_size, datas))
            return
        self.ov.drop_many(datas)
        self.spilled -= sum(type(d) is int for d in datas)

    def _dropped_run(self, run: list[tuple[Chunk, int, int]]) -> None:
        """_dropped() of the slots of a run (_run): the packed references counted from their
        chunk's array, no int made."""
        per, size, n = self._packed(run)
        if n:
            self.ov.drop_refs(per, size)
            self.spilled -= n
        self.ov.budget.held -= sum([c.joined_size(p, k) for c, p, k in run])
        self._dropped_many([d for c, p, k in run for d in c.loose(p, k)])

    def set_states(self, ids: list[int], states: list[tuple]) -> None:
        """set_state() of each stored msg_id."""
        run = self._run(ids) if ids else None
        if run is not None:
            j = 0
            for c, p, k in run:
                c.states[p:p + k] = states[j:j + k]
                j += k
            return
        chunks = self.chunks
        last = -1
        c = None
        for i, s in zip(ids, states):
            n = i >> BITS
            if n != last:
                c = chunks.get(n)
                last = n
            if c is not None:
                c.states[i & MASK] = s
            else:
                self.side[i] = (self.side[i][0], s)

    def delete_many(self, ids: list[int]) -> None:
        """Take out stored messages: distinct msg_ids, every one stored (the caller has
        checked: a msg_id not stored may leave the others half deleted)."""
        run = self._run(ids) if ids else None
        if run is not None:
            for c, p, k in run:
                if None in c.states[p:p + k]:
                    raise KeyError(f"msg_ids from {ids[0]}: not all stored")
            if self.ov is not None:
                self._dropped_run(run)
            for c, p, k in run:
                c.data[p:p + k] = c.states[p:p + k] = [None] * k
                c.live -= k
            self.n -= len(ids)
            chunks = self.chunks
            for n in range(ids[0] >> BITS, (ids[-1] >> BITS) + 1):
                if n != self.top:
                    self._shrunk(n, chunks[n])
            return
        chunks = self.chunks
        side = self.side
        last = -1
        c = None
        touched = []
        k = 0
        if self.ov is not None:
            datas = self._columns(ids, True)[0]
            if None in datas:
                raise KeyError(ids[datas.index(None)])
            self._dropped_many(datas)
        for i in ids:
            k += 1
            n = i >> BITS
            if n != last:
                c = chunks.get(n)
                last = n
                if c is not None:
                    touched.append(n)
            if c is not None:
                p = i & MASK
                if p >= len(c.states) or c.states[p] is None:
                    raise KeyError(i)
                c.data[p] = c.states[p] = None
                c.live -= 1
            else:
                del side[i]
        self.n -= k
        top = self.top
        for n in touched:
            c = chunks.get(n)
            if c is not None and n != top:
                self._shrunk(n, c)

    def _shrunk(self, n: int, c: Chunk) -> None:
        """Chunk `n` (not the newest) after messages left it: thinned when sparse, its bodies
        trimmed when it holds fewer than half the messages it last joined or trimmed with."""
        if c.live < SPARSE:
            self.thin(n)
        elif c.live < c.trim_below:
            c.trim_bodies()

    def thin(self, n: int) -> None:
        """Free chunk `n` (not the newest), its few live messages moved to the side dict."""
        c = self.chunks.pop(n)
        if c.live:
            base = n << BITS
            side = self.side
            for p, s in enumerate(c.states):
                if s is not None:
                    side[base + p] = (c.slot(p), s)

    def thin_sparse(self) -> None:
        """Thin every sparse chunk but the newest (after a load, which fills chunks as it
        finds the msg_ids)."""
        for n in [n for n, c in self.chunks.items() if c.live < SPARSE and n != self.top]:
            self.thin(n)

    def clear(self) -> None:
        """Take every message out."""
        self.detach()
        self.chunks = {}
        self.side = {}
        self.top = -1
        self.n = 0

    def _slots(self) -> Iterator[str | int]:
        """The payload slot of every stored message."""
        for c in self.chunks.values():
            for p, d in enumerate(c.data):
                if d is not None:
                    yield c.slot(p)
        for d, _ in self.side.values():
            yield d

    def _loose(self) -> Iterator[str | int]:
        """The payload slot of every stored message but those packed in a chunk's array
        (`_packed` counts them)."""
        for c in self.chunks.values():
            for p, d in enumerate(c.data):
                if d is not None and d is not SPILLED:
                    yield c.slot(p)
        for d, _ in self.side.values():
            yield d

    def _packed(self, run: Iterable[tuple[Chunk, int, int]] | None = None) -> tuple[Counter, int, int]:
        """The references packed in the chunks' arrays (those of `run`'s slots, else all): how
        many per segment, their bodies' bytes, and how many in all."""
        per: Counter = Counter()
        size = n = 0
        for c, p, k in (run if run is not None else ((c, 0, CHUNK) for c in self.chunks.values())):
            packed = c.packed(p, k)
            if packed:
                size += _tally(packed, per)
                n += len(packed)
        return per, size, n

    def detach(self) -> None:
        """The overflow no longer counts this store's bodies (a purge swapped it out, or its
        queue was deleted: the undo journal may still hold it); `reattach` undoes it."""
        if self.ov is not None and self.n:
            if self.spilled:
                per, size, _ = self._packed()
                self.ov.drop_refs(per, size)
                self.ov.drop_many(self._loose())
            else:  # every body in memory: one sum, at C speed
                self.ov.budget.free(self._held())

    def reattach(self) -> None:
        """The overflow counts this store's bodies again, where they are (undo of detach)."""
        if self.ov is not None and self.n:
            if self.spilled:
                per, size, _ = self._packed()
                self.ov.hold_refs(per, size)
                self.ov.hold_again(self._loose())
            else:
                self.ov.budget.hold(self._held())

    def move_out(self, seg: int, n: int | None) -> int:
        """Give every slot of chunk `n` (None: the side dict) that refers to overflow segment
        `seg` a reference to a copy of its body (Overflow.move: workers/compaction.py); the bytes
        moved."""
        ov = self.ov
        if ov is None or not self.spilled:
            return 0
        moved = 0
        if n is None:
            lo, hi = seg << 64, (seg + 1) << 64
            side = self.side
            for i, (d, s) in list(side.items()):
                if type(d) is int and lo <= d < hi:
                    side[i] = (ov.move(d), s)
                    moved += d & _LOW
            return moved
        c = self.chunks.get(n)
        if c is None:
            return 0
        data = c.data
        if c.at is not None and not seg >> _SEG_BITS:  # the packed ones: by their array
            lo, hi = seg << _SEG_AT, (seg + 1) << _SEG_AT
            for p, (a, d) in enumerate(zip(c.at, data)):
                if lo <= a < hi and d is SPILLED:
                    r = c.ref(p)
                    c.store(p, ov.move(r))
                    moved += r & _LOW
        if int in map(type, data):  # the ones too big to pack
            lo, hi = seg << 64, (seg + 1) << 64
            for p, d in enumerate(data):
                if type(d) is int and lo <= d < hi:
                    c.store(p, ov.move(d))
                    moved += d & _LOW
        return moved

    def _held(self) -> int:
        """The length of every body (all in memory)."""
        return (sum(c.held() for c in self.chunks.values())
                + sum(body_size(d) for d, _ in self.side.values()))

    def attach(self, ov: Overflow | None) -> None:
        """Count this store's bodies in `ov` from now on, as if each were stored now (a store
        filled by a load, before the overflow was given: bodies past the budget go to disk)."""
        if ov is self.ov:
            return
        self.detach()
        self.ov = ov
        self.spilled = 0
        if ov is None or not self.n:
            return
        per, size, self.spilled = self._packed()  # references stay where they are
        ov.hold_refs(per, size)
        for c in self.chunks.values():
            data = c.data
            out = 0  # JOINED bodies now on disk
            for p, d in enumerate(data):
                if d is not None and d is not SPILLED:
                    d = ov.keep(c.slot(p))
                    if type(d) is int:
                        out += data[p] is JOINED
                        c.store(p, d)
                        self.spilled += 1
            if out:
                c.join_bodies()
        side = self.side
        for i, (d, s) in side.items():
            d = ov.keep(d)
            side[i] = (d, s)
            self.spilled += type(d) is int
