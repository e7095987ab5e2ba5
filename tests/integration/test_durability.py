"""Durability on real nodes: kill -9 and restart, snapshots, a corrupt log, a full disk, the data
dir lock, and a whole cluster restarted."""
from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import threading

import orjson
import pytest

from queue_server.client import QueueClient, QueueError
from queue_server.replication import group_marker
from load.procs import process_name
from queue_server.server.node_memory import children
from tests.harness import Cluster, NodeProcess, RawTcp, alive, kill_all, recovery_line, wait_for


_kill_all = kill_all



def _restart(node: NodeProcess) -> NodeProcess:
    fresh = NodeProcess(node.workdir, node.config, name=node.name)
    fresh.log_path = node.log_path
    return fresh.start()


def test_acknowledged_messages_survive_kill_9_with_fsync_always(tmp_path):
    node = NodeProcess(str(tmp_path), {"fsync": "always"}).start()
    acked: list[tuple[str, int]] = []
    stop = threading.Event()

    def produce(t: int) -> None:
        with QueueClient(node.hosts, timeout=2) as q:
            i = 0
            while not stop.is_set():
                data = f"t{t}-{i}"
                try:
                    acked.append((data, q.produce("durable", data, retry=60)))
                except QueueError:
                    return
                i += 1

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(acked) >= 2000, 60, "2000 acknowledged produces")
    finally:
        _kill_all(node)
        stop.set()
        for t in threads:
            t.join()
    node = _restart(node)
    try:
        with QueueClient(node.hosts) as q:
            got = {}
            while True:
                batch = q.consume_batch("durable", 1000)
                if not batch:
                    break
                got.update((m.data, m.msg_id) for m in batch)
            missing = [d for d, _ in acked if d not in got]
            assert not missing, f"{len(missing)} acknowledged messages lost: {missing[:5]}"
            assert all(got[d] == i for d, i in acked)
            new_id = q.produce("durable", "after restart")
            assert new_id > max(i for _, i in acked)  # ids continue, never reused
    finally:
        node.stop()


def test_restart_keeps_ids_times_leases_and_delivery_counts(tmp_path):
    node = NodeProcess(str(tmp_path), {"snapshot_every": 50}).start()
    try:
        _fill_and_lease(node)
    except BaseException:
        node.stop()
        raise
    with QueueClient(node.hosts) as q:
        before = q.monitor("state")
    wait_for(lambda: glob.glob(str(tmp_path / "node-data/snapshots/*.snap")), 10, "a snapshot")
    node.stop()
    # the coordinator recorded the placement of queue groups the data is written with (one group)
    assert orjson.loads((tmp_path / "node-data" / "groups.json").read_bytes()) == group_marker.DEFAULT
    node = _restart(node)
    try:
        with QueueClient(node.hosts) as q:
            after = q.monitor("state")
            for key in ("size", "ready", "delayed", "in_flight", "max_id"):
                assert after[key] == before[key], key
            rest = q.consume_batch("state", 1000)
            assert [m.msg_id for m in rest] == list(range(11, 121))  # leased stay leased, delayed stays delayed
            assert all(m.delivery_count == 1 for m in rest)
            assert q.produce("state", "next") > 121
        # 120 produced, 1 delayed, 5 confirmed: what the node holds once the log after the snapshot is replayed
        assert after["size"] == 116
        recovery_line(node, r"recovered in [\d.]+ s: 1 queue holding 116 messages at trans_id \d+, "
                             r"from a snapshot at trans_id [1-9]\d* and \d+ log records? after it")
    finally:
        node.stop()


def test_the_recovery_line_counts_messages_only_in_the_log(tmp_path):
    node = NodeProcess(str(tmp_path)).start()
    try:
        with QueueClient(node.hosts) as q:
            for i in range(12):
                q.produce("a" if i % 3 else "b", f"m{i}")
            trans_id = q.monitor()["trans_id"]
    finally:
        node.stop()
    assert not glob.glob(str(tmp_path / "node-data/snapshots/*.snap"))  # all of it only in the log
    node = _restart(node)
    try:
        with QueueClient(node.hosts) as q:
            assert (q.monitor("a")["size"], q.monitor("b")["size"]) == (8, 4)
        line = recovery_line(node, r"recovered in [\d.]+ s: 2 queues holding 12 messages at trans_id (\d+), "
                                    r"from (\d+) log records \(no snapshot\)")
        assert int(line[1]) == int(line[2]) == trans_id  # every record the first run wrote
    finally:
        node.stop()


def _fill_and_lease(node: NodeProcess) -> None:
    with QueueClient(node.hosts) as q:
        ids = q.produce_batch("state", [f"m{i}" for i in range(120)], retry=600)
        assert ids == list(range(1, 121))
        assert q.produce("state", "later", delay=3600) == 121
        leased = q.consume_batch("state", 10)
        assert [m.msg_id for m in leased] == ids[:10]
        for m in leased[:5]:
            q.confirm("state", m.msg_id)


def test_torn_tail_is_truncated_and_middle_corruption_stops_the_start(tmp_path):
    node = NodeProcess(str(tmp_path), {"fsync": "always"}).start()
    with QueueClient(node.hosts) as q:
        for i in range(50):
            q.produce("torn", f"m{i}")
    node.stop()
    segment = sorted(glob.glob(str(tmp_path / "node-data/wal/*.log")))[-1]
    size = os.path.getsize(segment)
    with open(segment, "r+b") as f:  # a torn last record
        f.truncate(size - 7)
    node = _restart(node)
    with QueueClient(node.hosts) as q:
        assert q.monitor("torn")["size"] == 49
        q.produce("torn", "again")
    node.stop()
    assert "torn" in node.log().lower() or "truncat" in node.log().lower()
    with open(segment, "r+b") as f:  # a flipped byte in the middle
        f.seek(os.path.getsize(segment) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    broken = NodeProcess(node.workdir, node.config, name="broken")
    broken.start(wait=False)
    assert broken.proc.wait(30) != 0
    assert "offset" in broken.log() and segment.rsplit("/", 1)[1] in broken.log()
    broken.stop()
    repaired = NodeProcess(node.workdir, dict(node.config, repair=True), name="repaired").start()
    try:
        with QueueClient(repaired.hosts) as q:
            assert 0 < q.monitor("torn")["size"] < 50
    finally:
        repaired.stop()


def test_a_damaged_vote_file_stops_the_start_saying_what_to_do(tmp_path):
    node = NodeProcess(str(tmp_path), {"queue_data_dir": str(tmp_path / "data")})
    os.makedirs(tmp_path / "data")
    (tmp_path / "data" / "vote.json").write_text("garbage\n")
    node.start(wait=False)
    try:
        assert node.proc.wait(30) == 1
        assert "Traceback" not in node.log()
        assert f"{tmp_path / 'data' / 'vote.json'} is not a vote state file" in node.log()
        assert "restore it, or delete it if the node may forget its vote" in node.log()
    finally:
        node.stop()


def test_second_node_on_the_same_data_dir_refuses_to_start(tmp_path):
    first = NodeProcess(str(tmp_path)).start()
    try:
        second = NodeProcess(str(tmp_path), {"queue_data_dir": first.config["queue_data_dir"]}, name="second")
        second.start(wait=False)
        assert second.proc.wait(30) != 0
        assert "in use" in second.log()
        second.stop()
        with QueueClient(first.hosts) as q:
            q.produce("lock", "still fine")
    finally:
        first.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_full_disk_refuses_writes_keeps_reads_and_recovers(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True)
    node = None
    try:
        node = NodeProcess(str(tmp_path), {"queue_data_dir": str(mnt / "data"), "fsync": "always"}).start()
        with QueueClient(node.hosts) as q:
            kept = q.produce("full", "before")
            filler = mnt / "filler"
            with open(filler, "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass
            def refused() -> bool:
                try:
                    q.produce("full", "x" * 20000)
                except QueueError as exc:
                    return exc.reason == "storage unavailable"
                return False
            wait_for(refused, 10, "writes to be refused")
            assert q.monitor("full")["size"] >= 1  # reads go on
            os.remove(filler)
            wait_for(lambda: _produces(q), 10, "writes to resume")
        node.stop()
        node = _restart(node)
        with QueueClient(node.hosts) as q:
            first = q.consume("full")
            assert first.msg_id == kept and first.data == "before"
    finally:
        if node is not None:
            node.stop()
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _produces(q: QueueClient) -> bool:
    try:
        q.produce("full", "after")
        return True
    except QueueError:
        return False


def test_whole_cluster_killed_and_restarted(tmp_path):
    c = Cluster(str(tmp_path), fsync="always").start()
    try:
        leader = c.wait_leader()
        with QueueClient(c.hosts) as q:
            ids = q.produce_batch("cluster", [f"m{i}" for i in range(500)], retry=60)
        for node in c.nodes.values():
            _kill_all(node)
        for i, node in list(c.nodes.items()):
            c.nodes[i] = NodeProcess(node.workdir, node.config, name=node.name)
            c.nodes[i].log_path = node.log_path
        c.start()
        c.wait_leader(timeout=30)
        with QueueClient(c.hosts) as q:
            got = q.consume_batch("cluster", 1000)
        assert [m.msg_id for m in got] == ids
        assert leader  # the cluster had one before the crash
    finally:
        c.stop()


def test_restarted_follower_pulls_only_the_gap(tmp_path):
    c = Cluster(str(tmp_path)).start()
    try:
        leader = c.wait_leader()
        follower = next(i for i in c.nodes if i != leader)
        with QueueClient(c.nodes[leader].hosts) as q:
            q.produce_batch("gap", [f"a{i}" for i in range(300)])
        node = c.nodes[follower]

        def has(n: int) -> bool:
            conn = RawTcp(*node.address)
            try:
                return conn.call({"action": 104, "queue": "gap"}).get("size") == n
            finally:
                conn.close()
        wait_for(lambda: has(300), 10, "the follower to replicate")
        node.stop()
        with QueueClient(c.nodes[leader].hosts) as q:
            q.produce_batch("gap", [f"b{i}" for i in range(200)])
        c.nodes[follower] = node = _restart(node)
        wait_for(lambda: has(500), 20, "the follower to catch up")
        # its own log replayed (the 300 messages it had), then only the gap pulled: no snapshot
        recovery_line(node, r"recovered in [\d.]+ s: 1 queue holding 300 messages at trans_id \d+, from \d+ log records "
                             r"\(no snapshot\)")
        log = node.log()
        assert "installed a snapshot" not in log
    finally:
        c.stop()


# ---------------------------------------------------------------------- snapshots made by the workers
_WRITTEN = re.compile(r"snapshot at trans_id (\d+) written")


def _producing(node: NodeProcess, acked: list[tuple[str, int]], stop: threading.Event, threads: int = 3) -> list[threading.Thread]:
    """Threads that produce batches of 50 to queues q0..q5 (spread over the workers) until `stop`,
    noting each acknowledged (data, msg_id)."""
    def produce(t: int) -> None:
        with QueueClient(node.hosts, timeout=5) as q:
            i = 0
            while not stop.is_set():
                data = [f"t{t}-{i}-{k}" for k in range(50)]
                try:
                    ids = q.produce_batch(f"q{(t + i) % 6}", data, retry=600)
                except (QueueError, OSError):
                    return
                acked.extend(zip(data, ids))
                i += 1

    started = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
    for t in started:
        t.start()
    return started


def _all_there(node: NodeProcess, acked: list[tuple[str, int]]) -> None:
    got = set()
    with QueueClient(node.hosts) as q:
        for n in range(6):
            while True:
                batch = q.consume_batch(f"q{n}", 1000)
                if not batch:
                    break
                got.update(m.data for m in batch)
    missing = [d for d, _ in acked if d not in got]
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged messages lost: {missing[:5]}"


def test_writes_made_during_worker_snapshots_survive_kill_9(tmp_path):
    node = NodeProcess(str(tmp_path), {"fsync": "always", "snapshot_every": 2000}).start()
    acked: list[tuple[str, int]] = []
    stop = threading.Event()
    threads = _producing(node, acked, stop)
    try:
        wait_for(lambda: len(acked) >= 20000 and len(_WRITTEN.findall(node.log())) >= 3, 120,
                 "20,000 acknowledged messages and 3 snapshots")
    finally:
        kill_all(node)
        stop.set()
        for t in threads:
            t.join()
    assert "failed" not in node.log(), node.log()
    cut_short = glob.glob(str(tmp_path / "node-data/snapshots/tmp-*"))
    node = _restart(node)
    try:
        _all_there(node, acked)
        recovery_line(node, r"from a snapshot at trans_id [1-9]\d* and \d+ log records? after it")
        assert not [path for path in cut_short if os.path.exists(path)]  # deleted at start
    finally:
        node.stop()


def _writer_of(node: NodeProcess) -> tuple[int, int] | None:
    """(worker pid, its snapshot writer's pid) while a worker has one."""
    for pid in node.child_pids():
        try:
            if process_name(pid).startswith("worker"):
                writers = children(pid)
                if writers:
                    return pid, writers[0]
        except OSError:
            pass
    return None


def test_a_worker_killed_mid_snapshot_loses_nothing_the_old_snapshot_and_the_log_hold(tmp_path):
    node = NodeProcess(str(tmp_path), {"fsync": "always", "snapshot_every": 3000}).start()
    acked: list[tuple[str, int]] = []
    stop = threading.Event()
    threads = _producing(node, acked, stop)
    try:
        wait_for(lambda: _WRITTEN.search(node.log()), 60, "a first snapshot")
        found = wait_for(lambda: _writer_of(node), 60, "a worker writing a snapshot part")
        os.kill(found[0], signal.SIGKILL)  # the worker, while its writer child runs
        wait_for(lambda: not alive(found[1]), 10, "the writer to die with its worker")
    finally:
        stop.set()
        for t in threads:
            t.join()
        kill_all(node)
    newest = max(int(t) for t in _WRITTEN.findall(node.log()))
    cut_short = glob.glob(str(tmp_path / "node-data/snapshots/tmp-*"))
    assert cut_short  # the killed worker's cut
    node = _restart(node)
    try:
        _all_there(node, acked)
        line = recovery_line(node, r"from a snapshot at trans_id (\d+) and \d+ log records? after it")
        assert int(line[1]) >= newest, node.log()
        assert not [path for path in cut_short if os.path.exists(path)]  # deleted at start
    finally:
        node.stop()


def test_a_snapshot_that_does_not_fit_fails_in_one_line_and_writes_go_on(tmp_path):
    data = tmp_path / "data"
    snapshots = data / "snapshots"
    snapshots.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(snapshots)], check=True)
    node = None
    try:
        node = NodeProcess(str(tmp_path), {"queue_data_dir": str(data), "snapshot_every": 500}).start()
        with QueueClient(node.hosts) as q:
            for n in range(10):
                q.produce_batch("big", ["x" * 1000] * 100)
            wait_for(lambda: "could not write its part: No space left on device" in node.log(), 20, "a failed snapshot")
            q.produce_batch("big", ["y"] * 10)
            assert q.monitor("big")["size"] == 1010
        failures = [line for line in node.log().splitlines() if "snapshot" in line and "failed" in line]
        assert all(re.search(r"snapshot at trans_id \d+ failed: worker \d could not write its part: "
                             r"No space left on device; keeping the snapshot at trans_id 0 and the log", f)
                   for f in failures), failures
        assert not os.listdir(snapshots) or all(not n.startswith("snapshot-") for n in os.listdir(snapshots))
        node.stop()
        node = _restart(node)
        with QueueClient(node.hosts) as q:
            assert q.monitor("big")["size"] == 1010
    finally:
        if node is not None:
            node.stop()
        subprocess.run(["umount", "-l", str(snapshots)], check=False)


def test_a_stop_during_a_snapshot_lets_it_finish_and_the_restart_reads_it(tmp_path):
    """SIGTERM while the workers' writers run: the workers wait for them (STOP_WAIT) and the
    coordinator publishes the cut before it exits, instead of losing it with its writers."""
    messages = 150_000
    node = NodeProcess(str(tmp_path), {"queue_size": messages + 1, "snapshot_every": messages}).start()
    try:
        with QueueClient(node.hosts, timeout=60) as q:
            for i in range(0, messages, 5000):
                q.produce_batch("stored", ["x" * 100] * 5000)
        # (On a fast machine the writers may be done before they are seen: then so is the cut.)
        wait_for(lambda: _writer_of(node) or _WRITTEN.search(node.log()), 60, "a worker writing a snapshot part")
    finally:
        node.stop()
    assert _WRITTEN.search(node.log()), node.log()[-2000:]
    node = _restart(node)
    try:
        recovery_line(node, r"from a snapshot at trans_id \d+ and 0 log records after it")
        with QueueClient(node.hosts, timeout=30) as q:
            assert q.monitor("stored")["size"] == messages
    finally:
        node.stop()
