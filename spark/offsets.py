"""Offsets and lease-token names of the streaming queue source. Pure: no Spark, no sockets.

Consuming changes a queue, so an offset cannot be a position in it. An offset names a *round*
instead: the end offset of micro-batch N holds the plan of that batch, which is everything an
executor or a restarted driver needs to read the same messages again:

    {"stream": "3f2a9c0d1b7e4a55", "round": 7, "take": {"a": 5000, "b": 120}, "parts": 2,
     "chunk": 1000}

* `stream` is fixed when the query starts (initialOffset) and kept in every offset, so tokens
  of two queries reading the same queue never collide.
* `round` counts micro-batches that read something; an offset equal to the start means "no new
  data" to Spark.
* `take` is how many messages each queue gives this round (queues with none are left out);
  `parts` partitions per queue share them evenly; each partition consumes them in chunks of
  at most `chunk` messages.

Partition i of queue q in round r reads chunk k with lease token ``"<stream>/<r>/<i>/<k>"``
(tokens live per queue, so the queue name is not part of them). A retried task consumes with
the same tokens and gets the same still-leased messages back; the driver confirms a whole round
with token_prefix ``"<stream>/<r>/"`` once Spark has committed it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

_KEYS = ("stream", "round", "take", "parts", "chunk")


@dataclass(frozen=True)
class Offset:
    """One streaming offset: the plan of the round that ends there."""

    stream: str
    round: int
    take: dict[str, int] = field(default_factory=dict)
    parts: int = 1
    chunk: int = 1000

    def to_json(self) -> dict:
        """The JSON dict Spark stores in its offset log (keys and value types fixed)."""
        return {"stream": self.stream, "round": self.round, "take": dict(sorted(self.take.items())),
                "parts": self.parts, "chunk": self.chunk}

    @classmethod
    def from_json(cls, data: Mapping) -> Offset:
        """Parse an offset from the log; ValueError names what is wrong."""
        if not isinstance(data, Mapping):
            raise ValueError(f"queue offset: not a JSON object: {data!r}")  # noqa: TRY004
        missing = [k for k in _KEYS if k not in data]
        if missing:
            raise ValueError(f"queue offset: missing {', '.join(missing)} in {dict(data)!r}")
        take = data["take"]
        if not isinstance(take, Mapping) or not all(
                isinstance(q, str) and type(n) is int and n > 0 for q, n in take.items()):
            raise ValueError(f"queue offset: take must map queue names to counts > 0: {take!r}")
        stream, rnd, parts, chunk = data["stream"], data["round"], data["parts"], data["chunk"]
        if not isinstance(stream, str) or not stream or "/" in stream:
            raise ValueError(f"queue offset: bad stream id {stream!r}")
        if type(rnd) is not int or rnd < 0 or type(parts) is not int or parts < 1 \
                or type(chunk) is not int or chunk < 1:
            raise ValueError(f"queue offset: bad round/parts/chunk in {dict(data)!r}")
        return cls(stream, rnd, dict(take), parts, chunk)

    def next(self, take: Mapping[str, int], parts: int, chunk: int) -> Offset:
        """The offset of the following round, which takes `take`."""
        return Offset(self.stream, self.round + 1, {q: n for q, n in take.items() if n > 0},
                      parts, chunk)

    @property
    def prefix(self) -> str:
        """The token prefix shared by every lease of this round."""
        return round_prefix(self.stream, self.round)


def round_prefix(stream: str, rnd: int) -> str:
    """Token prefix of round `rnd` of a stream (the trailing '/' keeps round 1 from matching 10)."""
    return f"{stream}/{rnd}/"


def chunk_token(base: str, k: int) -> str:
    """The lease token of chunk `k` of a partition whose tokens start with `base`."""
    return f"{base}/{k}"


def split(n: int, parts: int) -> list[int]:
    """`n` messages shared by `parts` partitions, as evenly as possible (first ones get more)."""
    share, extra = divmod(n, parts)
    return [share + (1 if i < extra else 0) for i in range(parts)]


def chunks(n: int, chunk: int) -> list[int]:
    """The consume counts that read `n` messages `chunk` at a time."""
    full, rest = divmod(n, chunk)
    return [chunk] * full + ([rest] if rest else [])


def plan(
    ready: Mapping[str, int],
    per_queue_cap: int,
    limit: int | None = None,
    remaining: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """How many messages each queue gives the next round.

    Each queue gives at most what it has ready, `per_queue_cap`, and (Trigger.AvailableNow)
    what is `remaining` of its target; `limit` caps the total (maxMessagesPerTrigger), shared
    fairly: no queue gets more than an equal share unless others need less. Queues giving
    nothing are left out.
    """
    caps = {}
    for q, n in ready.items():
        cap = min(max(n, 0), per_queue_cap)
        if remaining is not None:
            cap = min(cap, max(remaining.get(q, 0), 0))
        if cap > 0:
            caps[q] = cap
    if limit is None or sum(caps.values()) <= limit:
        return caps
    take = {q: 0 for q in caps}
    left = limit
    hungry = sorted(caps, key=lambda q: (caps[q], q))
    while left > 0 and hungry:
        share = max(left // len(hungry), 1)
        still = []
        for q in hungry:
            give = min(share, caps[q] - take[q], left)
            take[q] += give
            left -= give
            if take[q] < caps[q]:
                still.append(q)
            if left == 0:
                break
        hungry = still
    return {q: n for q, n in take.items() if n > 0}
