"""Locust load test for queue-server over TCP and UDP, built on our client (client/).

    locust -f load/locustfile.py --headless -u 50 -r 10 -t 30s --host 127.0.0.1:1111
    locust -f load/locustfile.py --headless -u 20 -r 20 -t 30s --host 127.0.0.1:1111 TcpQueueUser

    # distributed: one locust process tops out far below the server
    locust -f load/locustfile.py --master --headless --expect-workers 2 -u 200 -r 50 -t 60s --host 127.0.0.1:1111
    locust -f load/locustfile.py --worker --master-host 127.0.0.1      # once per worker

    # a cluster: users start on the nodes of the list in turn and fail over to the others
    locust -f load/locustfile.py --headless -u 60 -r 20 -t 60s --host 127.0.0.1:1111,127.0.0.1:1112,127.0.0.1:1113

Every action fires one locust request event: request type TCP or UDP, name the action
(produce, consume, confirm, produce_batch, consume_batch, confirm_batch, consume_wait, monitor),
response time, response length (bytes of the reply as JSON), and an exception for a reply with
code != 0 (QueueError: "[code] reason") and for timeouts or unreachable nodes (QueueTimeout,
NoServerAvailable).

The mix per user (weights): produce 8, consume then confirm 8, batch produce 2, batch consume
then confirm 2, long-poll consume then confirm 1 (TCP only; UDP answers a consume at once), monitor
1. Consumers can take more than producers put in, so queues stay short and long polls really
wait. Messages are produced with `retry` (default 30 s): a consume leases, the confirm deletes.
Every produce carries the user's (producer, sequence), as QueueClient.produce numbers them, so a
produce whose outcome a change of leader left unknown is sent again by the client and stored
once, as for an application on the default client.

Custom arguments (also in the web UI; a master passes them to its workers):
  --queues          comma-separated queue names used at random (default locust-0..locust-7)
  --payload-size    bytes per message (default 100)
  --batch-size      messages per batch produce / most per batch consume (default 10)
  --long-poll-wait  seconds a long-poll consume waits (default 1)
  --retry           lease seconds of produced messages (default 30; 0: at most once, no confirm)
  --request-timeout seconds before a request counts as timed out (default 5)
  --think-time      most seconds a user pauses between tasks, at random (default 0: closed loop)
  --timeline FILE   at exit, write this process's requests and failures per second and every
                    failure with its time (JSON; load/cluster_scenario.py reads it)
"""
from __future__ import annotations

import itertools
import random
import time
from typing import Any

import orjson
from locust import User, events, task
from locust.env import Environment

from queue_server.client import QueueClient, QueueError
from queue_server.client.credentials import load_token
from queue_server.client import protocol as p

# Replies larger than this cannot come back over UDP (the server's udp_max_response default).
UDP_REPLY_BUDGET = 60000
_user_numbers = itertools.count()


@events.init_command_line_parser.add_listener
def _arguments(parser: Any) -> None:
    group = parser  # (argument groups do not take include_in_web_ui)
    group.add_argument("--queues", default=",".join(f"locust-{i}" for i in range(8)), include_in_web_ui=True,
                       help="comma-separated queue names, used at random")
    group.add_argument("--payload-size", type=int, default=100, include_in_web_ui=True, help="bytes per message")
    group.add_argument("--batch-size", type=int, default=10, include_in_web_ui=True,
                       help="messages per batch produce / most per batch consume (1..1000)")
    group.add_argument("--long-poll-wait", type=float, default=1.0, include_in_web_ui=True,
                       help="seconds a long-poll consume waits")
    group.add_argument("--retry", type=float, default=30.0, include_in_web_ui=True,
                       help="lease seconds of produced messages (0: at most once)")
    group.add_argument("--request-timeout", type=float, default=5.0, include_in_web_ui=True,
                       help="seconds before a request counts as timed out")
    group.add_argument("--think-time", type=float, default=0.0, include_in_web_ui=True,
                       help="most seconds between a user's tasks (random; 0 = closed loop)")
    group.add_argument("--token-file", default="", help="file holding the client token (the nodes' "
                       "auth_token_file); default: the QUEUE_TOKEN environment variable")
    group.add_argument("--timeline", default="", help="write requests/failures per second and each failure to this JSON file at exit")


class Timeline:
    """Requests and failures per second, and each failure with its time, for --timeline."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.per_second: dict[int, list[int]] = {}
        self.failures: list[dict[str, Any]] = []

    def on_request(self, request_type: str, name: str, response_time: float, exception: Exception | None = None,
                   **_: Any) -> None:
        now = time.time()
        counts = self.per_second.setdefault(int(now), [0, 0])
        counts[0] += 1
        if exception is not None:
            counts[1] += 1
            self.failures.append({"start": now - response_time / 1000.0, "end": now, "type": request_type,
                                  "name": name, "error": str(exception)})

    def write(self, **_: Any) -> None:
        with open(self.path, "w") as f:
            f.write(orjson.dumps({"per_second": sorted([t, *c] for t, c in self.per_second.items()),
                                  "failures": self.failures}).decode())


@events.init.add_listener
def _timeline(environment: Environment, **_: Any) -> None:
    path = getattr(environment.parsed_options, "timeline", "") if environment.parsed_options else ""
    if path:
        timeline = Timeline(path)
        environment.events.request.add_listener(timeline.on_request)
        environment.events.quitting.add_listener(timeline.write)


def host_order(hosts: str, number: int) -> list[str]:
    """The host list rotated so that user `number` starts on its own node."""
    items = [h.strip() for h in hosts.split(",") if h.strip()]
    if not items:
        raise ValueError("--host: give host:port (or a comma-separated list for a cluster)")
    k = number % len(items)
    return items[k:] + items[:k]


class QueueUser(User):
    """One simulated client of queue-server; subclasses pick the transport."""

    abstract = True
    transport = "tcp"

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        opts = environment.parsed_options
        self.queues = [q.strip() for q in (getattr(opts, "queues", "") or "locust-0").split(",") if q.strip()]
        self.payload = ("x" * max(0, getattr(opts, "payload_size", 100)))
        self.batch_size = max(1, min(1000, getattr(opts, "batch_size", 10)))
        if self.transport == "udp":  # a batch and its reply must each fit in one datagram
            self.batch_size = max(1, min(self.batch_size, UDP_REPLY_BUDGET // (len(self.payload) + 100)))
        self.long_poll_wait = getattr(opts, "long_poll_wait", 1.0)
        self.retry = getattr(opts, "retry", 30.0)
        self.think_time = getattr(opts, "think_time", 0.0)
        self.client = QueueClient(
            host_order(self.host or "127.0.0.1:1111", next(_user_numbers)),
            transport=self.transport,
            timeout=getattr(opts, "request_timeout", 5.0),
            token=load_token(getattr(opts, "token_file", "")),
        )
        self.request_type = self.transport.upper()
        self.numbering = p.ProducerSequence()  # what QueueClient.produce gives each produce

    def wait_time(self) -> float:
        return random.random() * self.think_time if self.think_time > 0 else 0.0

    def on_stop(self) -> None:
        self.client.close()

    # ------------------------------------------------------------------ one request, one event
    def call(self, name: str, request: dict[str, Any]) -> dict[str, Any] | None:
        """Send `request`, fire its locust event, and return the reply (None if it failed)."""
        started = time.perf_counter()
        reply = None
        exception: Exception | None = None
        length = 0
        try:
            reply = self.client.request(request)
            length = len(orjson.dumps(reply))
        except QueueError as exc:  # code != 0, timeouts, no node reachable
            exception = exc
            length = len(orjson.dumps(exc.reply))
        self.environment.events.request.fire(
            request_type=self.request_type,
            name=name,
            response_time=(time.perf_counter() - started) * 1000.0,
            response_length=length,
            exception=exception,
            context={"queue": request.get("queue"), "host": p.format_address(self.client.address)},
        )
        return reply

    def queue(self) -> str:
        return random.choice(self.queues)

    def confirm(self, queue: str, msg_ids: list[int], name: str) -> None:
        if msg_ids and self.retry > 0:
            self.call(name, p.ids_request(p.CONFIRM, queue, msg_ids[0] if len(msg_ids) == 1 else msg_ids))

    # ------------------------------------------------------------------ the mix
    @task(8)
    def produce(self) -> None:
        producer, sequence = self.numbering.next()
        self.call("produce", p.produce_request(self.queue(), self.payload, retry=self.retry, producer=producer,
                                               sequence=sequence))

    @task(8)
    def consume_confirm(self) -> None:
        queue = self.queue()
        reply = self.call("consume", p.consume_request(queue))
        if reply is not None and reply.get("msg_id") is not None:
            self.confirm(queue, [reply["msg_id"]], "confirm")

    @task(2)
    def produce_batch(self) -> None:
        producer, sequence = self.numbering.next()
        self.call("produce_batch", p.produce_request(self.queue(), [self.payload] * self.batch_size, retry=self.retry,
                                                     producer=producer, sequence=sequence))

    @task(2)
    def consume_batch_confirm(self) -> None:
        queue = self.queue()
        reply = self.call("consume_batch", p.consume_request(queue, count=self.batch_size * 2 if self.transport == "tcp" else self.batch_size))
        if reply is not None:
            self.confirm(queue, [m.msg_id for m in p.messages_from_reply(queue, reply)], "confirm_batch")

    @task(1)
    def long_poll(self) -> None:
        if self.transport != "tcp":  # UDP answers a consume at once: nothing to measure
            return self.consume_confirm()
        queue = self.queue()
        reply = self.call("consume_wait", p.consume_request(queue, wait=self.long_poll_wait))
        if reply is not None and reply.get("msg_id") is not None:
            self.confirm(queue, [reply["msg_id"]], "confirm")

    @task(1)
    def monitor(self) -> None:
        self.call("monitor", p.monitor_request(self.queue()))


class TcpQueueUser(QueueUser):
    """A client on TCP (newline-delimited JSON, one request at a time)."""

    transport = "tcp"


class UdpQueueUser(QueueUser):
    """A client on UDP (one request per datagram)."""

    transport = "udp"
