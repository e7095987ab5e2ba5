"""Fault tests on real 3-node clusters: kill -9 of the leader under load, a paused leader, the
leader cut off from both followers, a follower left far behind, simultaneous starts. Each checks
the workload's history (tests/fault/history.py)."""
from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.request

import pytest

from queue_server.client import QueueClient, QueueError
from queue_server.client import protocol as client_protocol
from queue_server.server.forwarding import FORWARD_GRACE
from tests.fault.history import History, Workload, drain, wait_acks
from tests.harness import Cluster, RawTcp, alive, can_connect, free_port, wait_for


@pytest.fixture
def cluster(tmp_path):
    clusters = []

    def make(metrics: bool = False, **kw) -> Cluster:
        """Start a cluster; with `metrics`, every node serves /metrics on a port of its own."""
        c = Cluster(str(tmp_path / f"c{len(clusters)}"), **kw)
        os.makedirs(c.workdir, exist_ok=True)
        if metrics:
            for node in c.nodes.values():
                node.config["metrics_port"] = free_port()
        clusters.append(c)
        return c.start()

    yield make
    for c in clusters:
        c.stop()


def _scrape(node) -> dict[str, float]:
    """The node's metrics (sample name with its labels -> value)."""
    url = f"http://{node.config['host']}:{node.config['metrics_port']}/metrics"
    with urllib.request.urlopen(url, timeout=2) as r:
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def _leader_term(node, timeout: float = 10.0) -> int:
    """The election term (vote_id) `node` leads in (with queue groups, in group 0, which
    Cluster.wait_leader names the leader of), from its metrics: waits until they say it leads
    (published about once a second; the term is published before the role)."""
    grouped = node.config.get("queue_groups", 1) > 1

    def of_group_0(sample: str, name: str) -> bool:
        return sample.split("{")[0] == name and (not grouped or 'group="0"' in sample)

    def leading() -> int | None:
        m = _scrape(node)
        if not any(of_group_0(k, "queue_server_role") and 'role="leader"' in k and v == 1 for k, v in m.items()):
            return None
        return next(int(v) for k, v in m.items() if of_group_0(k, "queue_server_term"))
    return wait_for(leading, timeout, f"{node.name}'s metrics to say it leads")



def test_kill_leader_under_load(cluster):
    c = cluster(metrics=True)
    leader = c.wait_leader()
    old_term = _leader_term(c.nodes[leader])
    history = History()
    work = Workload(c.hosts, history).start()
    try:
        wait_acks(history, 200)
        pids = c.nodes[leader].pids()
        committed = wait_for(lambda: c.ask(leader, {"action": 104}), 5, "the leader's monitor")["commit_trans_id"]
        c.nodes[leader].signal_all(signal.SIGKILL)
        killed_at = time.monotonic()
        survivors = [i for i in c.nodes if i != leader]
        new_leader = c.wait_leader(among=survivors, exclude=leader)
        print(f"new leader {new_leader} {time.monotonic() - killed_at:.3f} s after kill -9 of {leader}")
        # the old leader is really gone: every process of it, and its client port
        wait_for(lambda: not any(alive(pid) for pid in pids), 10, f"every process of node {leader} to die")
        assert not can_connect(*c.nodes[leader].address)
        # a new term, and a log holding every record the old leader had committed before the kill
        new_term = _leader_term(c.nodes[new_leader])
        assert new_term > old_term, f"node {new_leader} leads in term {new_term}, node {leader} led in {old_term}"
        last = wait_for(lambda: c.ask(new_leader, {"action": 104}), 5, "the new leader's monitor")["trans_id"]
        assert last >= committed, f"the new leader's log ends at {last}, before the old commit point {committed}"
        wait_acks(history, 200)
    finally:
        work.stop()
    drain(",".join(c.nodes[i].hosts for i in survivors), history)
    history.check()


def test_paused_leader_steps_down_and_no_two_leaders_accept_writes(cluster):
    c = cluster()
    leader = c.wait_leader()
    history = History()
    work = Workload(c.hosts, history).start()
    try:
        wait_acks(history, 100)
        c.nodes[leader].signal_all(signal.SIGSTOP)
        paused_at = time.monotonic()
        others = [i for i in c.nodes if i != leader]
        new_leader = c.wait_leader(among=others, exclude=leader)
        print(f"new leader {new_leader} {time.monotonic() - paused_at:.3f} s after pausing {leader}")
        wait_acks(history, 100)
        c.nodes[leader].signal_all(signal.SIGCONT)
        wait_for(lambda: c.role(leader) == "follower", 15, "the old leader to step down")
        assert c.wait_leader() == new_leader
        wait_acks(history, 100)
    finally:
        c.nodes[leader].signal_all(signal.SIGCONT)
        work.stop()
    drain(c.hosts, history)
    history.check()


def test_leader_cut_off_from_both_followers(cluster):
    c = cluster(proxied=True)
    leader = c.wait_leader()
    history = History()
    work = Workload(c.hosts, history).start()
    others = [i for i in c.nodes if i != leader]
    try:
        wait_acks(history, 100)
        for (a, b), proxy in c.proxies.items():
            if leader in (a, b):
                proxy.cut()
        c.wait_leader(among=others, exclude=leader)  # the other two elect one of themselves
        wait_for(lambda: c.role(leader) != "leader", 10, "the cut-off leader to step down")
        isolated = RawTcp(*c.nodes[leader].address)
        try:
            r = isolated.call({"action": 1, "queue": "alo", "data": "isolated"})
        finally:
            isolated.close()
        assert r["code"] == -1, r
        wait_acks(history, 100)
        for proxy in c.proxies.values():
            proxy.heal()
        assert c.wait_leader(timeout=20) in others
        wait_acks(history, 100)
    finally:
        for proxy in c.proxies.values():
            proxy.heal()
        work.stop()
    drain(c.hosts, history)
    history.check()


def _behind_and_back(c: Cluster, how: str) -> tuple[int, int]:
    """Stop a follower, produce 3000 messages (30 batches of 100) to queue "behind", start it
    again and wait until it holds them all: (leader, follower)."""
    leader = c.wait_leader()
    follower = next(i for i in c.nodes if i != leader)
    c.nodes[follower].stop()
    with QueueClient(c.nodes[leader].hosts) as q:
        for i in range(30):
            q.produce_batch("behind", [f"m{i}-{j}" for j in range(100)], retry=30)
        size = q.monitor("behind")["size"]
    assert size == 3000
    started = time.monotonic()
    c.nodes[follower].start()

    def caught_up() -> bool:
        conn = RawTcp(*c.nodes[follower].address)
        try:
            r = conn.call({"action": 104, "queue": "behind"})
        finally:
            conn.close()
        return r.get("size") == 3000
    wait_for(caught_up, 30, "the restarted follower to catch up")
    print(f"follower {follower} caught up 3000 messages past a 500-record log {how} in "
          f"{time.monotonic() - started:.3f} s")
    return leader, follower


def _log_of(node) -> str:
    with open(node.log_path) as f:
        return f.read()


def test_follower_far_behind_catches_up_by_snapshot(cluster):
    """Behind the log and older than the WAL (snapshots every 500 records remove the small
    segments they cover), the follower gets a snapshot."""
    c = cluster(queue_log_size=500, snapshot_every=500, wal_segment_bytes=32768)
    leader, follower = _behind_and_back(c, "by a snapshot")
    assert "installed a snapshot from the leader" in _log_of(c.nodes[follower])
    # the follower's copy is a real one: it can lead
    c.nodes[leader].signal_all(signal.SIGKILL)
    rest = [i for i in c.nodes if i != leader]
    new_leader = c.wait_leader(among=rest, exclude=leader)
    with QueueClient(c.nodes[new_leader].hosts) as q:
        got = q.consume_batch("behind", 1000)
    assert len(got) == 1000 and got[0].data == "m0-0"


def test_follower_behind_the_log_but_within_the_wal_catches_up_from_the_wal(cluster):
    """Behind the 500-record log but within the WAL (no snapshot yet), the follower is fed
    batches the leader reads from its WAL: no snapshot is cut or installed, and every message
    comes back as produced, in order, from a leader the caught-up follower could be."""
    c = cluster(queue_log_size=500)
    leader, follower = _behind_and_back(c, "from the WAL")
    assert "installed a snapshot" not in _log_of(c.nodes[follower])
    assert "snapshot at trans_id" not in _log_of(c.nodes[leader])  # none cut for it
    c.nodes[leader].signal_all(signal.SIGKILL)
    rest = [i for i in c.nodes if i != leader]
    new_leader = c.wait_leader(among=rest, exclude=leader)
    got = []
    with QueueClient(c.nodes[new_leader].hosts) as q:
        while len(got) < 3000:
            batch = q.consume_batch("behind", 1000)
            assert batch, f"only {len(got)} of 3000 messages came back"
            got += [m.data for m in batch]
    assert got == [f"m{i}-{j}" for i in range(30) for j in range(100)]


def test_an_in_memory_follower_far_behind_gets_a_snapshot_its_leader_cuts_for_it(cluster):
    """An in_memory leader keeps no snapshots: it has its workers cut one into its run dir for
    the follower, and streams that."""
    c = cluster(queue_log_size=200, in_memory=True)
    leader = c.wait_leader()
    follower = next(i for i in c.nodes if i != leader)
    c.nodes[follower].stop()
    with QueueClient(c.nodes[leader].hosts) as q:
        for i in range(5):
            q.produce_batch("far", [f"{i}-{j}" for j in range(100)])
    c.nodes[follower].start()

    def size() -> int | None:
        conn = RawTcp(*c.nodes[follower].address)
        try:
            return conn.call({"action": 104, "queue": "far"}).get("size")
        finally:
            conn.close()
    wait_for(lambda: size() == 500, 30, "the restarted follower to catch up")
    with open(c.nodes[follower].log_path) as f:
        assert re.search(r"installed a snapshot from the leader at trans_id \d+ \(2 parts, 500 messages\)", f.read())


def test_no_majority_answers_no_leader(cluster):
    c = cluster()
    leader = c.wait_leader()
    for i in c.nodes:
        if i != leader:
            c.nodes[i].stop()
    conn = RawTcp(*c.nodes[leader].address)
    try:
        def refused() -> bool:  # (with queue groups, once it knows no leader of q's group nor group 0)
            r = conn.call({"action": 1, "queue": "q", "data": "x"})
            return r["code"] == -1 and "leader" in r["reason"] and conn.call({"action": 8})["code"] == -1
        wait_for(refused, 10, "the lone node to refuse writes")
        for req in ({"action": 2, "queue": "q"}, {"action": 3, "queue": "q", "msg_id": 1}, {"action": 4}, {"action": 8}):
            r = conn.call(req)
            assert r["code"] == -1 and r["reason"] == "no leader", r
    finally:
        conn.close()


def test_a_client_call_waits_out_a_cluster_with_no_leader_within_its_timeout(cluster, monkeypatch):
    """While no node knows a leader (here two of three are down), a call is not failed as soon as
    every node has refused it: the client pauses and goes round the nodes again, within its
    timeout, and the call succeeds once a leader is elected (a node comes back meanwhile)."""
    refusals: list[str] = []
    retry_elsewhere = client_protocol.retry_elsewhere

    def counting(req: dict, reply: dict) -> bool:
        again = retry_elsewhere(req, reply)
        if again:
            refusals.append(str(reply.get("reason")))
        return again

    monkeypatch.setattr(client_protocol, "retry_elsewhere", counting)
    c = cluster()
    leader = c.wait_leader()
    down = [i for i in c.nodes if i != leader]
    for i in down:
        c.nodes[i].stop()
    conn = RawTcp(*c.nodes[leader].address)
    try:
        # (a probe of another queue: one the lone leader took before it stepped down may be
        # committed once a majority is back)
        wait_for(lambda: conn.call({"action": 1, "queue": "probe", "data": "x"}).get("reason") == "no leader", 10,
                 "the lone node to know no leader")
    finally:
        conn.close()
    outcome: dict = {}

    def call() -> None:
        with QueueClient(c.hosts, timeout=30.0) as q:
            try:
                outcome["msg_id"] = q.produce("q", "waited")
            except QueueError as exc:
                outcome["error"] = exc

    caller = threading.Thread(target=call)
    caller.start()
    try:
        wait_for(lambda: refusals.count("no leader") >= 2 or outcome, 10, "the call to be refused twice")
        assert not outcome, outcome  # every node refused or was down, and the call goes on
        c.nodes[down[0]].start()
    finally:
        caller.join(60)
    assert "msg_id" in outcome, outcome
    with QueueClient(c.hosts) as q:
        assert q.consume("q").data == "waited"


def test_redirect_when_forwarding_is_off(cluster):
    c = cluster(forward_request=0)
    c.wait_leader()
    leader = c.leader_of("q")  # (with queue groups, of its group)
    follower = next(i for i in c.nodes if i != leader)
    conn = RawTcp(*c.nodes[follower].address)
    try:
        r = conn.call({"action": 1, "queue": "q", "data": "x", "seq": 5})
    finally:
        conn.close()
    assert r["code"] == -2 and r["seq"] == 5
    assert (r["leader_node_id"], r["leader_port"]) == (leader, c.nodes[leader].config["port"])
    with QueueClient(c.nodes[follower].hosts) as q:  # the client follows the redirect
        assert isinstance(q.produce("q", "via redirect"), int)


def test_forwarding_and_replicated_local_state(cluster):
    c = cluster()
    leader = c.wait_leader()
    # At once: a follower's own link to the leader may still be connecting (a forward it cannot
    # send yet is sent again each heartbeat, ClusterNode.on_unsent).
    followers = [i for i in c.nodes if i != leader]
    with QueueClient(c.nodes[followers[0]].hosts) as q:
        ids = q.produce_batch("fwd", ["a", "b", "c"], retry=30)
        assert q.consume("fwd").data == "a"
        assert q.confirm("fwd", ids[0])
        assert q.monitor("fwd")["size"] == 2
        assert q.leader()["leader_node_id"] == leader

    def replicated(node_id: int) -> bool:
        conn = RawTcp(*c.nodes[node_id].address)
        try:
            r = conn.call({"action": 104, "queue": "fwd"})
            lst = conn.call({"action": 107})
        finally:
            conn.close()
        return r.get("size") == 2 and "fwd" in lst.get("queue_list", [])
    for f in followers:
        wait_for(lambda: replicated(f), 10, f"node {f} to replicate")


def test_follower_cut_off_from_the_leader_still_answers(cluster):
    """Every request gets exactly one reply: a follower that hears the leader but cannot reach
    it (the state a follower is in at a cluster's start while its link to the leader is still
    reconnecting) must still answer a forwarded request -- the leader's reply, or an error to
    retry elsewhere -- within FORWARD_GRACE."""
    c = cluster(proxied=True)
    leader = c.wait_serving()
    follower = next(i for i in c.nodes if i != leader)
    link = c.proxies[(follower, leader)]
    link.cut()
    wait_for(lambda: link.cut_off, 5, "the link to be cut")
    assert c.leader_view(follower) == leader  # it still hears the leader over the other link
    conn = RawTcp(*c.nodes[follower].address, timeout=FORWARD_GRACE + 5)
    try:
        conn.send({"action": 1, "queue": "q", "data": "x"})
        try:
            reply = conn.recv()
        except TimeoutError:
            pytest.fail(f"node {follower} never answered a forwarded request ({FORWARD_GRACE + 5} s)")
    finally:
        conn.close()
        link.heal()
    assert reply["code"] in (0, -1), reply  # served, or failed with a reason (code -1)


# Rounds of test_simultaneous_start_elects_exactly_one_leader (load/soak.py runs may lower it).
START_ROUNDS = int(os.environ.get("SIMULTANEOUS_START_ROUNDS", "20"))


def test_simultaneous_start_elects_exactly_one_leader(tmp_path):
    for round_no in range(START_ROUNDS):
        c = Cluster(str(tmp_path / f"r{round_no}")).start()
        try:
            leader = c.wait_leader(timeout=20)
            roles = [c.role(i) for i in c.nodes]
            assert roles.count("leader") == 1, roles
            assert all(c.leader_view(i) == leader for i in c.nodes)
        finally:
            c.stop()
