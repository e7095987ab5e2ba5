"""Queue administration and dead letters on real nodes: peek, purge, delete_queue, pause/resume
and dlq_replay through both clients and queue-cli, with bad input; on a 3-node cluster through
a follower (forwarded), after a fail-over, and after a restart."""
from __future__ import annotations

import asyncio
import io
import json
import os
from contextlib import redirect_stdout

import pytest

from queue_server.client import AsyncQueueClient, QueueClient, QueueError
from queue_server.client import cli
from tests.harness import Cluster, NodeProcess, RawTcp, kill_all, wait_for


@pytest.fixture
def tcp(node):
    conn = RawTcp(*node.address)
    yield conn
    conn.close()


def _cli(hosts: str, *args: str) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        status = cli.main(["--hosts", hosts, "--json", *args])
    assert status == 0, out.getvalue()
    return json.loads(out.getvalue())


def test_peek_purge_delete_through_the_client_and_cli(node, qname):
    with QueueClient(node.hosts) as q:
        q.produce_batch(qname, ["a", "b", "c"], retry=30)
        q.produce(qname, "later", delay=600)
        assert q.consume(qname).data == "a"
        assert [m["data"] for m in q.peek(qname)] == ["b", "c"]
        assert [m["data"] for m in q.peek(qname, 1)] == ["b"]
        assert [m["data"] for m in q.peek(qname, state="leased")] == ["a"]
        assert [m["data"] for m in q.peek(qname, state="delayed")] == ["later"]
        assert q.monitor(qname)["size"] == 4  # peeking took nothing
        assert [m["data"] for m in _cli(node.hosts, "peek", qname, "--count", "5")["messages"]] == ["b", "c"]
        assert q.purge(qname) == 4
        assert q.monitor(qname)["size"] == 0 and q.consume(qname) is None
        assert q.produce(qname, "d") == 5  # ids go on after a purge
        assert _cli(node.hosts, "purge", qname)["purged"] == 1
        assert qname in q.list_queues(qname)
        assert _cli(node.hosts, "delete-queue", qname)["deleted"] == 1
        assert qname not in q.list_queues(qname)
        assert q.monitor()["queue_count"] == len(q.list_queues())
        assert q.delete_queue(qname) is False and q.purge(qname) == 0


def test_pause_holds_consumers_and_long_polls_until_resume(node, qname):
    async def run() -> None:
        async with AsyncQueueClient(node.hosts) as q:
            assert await q.pause(qname) is True
            assert await q.pause(qname) is False
            await q.produce(qname, "held")
            assert await q.consume(qname) is None
            assert (await q.monitor(qname))["paused"] is True
            poll = asyncio.ensure_future(q.consume(qname, wait=4))
            await asyncio.sleep(0)  # the poll is sent (and parked) before the resume
            wait_deadline = asyncio.get_running_loop().time() + 5
            while (await q.monitor(qname))["waiters"] != 1:
                assert asyncio.get_running_loop().time() < wait_deadline, "the poll never parked"
                await asyncio.sleep(0.01)
            assert not poll.done()
            assert [m["data"] for m in await q.peek(qname)] == ["held"]
            assert await q.resume(qname) is True
            got = await asyncio.wait_for(poll, 5)
            assert got is not None and got.data == "held"
            assert (await q.monitor(qname))["paused"] is False
    asyncio.run(run())
    assert _cli(node.hosts, "pause", qname)["changed"] == 1
    assert _cli(node.hosts, "resume", qname)["changed"] == 1


@pytest.mark.parametrize("req,field", [
    ({"action": "peek"}, "queue"),
    ({"action": 20, "queue": 3}, "queue"),
    ({"action": "peek", "queue": "Q", "count": 0}, "count"),
    ({"action": "peek", "queue": "Q", "count": 1001}, "count"),
    ({"action": "peek", "queue": "Q", "count": "2"}, "count"),
    ({"action": "peek", "queue": "Q", "state": "sleeping"}, "state"),
    ({"action": "local_peek", "queue": "Q", "state": None, "count": -1}, "count"),
    ({"action": "purge"}, "queue"),
    ({"action": 21, "queue": ""}, "queue"),
    ({"action": "delete_queue", "queue": ["Q"]}, "queue"),
    ({"action": "pause", "queue": "fan"}, "queue"),
    ({"action": "resume", "queue": 1.5}, "queue"),
    ({"action": "dlq_replay"}, "queue"),
    ({"action": "dlq_replay", "queue": "Q.dlq"}, "queue"),
    ({"action": "produce", "queue": "Q", "data": "x", "max_deliveries": -2}, "max_deliveries"),
])
def test_bad_admin_requests_answer_one_error_naming_the_field(tcp, req, field):
    r = tcp.call(req)
    assert r["code"] == -1 and r["reason"].startswith(field + ": "), r
    assert tcp.call({"action": "leader"})["code"] == 0  # the connection is still served


def test_missing_queue_answers_code_0_with_nothing_done(tcp, qname):
    assert tcp.call({"action": "purge", "queue": qname})["purged"] == 0
    assert tcp.call({"action": "delete_queue", "queue": qname})["deleted"] == 0
    assert tcp.call({"action": "peek", "queue": qname})["messages"] == []
    assert tcp.call({"action": "dlq_replay", "queue": qname})["moved"] == 0
    assert qname not in tcp.call({"action": "list", "pattern": qname})["queue_list"]


def test_unconfirmed_messages_become_dead_letters_and_replay_brings_them_back(node, qname):
    with QueueClient(node.hosts) as q:
        q.produce(qname, "poison", retry=0.2, max_deliveries=2)
        for n in (1, 2):
            m = wait_for(lambda: q.consume(qname), 5, f"delivery {n}")
            assert m.delivery_count == n
        dead = wait_for(lambda: q.peek(qname, state="dead"), 5, "the dead letter")
        assert [(d["data"], d["dead_queue"], d["dead_reason"], d["delivery_count"]) for d in dead] == \
            [("poison", qname, "max_deliveries", 2)]
        assert q.consume(qname) is None and q.monitor(qname)["size"] == 0
        assert q.peek(qname + ".dlq")[0]["data"] == "poison"  # an ordinary queue too
        assert _cli(node.hosts, "dlq", "replay", qname)["moved"] == 1
        back = q.consume(qname)
        assert (back.data, back.delivery_count) == ("poison", 1)
        assert q.confirm(qname, back.msg_id)
        assert q.peek(qname, state="dead") == []


# ------------------------------------------------------------------ restart and cluster


def test_paused_state_and_dead_letters_survive_a_restart(tmp_path):
    node = NodeProcess(str(tmp_path), {"snapshot_every": 5, "max_deliveries": 1}).start()
    try:
        with QueueClient(node.hosts) as q:
            q.produce("dl", "dead", retry=0.2)
            assert q.consume("dl").data == "dead"
            wait_for(lambda: q.peek("dl", state="dead"), 5, "the dead letter")
            q.pause("paused")
            for i in range(10):  # past a snapshot, and some after it in the log
                q.produce("paused", f"m{i}")
            q.pause("paused-late")  # in the log tail after the last snapshot (most likely)
        wait_for(lambda: os.listdir(tmp_path / "node-data" / "snapshots"), 10, "a snapshot")
    finally:
        node.stop()
    node = NodeProcess(node.workdir, node.config, name=node.name).start()
    try:
        with QueueClient(node.hosts) as q:
            assert q.monitor("paused")["paused"] and q.monitor("paused-late")["paused"]
            assert q.consume("paused") is None and q.monitor("paused")["size"] == 10
            [dead] = q.peek("dl", state="dead")
            assert (dead["data"], dead["dead_reason"]) == ("dead", "max_deliveries")
            assert q.dlq_replay("dl") == 1 and q.consume("dl").data == "dead"
    finally:
        node.stop()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(str(tmp_path / "c"), max_deliveries=1).start()
    yield c
    c.stop()


def test_forwarded_admin_actions_and_their_state_after_a_fail_over(cluster):
    leader = cluster.wait_serving()
    follower = next(i for i in cluster.nodes if i != leader)
    with QueueClient(cluster.nodes[follower].hosts) as q:
        q.produce_batch("jobs", ["a", "b"])
        q.produce("gone", "x")
        q.produce("purged", "x")
        q.produce("dl", "poison", retry=0.2)
        assert q.consume("dl").data == "poison"
        assert q.pause("jobs") is True
        reply = q.request({"action": "peek", "queue": "jobs"})
        assert reply["node_id"] == leader and [m["data"] for m in reply["messages"]] == ["a", "b"]
        assert q.consume("jobs") is None
        assert q.purge("purged") == 1 and q.delete_queue("gone") is True
        wait_for(lambda: q.peek("dl", state="dead"), 5, "the dead letter")
        # a follower answers local_peek and local_monitor from its own replica
        local = wait_for(lambda: q.peek("dl", state="dead", local=True), 5, "the follower's copy of the dead letter")
        assert local[0]["data"] == "poison"
        assert q.request({"action": "local_peek", "queue": "jobs"})["node_id"] == follower
        wait_for(lambda: q.monitor("jobs", local=True).get("paused"), 5, "the follower to see the pause")
    kill_all(cluster.nodes[leader])
    survivors = [i for i in cluster.nodes if i != leader]
    new_leader = cluster.wait_leader(among=survivors, exclude=leader)
    with QueueClient(cluster.nodes[new_leader].hosts) as q:
        assert q.monitor("jobs")["paused"] is True and q.consume("jobs") is None
        assert "gone" not in q.list_queues() and q.monitor("purged")["size"] == 0
        [dead] = q.peek("dl", state="dead")
        assert (dead["data"], dead["dead_queue"], dead["delivery_count"]) == ("poison", "dl", 1)
        assert q.resume("jobs") is True
        assert [m.data for m in q.consume_batch("jobs", 5)] == ["a", "b"]
        assert q.dlq_replay("dl") == 1 and q.consume("dl").data == "poison"
        q.produce("purged", "y")
        assert q.purge("purged") == 1 and q.delete_queue("purged") is True
        assert "purged" not in q.list_queues()


def test_per_queue_metrics_on_a_real_node(tmp_path):
    from tests.harness import free_port
    from tests.integration.test_metrics import scrape, value

    node = NodeProcess(str(tmp_path), {"metrics_port": free_port(), "max_deliveries": 1,
                                       "queue_metrics_max": 4}).start()
    port = node.config["metrics_port"]
    try:
        with QueueClient(node.hosts) as q:
            q.produce_batch("m-jobs", ["a", "b", "c"], retry=0.2)
            got = q.consume_batch("m-jobs", 2)
            q.confirm("m-jobs", got[0].msg_id)
            q.produce("m-later", "x", delay=3600)
            q.produce("m-gone", "x")
            wait_for(lambda: q.peek("m-jobs", state="dead"), 5, "the dead letter")
            q.delete_queue("m-gone")

        def published():
            s = scrape(port)
            want = {("queue_server_queue_produced_total", "m-jobs"): 3,
                    ("queue_server_queue_consumed_total", "m-jobs"): 2,
                    ("queue_server_queue_confirmed_total", "m-jobs"): 1,
                    ("queue_server_queue_dead_lettered_total", "m-jobs"): 1,
                    ("queue_server_queue_ready", "m-jobs"): 1,
                    ("queue_server_queue_dead", "m-jobs"): 1,
                    ("queue_server_queue_delayed", "m-later"): 1,
                    ("queue_server_queue_ready", "m-gone"): 0}
            return all(value(s, name, queue=label) == n for (name, label), n in want.items())
        wait_for(published, 15, "the per-queue metrics")
    finally:
        node.stop()
