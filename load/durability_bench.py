"""Durability figures: throughput and p99 of produce -> consume -> confirm cycles with fsync
"always", "everysec", "no" and in memory, beside beanstalkd with its binlog (-b) driven by the
same compiled client in the same run; p99 while a snapshot is being written; and the restart time
of a node holding 1,000,000 messages. A benchmark, not a test.

    python load/durability_bench.py --seconds 5 --messages 1000000
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from queue_server.client import QueueClient  # noqa: E402
from load.options import parse_numbers  # noqa: E402
from load.peers import installed as installed_peers  # noqa: E402
from tests.harness import wait_for  # noqa: E402
from load.bench import REPO, QueueServer, Server, build_client, print_machine, run_client, start_peer  # noqa: E402


# Each queue-server durability setting: (label, config keys over the defaults).
SETTINGS = (
    ("fsync always", {"fsync": "always"}),
    ("fsync everysec (default)", {"fsync": "everysec"}),
    ("fsync no", {"fsync": "no"}),
    ("no WAL (in_memory)", {"in_memory": True}),
    ("everysec, a snapshot every 20k records", {"snapshot_every": 20000}),
)


def beanstalkd_binlog(binlog: str, fsync_every_write: bool) -> tuple[str, tuple[str, ...]]:
    """(label, beanstalkd's extra arguments) for its binlog in `binlog` (-b), syncing every write
    (-f0) or never."""
    label = "beanstalkd -b (fsync every write, -f0)" if fsync_every_write else "beanstalkd -b (no fsync)"
    return label, ("-b", binlog, *(("-f", "0") if fsync_every_write else ()))


def restart_time(workdir: str, messages: int, batch: int) -> tuple[float, float]:
    """Store `messages` messages, stop the node, start it again: (seconds to store, seconds from
    start until it answers with every message back)."""
    node = QueueServer(REPO, workdir, 2, False, {"queue_size": messages + 1, "snapshot_every": messages // 2},
                       name="restart")
    try:
        start = time.monotonic()
        with QueueClient(node.addresses[0], timeout=60) as q:
            for i in range(0, messages, batch):
                q.produce_batch("stored", ["x" * 48] * min(batch, messages - i), retry=60)
        stored = time.monotonic() - start
    finally:
        node.stop()
    start = time.monotonic()
    same_disk = {k: v for k, v in node.config.items() if k != "port"}
    node = QueueServer(REPO, workdir, 2, False, same_disk, name="restart")
    try:
        with QueueClient(node.addresses[0], timeout=60) as q:
            wait_for(lambda: q.monitor("stored")["size"] == messages, 600, f"the restarted node to hold {messages:,} messages")
        return stored, time.monotonic() - start
    finally:
        node.stop()


def main(argv: list[str] | None = None) -> None:
    args = parse_numbers(__doc__, argv, seconds=5.0, conns=8, payload=64, messages=1_000_000, batch=1000)
    print_machine()
    print(f"client: load/cbench.c, {args.conns} connections, one request in flight each, {args.seconds:g} s per row")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        client = build_client(tmp)

        def measure(name: str, server: Server, proto: str = "qs") -> None:
            try:
                r = run_client(client, proto, server.addresses, args)
            finally:
                server.stop()
            rows.append((name, r))
            print(f"  {name:<44} {r['ops_per_s']:>9,.0f} ops/s  p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms", flush=True)

        for label, config in SETTINGS:
            measure(f"queue-server {label}", QueueServer(REPO, tmp, 2, False, config, name="durability"))
        notes: list[str] = []
        if installed_peers(notes, "beanstalkd"):
            for every_write in (True, False):
                label, extra = beanstalkd_binlog(tempfile.mkdtemp(dir=tmp), every_write)
                measure(label, start_peer("beanstalkd", *extra), "beanstalk")
        for note in notes:
            print("  " + note)
        stored, restarted = restart_time(tmp, args.messages, args.batch)
    print(f"\nstored {args.messages:,} messages in {stored:.1f} s; restart until all are back: {restarted:.1f} s")
    print("\n| workload | ops/s | p50 ms | p99 ms |\n|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['ops_per_s']:,.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} |")


if __name__ == "__main__":
    main()
