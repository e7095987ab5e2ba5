"""One client process of the comparison with the replicated brokers (load/broker_bench.py): its
share of the connections, each a closed loop of cycles on one queue shared by all: produce with
the broker's acknowledgement, consume, acknowledge, `batch` messages per cycle. One Python
client per system, on asyncio (uvloop): queue-server's AsyncQueueClient, nats-py (JetStream
publish, a pull consumer's fetch, ack), aio-pika (publisher confirms, a consumer with prefetch
`batch`, ack). Connection k goes to node k mod 3, for every system. A connection that is done
gives back what was delivered to it and not consumed (RabbitMQ pushes up to its prefetch).

Run by broker_bench: it connects every connection, prints "ready", reads the monotonic time to
stop at from stdin, cycles until then, writes its figures (requests, messages, each cycle's
time, its own CPU seconds over the run) as JSON to --out, prints "done" and exits; a failure
prints a JSON line {"errors": [...]} instead.

    python -m load.broker_client --system nats --addresses nats://127.0.0.1:4222,... --conns 0,3 --queue q --out f
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
import time
from typing import Any, Protocol

PACKAGES = {"nats": ("nats", "nats-py"), "rabbitmq": ("aio_pika", "aio-pika")}
CONSUMER = "work"  # the stream's durable pull consumer, shared by every connection
FETCH_TIMEOUT = 5.0
RETRY = 30  # queue-server: the lease of a consumed message, as load/cbench.c asks for


def missing_package(system: str) -> str | None:
    """Why the client of `system` cannot run here, in one line, or None."""
    module, package = PACKAGES.get(system, (None, None))
    if module and importlib.util.find_spec(module) is None:
        return f"the Python package {package} is not installed (pip install -e '.[bench]'): {system} skipped"
    return None


class Connection(Protocol):
    """One client connection's side of the cycle."""

    async def start(self) -> None: ...
    async def produce(self, n: int) -> None: ...
    async def consume(self, n: int) -> list[Any]: ...
    async def ack(self, messages: list[Any]) -> None: ...
    async def finish(self) -> None:
        """Give back what was delivered to this connection that it will not consume."""
    async def close(self) -> None: ...


class QueueServerConnection:
    """AsyncQueueClient: produce (batch: produce_batch), consume (consume_batch), confirm
    (confirm_many); every request has a reply."""

    def __init__(self, hosts: list[str], queue: str, payload: bytes) -> None:
        from queue_server.client import AsyncQueueClient

        self.client = AsyncQueueClient(hosts)
        self.queue, self.data = queue, payload.decode()

    async def start(self) -> None:
        await self.client.leader()

    async def produce(self, n: int) -> None:
        if n == 1:
            await self.client.produce(self.queue, self.data, retry=RETRY)
        else:
            await self.client.produce_batch(self.queue, [self.data] * n, retry=RETRY)

    async def consume(self, n: int) -> list[Any]:
        if n == 1:
            m = await self.client.consume(self.queue)
            return [] if m is None else [m]
        return await self.client.consume_batch(self.queue, n)

    async def ack(self, messages: list[Any]) -> None:
        if len(messages) == 1:
            await self.client.confirm(self.queue, messages[0].msg_id)
        else:
            await self.client.confirm_many(self.queue, [m.msg_id for m in messages])

    async def finish(self) -> None:
        pass  # a consume takes only what it returns

    async def close(self) -> None:
        await self.client.close()


class NatsConnection:
    """nats-py: a JetStream publish waits for the stream's PubAck; consume is a fetch from the
    shared durable pull consumer; ack is the plain ack (no reply, as NATS clients ack)."""

    def __init__(self, hosts: list[str], queue: str, payload: bytes) -> None:
        self.hosts, self.queue, self.data = hosts, queue, payload

    async def start(self) -> None:
        import nats

        self.nc = await nats.connect(self.hosts, dont_randomize=True, max_reconnect_attempts=0)
        self.js = self.nc.jetstream()
        self.sub = await self.js.pull_subscribe_bind(durable=CONSUMER, stream=self.queue)

    async def produce(self, n: int) -> None:
        publish = self.js.publish
        if n == 1:
            await publish(self.queue, self.data, stream=self.queue)
        else:
            await asyncio.gather(*(publish(self.queue, self.data, stream=self.queue) for _ in range(n)))

    async def consume(self, n: int) -> list[Any]:
        import nats.errors

        try:
            return await self.sub.fetch(n, timeout=FETCH_TIMEOUT)
        except nats.errors.TimeoutError:
            return []

    async def ack(self, messages: list[Any]) -> None:
        for m in messages:
            await m.ack()

    async def finish(self) -> None:
        pass  # a fetch takes only what it returns

    async def close(self) -> None:
        await self.nc.close()


class RabbitConnection:
    """aio-pika: a publish on a channel in confirm mode waits for the broker's confirm; consume
    takes deliveries of a consumer with prefetch `batch`; ack is basic.ack (AMQP has no reply to
    it), once per cycle with `multiple` for a batch."""

    def __init__(self, hosts: list[str], queue: str, payload: bytes, batch: int) -> None:
        self.url, self.queue, self.data, self.batch = hosts[0], queue, payload, batch

    async def start(self) -> None:
        import aio_pika

        self.conn = await aio_pika.connect(self.url)
        self.channel = await self.conn.channel(publisher_confirms=True)
        await self.channel.set_qos(prefetch_count=self.batch)
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()
        queue = await self.channel.declare_queue(self.queue, passive=True)
        await queue.consume(self.inbox.put)
        self.message = lambda: aio_pika.Message(self.data, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)

    async def produce(self, n: int) -> None:
        publish = self.channel.default_exchange.publish
        if n == 1:
            await publish(self.message(), routing_key=self.queue)
        else:
            await asyncio.gather(*(publish(self.message(), routing_key=self.queue) for _ in range(n)))

    async def consume(self, n: int) -> list[Any]:
        try:
            got = [await asyncio.wait_for(self.inbox.get(), FETCH_TIMEOUT)]
        except asyncio.TimeoutError:
            return []
        while len(got) < n and not self.inbox.empty():
            got.append(self.inbox.get_nowait())
        return got

    async def ack(self, messages: list[Any]) -> None:
        await messages[-1].ack(multiple=len(messages) > 1)

    async def finish(self) -> None:
        """The consumer keeps taking deliveries up to its prefetch after the last cycle; closing
        the channel puts them back in the queue for the connections still cycling."""
        await self.channel.close()

    async def close(self) -> None:
        await self.conn.close()


def connection(system: str, hosts: list[str], queue: str, payload: bytes, batch: int) -> Connection:
    """The client connection of `system` to the first of `hosts`."""
    if system == "queue-server":
        return QueueServerConnection(hosts, queue, payload)
    if system == "nats":
        return NatsConnection(hosts, queue, payload)
    return RabbitConnection(hosts, queue, payload, batch)


async def prepare(system: str, addresses: list[str], queue: str) -> None:
    """Make `queue` before the clients connect: a file stream with 3 replicas, work-queue
    retention and its durable pull consumer (NATS), a quorum queue (RabbitMQ); queue-server
    makes a queue on its first produce."""
    if system == "nats":
        import nats
        import nats.errors
        import nats.js.errors
        from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig

        nc = await nats.connect(addresses)
        try:
            js = nc.jetstream()
            deadline = time.monotonic() + 60
            while True:  # the servers answer "temporarily unavailable" until they elect a meta leader
                try:
                    await js.add_stream(StreamConfig(name=queue, subjects=[queue], num_replicas=3,
                                                     storage=StorageType.FILE, retention=RetentionPolicy.WORK_QUEUE))
                    await js.add_consumer(queue, ConsumerConfig(durable_name=CONSUMER, ack_policy=AckPolicy.EXPLICIT,
                                                                ack_wait=RETRY, max_ack_pending=-1, max_waiting=4096))
                    return
                except (nats.js.errors.Error, nats.errors.TimeoutError):
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
        finally:
            await nc.close()
    elif system == "rabbitmq":
        import aio_pika

        conn = await aio_pika.connect(addresses[0])
        try:
            channel = await conn.channel()
            await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
        finally:
            await conn.close()


async def _cycles(conn: Connection, batch: int, until: float, latencies: list[float], counts: list[int]) -> None:
    """Cycle until `until`: produce `batch`, consume until `batch` came, acknowledge them."""
    clock = time.perf_counter
    while time.monotonic() < until:
        started = clock()
        await conn.produce(batch)
        got: list[Any] = []
        while len(got) < batch:
            more = await conn.consume(batch - len(got))
            if not more:
                counts[2] += 1
                if time.monotonic() > until:  # each connection's own messages are there to take
                    raise RuntimeError(f"a consume still found nothing after the run ended ({len(got)} of {batch})")
            got += more
        await conn.ack(got)
        latencies.append(clock() - started)
        counts[0] += 3
        counts[1] += batch
    await conn.finish()


async def run(args: argparse.Namespace) -> dict:
    addresses = args.addresses.split(",")
    indices = [int(k) for k in args.conns.split(",")]
    payload = b"x" * args.payload
    conns = [connection(args.system, addresses[k % 3:] + addresses[:k % 3], args.queue, payload, args.batch)
             for k in indices]
    await asyncio.gather(*(c.start() for c in conns))
    print("ready", flush=True)
    until = float(await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline))
    cpu = time.process_time()
    latencies: list[float] = []
    counts = [0, 0, 0]  # requests, messages, consumes that found nothing
    outcomes = await asyncio.gather(*(_cycles(c, args.batch, until, latencies, counts) for c in conns),
                                    return_exceptions=True)
    finished = time.monotonic()
    cpu = time.process_time() - cpu
    errors = sorted({f"{type(e).__name__}: {e}" for e in outcomes if isinstance(e, BaseException)})
    await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
    return {"ops": counts[0], "messages": counts[1], "empty": counts[2], "finished": finished, "cpu_seconds": cpu,
            "latencies": latencies, "errors": errors}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", choices=("queue-server", "nats", "rabbitmq"), required=True)
    parser.add_argument("--addresses", required=True, help="the three nodes' client addresses, comma-separated")
    parser.add_argument("--conns", required=True, help="this process's connection numbers, comma-separated")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--payload", type=int, default=64)
    parser.add_argument("--out", required=True, help="where the figures go (JSON)")
    args = parser.parse_args(argv)
    import uvloop  # queue-server's own dependency: every system's client runs on it

    try:
        result = uvloop.run(run(args))
    except Exception as exc:  # one line for broker_bench to show, no traceback
        print(json.dumps({"errors": [f"{type(exc).__name__}: {exc}"]}), flush=True)
        sys.exit(1)
    with open(args.out, "w") as f:
        json.dump(result, f)
    print("done", flush=True)


if __name__ == "__main__":
    main()
