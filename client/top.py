"""queue-cli top: per-queue rates, refreshed live in a table (the rich library draws it).

Rates come from two monitor samples of each queue: messages in per second from the growth of
`max_id` (every stored message takes the next id), messages out (consumed at most once,
confirmed, expired, purged) from what came in minus the growth of `size`.
"""
from __future__ import annotations

import time
from typing import Any, NamedTuple

from rich.console import Console
from rich.live import Live
from rich.table import Table

DEFAULT_LIMIT = 30


class Row(NamedTuple):
    """One queue's line of the table."""

    queue: str
    size: int
    ready: int
    in_flight: int
    delayed: int
    waiters: int
    in_per_s: float
    out_per_s: float
    paused: bool
    overflowed: int = 0  # messages whose body is on disk (the node's overflow_mb)
    group: int | None = None  # its queue group (None: the cluster has one)


def rates(before: dict[str, dict], after: dict[str, dict], seconds: float, limit: int = DEFAULT_LIMIT) -> list[Row]:
    """The rows for two samples (queue -> monitor reply) taken `seconds` apart, busiest first
    (then by name); at most `limit`. A queue new in `after` counts from zero."""
    rows = []
    span = max(seconds, 1e-9)
    for name, now in after.items():
        then = before.get(name, {})
        came = max(0, _int(now, "max_id") - _int(then, "max_id"))
        went = max(0, came - (_int(now, "size") - _int(then, "size")))
        rows.append(Row(name, _int(now, "size"), _int(now, "ready"), _int(now, "in_flight"), _int(now, "delayed"),
                        _int(now, "waiters"), came / span, went / span, bool(now.get("paused")),
                        _int(now, "overflowed"), now.get("group")))
    rows.sort(key=lambda r: (-(r.in_per_s + r.out_per_s), r.queue))
    return rows[:max(0, limit)]


def _int(reply: dict, key: str) -> int:
    value = reply.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def table(rows: list[Row], node: dict[str, Any], seconds: float) -> Table:
    """The table of rows, titled with the node that answered and the measuring interval."""
    groups = node.get("groups") or []
    if groups:  # each queue group's leader
        leaders = "leaders " + ", ".join(f"{g.get('group')}: {g.get('leader_node_id') or '?'}" for g in groups)
    else:
        leaders = f"leader {node.get('leader_node_id', '?')}"
    title = (f"node {node.get('node_id', '?')} ({node.get('role', '?')}, {leaders}) "
             f"- {node.get('queue_count', len(rows))} queues{_held(node)} - rates over {seconds:.1f} s")
    t = Table(title=title, title_justify="left")
    t.add_column("queue", overflow="fold")
    grouped = bool(groups) or any(r.group is not None for r in rows)
    if grouped:
        t.add_column("group", justify="right")
    for header in ("in/s", "out/s", "size", "ready", "in flight", "delayed", "waiters", "on disk"):
        t.add_column(header, justify="right")
    t.add_column("state")
    for r in rows:
        group = ("" if r.group is None else str(r.group),) if grouped else ()
        t.add_row(r.queue, *group, f"{r.in_per_s:.1f}", f"{r.out_per_s:.1f}", str(r.size), str(r.ready),
                  str(r.in_flight), str(r.delayed), str(r.waiters), str(r.overflowed), "paused" if r.paused else "")
    if not rows:
        t.add_row("(no queue)", *([""] * (len(t.columns) - 1)))
    return t


def _held(node: dict[str, Any]) -> str:
    """What the cluster holds for its messages, as the monitor of every queue sums it: in memory,
    and on disk (bodies overflowed, overflow_mb); "" from a node that says neither."""
    if "memory_bytes" not in node and "overflow_bytes" not in node:
        return ""
    return f" - {_int(node, 'memory_bytes') / 2**20:.1f} MiB in memory, {_int(node, 'overflow_bytes') / 2**20:.1f} MiB on disk"


class Sampler:
    """Takes monitor samples of a cluster's queues through a client (QueueClient or alike); each
    measurement runs from the previous sample to a new one."""

    def __init__(self, client: Any, pattern: str = "") -> None:
        self.client = client
        self.pattern = pattern
        self.node: dict[str, Any] = {}
        self.seconds = 0.0  # the span of the last measurement
        self._last: tuple[float, dict[str, dict]] | None = None

    def sample(self) -> tuple[float, dict[str, dict]]:
        """(monotonic time, queue -> monitor reply) now; `node` gets the node-wide monitor."""
        client = self.client
        self.node = client.monitor()
        stats = {name: client.monitor(name) for name in client.list_queues(self.pattern)}
        self._last = time.monotonic(), stats
        return self._last

    def measure(self, interval: float, limit: int = DEFAULT_LIMIT) -> list[Row]:
        """The rows of the previous sample (one taken now if none) and one `interval` later."""
        t0, before = self._last or self.sample()
        time.sleep(interval)
        t1, after = self.sample()
        self.seconds = t1 - t0
        return rates(before, after, self.seconds, limit)


def print_once(sampler: Sampler, rows: list[Row], console: Console | None = None) -> None:
    """Print the table of one measurement."""
    (console or Console()).print(table(rows, sampler.node, sampler.seconds))


def live(sampler: Sampler, interval: float, limit: int = DEFAULT_LIMIT, console: Console | None = None) -> None:
    """Refresh the table every `interval` seconds until ^C (KeyboardInterrupt)."""
    sampler.sample()
    with Live(table([], sampler.node, 0.0), console=console, auto_refresh=False) as screen:
        while True:
            rows = sampler.measure(interval, limit)
            screen.update(table(rows, sampler.node, sampler.seconds), refresh=True)
