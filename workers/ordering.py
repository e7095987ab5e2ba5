"""An ordering of message keys (group, ready, msg_id) that costs no object per message when the
keys of a group arrive in order.

A queue holds millions of messages, and most arrive in delivery order: produced without delay,
one priority, msg_ids increasing, ready times not decreasing. Those keys go to their group's
`_Lane`, two arrays (ready times and msg_ids, 16 bytes a key) read from the front. A key that
arrives out of order (a delayed message becoming ready, a released lease, a restore) goes to one
SortedList of key tuples. The first key is the smaller of the first lane's head and the
SortedList's head.

A key taken from the middle of a lane is marked dead (a byte a key) and skipped at the head; a
lane compacts itself once its dead keys outnumber half its keys, so the garbage is bounded by
the live keys plus a constant, and every count is of live keys only.

Pure logic: no I/O.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from itertools import compress, groupby, islice, repeat
from operator import itemgetter, le, lt

from sortedcontainers import SortedList

Key = tuple  # (group, ready, msg_id): group an int (-priority for the ready ordering), ready a float

_INF = float("inf")
# A lane's dead keys that are always tolerated before it compacts (below this, compacting costs
# more than it frees).
_MIN_GARBAGE = 64
# A lane drops the consumed front of its arrays once it is this long and over half the arrays.
_MIN_TRIM = 4096
_ALIVE = bytes.maketrans(b"\x00\x01", b"\x01\x00")  # dead flags -> keep flags


class _Lane:
    """One group's in-order keys: ready times not decreasing and msg_ids increasing, so the
    lane is sorted both by (ready, msg_id) and by msg_id. Positions before `start` are consumed."""

    __slots__ = ("readies", "ids", "dead", "start", "n_dead")

    def __init__(self) -> None:
        self._reset()

    def __len__(self) -> int:
        return len(self.ids) - self.start - self.n_dead

    def append(self, ready: float, msg_id: int) -> bool:
        """Add the key at the end if it keeps the lane in order; False (nothing added) if not."""
        ids = self.ids
        if ids and (msg_id <= ids[-1] or ready < self.readies[-1]):
            return False
        ids.append(msg_id)
        self.readies.append(ready)
        self.dead.append(0)
        return True

    def extend(self, keys: list[Key]) -> bool:
        """Add keys sorted by (ready, msg_id) at the end if all keep the lane in order; False
        (nothing added) if not."""
        ids = array("q", map(itemgetter(2), keys))
        if not all(map(lt, ids, islice(ids, 1, None))):
            return False
        return self.extend_columns(array("d", map(itemgetter(1), keys)), ids, True)

    def extend_columns(self, readies: array, ids: array, sorted_readies: bool = False) -> bool:
        """Add the keys (readies[k], ids[k]) (not empty; msg_ids ascending) at the end if all
        keep the lane in order; False (nothing added) if not. `sorted_readies`: the caller knows
        the readies do not decrease."""
        if self.ids and (ids[0] <= self.ids[-1] or readies[0] < self.readies[-1]):
            return False
        if not sorted_readies and not all(map(le, readies, islice(readies, 1, None))):
            return False
        self.ids.extend(ids)
        self.readies.extend(readies)
        self.dead.extend(bytes(len(ids)))
        return True

    def find(self, ready: float, msg_id: int) -> int:
        """The position of the live key (ready, msg_id), or -1."""
        ids = self.ids
        i = bisect_left(ids, msg_id, self.start)
        if i < len(ids) and ids[i] == msg_id and self.readies[i] == ready and not self.dead[i]:
            return i
        return -1

    def kill(self, i: int) -> None:
        """Take the live key at position `i` out."""
        if i == self.start:  # the consume hot path
            i += 1
            self.start = i
            n = len(self.ids)
            if self.n_dead or i == n or (i >= _MIN_TRIM and 2 * i > n):
                self._skip_dead()
            return
        self.dead[i] = 1
        self.n_dead += 1
        if self.n_dead > _MIN_GARBAGE and 2 * self.n_dead > len(self.ids) - self.start:
            self._compact()

    def position_after(self, ready: float, msg_id: float) -> int:
        """The first position whose key is greater than (ready, msg_id)."""
        readies = self.readies
        lo = bisect_left(readies, ready, self.start)
        hi = bisect_right(readies, ready, lo)
        return bisect_right(self.ids, msg_id, lo, hi) if lo < hi else lo

    def live(self, lo: int, hi: int) -> int:
        """How many live keys positions lo..hi-1 hold."""
        n = hi - lo
        return n - self.dead.count(1, lo, hi) if self.n_dead else n

    def keys(self, group: int, lo: int, hi: int) -> list[Key]:
        """The live keys at positions lo..hi-1, in order."""
        readies = self.readies[lo:hi]
        ids = self.ids[lo:hi]
        if self.n_dead:
            keep = self.dead[lo:hi].translate(_ALIVE)
            readies = compress(readies, keep)
            ids = compress(ids, keep)
        return [(group, r, i) for r, i in zip(readies, ids)]

    def first_keys(self, group: int, lo: int, count: int) -> list[Key]:
        """Up to `count` live keys from position `lo` on, in order."""
        if not self.n_dead:
            return self.keys(group, lo, lo + count)
        out: list[Key] = []
        dead, readies, ids = self.dead, self.readies, self.ids
        for i in range(lo, len(ids)):
            if not dead[i]:
                out.append((group, readies[i], ids[i]))
                if len(out) >= count:
                    break
        return out

    def drop_front(self, hi: int) -> None:
        """Take out every key before position `hi`."""
        if self.n_dead:
            self.n_dead -= self.dead.count(1, self.start, hi)
        self.start = hi
        self._skip_dead()

    def _skip_dead(self) -> None:
        dead = self.dead
        ids = self.ids
        i = self.start
        while i < len(ids) and dead[i]:
            i += 1
            self.n_dead -= 1
        self.start = i
        if i == len(ids):
            self._reset()
        elif self.n_dead > _MIN_GARBAGE and 2 * self.n_dead > len(ids) - i:
            self._compact()  # live keys left the front: the dead ones behind them now outnumber them
        elif i >= _MIN_TRIM and 2 * i > len(ids):
            del self.readies[:i], self.ids[:i], self.dead[:i]
            self.start = 0

    def _compact(self) -> None:
        i = self.start
        keep = self.dead[i:].translate(_ALIVE)
        self.readies = array("d", compress(self.readies[i:], keep))
        self.ids = array("q", compress(self.ids[i:], keep))
        self.dead = bytearray(len(self.ids))
        self.start = self.n_dead = 0

    def _reset(self) -> None:
        """Empty: no key, live or dead."""
        self.readies = array("d")
        self.ids = array("q")
        self.dead = bytearray()
        self.start = self.n_dead = 0


class Ordering:
    """Keys (group, ready, msg_id) in ascending order, each at most once; the same order and
    answers as a SortedList of those tuples, without a tuple per key for keys that arrive in
    order within their group."""

    __slots__ = ("_lanes", "_groups", "_late", "_n_late")

    def __init__(self, keys: Iterable[Key] = ()) -> None:
        self._lanes: dict[int, _Lane] = {}
        self._groups: list[int] = []  # the groups of _lanes, ascending; each lane not empty
        self._late = SortedList()  # keys that came out of order
        self._n_late = 0  # len(self._late), without a call on the hot paths
        self.update(keys)

    def __len__(self) -> int:
        return sum(map(len, self._lanes.values())) + self._n_late

    def __bool__(self) -> bool:
        return bool(self._groups) or self._n_late != 0

    def __iter__(self) -> Iterator[Key]:
        return iter(self.first(len(self)))

    def __contains__(self, key: object) -> bool:
        group, ready, msg_id = key  # type: ignore[misc]
        lane = self._lanes.get(group)
        return (lane is not None and lane.find(ready, msg_id) >= 0) or key in self._late

    def add(self, group: int, ready: float, msg_id: int) -> None:
        """Add the key (group, ready, msg_id); it must not be there already."""
        lane = self._lanes.get(group)
        if lane is None:
            lane = self._new_lane(group)
        if not lane.append(ready, msg_id):
            self._late.add((group, ready, msg_id))
            self._n_late += 1

    def update(self, keys: Iterable[Key]) -> None:
        """Add keys (none there already), in ascending order so that most go to the lanes."""
        keys = sorted(keys)
        late: list[Key] = []
        lanes = self._lanes
        for group, run in groupby(keys, itemgetter(0)):
            run = list(run)
            lane = lanes.get(group)
            if lane is None:
                lane = self._new_lane(group)
            if not lane.extend(run):
                late.extend(key for key in run if not lane.append(key[1], key[2]))
        if late:
            self._late.update(late)
            self._n_late += len(late)

    def update_columns(self, group: int, readies: array, ids: array, sorted_readies: bool = False) -> None:
        """Add the keys (group, readies[k], ids[k]) (none there already; ids ascending, as a
        snapshot's rows come): at array speed when they continue the group's lane in order.
        `sorted_readies`: the caller knows the readies do not decrease."""
        if not ids:
            return
        lane = self._lanes.get(group)
        if lane is None:
            lane = self._new_lane(group)
        if not lane.extend_columns(readies, ids, sorted_readies):
            self.update(zip(repeat(group), readies, ids))

    def head(self) -> Key | None:
        """The first key, or None when empty."""
        groups = self._groups
        if not groups:
            return self._late[0] if self._n_late else None
        group = groups[0]
        lane = self._lanes[group]
        i = lane.start
        best = (group, lane.readies[i], lane.ids[i])
        if self._n_late and self._late[0] < best:
            return self._late[0]
        return best

    def discard(self, group: int, ready: float, msg_id: int) -> bool:
        """Take the key out; False if it is not there."""
        lane = self._lanes.get(group)
        if lane is not None:
            i = lane.start
            if lane.ids[i] != msg_id or lane.readies[i] != ready:  # not the head
                i = lane.find(ready, msg_id)
            if i >= 0:
                lane.kill(i)
                if not lane.ids:  # a lane keeps no dead key once it has no live one
                    self._drop_lane(group)
                return True
        if self._n_late:
            key = (group, ready, msg_id)
            late = self._late
            if key in late:
                late.remove(key)
                self._n_late -= 1
                return True
        return False

    def discard_many(self, keys: list[Key]) -> list[Key]:
        """Take the keys out; those that are not there, in the order given."""
        discard = self.discard
        return [key for key in keys if not discard(*key)]

    def take_first(self, group: int, readies: list[float], ids: list[int]) -> bool:
        """Take out the keys (group, readies[k], ids[k]) if they are the first len(ids) keys, in
        order (what a consume delivers): True. False, and nothing changed, if they are not."""
        n = len(ids)
        groups = self._groups
        if n and self._n_late >= n and self._late[0][0] == group:
            return self._take_first_late(group, readies, ids)
        if not n or not groups or groups[0] != group:
            return False
        lane = self._lanes[group]
        lo = lane.start
        hi = lo + n
        if lane.n_dead or hi > len(lane.ids):
            return False
        if self._n_late and self._late[0] < (group, readies[-1], ids[-1]):
            return False
        if lane.ids[lo:hi] != array("q", ids) or lane.readies[lo:hi] != array("d", readies):
            return False
        lane.drop_front(hi)
        if not lane.ids:
            self._drop_lane(group)
        return True

    def _take_first_late(self, group: int, readies: list[float], ids: list[int]) -> bool:
        """take_first of keys that came out of order (a batch released together, consumed
        again)."""
        n = len(ids)
        late = self._late
        keys = [(group, r, i) for r, i in zip(readies, ids)]
        if list(late.islice(0, n)) != keys:
            return False
        if self._groups:
            g = self._groups[0]
            lane = self._lanes[g]
            if (g, lane.readies[lane.start], lane.ids[lane.start]) < keys[-1]:
                return False
        del late[:n]
        self._n_late -= n
        return True

    def remove(self, group: int, ready: float, msg_id: int) -> None:
        """Take the key out; KeyError if it is not there."""
        if not self.discard(group, ready, msg_id):
            raise KeyError((group, ready, msg_id))

    def first(self, count: int, after: Key | None = None) -> list[Key]:
        """The first `count` keys (greater than `after` when given), in order."""
        if count <= 0:
            return []
        found: list[Key] = []
        lanes = self._lanes
        for group in self._groups:
            lane = lanes[group]
            if after is None or group > after[0]:
                lo = lane.start
            elif group == after[0]:
                lo = lane.position_after(after[1], after[2])
            else:
                continue
            found.extend(lane.first_keys(group, lo, count - len(found)))
            if len(found) >= count:
                break
        late = self._late
        if self._n_late:
            lo = 0 if after is None else late.bisect_right(after)
            found = list(heapq.merge(found, late.islice(lo, lo + count)))[:count]
        return found

    def through(self, group: int, ready: float) -> list[Key]:
        """Every key not after (group, ready, any msg_id), in order."""
        return self._upto(group, ready, take=False)

    def pop_through(self, group: int, ready: float) -> list[Key]:
        """Take out and return every key not after (group, ready, any msg_id), in order."""
        return self._upto(group, ready, take=True)

    def count_through(self, group: int, ready: float) -> int:
        """How many keys are not after (group, ready, any msg_id)."""
        n = 0
        lanes = self._lanes
        for g in self._groups:
            if g > group:
                break
            lane = lanes[g]
            hi = lane.position_after(ready, _INF) if g == group else len(lane.ids)
            n += lane.live(lane.start, hi)
        return n + self._late.bisect_right((group, ready, _INF))

    def clear(self) -> None:
        """Take every key out."""
        self._lanes.clear()
        self._groups.clear()
        self._late.clear()
        self._n_late = 0

    def _upto(self, group: int, ready: float, take: bool) -> list[Key]:
        found: list[Key] = []
        lanes = self._lanes
        emptied = []
        for g in self._groups:
            if g > group:
                break
            lane = lanes[g]
            hi = lane.position_after(ready, _INF) if g == group else len(lane.ids)
            keys = lane.keys(g, lane.start, hi)
            found.extend(keys)
            if take and keys:
                lane.drop_front(hi)
                if not lane:
                    emptied.append(g)
        for g in emptied:
            self._drop_lane(g)
        late = self._late
        if self._n_late:
            n = late.bisect_right((group, ready, _INF))
            if n:
                found = list(heapq.merge(found, late.islice(0, n)))
                if take:
                    del late[:n]
                    self._n_late -= n
        return found

    def _new_lane(self, group: int) -> _Lane:
        lane = self._lanes[group] = _Lane()
        self._groups.append(group)
        if len(self._groups) > 1:
            self._groups.sort()
        return lane

    def _drop_lane(self, group: int) -> None:
        del self._lanes[group]
        self._groups.remove(group)
