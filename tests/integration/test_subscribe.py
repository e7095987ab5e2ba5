"""Push subscriptions with credit on real nodes: the credit is never exceeded, a confirm frees
it, a consumer that disconnects gets its at-least-once messages redelivered after their lease,
and at-most-once pushes are never delivered twice across a fail-over."""
from __future__ import annotations

import threading

from queue_server.client import QueueClient
from tests.harness import Cluster, RawTcp, kill_all, wait_for


def _read_until_reply(conn: RawTcp, action: str) -> tuple[list[dict], dict]:
    """The pushes read before the reply to the last `action` request, and that reply."""
    got = []
    while True:
        r = conn.recv()
        if r.get("push"):
            got.append(r)
        elif r.get("action") == action:
            return got, r


def test_credit_is_never_exceeded_and_a_confirm_frees_it(node, qname):
    with QueueClient(node.hosts) as q:
        q.produce_batch(qname, [f"m{i}" for i in range(20)], retry=30)
        conn = RawTcp(*node.address)
        try:
            conn.send({"action": "subscribe", "queue": qname, "credit": 3})
            pushed, ack = _read_until_reply(conn, "subscribe")
            assert ack["code"] == 0 and ack["subscribed"] == 3
            while len(pushed) < 3:
                pushed.append(conn.recv())
            conn.send({"action": "peek", "queue": qname})  # served after any push already made
            more, _ = _read_until_reply(conn, "peek")
            assert more == [] and q.monitor(qname)["in_flight"] == 3
            assert [m["data"] for m in pushed] == ["m0", "m1", "m2"]
            assert q.confirm(qname, pushed[0]["msg_id"])
            nxt = conn.recv()
            assert nxt["push"] and nxt["data"] == "m3"
            conn.send({"action": "subscribe", "queue": qname, "credit": 0})
            more, _ = _read_until_reply(conn, "subscribe")
            assert more == []
            assert q.confirm_many(qname, [m["msg_id"] for m in pushed[1:]] + [nxt["msg_id"]]) == 3
            conn.send({"action": "peek", "queue": qname})
            more, _ = _read_until_reply(conn, "peek")
            assert more == [] and q.monitor(qname)["in_flight"] == 0  # credit 0: nothing flows
        finally:
            conn.close()


def test_a_consumer_that_disconnects_gets_its_messages_back_after_the_lease(node, qname):
    with QueueClient(node.hosts) as q:
        q.produce_batch(qname, ["a", "b", "c"], retry=0.5)
        sub = q.subscribe(qname, credit=2)
        it = iter(sub)
        taken = [next(it).data, next(it).data]
        assert taken == ["a", "b"] and q.monitor(qname)["in_flight"] == 2
        sub.close()
        got: dict[str, int] = {}

        # c was never pushed; if it was consumed before a and b came back, its own 0.5 s lease
        # may have run out meanwhile and delivered it again, so only "at least once" is certain.
        def all_back() -> bool:
            got.update({m.data: m.delivery_count for m in q.consume_batch(qname, 5, wait=0.5)})
            return {"a", "b"} <= got.keys() and got["a"] >= 2 and got["b"] >= 2 and "c" in got
        try:
            wait_for(all_back, 15, "a and b back after their lease, and c")
        except TimeoutError as e:
            raise AssertionError(f"{e}; got {got}") from None


def test_at_most_once_pushes_are_never_delivered_twice_across_a_fail_over(tmp_path):
    c = Cluster(str(tmp_path / "c")).start()
    try:
        leader = c.wait_serving()
        sent = [f"amo-{i}" for i in range(300)]
        with QueueClient(c.hosts) as q:
            q.produce_batch("pushed", sent)
        received: list[str] = []
        stop = threading.Event()
        errors: list[BaseException] = []

        def consume() -> None:
            try:
                with QueueClient(c.hosts, timeout=2) as q, q.subscribe("pushed", credit=5) as sub:
                    for m in sub:
                        received.append(m.data)
                        if stop.is_set():
                            return
            except BaseException as exc:  # noqa: BLE001 -- reported by the test
                errors.append(exc)

        worker = threading.Thread(target=consume, daemon=True)
        worker.start()
        wait_for(lambda: len(received) >= 50, 20, "pushes from the first leader")
        kill_all(c.nodes[leader])
        survivors = [i for i in c.nodes if i != leader]
        new_leader = c.wait_leader(among=survivors, exclude=leader)
        with QueueClient(c.nodes[new_leader].hosts) as q:
            q.produce("pushed", "after")
        wait_for(lambda: "after" in received or errors, 40, "pushes from the new leader")
        stop.set()
        assert not errors, errors
        assert len(received) == len(set(received)), "an at-most-once message was pushed twice"
        assert set(received) <= set(sent) | {"after"}
    finally:
        c.stop()


def test_async_subscription_pushes_within_the_credit_and_confirm_frees_it(node, qname):
    import asyncio

    from queue_server.client import AsyncQueueClient

    async def run() -> None:
        async with AsyncQueueClient(node.hosts) as q:
            await q.produce_batch(qname, [f"m{i}" for i in range(6)], retry=30)
            got = []
            async with q.subscribe(qname, credit=2) as sub:
                async for m in sub:
                    got.append(m)
                    if len(got) == 2:
                        assert (await q.monitor(qname))["in_flight"] == 2
                        for held in got:
                            await sub.confirm(held)
                    if len(got) == 4:
                        break
            assert [m.data for m in got] == ["m0", "m1", "m2", "m3"]
            assert all(m.lease_until is not None for m in got)
    asyncio.run(run())


def test_the_subscribe_benchmark_counts_what_it_consumed(node):
    from load import subscribe_bench

    for mode in ("consume", "subscribe"):
        row = subscribe_bench.run(node.hosts, 2, 1.0, mode, fill=300)
        assert 0 < row["messages"] <= 300 and row["messages_per_s"] > 0, (mode, row)
        with QueueClient(node.hosts) as q:
            assert q.monitor(f"bench-{mode}")["size"] == 300 - row["messages"]


def test_one_subscription_to_several_queues(node, qname):
    a, b = f"{qname}-a", f"{qname}-b"
    with QueueClient(node.hosts) as q:
        q.produce_batch(a, ["a1", "a2"])
        q.produce_batch(b, ["b1", "b2"], retry=30)
        with q.subscribe([a, b], credit=1) as sub:
            got = []
            for m in sub:
                got.append((m.queue, m.data))
                if m.lease_until is not None:
                    q.confirm(m.queue, m.msg_id)
                if len(got) == 4:
                    break
        assert sorted(got) == [(a, "a1"), (a, "a2"), (b, "b1"), (b, "b2")]
        assert q.monitor(a)["size"] == 0 and q.monitor(b)["size"] == 0
