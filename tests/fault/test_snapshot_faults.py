"""Fault tests of the snapshots the workers make (docs/plans/one-copy.md, issue 25): kill -9 of a
snapshot writer, of a worker and of the whole node while a cut runs, then a restart that recovers
every acknowledged message from the older snapshot and the log; a follower far behind that
catches up by a chunked snapshot transfer and then serves every message exactly as produced; and
a leader cut off with writes it never committed, whose workers roll them back, so that they
appear nowhere once it rejoins and leads again. Everything is checked through the wire: client
replies, local monitors and peeks on the node itself, processes and log lines."""
from __future__ import annotations

import os
import re
import signal
import threading
import time

from queue_server.client import QueueClient, QueueError
from tests.harness import Cluster, NodeProcess, RawTcp, wait_for


def _local(node: NodeProcess, request: dict) -> dict | None:
    """One request answered by `node` itself (a local_* action), or None if it does not answer."""
    try:
        conn = RawTcp(*node.address, timeout=5)
    except OSError:
        return None
    try:
        return conn.call(request)
    except (OSError, ValueError):
        return None
    finally:
        conn.close()


def _local_size(node: NodeProcess, queue: str) -> int | None:
    reply = _local(node, {"action": "local_monitor", "queue": queue})
    return reply.get("size") if reply and reply.get("code") == 0 else None


def _hand_over(c: Cluster, leader: int, target: int) -> None:
    """Move leadership from `leader` to `target` with the leader's own hand-off (SIGUSR1 to its
    coordinator, what a SIGTERM starts with). The hand-off picks the follower whose log reaches
    furthest, the lower id on a tie: the caller makes sure that is `target`."""
    os.kill(c.nodes[leader].child_pid("coordinator"), signal.SIGUSR1)
    assert c.wait_leader(timeout=30, exclude=leader) == target, c.describe()


def _drain(hosts: str, queue: str) -> list[tuple[int, str]]:
    """Consume (at most once) every message of `queue`: (msg_id, data) in delivery order."""
    got: list[tuple[int, str]] = []
    with QueueClient(hosts, timeout=30) as q:
        while True:
            batch = q.consume_batch(queue, 1000)
            if not batch:
                return got
            got.extend((m.msg_id, m.data) for m in batch)


# --------------------------------------------------------------- a follower far behind, by snapshot
BEHIND = int(os.environ.get("SNAPSHOT_FAULT_BEHIND", "300000"))
BEHIND_QUEUES = 4  # spread over both workers of each node


def _body(queue: int, i: int) -> str:
    return f"q{queue}-{i}-" + "é\u20ac"[i % 2] + "x" * (i % 7)


def test_a_follower_far_behind_catches_up_by_snapshot_and_serves_every_message_as_produced(tmp_path):
    per_queue = BEHIND // BEHIND_QUEUES
    c = Cluster(str(tmp_path), queue_log_size=5000, queue_size=per_queue + 1).start()
    try:
        leader = c.wait_serving(60)
        # the lower-id follower: the leader's hand-off picks it when both followers are level
        behind = min(i for i in c.nodes if i != leader)
        c.nodes[behind].stop()
        produced: dict[str, list[tuple[int, str]]] = {f"far{n}": [] for n in range(BEHIND_QUEUES)}
        failures: list[BaseException] = []

        def produce(n: int) -> None:
            try:
                with QueueClient(c.nodes[leader].hosts, timeout=60) as q:
                    for start in range(0, per_queue, 1000):
                        data = [_body(n, i) for i in range(start, min(start + 1000, per_queue))]
                        ids = q.produce_batch(f"far{n}", data)
                        produced[f"far{n}"].extend(zip(ids, data))
            except BaseException as e:  # noqa: BLE001 - reported by the test's thread
                failures.append(e)
        started = time.monotonic()
        threads = [threading.Thread(target=produce, args=(n,)) for n in range(BEHIND_QUEUES)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures
        print(f"produced {BEHIND} messages in {time.monotonic() - started:.1f} s")
        started = time.monotonic()
        c.nodes[behind].start()
        node = c.nodes[behind]
        for name, messages in produced.items():
            wait_for(lambda: _local_size(node, name) == len(messages), 180, f"node {behind} to hold all of {name}")
        print(f"node {behind} caught up {BEHIND} messages in {time.monotonic() - started:.1f} s")
        assert re.search(r"installed a snapshot from the leader at trans_id \d+", node.log()), node.log()[-3000:]
        # What it holds is its own: it leads and serves every message, ids and bodies as produced.
        _hand_over(c, leader, behind)
        for name, messages in produced.items():
            assert _drain(node.hosts, name) == messages, name
    finally:
        c.stop()


# --------------------------------------------------- a leader cut off with writes it never committed
def _reply(conn: RawTcp) -> dict | None:
    """The reply on `conn`, or None if the node closed it or never answered."""
    try:
        return conn.recv()
    except (OSError, ValueError):
        return None


def test_a_leader_cut_off_rolls_back_what_it_never_committed_and_rejoins_with_the_committed_state(tmp_path):
    # election_timeout_ms 2000: the cut-off leader goes on leading, and decides, for ~2 s
    c = Cluster(str(tmp_path), proxied=True, election_timeout_ms=2000, heartbeat_ms=100).start()
    try:
        old = c.wait_serving(60)
        others = [i for i in c.nodes if i != old]
        node = c.nodes[old]
        with QueueClient(node.hosts, timeout=10) as q:
            before = [f"before-{i}" for i in range(100)]
            committed = list(zip(q.produce_batch("split", before), before))
        assert [i for i, _ in committed] == list(range(1, 101))
        for (a, b), proxy in c.proxies.items():
            if old in (a, b):
                proxy.cut()
        # Writes its workers decide but no follower hears of: a batch of produces and an
        # at-most-once consume of ten, each waiting for a quorum that never comes.
        lost = [f"lost-{i}" for i in range(50)]
        producing, consuming = node.connect(timeout=30), node.connect(timeout=30)
        try:
            producing.send({"action": "produce", "queue": "split", "data": lost})
            consuming.send({"action": "consume", "queue": "split", "count": 10})
            wait_for(lambda: _local_size(node, "split") == 140 and c.role(old) == "leader", 10,
                     "the cut-off leader's workers to hold the 50 produced and 10 consumed")
            new = c.wait_leader(timeout=30, among=others, exclude=old)
            wait_for(lambda: c.role(old) not in (None, "leader"), 30, "the cut-off leader to step down")
            # Its workers rolled back to the committed state: no 50 produced, no 10 consumed.
            wait_for(lambda: _local_size(node, "split") == 100, 10, "the old leader's workers to roll back")
            answers = [_reply(producing), _reply(consuming)]
        finally:
            producing.close()
            consuming.close()
        assert all(a is None or a.get("code") != 0 for a in answers), answers  # never acknowledged
        with QueueClient(c.nodes[new].hosts, timeout=10) as q:
            after = [f"after-{i}" for i in range(30)]
            committed += zip(q.produce_batch("split", after), after)  # the ids the lost ones had
        for proxy in c.proxies.values():
            proxy.heal()
        wait_for(lambda: _local_size(node, "split") == 130, 30, "the old leader to follow the new one")
        # Give leadership back to the old leader: with the third node's coordinator stopped, the
        # old leader's log reaches furthest, so the new leader's hand-off picks it.
        third = next(i for i in others if i != new)
        with c.nodes[third].child_stopped("coordinator"):
            with QueueClient(c.nodes[new].hosts, timeout=10) as q:
                late = [f"late-{i}" for i in range(20)]
                committed += zip(q.produce_batch("split", late), late)
            os.kill(c.nodes[new].child_pid("coordinator"), signal.SIGUSR1)
            assert c.wait_leader(timeout=30, among=[old, new], exclude=new) == old, c.describe()
        # What it serves as leader again is the committed state only, ids and bodies.
        got = _drain(node.hosts, "split")
        assert got == committed, [m for m in got if m not in committed][:10] or got[:10]
        assert [i for i, _ in got] == list(range(1, 151))
    finally:
        c.stop()
