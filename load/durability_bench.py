"""Durability figures: throughput and p99 of produce -> consume -> confirm cycles with fsync
"always", "everysec", "no" and in memory, beside beanstalkd with its binlog (-b) driven by the
same compiled client in the same run; p99 while snapshots of 1,000,000 stored messages are being
written, beside the same node writing none; and the restart time of a node holding 1,000,000
messages. --repo runs another checkout's node (a directory whose queue_server package is whole). A
benchmark, not a test.

    python load/durability_bench.py --seconds 5 --messages 1000000
    python load/durability_bench.py --restart-only --rounds 2   # only the restart time
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from queue_server.client import QueueClient  # noqa: E402
from load.options import number_options  # noqa: E402
from load.peers import installed as installed_peers  # noqa: E402
from tests.harness import wait_for  # noqa: E402
from load.bench import (REPO, QueueServer, Server, build_client, comparison_options, print_machine,  # noqa: E402
                        run_client, start_peer)


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


def _store(node: QueueServer, messages: int, batch: int) -> float:
    """Produce `messages` messages of 48 bytes to queue "stored"; the seconds it took."""
    start = time.monotonic()
    with QueueClient(node.addresses[0], timeout=60) as q:
        for i in range(0, messages, batch):
            q.produce_batch("stored", ["x" * 48] * min(batch, messages - i), retry=60)
    return time.monotonic() - start


RECOVERY_LINES = re.compile(r".*(?:loaded \d+ queues|recovered in).*")


def restart_time(workdir: str, messages: int, batch: int, repo: str = REPO,
                 lines: list[str] | None = None) -> tuple[float, float]:
    """Store `messages` messages, wait for a snapshot of them, stop the node, start it again:
    (seconds to store, seconds from start until it answers with every message back). The
    restarted node's recovery lines (the workers' loads, the recovery line) go to `lines`."""
    node = QueueServer(repo, workdir, 2, False, {"queue_size": messages + 1, "snapshot_every": messages // 2,
                                                 "log_level": 3}, name="restart")
    try:
        stored = _store(node, messages, batch)
        # The restart is to read a snapshot of all of them, not the log: wait until it is written.
        # A cut starts at the first timer after snapshot_every more records, so the last one may
        # start a little past the fill's end: a few records to another queue bring it about.
        snapshots = os.path.join(node.config["queue_data_dir"], "snapshots")

        def covered() -> bool:
            names = " ".join(os.listdir(snapshots))
            if max(map(int, re.findall(r"snapshot-(\d+)\.snap", names)), default=0) >= messages:
                return True
            if "tmp-" not in names:
                q.produce_batch("filler", ["x"] * batch)
            return False

        with QueueClient(node.addresses[0], timeout=60) as q:
            wait_for(covered, 120, f"a snapshot of the {messages:,} messages")
    finally:
        node.stop()
    start = time.monotonic()
    same_disk = {k: v for k, v in node.config.items() if k != "port"}
    node = QueueServer(repo, workdir, 2, False, same_disk, name="restart")
    try:
        with QueueClient(node.addresses[0], timeout=60) as q:
            wait_for(lambda: q.monitor("stored")["size"] == messages, 600, f"the restarted node to hold {messages:,} messages")
        restarted = time.monotonic() - start
        if lines is not None:
            lines += RECOVERY_LINES.findall(node.log_tail(200))
        return stored, restarted
    finally:
        node.stop()


SNAPSHOT_LINE = re.compile(r"snapshot at trans_id \d+ written")


def while_stored(client: str, args, workdir: str, every: int, repo: str = REPO) -> tuple[dict, int]:
    """The cycles of `run_client` on a node that holds `args.messages` messages in another queue
    and writes a snapshot every `every` committed records (so, with a small one, snapshots of all
    of them are being written most of the run): (its figures, snapshots written during the run)."""
    node = QueueServer(repo, workdir, 2, False, {"queue_size": args.messages + 1, "snapshot_every": every,
                                                   "log_level": 3}, name=f"stored-{every}")
    try:
        _store(node, args.messages, args.batch)
        before = len(SNAPSHOT_LINE.findall(node.log_tail(1 << 30)))
        figures = run_client(client, "qs", node.addresses, args)
        return figures, len(SNAPSHOT_LINE.findall(node.log_tail(1 << 30))) - before
    finally:
        node.stop()


def main(argv: list[str] | None = None) -> None:
    parser = number_options(__doc__, seconds=5.0, conns=8, payload=64, messages=1_000_000, batch=1000,
                            snapshot_every=(20_000, "while-stored rows: records between snapshots"))
    comparison_options(parser)
    parser.add_argument("--restart-only", action="store_true", help="only the restart time, --rounds times")
    parser.add_argument("--rounds", type=int, default=1, help="--restart-only: restarts measured (default 1)")
    args = parser.parse_args(argv)
    print_machine()
    if args.restart_only:
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                lines: list[str] = []
                stored, restarted = restart_time(tmp, args.messages, args.batch, args.repo, lines)
            print(f"stored {args.messages:,} messages in {stored:.1f} s; restart until all are back: "
                  f"{restarted:.1f} s (load average {os.getloadavg()[0]:.1f})", *lines, sep="\n  ", flush=True)
        return
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
            measure(f"queue-server {label}", QueueServer(args.repo, tmp, 2, False, config, name="durability"))
        for every in (args.snapshot_every, 1 << 40):
            label = f"{args.messages:,} stored, " + (f"a snapshot every {every:,} records" if every < 1 << 40
                                                     else "no snapshot")
            r, written = while_stored(client, args, tmp, every, args.repo)
            rows.append((f"queue-server {label} ({written} written in the run)", r))
            print(f"  {rows[-1][0]:<44} {r['ops_per_s']:>9,.0f} ops/s  p50 {r['p50_ms']:.3f} ms  "
                  f"p99 {r['p99_ms']:.3f} ms", flush=True)
        notes: list[str] = []
        if not args.no_peers and installed_peers(notes, "beanstalkd"):
            for every_write in (True, False):
                label, extra = beanstalkd_binlog(tempfile.mkdtemp(dir=tmp), every_write)
                measure(label, start_peer("beanstalkd", *extra), "beanstalk")
        for note in notes:
            print("  " + note)
        stored, restarted = restart_time(tmp, args.messages, args.batch, args.repo)
    print(f"\nstored {args.messages:,} messages in {stored:.1f} s; restart until all are back: {restarted:.1f} s")
    print("\n| workload | ops/s | p50 ms | p99 ms |\n|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['ops_per_s']:,.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} |")


if __name__ == "__main__":
    main()
