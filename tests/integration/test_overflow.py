"""Bodies past overflow_mb go to disk and come back (issue 26), through the TCP protocol on a
real node: in order and whole, across a restart and a kill -9; the segments go once their
messages are consumed; a full overflow disk refuses the produces that need it, naming the disk,
and loses nothing; an overflow_dir that cannot be made stops the start in one line."""
from __future__ import annotations

import glob
import os
import random
import re
import subprocess
import sys

import pytest

from queue_server.workers.overflow import ROTATE_EMPTY
from tests.harness import Cluster, NodeProcess, free_port, kill_all, recovery_line, wait_for

N = 300
SIZE = 8000  # 300 x 8 KB: 2.4 MB, past a 1 MiB budget


def bodies(seed: int, n: int = N) -> list[str]:
    rng = random.Random(seed)
    return [f"{i:05d}:" + "".join(rng.choice("abcdefgh") for _ in range(16)) * (SIZE // 16) + "é"
            for i in range(n)]


def produce_all(node: NodeProcess, queue: str, data: list[str]) -> None:
    c = node.connect()
    try:
        for k in range(0, len(data), 30):
            reply = c.call({"action": "produce", "queue": queue, "data": data[k:k + 30]})
            assert reply["code"] == 0, str(reply)
    finally:
        c.close()


def consume_all(node: NodeProcess, queue: str, n: int) -> list[str]:
    c = node.connect()
    got: list[str] = []
    try:
        while len(got) < n:
            reply = c.call({"action": "consume", "queue": queue, "count": 40})
            assert reply["code"] == 0, str(reply)
            assert reply.get("messages"), f"{len(got)} of {n} came back"
            got += [m["data"] for m in reply["messages"]]
    finally:
        c.close()
    return got


def segments(node: NodeProcess) -> dict[str, int]:
    where = os.path.join(node.config["queue_data_dir"], "overflow", "worker-0")
    return {name: os.path.getsize(os.path.join(where, name)) for name in os.listdir(where)
            if name.startswith("seg-")}


def test_bodies_overflow_to_disk_and_come_back_in_order(tmp_path):
    node = NodeProcess(str(tmp_path), {"overflow_mb": 1, "workers": 1}).start(serving=True)
    try:
        data = bodies(1)
        produce_all(node, "big", data)
        assert sum(segments(node).values()) > 1_000_000  # most of it on disk
        peek = node.connect().call({"action": "peek", "queue": "big", "count": 200})
        assert [m["data"] for m in peek["messages"]] == data[:len(peek["messages"])]
        assert consume_all(node, "big", N) == data
        # Memory is free again: new bodies stay there; the emptied segment goes.
        produce_all(node, "small", ["x"] * 10)
        wait_for(lambda: not segments(node), what="the emptied segment deleted")
    finally:
        node.stop()


@pytest.mark.parametrize("how", ["restart", "kill -9", "from a snapshot"])
def test_overflowed_bodies_survive_a_restart(tmp_path, how):
    config = {"overflow_mb": 1, "workers": 1, "fsync": "always"}
    if how == "from a snapshot":  # the workers' snapshot parts refer to the overflowed bodies
        config["snapshot_every"] = 100
    node = NodeProcess(str(tmp_path), config).start(serving=True)
    data = bodies(2)
    try:
        produce_all(node, "big", data)
        assert segments(node)
        if how == "from a snapshot":
            wait_for(lambda: glob.glob(str(tmp_path / "node-data/snapshots/*.snap")), 10, "a snapshot")
    finally:
        if how == "kill -9":
            kill_all(node)
        else:
            node.stop()
    node.start(serving=True)
    try:
        if how == "from a snapshot":
            recovery_line(node, r"from a snapshot at trans_id [1-9]")
        # The restarted node applies its budget again: most bodies are on disk.
        monitor = node.connect().call({"action": "monitor", "queue": "big"})
        assert monitor["size"] == N and monitor["overflowed"] > N // 2, monitor
        assert consume_all(node, "big", N) == data
    finally:
        node.stop()


def test_a_full_overflow_disk_refuses_produces_naming_it_and_loses_nothing(tmp_path):
    where = tmp_path / "small-disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs here: {mounted.stderr.strip()}")
    node = NodeProcess(str(tmp_path), {"overflow_mb": 1, "workers": 1, "overflow_dir": str(where)})
    try:
        node.start(serving=True)
        data = bodies(3, 400)  # 3.2 MB: 1 MiB in memory, 1 MiB on disk, the rest refused
        c = node.connect()
        stored, refused = [], []
        for d in data:
            reply = c.call({"action": "produce", "queue": "big", "data": d})
            if reply["code"] == 0:
                stored.append(d)
            else:
                refused.append(reply["reason"])
        assert refused and len(stored) > 200
        assert set(refused) == {f"overflow disk full: {where / 'worker-0'}"}
        c.close()
        assert consume_all(node, "big", len(stored)) == stored  # every acknowledged body, whole
        assert f"overflow disk full: {where / 'worker-0'}: produces that need it are refused" in node.log()
        # Room again: produces go.
        produce_all(node, "big", data[:50])
        assert consume_all(node, "big", 50) == data[:50]
    finally:
        node.stop()
        subprocess.run(["umount", str(where)], capture_output=True)


def start_error(tmp_path, overflow_dir) -> list[str]:
    """The lines a node with `overflow_dir` that cannot start prints (exit status 1)."""
    config = tmp_path / "refused.json"
    config.write_text(f'{{"port": {free_port()}, "http_port": 0, "workers": 1, '
                      f'"queue_data_dir": "{tmp_path / "refused-data"}", "overflow_dir": "{overflow_dir}"}}')
    proc = subprocess.run([sys.executable, "-P", "-m", "queue_server.server.main", "--config", str(config)],
                          capture_output=True, text=True, timeout=30)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out, out
    return out.strip().splitlines()


def newest_part(tmp_path) -> tuple[str, dict]:
    """The path and manifest entry of the newest snapshot's (only) part."""
    from queue_server.replication.snapshot import latest_manifest
    found = latest_manifest(str(tmp_path / "node-data/snapshots"))
    assert found is not None and found.parts
    return found.parts[0], found.entries[0]


def test_a_snapshot_refers_to_the_segments_and_a_kill_after_it_loses_nothing(tmp_path):
    """The snapshot part holds the overflowed bodies as references (REFS frames) to segment
    files linked beside it, not the bodies; a kill -9 after more produces (in the log only) and
    a restart give every acknowledged body back, the loaded ones still on disk; once consumed,
    the segments the worker took from the snapshot go."""
    from queue_server.protocol.snapshot_frames import REFS, rows_count
    from queue_server.replication.snapshot import iter_frames
    config = {"overflow_mb": 1, "workers": 1, "fsync": "always", "snapshot_every": 100}
    node = NodeProcess(str(tmp_path), config).start(serving=True)
    data, more = bodies(7), bodies(8, 40)
    try:
        produce_all(node, "big", data)

        def covered() -> bool:  # more records (small ones) until a cut comes after every body
            produce_all(node, "tick", ["t"] * 5)
            return bool(glob.glob(str(tmp_path / "node-data/snapshots/*.snap"))) and newest_part(tmp_path)[1]["messages"] > N
        wait_for(covered, 20, "a snapshot of every body")
        part, entry = newest_part(tmp_path)
        refs = sum(rows_count(body) for kind, _, body in iter_frames(part) if kind == REFS)
        # Every body past the 1 MiB in memory is a reference, not in the part.
        assert refs >= N - (1 << 20) // SIZE, entry
        assert entry["bytes"] < (1 << 20) + SIZE * 10
        assert entry["segments"] and all(os.path.exists(f"{part}.seg-{seg}") for seg, _ in entry["segments"])
        produce_all(node, "big", more)  # after the snapshot: only in the log
    finally:
        kill_all(node)
    node.start(serving=True)
    try:
        monitor = node.connect().call({"action": "monitor", "queue": "big"})
        assert monitor["size"] == N + 40 and monitor["overflowed"] > N // 2, monitor
        assert consume_all(node, "big", N + 40) == data + more
        node.connect().call({"action": "purge", "queue": "tick"})
        # What is left is at most the current segment, under ROTATE_EMPTY: kept for new bodies.
        wait_for(lambda: len(segments(node)) <= 1 and sum(segments(node).values()) < ROTATE_EMPTY,
                 what="the loaded segments deleted once consumed")
    finally:
        node.stop()


def test_a_snapshot_whose_segment_is_missing_is_skipped_naming_it(tmp_path):
    """A segment file a snapshot relies on, deleted: the node says so in one line and does not
    load that snapshot (it falls back to an older one)."""
    config = {"overflow_mb": 1, "workers": 1, "snapshot_every": 100}
    node = NodeProcess(str(tmp_path), config).start(serving=True)
    try:
        produce_all(node, "big", bodies(9))
        wait_for(lambda: glob.glob(str(tmp_path / "node-data/snapshots/*.snap")), 10, "a snapshot")
    finally:
        node.stop()
    part, entry = newest_part(tmp_path)
    missing = f"{part}.seg-{entry['segments'][0][0]}"
    os.remove(missing)
    node.start()
    try:
        wait_for(lambda: f"overflow segment {missing} is missing" in node.log(), 30, "the line naming it")
    finally:
        node.stop()


def test_an_overflow_dir_that_cannot_be_made_stops_the_start_in_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert start_error(tmp_path, blocker / "ov") == [
        f"queue-server: config key 'overflow_dir': cannot create '{blocker / 'ov'}': Not a directory"]


def test_a_cluster_overflows_on_every_node_and_a_new_leader_delivers_every_body(tmp_path):
    """Followers apply the same rule with their own budget; the leader is killed (-9) with most
    bodies on disk, and the new one delivers them all, in order."""
    c = Cluster(str(tmp_path), overflow_mb=1, workers=1, fsync="always").start()
    try:
        leader = c.wait_leader()
        data = bodies(4)
        produce_all(c.nodes[leader], "big", data)

        def overflowed(i: int) -> int:
            reply = c.ask(i, {"action": 104, "queue": "big"})
            return reply.get("overflowed", 0) if reply and reply.get("size") == N else 0
        for i in c.nodes:
            wait_for(lambda: overflowed(i) > N // 2, 20, f"node {i} to overflow its copy")
        kill_all(c.nodes[leader])
        new = c.wait_leader(timeout=30, among=[i for i in c.nodes if i != leader], exclude=leader)
        assert consume_all(c.nodes[new], "big", N) == data
    finally:
        c.stop()


def test_two_nodes_cannot_share_an_overflow_dir(tmp_path):
    shared = tmp_path / "shared-overflow"
    first = NodeProcess(str(tmp_path), {"overflow_dir": str(shared), "workers": 1}, name="first").start(serving=True)
    try:
        worker = first.child_pid("worker")
        assert start_error(tmp_path, shared) == [
            f"queue-server: config key 'overflow_dir': {shared / 'worker-0'} is in use by another node "
            f"(pid {worker}); give each node its own"]
    finally:
        first.stop()


def test_a_follower_far_behind_gets_a_snapshot_and_overflows_what_it_loads(tmp_path):
    """The leader's snapshot refers to its overflow segments, which are streamed with the parts;
    the follower that LOADs it keeps those bodies on disk (its own budget for the rest), and can
    lead with every body."""
    # Small WAL segments, so that the snapshots remove those the follower would need: a follower
    # older than the leader's WAL gets a snapshot (one within it is fed from the WAL).
    c = Cluster(str(tmp_path), overflow_mb=1, workers=1, queue_log_size=100, snapshot_every=100,
                wal_segment_bytes=32768).start()
    try:
        leader = c.wait_leader()
        follower = next(i for i in c.nodes if i != leader)
        c.nodes[follower].stop()
        data = bodies(5)
        produce_all(c.nodes[leader], "big", data)  # 300 records: past the 100 of the log
        c.nodes[follower].start()

        def overflowed() -> int:
            reply = c.ask(follower, {"action": 104, "queue": "big"})
            return reply.get("overflowed", 0) if reply and reply.get("size") == N else 0
        wait_for(lambda: overflowed() > N // 2, 30, "the follower to load the snapshot and overflow it")
        assert "installed a snapshot" in c.nodes[follower].log()
        kill_all(c.nodes[leader])
        new = c.wait_leader(timeout=30, among=[i for i in c.nodes if i != leader], exclude=leader)
        assert consume_all(c.nodes[new], "big", N) == data
    finally:
        c.stop()
