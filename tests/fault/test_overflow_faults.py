"""Faults while message bodies overflow to disk (issue 26) on a real 3-node cluster: kill -9 of
the leader while producers fill the queues past every node's overflow_mb. Every acknowledged
at-least-once message is consumed afterwards, nothing that was never produced, and no
at-most-once message twice (tests/fault/history.py)."""
from __future__ import annotations

import signal
import time

from tests.fault.history import AT_LEAST_ONCE, AT_MOST_ONCE, History, Workload, drain
from tests.harness import Cluster, alive, wait_for

PAD = 4000  # bytes of padding per body: a 1 MiB budget holds about 250 of them


def _overflowed(c: Cluster, node_id: int) -> int:
    """How many messages of the workload's queues node_id holds with their bodies on disk."""
    total = 0
    for queue in (AT_LEAST_ONCE, AT_MOST_ONCE):
        reply = c.ask(node_id, {"action": 104, "queue": queue})
        total += reply.get("overflowed", 0) if reply and reply.get("code") == 0 else 0
    return total


def test_kill_leader_while_bodies_overflow_loses_nothing_acknowledged(tmp_path):
    c = Cluster(str(tmp_path), overflow_mb=1, workers=1).start()
    try:
        leader = c.wait_serving(60)
        history = History()
        work = Workload(c.hosts, history, pad=PAD, consumer=False).start()  # the queues only fill
        try:
            wait_for(lambda: _overflowed(c, leader) > 200, 60, f"node {leader} to overflow bodies to disk")
            pids = c.nodes[leader].pids()
            c.nodes[leader].signal_all(signal.SIGKILL)
            killed_at = time.monotonic()
            survivors = [i for i in c.nodes if i != leader]
            new = c.wait_leader(timeout=30, among=survivors, exclude=leader)
            print(f"new leader {new} {time.monotonic() - killed_at:.3f} s after kill -9 of {leader}")
            wait_for(lambda: not any(alive(pid) for pid in pids), 10, f"every process of node {leader} to die")
            acked = history.acked_count()
            wait_for(lambda: history.acked_count() >= acked + 100, 30, "100 more acknowledged produces")
            # the new leader holds bodies on disk too (its own budget): the drain reads them back
            assert _overflowed(c, new) > 0
        finally:
            work.stop()
        print(f"{history.acked_count()} produces acknowledged; errors {dict(history.errors)}")
        drain(",".join(c.nodes[i].hosts for i in survivors), history, timeout=120)
        history.check()
    finally:
        c.stop()
