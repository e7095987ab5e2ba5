"""Cluster timings on a real 3-node loopback cluster: time to a new leader after kill -9 of the
leader and after pausing it (SIGSTOP), and a follower's catch-up rate over the change log.
With --behind N, only a follower's catch-up past the leader's log window instead: N messages
produced while it is down on nodes with a disk whose log keeps BEHIND_LOG records, so that it
gets the leader's snapshot on disk, streamed in chunks, and then the log after it (from the WAL
where the log no longer reaches); with N below Flow.snapshot_over and no snapshot on disk yet,
batches read from the WAL only.
A benchmark, not a test; prints its figures and the machine.

    python load/failover_bench.py --records 1000000
    python load/failover_bench.py --behind 1000000
"""
from __future__ import annotations

import os
import re
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from queue_server.client import QueueClient  # noqa: E402
from load.bench import print_machine  # noqa: E402
from load.options import parse_numbers  # noqa: E402
from tests.harness import Cluster, NodeProcess, RawTcp, wait_for  # noqa: E402

BEHIND_LOG = 10_000  # queue_log_size of --behind: far fewer records than the follower lacks
# The lines that say where a catch-up's time went: the leader's cuts, the follower's install and loads.
CATCH_UP_LINES = re.compile(r".*(?:snapshot at trans_id \d+ written|installed a snapshot|loaded \d+ queues"
                            r"|coordinator ready|role: follower).*")


def time_to_new_leader(workdir: str, sig: int, rounds: int) -> list[float]:
    """Seconds from signalling the leader until both others agree on a new one."""
    times = []
    for r in range(rounds):
        c = Cluster(os.path.join(workdir, f"{sig}-{r}")).start()
        try:
            leader = c.wait_leader()
            others = [i for i in c.nodes if i != leader]
            start = time.monotonic()
            c.nodes[leader].signal_all(sig)
            c.wait_leader(among=others, exclude=leader, timeout=30)
            times.append(time.monotonic() - start)
            if sig == signal.SIGSTOP:
                c.nodes[leader].signal_all(signal.SIGCONT)
        finally:
            c.stop()
    return times


def catch_up(workdir: str, records: int, batch: int, behind: bool = False,
             lines: list[str] | None = None) -> tuple[float, float]:
    """Produce `records` messages while a follower is down, restart it, time its catch-up:
    over the log (in_memory nodes whose log keeps them all), or, `behind`, past the log (nodes
    with a disk whose log keeps BEHIND_LOG records: a streamed snapshot, then the log).
    Returns (seconds to produce, seconds to catch up); the leader's and the follower's log lines
    about it (CATCH_UP_LINES, from the follower's start on) go to `lines`."""
    where = {"queue_log_size": BEHIND_LOG} if behind else {"queue_log_size": records + 1000, "in_memory": True}
    c = Cluster(os.path.join(workdir, "catchup"), queue_size=records + 1000, **where).start()
    try:
        leader = c.wait_leader()
        follower = next(i for i in c.nodes if i != leader)
        c.nodes[follower].stop()
        start = time.monotonic()
        with QueueClient(c.nodes[leader].hosts, timeout=30) as q:
            for i in range(0, records, batch):
                q.produce_batch("catchup", ["x" * 32] * min(batch, records - i))
        produced = time.monotonic() - start
        node = c.nodes[follower]
        c.nodes[follower] = node = NodeProcess(node.workdir, node.config, name=node.name)
        leader_lines = len(c.nodes[leader].log().splitlines())
        start = time.monotonic()
        node.start()

        def done() -> bool:
            conn = RawTcp(*node.address)
            try:
                return conn.call({"action": 104, "queue": "catchup"}).get("size") == records
            finally:
                conn.close()
        wait_for(done, 600, "the follower to catch up")
        caught = time.monotonic() - start
        if lines is not None:
            lines += [time.strftime("follower started at %H:%M:%S", time.gmtime(time.time() - caught)) + "; leader:", *CATCH_UP_LINES.findall("\n".join(c.nodes[leader].log().splitlines()[leader_lines:])),
                      "follower:", *CATCH_UP_LINES.findall(node.log())]
        return produced, caught
    finally:
        c.stop()


def main(argv: list[str] | None = None) -> None:
    args = parse_numbers(__doc__, argv, records=1_000_000, batch=1000, rounds=5,
                         behind=(0, "only time a follower's catch-up past the log, this many messages behind"))
    print_machine()
    with tempfile.TemporaryDirectory() as tmp:
        if args.behind:
            lines: list[str] = []
            produced, caught = catch_up(tmp, args.behind, args.batch, behind=True, lines=lines)
            print(f"produced {args.behind:,} messages in {produced:.1f} s with a follower down")
            print(f"follower catch-up past a log of {BEHIND_LOG:,} records: {args.behind:,} messages in {caught:.1f} s "
                  f"(a snapshot streamed from the leader's disk if it is that far behind one, then the log "
                  f"or the WAL; including its start-up; load average {os.getloadavg()[0]:.1f})", *lines, sep="\n  ")
            return
        kill = time_to_new_leader(tmp, signal.SIGKILL, args.rounds)
        print(f"new leader after kill -9: min {min(kill):.3f} s, max {max(kill):.3f} s over {len(kill)} rounds", flush=True)
        pause = time_to_new_leader(tmp, signal.SIGSTOP, args.rounds)
        print(f"new leader after SIGSTOP: min {min(pause):.3f} s, max {max(pause):.3f} s over {len(pause)} rounds", flush=True)
        produced, caught = catch_up(tmp, args.records, args.batch)
        print(f"produced {args.records:,} records in {produced:.1f} s ({args.records / produced:,.0f}/s) with a follower down")
        print(f"follower catch-up: {args.records:,} records in {caught:.1f} s ({args.records / caught:,.0f} records/s, "
              f"including its start-up)")


if __name__ == "__main__":
    main()
