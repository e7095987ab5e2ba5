"""The hop floor: what queue-server's process shape costs per request with no queue work at all.
A benchmark, not a test.

A skeleton node with our processes and transports (a uvloop acceptor speaking newline-delimited
JSON, two "workers", a "coordinator", ZeroMQ PUSH/PULL over ipc, one frame per message, one
message per destination per loop turn) that parses each request once with orjson and answers a
fixed reply of the right shape. The workers and the coordinator forward what they receive, every
message drained in one poll joined into one. Variants (--hops):

  0  the acceptor answers itself: the floor of a uvloop + orjson server in Python
  2  acceptor -> worker -> acceptor
  3  acceptor -> worker -> coordinator -> acceptor: our write path
  4  acceptor -> worker -> coordinator, and worker -> acceptor with the replies, which the
     acceptor holds until the coordinator's small "released up to N" message arrives (the
     watermark design of issue 12)

Each variant, and beanstalkd, runs under load/cbench.c at 1 connection, at each --sweep
connection count, and pipelined (--depth in flight) at --conns connections; the table gives
ops/s, the ratio to beanstalkd's same setting, p50/p99 and CPU us per request per process.
It is bench.py's workload `floor`; this script runs that workload alone:

    python load/hop_floor.py --seconds 5                  # all variants, beanstalkd beside
    python load/bench.py --only unloaded,per-request,pipelined,floor --depths 16 --no-peers
"""
from __future__ import annotations

import argparse
import asyncio
import os
import struct
import subprocess
import sys
import tempfile
import zlib
from array import array
from typing import Callable

import orjson
import zmq

from queue_server.server import ipc
from queue_server.server.child import die_with_parent

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = (0, 2, 3, 4)

# The replies cbench reads (a "code":0; a consume's "msg_id"), shaped as ours are.
_PAYLOAD = ("0123456789abcdef" * 4).encode()
REPLIES = {
    1: b'{"action":1,"queue":"bench0","retry":30,"code":0,"msg_id":1,"node_id":1}\n',
    2: b'{"action":2,"queue":"bench0","code":0,"msg_id":1,"data":"' + _PAYLOAD + b'","delivery_count":1,"node_id":1}\n',
    3: b'{"action":3,"queue":"bench0","msg_id":1,"code":0,"confirmed":1,"node_id":1}\n',
}
BAD = b'{"code":-1,"reason":"the floor answers actions 1, 2 and 3 only"}\n'

# A bundle is messages back to back, each [u32 length][u32 count][count x u32 conn][count x u8
# action][request lines]; bundles joined are a bundle, so a hop forwards what it drained as one.
_U32 = struct.Struct("<I")
_PAIR = struct.Struct("<II")
PAYLOAD, RELEASE = b"P", b"R"  # to the acceptor: [P][u32 worker][u32 seq] bundle, or [R] pairs


def encode(conns: array, actions: bytearray, lines: list[bytes]) -> bytes:
    """One message of a bundle: who asked (connection ids), what (actions), the requests."""
    body = b"".join([_U32.pack(len(conns)), conns.tobytes(), actions, b"\n".join(lines)])
    return _U32.pack(len(body)) + body


def items(bundle: bytes | memoryview) -> list[tuple[int, int]]:
    """The (connection id, action) of every request in a bundle, in order."""
    out: list[tuple[int, int]] = []
    pos, end = 0, len(bundle)
    while pos < end:
        (size,) = _U32.unpack_from(bundle, pos)
        (count,) = _U32.unpack_from(bundle, pos + 4)
        conns = array("I")
        conns.frombytes(bundle[pos + 8:pos + 8 + 4 * count])
        actions = bundle[pos + 8 + 4 * count:pos + 8 + 5 * count]
        out.extend(zip(conns, actions))
        pos += 4 + size
    return out


# ----------------------------------------------------------------------------- processes
def _pass_on(inbox: zmq.Socket, handle: Callable[[list[bytes]], None]) -> None:
    """A worker's or the coordinator's loop: wait for a message, drain up to ipc.MAX_DRAIN, hand
    them to `handle` together (it sends one message per destination). A blocking recv, not ours'
    poll: one system call fewer per wake-up."""
    recv = inbox.recv
    poll = ipc.poller_of(inbox).poll
    while True:
        got = [recv()]
        while len(got) < ipc.MAX_DRAIN and poll(0):  # as ipc.drain: no receive that raises zmq.Again
            got.append(recv(zmq.NOBLOCK))
        handle(got)


def worker(hops: int, index: int, run_dir: str) -> None:
    """Forwards the acceptor's requests: to the acceptor (hops 2), to the coordinator (3), or the
    "records" to the coordinator and the "replies" to the acceptor, numbered (4)."""
    ctx = zmq.Context()
    inbox = ipc.inbox(ctx, run_dir, ipc.worker_name(index))
    to_acceptor = ipc.outbox(ctx, run_dir, "acceptor")
    to_coordinator = ipc.outbox(ctx, run_dir, "coordinator")
    seq = 0

    def handle(got: list[bytes]) -> None:
        nonlocal seq
        bundle = b"".join(got)
        if hops == 2:
            to_acceptor.send(PAYLOAD + bundle)
        elif hops == 3:
            to_coordinator.send(bundle)
        else:
            seq += 1
            head = _PAIR.pack(index, seq)
            to_acceptor.send(PAYLOAD + head + bundle)
            to_coordinator.send(head + bundle)

    _pass_on(inbox, handle)


def coordinator(hops: int, run_dir: str) -> None:
    """Sends the acceptor what the workers sent (hops 3), or only how far each worker's batches
    are released (4)."""
    ctx = zmq.Context()
    inbox = ipc.inbox(ctx, run_dir, "coordinator")
    to_acceptor = ipc.outbox(ctx, run_dir, "acceptor")

    def handle(got: list[bytes]) -> None:
        if hops == 3:
            to_acceptor.send(PAYLOAD + b"".join(got))
            return
        released: dict[int, int] = {}
        for message in got:
            index, seq = _PAIR.unpack_from(message)
            released[index] = max(seq, released.get(index, 0))
        to_acceptor.send(RELEASE + b"".join(_PAIR.pack(i, s) for i, s in released.items()))

    _pass_on(inbox, handle)


class Connection(asyncio.Protocol):
    """One client connection. Parses each request line once (orjson); with hops 0 answers at
    once, else queues it for its worker (flushed once per loop turn)."""

    def __init__(self, node: "Acceptor") -> None:
        self.node = node
        self.rest = b""
        self.conn_id = 0
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes] = []

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.conn_id = self.node.register(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.node.conns.pop(self.conn_id, None)

    def data_received(self, data: bytes) -> None:
        lines = (self.rest + data).split(b"\n")
        self.rest = lines.pop()
        node = self.node
        loads = orjson.loads
        if node.hops == 0:
            out = []
            for line in lines:
                try:
                    out.append(REPLIES.get(loads(line).get("action"), BAD))
                except (orjson.JSONDecodeError, AttributeError):
                    out.append(BAD)
            self.transport.write(b"".join(out))  # type: ignore[union-attr]
            return
        for line in lines:
            try:
                value = loads(line)
                action = value["action"]
                queue = value["queue"].encode()
            except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
                action, queue = 0, b""
            node.submit(self.conn_id, action if action in REPLIES else 0, crc(queue) % node.workers, line)


crc = zlib.crc32


class Acceptor:
    """The acceptor process's state: connections, requests pending per worker, replies held
    until released (hops 4)."""

    def __init__(self, hops: int, workers: int, run_dir: str, loop: asyncio.AbstractEventLoop) -> None:
        self.hops = hops
        self.workers = workers
        self.loop = loop
        self.conns: dict[int, Connection] = {}
        self.next_conn = 1
        ctx = zmq.Context()
        self.inbox = ipc.inbox(ctx, run_dir, "acceptor")
        self.inbox_poller = ipc.poller_of(self.inbox)
        self.to_workers = [ipc.outbox(ctx, run_dir, ipc.worker_name(i)) for i in range(workers if hops else 0)]
        self.pending: list[tuple[array, bytearray, list[bytes]]] = [(array("I"), bytearray(), []) for _ in range(workers)]
        self.flush_scheduled = False
        self.held: list[list[tuple[int, bytes]]] = [[] for _ in range(workers)]  # (seq, bundle) per worker
        self.released = [0] * workers
        self.dirty: set[Connection] = set()

    def register(self, conn: Connection) -> int:
        conn_id = self.next_conn
        self.next_conn += 1
        self.conns[conn_id] = conn
        return conn_id

    def submit(self, conn_id: int, action: int, index: int, line: bytes) -> None:
        conns, actions, lines = self.pending[index]
        conns.append(conn_id)
        actions.append(action)
        lines.append(line)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Send each worker one message with every request it got this loop turn."""
        self.flush_scheduled = False
        for index, (conns, actions, lines) in enumerate(self.pending):
            if lines:
                self.to_workers[index].send(encode(conns, actions, lines), zmq.NOBLOCK)
                self.pending[index] = (array("I"), bytearray(), [])

    def on_inbox(self) -> None:
        """Drain the inbox, answer what is released, write each connection's replies once."""
        recv, poll = self.inbox.recv, self.inbox_poller.poll
        received = 0
        # As ipc.drain (whose sockets carry packed frames, not these): the first on trust, then
        # a poll before each next, never a receive that raises zmq.Again.
        while received < ipc.MAX_DRAIN and (received == 0 or poll(0)):
            try:
                message = recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            received += 1
            if message[:1] == RELEASE:
                for index, seq in _PAIR.iter_unpack(message[1:]):
                    self.released[index] = max(seq, self.released[index])
                    self.release(index)
            elif self.hops == 4:
                index, seq = _PAIR.unpack_from(message, 1)
                self.held[index].append((seq, message))
                self.release(index)
            else:
                self.answer(memoryview(message)[1:])
        if received == ipc.MAX_DRAIN:
            self.loop.call_soon(self.on_inbox)  # more may be waiting: the fd is edge-triggered
        for conn in self.dirty:
            if conn.transport is not None and not conn.transport.is_closing():
                conn.transport.write(b"".join(conn.out))
            conn.out.clear()
        self.dirty.clear()

    def release(self, index: int) -> None:
        """Answer the held batches of worker `index` the coordinator has released."""
        held, upto = self.held[index], self.released[index]
        n = 0
        while n < len(held) and held[n][0] <= upto:
            self.answer(memoryview(held[n][1])[1 + _PAIR.size:])
            n += 1
        del held[:n]

    def answer(self, bundle: memoryview) -> None:
        """Queue the fixed reply of every request in `bundle` on its connection."""
        conns = self.conns
        for conn_id, action in items(bundle):
            conn = conns.get(conn_id)
            if conn is not None:
                conn.out.append(REPLIES.get(action, BAD))
                self.dirty.add(conn)


def acceptor(hops: int, workers: int, port: int, run_dir: str) -> None:
    """The acceptor process: serve 127.0.0.1:`port` until killed."""
    import uvloop

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    node = Acceptor(hops, workers, run_dir, loop)
    loop.add_reader(node.inbox.getsockopt(zmq.FD), node.on_inbox)
    loop.run_until_complete(loop.create_server(lambda: Connection(node), "127.0.0.1", port, backlog=1024,
                                               reuse_address=True))
    loop.run_forever()


# ----------------------------------------------------------------------------- the benchmark
class FloorNode:
    """A skeleton node of `hops` hops on a free loopback port, with bench.Server's interface
    (addresses, cpu_seconds, log_tail, stop)."""

    def __init__(self, hops: int, workdir: str, workers: int = 2) -> None:
        from load.bench import free_port, wait_port

        self.port = free_port()
        self.addresses = [f"127.0.0.1:{self.port}"]
        run_dir = tempfile.mkdtemp(prefix=f"floor{hops}-", dir=workdir)
        self.log_path = os.path.join(run_dir, "log")
        self.log = open(self.log_path, "ab")
        script = [sys.executable, os.path.abspath(__file__), "--role"]
        common = ["--hops", str(hops), "--run-dir", run_dir, "--workers", str(workers)]
        roles = {ipc.worker_name(i): ["worker", "--index", str(i)] for i in range(workers)} if hops else {}
        if hops >= 3:
            roles["coordinator"] = ["coordinator"]
        roles["acceptor"] = ["acceptor", "--port", str(self.port)]
        self.procs: dict[str, subprocess.Popen] = {}
        try:
            for name, role in roles.items():
                self.procs[name] = subprocess.Popen(script + role + common, stdout=self.log, stderr=subprocess.STDOUT)
            wait_port(self.port, self.procs["acceptor"])
        except Exception:
            self.stop()
            raise

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds so far of each process, by name, split in two: its Python thread
        ("acceptor") and ZeroMQ's I/O threads ("acceptor zmq")."""
        from load.procs import thread_cpu

        out: dict[str, float] = {}
        for name, proc in self.procs.items():
            threads = thread_cpu(proc.pid)
            out[name] = sum(s for t, s in threads.items() if not t.startswith("ZMQbg"))
            out[name + " zmq"] = sum(s for t, s in threads.items() if t.startswith("ZMQbg"))
        return out

    def log_tail(self, lines: int = 5) -> str:
        from load.bench import tail_of

        return tail_of(self.log_path, lines)

    def stop(self) -> None:
        from load.procs import stop

        for proc in self.procs.values():
            stop(proc)
        self.log.close()


def workload(args: argparse.Namespace, workdir: str, peers: list[str], start: Callable, measure: Callable) -> None:
    """bench.py's `floor` workload: beanstalkd (when among `peers`) and each --hops variant at 1
    connection, each --sweep count, and --depth in flight at --conns."""
    servers: list[tuple[str, str, object]] = []
    if "beanstalkd" in peers:
        servers.append(("beanstalkd", "beanstalkd", lambda: start("beanstalkd")))
    for hops in args.hops:
        servers.append((f"hops={hops}", "floor", lambda h=hops: FloorNode(h, workdir, args.workers)))
    for label, server, starter in servers:
        runs = [("1", "1 connection", {"conns": 1})]
        runs += [(str(c), f"{c} connections", {"conns": c}) for c in args.sweep]
        runs.append((f"d{args.depth}", f"{args.conns} connections, depth {args.depth}", {"depth": args.depth}))
        for setting, what, kw in runs:
            measure("floor", server, f"{label}, {what}", starter, key=f"floor/{label}/{setting}", **kw)


def table(rows: list[dict]) -> list[str]:
    """The floor rows as a markdown table, each with its ratio to beanstalkd's same setting."""
    floor = {r["key"]: r for r in rows if r.get("workload") == "floor" and r.get("key")}
    if not floor:
        return []
    lines = ["| variant | setting | ops/s | x beanstalkd | p50 ms | p99 ms | CPU us/op: total (by process) |",
             "|---|---|---:|---:|---:|---:|---|"]
    for key, r in floor.items():
        _, label, setting = key.split("/")
        peer = floor.get(f"floor/beanstalkd/{setting}")
        ratio = f"{r['ops_per_s'] / peer['ops_per_s']:.2f}" if peer and label != "beanstalkd" else ""
        cpu = r.get("cpu_us_per_op") or {}
        by = ", ".join(f"{n} {us:.1f}" for n, us in cpu.items())
        where = r["what"].split(", ", 1)[1]
        lines.append(f"| {label} | {where} | {r['ops_per_s']:,.0f} | {ratio} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                     f"{sum(cpu.values()):.1f}" + (f" ({by})" if len(cpu) > 1 else "") + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["--role"]:
        sys.path.insert(0, os.path.dirname(HERE))
        from load import bench

        bench.main(["--only", "floor", *argv])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=("acceptor", "worker", "coordinator"))
    parser.add_argument("--hops", type=int, choices=VARIANTS)
    parser.add_argument("--run-dir")
    parser.add_argument("--workers", type=int)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    a = parser.parse_args(argv)
    die_with_parent()  # as our children do: no orphan outlives the benchmark
    if a.role == "acceptor":
        acceptor(a.hops, a.workers, a.port, a.run_dir)
    elif a.role == "worker":
        worker(a.hops, a.index, a.run_dir)
    else:
        coordinator(a.hops, a.run_dir)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
