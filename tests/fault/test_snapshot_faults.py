"""Fault tests of the snapshots the workers make (docs/plans/one-copy.md, issue 25): kill -9 of a
snapshot writer, of a worker and of the whole node while a cut runs, then a restart that recovers
every acknowledged message from the older snapshot and the log; a follower far behind that
catches up by a chunked snapshot transfer and then serves every message exactly as produced; and
a leader cut off with writes it never committed, whose workers roll them back, so that they
appear nowhere once it rejoins and leads again. Everything is checked through the wire: client
replies, local monitors answered by the node itself, processes and log lines."""
from __future__ import annotations

import os
import re
import signal
import threading
import time

from load.procs import signal_each
from queue_server.client import QueueClient, QueueError
from tests.harness import Cluster, NodeProcess, RawTcp, alive, kill_all, process_state, wait_for
from tests.integration.test_durability import _restart, _writer_of


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
    furthest, the lower id on a tie: the caller makes sure that is `target` once every log is
    level."""
    c.wait_level(leader)
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


# ------------------------------------------------------------ kill -9 while the workers write a cut
_WRITTEN = re.compile(r"snapshot at trans_id (\d+) written")
_RECOVERED = re.compile(r"from a snapshot at trans_id (\d+) and \d+ log records? after it")
QUEUES = [f"q{n}" for n in range(6)]  # spread over both workers


class Producers:
    """Threads producing batches of 50 to QUEUES until stopped, noting every body attempted and
    every (body, msg_id) acknowledged."""

    def __init__(self, node: NodeProcess, threads: int = 3) -> None:
        self.node = node
        self.attempted: set[str] = set()
        self.acked: list[tuple[str, int]] = []
        self.highest: dict[str, int] = {}  # each queue's highest acknowledged msg_id
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(t,)) for t in range(threads)]

    def fill(self, queue: str, n: int) -> "Producers":
        """First `n` messages into `queue`, 1,000 a request (a state whose cut takes a while)."""
        with QueueClient(self.node.hosts, timeout=60) as q:
            for start in range(0, n, 1000):
                data = [f"{queue}-{i}" for i in range(start, start + 1000)]
                self.attempted.update(data)
                ids = q.produce_batch(queue, data, retry=600)
                self.acked.extend(zip(data, ids))
                self.highest[queue] = max(ids)
        return self

    def start(self) -> "Producers":
        for t in self.threads:
            t.start()
        return self

    def _run(self, t: int) -> None:
        with QueueClient(self.node.hosts, timeout=5) as q:
            i = 0
            while not self.stopping.is_set():
                data = [f"t{t}-{i}-{k}" for k in range(50)]
                self.attempted.update(data)
                try:
                    queue = QUEUES[(t + i) % len(QUEUES)]
                    ids = q.produce_batch(queue, data, retry=600)
                except (QueueError, OSError):
                    return
                self.acked.extend(zip(data, ids))
                with self.lock:
                    self.highest[queue] = max(self.highest.get(queue, 0), *ids)
                i += 1

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            if t.is_alive():
                t.join()

    def check(self, node: NodeProcess, queues: list[str]) -> None:
        """Every acknowledged message is in `node` once, with the id it was acknowledged with, and
        nothing is there that was never produced."""
        got: dict[str, int] = {}
        twice = []
        for name in queues:
            for msg_id, data in _drain(node.hosts, name):
                if data in got:
                    twice.append(data)
                got[data] = msg_id
        lost = [(d, i) for d, i in self.acked if d not in got]
        assert not lost, f"{len(lost)} of {len(self.acked)} acknowledged messages lost: {lost[:5]}"
        moved = [(d, i, got[d]) for d, i in self.acked if got[d] != i]
        assert not moved, f"{len(moved)} messages came back with other ids (body, acked, now): {moved[:5]}"
        assert not twice, f"{len(twice)} messages there twice: {twice[:5]}"
        phantom = set(got) - self.attempted
        assert not phantom, f"never produced: {sorted(phantom)[:5]}"


def _writer_stopped(node: NodeProcess) -> tuple[int, int] | None:
    """(worker pid, writer pid) of a snapshot writer child now stopped (SIGSTOP) in the middle of
    its part: it cannot finish before the test kills something. None if no writer runs now."""
    found = _writer_of(node)
    if found is None:
        return None
    try:
        os.kill(found[1], signal.SIGSTOP)
        wait_for(lambda: process_state(found[1]) in ("T", "Z"), 5, "the writer to stop")
        return found if process_state(found[1]) == "T" else None  # else it had just finished
    except OSError:
        return None


def _node_with_a_cut_running(tmp_path) -> tuple[NodeProcess, Producers, tuple[int, int]]:
    """A node (fsync always, a cut every 3,000 records) holding 100k messages while producers
    go on, after its first snapshot, and one of its workers' writers stopped mid-part."""
    node = NodeProcess(str(tmp_path), {"fsync": "always", "snapshot_every": 3000, "queue_size": 200000}).start()
    work = Producers(node)
    try:
        work.fill("bulk", 100_000).start()
        wait_for(lambda: _WRITTEN.search(node.log()), 120, "a first snapshot")
        writer = wait_for(lambda: _writer_stopped(node), 120, "a worker writing a snapshot part")
    except BaseException:
        work.stop()
        node.stop()
        raise
    return node, work, writer  # type: ignore[return-value]


def _recovery_line(log: str) -> str | None:
    """The node's recovery line, once it is whole in `log` (read once: a line read while it is
    written is not yet whole)."""
    lines = [line for line in log.splitlines(keepends=True) if "recovered in" in line and line.endswith("\n")]
    return lines[-1] if lines else None


def _restart_and_check(node: NodeProcess, work: Producers, newest: int) -> None:
    """kill -9 of the node, a restart, and every acknowledged message back, from the snapshot at
    `newest` (or a newer one) and the log after it."""
    cut_short = [p for p in os.listdir(os.path.join(node.config["queue_data_dir"], "snapshots")) if p.startswith("tmp-")]
    earlier = len(node.log())
    node = _restart(node)
    try:
        line = wait_for(lambda: _recovery_line(node.log()[earlier:]), 60, "the recovery line")
        found = _RECOVERED.search(line)
        assert found is not None and int(found[1]) >= newest, node.log()[earlier:]
        work.check(node, ["bulk", *QUEUES])
        assert not [p for p in cut_short if os.path.exists(os.path.join(node.config["queue_data_dir"], "snapshots", p))]
        with QueueClient(node.hosts) as q:  # ids go on after the highest acknowledged ones
            for queue, highest in work.highest.items():
                assert q.produce(queue, "after") > highest, queue
    finally:
        node.stop()


def test_a_snapshot_writer_killed_fails_its_cut_in_one_line_the_node_goes_on_and_loses_nothing(tmp_path):
    node, work, (worker, writer) = _node_with_a_cut_running(tmp_path)
    try:
        os.kill(writer, signal.SIGKILL)
        failed = wait_for(lambda: re.search(
            r"snapshot at trans_id \d+ failed: worker \d could not write its part: its writer was killed by "
            r"signal 9; keeping the snapshot at trans_id (\d+) and the log", node.log()), 30, "the cut to fail")
        assert int(failed[1]) == max(int(t) for t in _WRITTEN.findall(node.log()[:failed.start()]))
        # the node goes on: the same worker, writes acknowledged, and the next cut written
        written = len(_WRITTEN.findall(node.log()))
        acked = len(work.acked)
        wait_for(lambda: len(_WRITTEN.findall(node.log())) > written and len(work.acked) > acked + 1000, 120,
                 "a later snapshot and more writes")
        assert alive(worker) and node.proc.poll() is None
    finally:
        work.stop()
        kill_all(node)
    _restart_and_check(node, work, max(int(t) for t in _WRITTEN.findall(node.log())))


def test_a_worker_killed_while_it_writes_a_cut_loses_nothing_the_older_snapshot_and_the_log_hold(tmp_path):
    node, work, (worker, writer) = _node_with_a_cut_running(tmp_path)
    newest = max(int(t) for t in _WRITTEN.findall(node.log()))
    try:
        os.kill(worker, signal.SIGKILL)
        os.kill(writer, signal.SIGCONT)  # to die of the SIGTERM its worker's death sent it
        wait_for(lambda: not alive(writer), 10, "the writer to die with its worker")
    finally:
        work.stop()
        kill_all(node)
    assert max(int(t) for t in _WRITTEN.findall(node.log())) == newest  # the cut was not published
    _restart_and_check(node, work, newest)


def test_a_node_killed_while_its_workers_write_a_cut_recovers_from_the_older_snapshot_and_the_log(tmp_path):
    node, work, (_, writer) = _node_with_a_cut_running(tmp_path)
    newest = max(int(t) for t in _WRITTEN.findall(node.log()))
    try:
        signal_each([writer, *node.pids()], signal.SIGKILL)  # the whole node, its writers with it
        node.proc.wait(10)
    finally:
        work.stop()
        kill_all(node)
    assert any(p.startswith("tmp-") for p in os.listdir(os.path.join(node.config["queue_data_dir"], "snapshots")))
    assert max(int(t) for t in _WRITTEN.findall(node.log())) == newest  # the cut was not published
    _restart_and_check(node, work, newest)


# --------------------------------------------------------------- a follower far behind, by snapshot
BEHIND = int(os.environ.get("SNAPSHOT_FAULT_BEHIND", "300000"))
BEHIND_QUEUES = 4  # spread over both workers of each node


def _body(queue: int, i: int) -> str:
    return f"q{queue}-{i}-" + "é\u20ac"[i % 2] + "x" * (i % 7)


def test_a_follower_far_behind_catches_up_by_snapshot_and_serves_every_message_as_produced(tmp_path):
    per_queue = BEHIND // BEHIND_QUEUES
    # election_timeout_ms 3000: a drain of 300k at-most-once consumes on a loaded machine must
    # not see a leader deposed by a late heartbeat (its replies would be lost with the messages).
    # snapshot_every: every group's leader cuts snapshots (and drops the log before them) well
    # before the follower is back, however the queues fall into groups (with queue_groups 3, a
    # group of ~100k records at the default 100,000 sometimes had none: caught up by log)
    c = Cluster(str(tmp_path), queue_log_size=5000, queue_size=per_queue + 2, election_timeout_ms=3000,
                heartbeat_ms=100, snapshot_every=max(BEHIND // 10, 1000)).start()
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
        # the log goes on after the installed snapshot
        with QueueClient(c.nodes[leader].hosts, timeout=30) as q:
            produced["far0"].append((q.produce("far0", "after the snapshot"), "after the snapshot"))
        wait_for(lambda: _local_size(node, "far0") == per_queue + 1, 30, f"node {behind} to replicate after the snapshot")
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
        split = c.in_first_group("split")  # (with queue groups, a queue the leader leads)
        others = [i for i in c.nodes if i != old]
        node = c.nodes[old]
        with QueueClient(node.hosts, timeout=10) as q:
            before = [f"before-{i}" for i in range(100)]
            committed = list(zip(q.produce_batch(split, before), before))
        assert [i for i, _ in committed] == list(range(1, 101))
        for (a, b), proxy in c.proxies.items():
            if old in (a, b):
                proxy.cut()
        # Writes its workers decide but no follower hears of: a batch of produces (ids 101-180,
        # more than the cluster will commit after them) and an at-most-once consume of ten, each
        # waiting for a quorum that never comes.
        lost = [f"lost-{i}" for i in range(80)]
        producing, consuming = node.connect(timeout=30), node.connect(timeout=30)
        try:
            producing.send({"action": "produce", "queue": split, "data": lost})
            consuming.send({"action": "consume", "queue": split, "count": 10})
            wait_for(lambda: _local_size(node, split) == 170 and c.role(old) == "leader", 10,
                     "the cut-off leader's workers to hold the 80 produced and 10 consumed")
            new = c.wait_leader(timeout=30, among=others, exclude=old)
            wait_for(lambda: c.role(old) not in (None, "leader"), 30, "the cut-off leader to step down")
            # Its workers rolled back to the committed state: no 80 produced, no 10 consumed.
            wait_for(lambda: _local_size(node, split) == 100, 10, "the old leader's workers to roll back")
            answers = [_reply(producing), _reply(consuming)]
        finally:
            producing.close()
            consuming.close()
        print(f"the cut-off leader answered its uncommitted produce and consume with {answers}")
        assert all(a is None or a.get("code") != 0 for a in answers), answers  # never acknowledged
        with QueueClient(c.nodes[new].hosts, timeout=10) as q:
            after = [f"after-{i}" for i in range(30)]
            committed += zip(q.produce_batch(split, after), after)  # the ids the lost ones had
        for proxy in c.proxies.values():
            proxy.heal()
        wait_for(lambda: _local_size(node, split) == 130, 30, "the old leader to follow the new one")
        # Give leadership back to the old leader: with the third node's coordinator stopped, the
        # old leader's log reaches furthest, so the new leader's hand-off picks it.
        third = next(i for i in others if i != new)
        with c.nodes[third].child_stopped("coordinator"):
            with QueueClient(c.nodes[new].hosts, timeout=10) as q:
                late = [f"late-{i}" for i in range(20)]
                committed += zip(q.produce_batch(split, late), late)
            os.kill(c.nodes[new].child_pid("coordinator"), signal.SIGUSR1)
            assert c.wait_leader(timeout=30, among=[old, new], exclude=new) == old, c.describe()
        # What it serves as leader again is the committed state only, ids and bodies.
        got = _drain(node.hosts, split)
        assert got == committed, [m for m in got if m not in committed][:10] or got[:10]
        assert [i for i, _ in got] == list(range(1, 151))
        with QueueClient(node.hosts, timeout=10) as q:  # its ids go on from the committed ones
            assert q.produce(split, "again") == 151
    finally:
        c.stop()
