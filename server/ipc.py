"""The ZeroMQ plumbing between a node's processes: endpoint names in the run directory, socket
construction, and the message kinds they exchange (see docs/architecture.md)."""
from __future__ import annotations

import os
from typing import Callable

import orjson
import zmq

_dumps = orjson.dumps
_NEWLINE = orjson.OPT_APPEND_NEWLINE
# Most messages a process drains from its inbox before sending its outputs on.
MAX_DRAIN = 256

# Message kinds (first frame of every multipart message).
REQ = b"req"  # -> worker: [REQ, json [[conn, req_no, request] | [conn, req_no, request, gather], ...], epoch]
CLOSE = b"close"  # acceptor -> worker: [CLOSE, json conn]
UNDELIVER = b"undeliver"  # acceptor -> worker: [UNDELIVER, json [queue, [msg_id, ...]]]
APPLY = b"apply"  # coordinator -> worker: [APPLY, json [record, ...]] (replicas replay the leader's log)
BATCH = b"batch"  # worker -> coordinator: [BATCH, records json, reply header json, reply blob, partials json]
REP = b"rep"  # coordinator -> acceptor: [REP, reply header json [[conn, req_no, end], ...], reply blob]
STATUS = b"status"  # coordinator -> acceptor: [STATUS, json {role, leader_node_id, leader_host, leader_port}]
FORWARD = b"forward"  # acceptor -> coordinator: [FORWARD, json [[conn, req_no, request], ...]] for the leader
MODE = b"mode"  # coordinator -> worker: [MODE, json [accepting, epoch]] whether to accept queue requests
RESET = b"reset"  # coordinator -> worker: [RESET, json {queue: snapshot}] replace all queues

EMPTY_LIST = b"[]"


def endpoint(run_dir: str, name: str) -> str:
    """The ipc:// endpoint of a process's inbox."""
    return "ipc://" + os.path.join(run_dir, name + ".ipc")


def inbox(ctx: zmq.Context, run_dir: str, name: str) -> zmq.Socket:
    """Bind and return the PULL socket that receives everything sent to process `name`."""
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint(run_dir, name))
    return sock


def outbox(ctx: zmq.Context, run_dir: str, name: str) -> zmq.Socket:
    """A PUSH socket to process `name`'s inbox (one per destination: PUSH to several peers would
    round-robin)."""
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint(run_dir, name))
    return sock


def worker_name(index: int) -> str:
    """The inbox name of worker `index`."""
    return f"worker-{index}"


def encode_replies(replies: list[tuple[int, int, dict]]) -> tuple[bytes, bytes]:
    """Encode (conn, req_no, reply) triples as a REP/BATCH header and blob: the blob is the
    newline-terminated JSON replies back to back, the header [[conn, req_no, end_offset], ...]."""
    header = []
    chunks = []
    end = 0
    for conn, req_no, reply in replies:
        data = _dumps(reply, option=_NEWLINE)
        end += len(data)
        chunks.append(data)
        header.append((conn, req_no, end))
    return _dumps(header), b"".join(chunks)


def serve(sock: zmq.Socket, dispatch: Callable[[list[bytes]], None], idle: Callable[[], float | None], after: Callable[[], None]) -> None:
    """A process's main loop: wait for messages on `sock` (at most until `idle()` seconds, or 1 s),
    hand each to `dispatch` (at most MAX_DRAIN before `after` runs, so output is never held back
    by a flood of input), then call `after`."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    while True:
        timeout = idle()
        timeout = 1.0 if timeout is None else min(max(timeout, 0.0), 1.0)
        if poller.poll(timeout * 1000 + 0.5):
            for _ in range(MAX_DRAIN):
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                dispatch(frames)
        after()
