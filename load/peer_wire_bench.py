"""The peer wire's traffic per heartbeat round of a 3-node cluster, in one process, without
sockets: three real ClusterNodes, each in a Coordinator (server/coordinator.py: its flush and
carry_out, which encode and send), on a fake clock; each peer link counts its sends (a send is one
ZeroMQ message, one wake of the peer) and their bytes, and hands the frames to the peer's node
(decoded by replication/wire.py). Idle, and with --produces N one-message produce batches on the
leader per round. A benchmark tool, not a test: it shows what one group costs on the peer wire,
and (with PYTHONPATH, see load/coordinator_bench.py) what another version cost.

    python load/peer_wire_bench.py                           # idle: heartbeats and their acks
    python load/peer_wire_bench.py --produces 4              # 4 produce batches per round
    python load/peer_wire_bench.py --produces 4 --multipart 1  # sent as with queue groups
    PYTHONPATH=/tmp/old-pkg python load/peer_wire_bench.py   # another version (a package tree)

Prints, per heartbeat round, the leader's sends and bytes to its followers and theirs back.
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0]) == HERE:
    del sys.path[0]
sys.path.append(os.path.dirname(HERE))  # for load/: after PYTHONPATH, which may name another version

import inspect  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import tempfile  # noqa: E402

import orjson  # noqa: E402

from load.options import parse_numbers  # noqa: E402
from queue_server.config.loader import parse_config  # noqa: E402
from queue_server.protocol import ipc_frames, replies  # noqa: E402
from queue_server.protocol.origin import Origin  # noqa: E402
from queue_server.replication import wire  # noqa: E402
from queue_server.replication.messages import Recovered  # noqa: E402
from queue_server.server.cluster import ClusterNode  # noqa: E402
from queue_server.server.coordinator import Coordinator  # noqa: E402
from queue_server.server.transfers import Transfers  # noqa: E402

try:  # a version with queue groups keeps each group's disk in a GroupDisks
    from queue_server.server.group_disks import GroupDisks  # noqa: E402
except ImportError:
    GroupDisks = None  # type: ignore[assignment,misc]

HEARTBEAT_MS = 50
STEP = 0.005  # the fake clock's step, in seconds


class Sink:
    """An outbox that drops what it is given."""

    def send_multipart(self, frames: list[bytes]) -> None:
        pass


class Link:
    """A peer link that counts what it sends and queues it for the peer."""

    def __init__(self, net: list, src: int, dst: int) -> None:
        self.net, self.src, self.dst = net, src, dst
        self.sends = self.bytes = self.frames = 0

    def send(self, data: bytes | list[bytes]) -> None:
        frames = [data] if isinstance(data, (bytes, bytearray)) else data  # one message before multipart sends
        self.sends += 1
        self.frames += len(frames)
        self.bytes += sum(len(f) for f in frames)
        self.net.append((self.dst, frames))


def cluster(tmp: str, multipart: bool = False) -> tuple[dict[int, Coordinator], list]:
    nodes = [{"node_id": i, "host": "127.0.0.1", "port": 1100 + i} for i in (1, 2, 3)]
    net: list = []
    envelope = len(inspect.signature(wire.encode).parameters) - 1  # the envelope's fields this version has
    out = {}
    for i in (1, 2, 3):
        cfg, _ = parse_config(orjson.dumps({"node_id": i, "port": 1000 + i, "workers": 1, "in_memory": True,
                                            "cluster_node_list": nodes, "heartbeat_ms": HEARTBEAT_MS,
                                            "election_timeout_ms": 300}).decode())
        c = Coordinator.__new__(Coordinator)  # its I/O but the peer links is not used
        c.config, c.storage, c.recovery = cfg, None, None
        c.log = logging.getLogger(f"node{i}")
        c.node = ClusterNode(cfg, 0.0, recovered=Recovered(), rng=random.Random(i))
        c.transfers = Transfers(c.node, None, tmp, c.log)
        if GroupDisks is not None:  # a version with queue groups reads its disks from here
            c.disks = GroupDisks.without_storage(c.node, tmp, c.log)
        # The envelope's fields but the group, which a version with queue groups passes apart.
        c.client = (cfg.host, cfg.port, cfg.node_type, cfg.http_port, 0, 0)[:min(envelope, 5)]
        c.workers, c.acceptor = [Sink()], Sink()
        c.peers = {j: Link(net, i, j) for j in (1, 2, 3) if j != i}
        c.next_observe = float("inf")  # no metrics
        c.multipart = multipart  # as a node with queue groups sends (a default node: one message a send)
        out[i] = c
    return out, net


def run(coordinators: dict[int, Coordinator], net: list, now: float) -> None:
    """Tick whoever is due, then deliver until nothing more is sent."""
    for c in coordinators.values():
        if now >= c.node.wake_at():
            c.node.tick(now)
        c.flush()
    while net:
        dst, frames = net.pop(0)
        c = coordinators[dst]
        for frame in frames:
            env = wire.decode(frame)
            c.node.on_peer(env.msg, (env.client_host, env.client_port), now, env.http_port)
        c.flush()


def produce(c: Coordinator, now: float, seq: int) -> None:
    """One worker BATCH of one produce, as the leader's worker sends it."""
    node = c.node
    record = {"op": "produce", "queue": "q", "msg_id": seq, "ready": now, "ttl": now + 60, "retry": 0,
              "priority": 0, "data": "x" * 64, "delivery_count": 0}
    header, blob = replies.encode([(Origin(7), seq, {"action": 1, "queue": "q", "code": 0, "msg_id": seq})])
    c.dispatch(ipc_frames.batch_frames(orjson.dumps([record]), header, blob, ipc_frames.EMPTY_LIST, node.epoch), now)


def main(argv: list[str] | None = None) -> None:
    args = parse_numbers(__doc__, argv, rounds=(200, "heartbeat rounds measured"),
                         produces=(0, "one-message produce batches on the leader per round"),
                         multipart=(0, "1: one send per peer per Ready, as a node with queue groups sends"))
    import queue_server.server.cluster as cluster_module
    print(f"code: {os.path.dirname(os.path.dirname(cluster_module.__file__))}")
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="peer-wire-bench-") as tmp:
        coordinators, net = cluster(tmp, bool(args.multipart))
        now = 0.0
        while not any(c.node.leader is not None and c.node.epoch for c in coordinators.values()):
            now += STEP
            run(coordinators, net, now)
        for _ in range(int(1.0 / STEP)):  # a second to settle: followers caught up, acks in
            now += STEP
            run(coordinators, net, now)
        leader = next(i for i, c in coordinators.items() if c.node.leader is not None)
        links = [link for c in coordinators.values() for link in c.peers.values()]
        for link in links:
            link.sends = link.bytes = link.frames = 0
        steps = round(HEARTBEAT_MS / 1000 / STEP)
        seq = 0
        for _ in range(args.rounds):
            for step in range(steps):
                now += STEP
                if step < args.produces:
                    seq += 1
                    produce(coordinators[leader], now, seq)
                run(coordinators, net, now)
    out = [link for link in links if link.src == leader]
    back = [link for link in links if link.dst == leader]
    for name, group in (("leader -> followers", out), ("followers -> leader", back)):
        sends, frames, size = (sum(getattr(link, f) for link in group) / args.rounds for f in ("sends", "frames", "bytes"))
        print(f"{name}: per heartbeat round {sends:.2f} sends, {frames:.2f} messages, {size:.1f} bytes")
    print(f"{args.rounds} rounds of {HEARTBEAT_MS} ms, {args.produces} produce batch(es) per round")


if __name__ == "__main__":
    main()
