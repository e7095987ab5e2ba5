"""AsyncQueueClient with linger_ms against a real node: many coroutines' produces, consumes and
confirms merged into batches, each caller answered as its own request would have been."""
from __future__ import annotations

import asyncio

import pytest

from queue_server.client import AsyncQueueClient, QueueError

N = 200


def _run(coro):
    return asyncio.run(coro)


class ReplyGate:
    """A TCP proxy in front of a node, on the test's event loop: the client's bytes go on at once
    (and are kept in `sent`); the node's replies go on only while the gate is open."""

    def __init__(self, node_port: int) -> None:
        self.node_port = node_port
        self.sent = bytearray()
        self._open = asyncio.Event()
        self._open.set()
        self._arrived = asyncio.Event()

    async def start(self) -> str:
        """Listen on a loopback port; the host string to give the client."""
        self._server = await asyncio.start_server(self._pipe_both, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def hold(self) -> None:
        """Hold the node's replies from now on, and forget what the client sent so far."""
        self._open.clear()
        self.sent.clear()

    def release(self) -> None:
        self._open.set()

    async def wait_sent(self, needle: bytes, timeout: float = 5.0) -> None:
        """Wait until the client has sent `needle` (TimeoutError after `timeout` seconds)."""
        async with asyncio.timeout(timeout):
            while needle not in self.sent:
                self._arrived.clear()
                await self._arrived.wait()

    def close(self) -> None:
        self._server.close()

    async def _pipe_both(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        node_r, node_w = await asyncio.open_connection("127.0.0.1", self.node_port)

        async def up() -> None:
            while data := await client_r.read(65536):
                self.sent += data
                self._arrived.set()
                node_w.write(data)
            node_w.close()

        async def down() -> None:
            while data := await node_r.read(65536):
                await self._open.wait()
                client_w.write(data)
            client_w.close()

        await asyncio.gather(up(), down(), return_exceptions=True)


def test_concurrent_produces_consumes_and_confirms_each_get_their_own_result(node, qname):
    async def run() -> None:
        async with AsyncQueueClient(node.hosts, linger_ms=1.0) as q:
            ids = await asyncio.gather(*(q.produce(qname, f"m{i}", retry=30) for i in range(N)))
            assert len(set(ids)) == N and all(isinstance(i, int) for i in ids)
            stats = await q.monitor(qname)
            assert stats["size"] == N
            # Produces went out as batches: ids follow the callers' order.
            assert ids == sorted(ids)
            got = await asyncio.gather(*(q.consume(qname) for _ in range(N + 5)))
            messages = [m for m in got if m is not None]
            assert len(messages) == N and got[N:] == [None] * 5  # the first N callers, in order
            assert {m.msg_id: m.data for m in messages} == {i: f"m{n}" for n, i in enumerate(ids)}
            assert all(m.delivery_count == 1 and m.queue == qname for m in messages)
            first = messages[0].msg_id
            done = await asyncio.gather(*(q.confirm(qname, m.msg_id) for m in messages),
                                        q.confirm(qname, first), q.confirm(qname, 10**12))
            assert done == [True] * N + [False, False]  # the same id twice: the first caller deleted it
            assert (await q.monitor(qname))["size"] == 0
    _run(run())


def test_a_virtual_queue_batch_gives_each_caller_its_ids_per_real_queue(node, qname):
    async def run() -> None:
        async with AsyncQueueClient(node.hosts, linger_ms=1.0) as q:
            before = (await q.monitor("fan_a"))["size"]
            ids = await asyncio.gather(*(q.produce("fan", f"v{i}") for i in range(20)))
            assert all(set(i) == {"fan_a", "fan_b"} for i in ids)
            assert len({i["fan_a"] for i in ids}) == 20
            assert (await q.monitor("fan_a"))["size"] == before + 20
    _run(run())


def test_an_error_reply_goes_to_every_caller_of_the_batch(node, qname):
    async def run() -> None:
        async with AsyncQueueClient(node.hosts, linger_ms=1.0) as q:
            results = await asyncio.gather(*(q.produce(qname, "x", retry=-1) for _ in range(10)),
                                           q.produce(qname, "fine"), return_exceptions=True)
            assert all(isinstance(r, QueueError) and r.reason == "retry: must be >= 0" for r in results[:10])
            assert isinstance(results[10], int)  # other options: another batch
    _run(run())


def test_a_consumer_that_leaves_loses_no_leased_message(node, qname):
    async def run() -> None:
        gate = ReplyGate(node.address[1])
        hosts = await gate.start()
        try:
            async with AsyncQueueClient(hosts, linger_ms=1.0) as q:
                await q.produce_batch(qname, ["a", "b", "c"], retry=60)
                calls = [asyncio.ensure_future(q.consume(qname)) for _ in range(3)]
                await asyncio.sleep(0)  # all three join the batch
                calls[1].cancel()
                kept = [m.data for m in await asyncio.gather(calls[0], calls[2])]
                assert kept == ["a", "b"]  # the caller that left took nothing out of the batch
                # Cancelled after the batch went out (the gate holds its reply until then): the
                # message is released, ready again.
                gate.hold()
                calls = [asyncio.ensure_future(q.consume(qname)) for _ in range(2)]
                await gate.wait_sent(b'"count":2')
                calls[0].cancel()
                gate.release()
                assert (await calls[1]) is None  # "c" was the first caller's
                deadline = asyncio.get_running_loop().time() + 5
                while (await q.monitor(qname))["ready"] != 1:
                    assert asyncio.get_running_loop().time() < deadline, "the message was not released"
                    await asyncio.sleep(0.01)
                again = await q.consume(qname)
                assert again is not None and again.data == "c"
        finally:
            gate.close()
    _run(run())


def test_a_lost_connection_fails_every_caller_of_the_batch(tmp_path):
    from tests.harness import NodeProcess
    node = NodeProcess(str(tmp_path), {"queue_size": 1000}).start()

    async def run() -> None:
        async with AsyncQueueClient(node.hosts, linger_ms=1.0, timeout=1.0) as q:
            await q.produce("lost", "warm")  # connected
            node.stop()
            results = await asyncio.gather(*(q.produce("lost", "x") for _ in range(8)), return_exceptions=True)
            assert all(isinstance(r, QueueError) for r in results)
            assert len({str(r) for r in results}) == 1
    try:
        _run(run())
    finally:
        node.stop()


def test_a_batch_stays_within_the_nodes_max_request_size(tmp_path):
    from tests.harness import NodeProcess
    node = NodeProcess(str(tmp_path), {"max_request_size": 4096}).start()

    async def run() -> None:
        async with AsyncQueueClient(node.hosts, linger_ms=1.0, max_request_size=4096) as q:
            ids = await asyncio.gather(*(q.produce("small", "x" * 1000) for _ in range(20)))
            assert len(set(ids)) == 20  # 20 KB of messages: in batches the node takes
    try:
        _run(run())
    finally:
        node.stop()


def test_linger_is_checked():
    with pytest.raises(ValueError, match="linger_ms must be 0..1"):
        AsyncQueueClient(linger_ms=2)
    with pytest.raises(ValueError, match="transport='tcp'"):
        AsyncQueueClient(transport="udp", linger_ms=1)
    with pytest.raises(ValueError, match="max_request_size"):
        AsyncQueueClient(linger_ms=1, max_request_size=0)
