"""The ZeroMQ plumbing between a node's processes: endpoint names in the run directory, socket
construction and the process loop. The messages themselves are protocol/ipc_frames.py's; each
crosses ZeroMQ as one frame (`pack`), which costs a fraction of a multipart message."""
from __future__ import annotations

import os
import struct
from typing import Any, Callable, Iterator

import zmq

# Most messages a process drains from its inbox before sending its outputs on.
MAX_DRAIN = 256
MAX_PARTS = 255
_LENGTHS = [struct.Struct(f"<B{n}I") for n in range(MAX_PARTS + 1)]


def pack(parts: list[bytes]) -> bytes:
    """A message's parts as one frame: their count (u8), their lengths (u32 each), the parts."""
    return b"".join([_LENGTHS[len(parts)].pack(len(parts), *map(len, parts)), *parts])


def unpack(data: bytes) -> list[bytes]:
    """The parts of a frame made by pack; ValueError if it is not one."""
    try:
        lengths = _LENGTHS[data[0]].unpack_from(data, 0)
    except (IndexError, struct.error):
        raise ValueError("not a packed message") from None
    pos = 1 + 4 * lengths[0]
    parts = []
    for n in lengths[1:]:
        parts.append(data[pos:pos + n])
        pos += n
    if pos != len(data):
        raise ValueError("not a packed message")
    return parts


class Pipe(zmq.Socket):
    """A ZeroMQ socket whose multipart messages travel packed in one frame: each frame of a
    multipart message costs the sender and the receiver a pass through libzmq of its own."""

    def send_multipart(self, msg_parts: Any, flags: int = 0, copy: bool = True, track: bool = False,
                       **kwargs: Any) -> Any:
        return self.send(pack(msg_parts), flags)

    def recv_multipart(self, flags: int = 0, copy: bool = True, track: bool = False) -> list[bytes]:  # type: ignore[override]
        return unpack(self.recv(flags))


def endpoint(run_dir: str, name: str) -> str:
    """The ipc:// endpoint of a process's inbox."""
    return "ipc://" + os.path.join(run_dir, name + ".ipc")


def inbox(ctx: zmq.Context, run_dir: str, name: str) -> zmq.Socket:
    """Bind and return the PULL socket that receives everything sent to process `name`."""
    sock = ctx.socket(zmq.PULL, socket_class=Pipe)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint(run_dir, name))
    return sock


def outbox(ctx: zmq.Context, run_dir: str, name: str) -> zmq.Socket:
    """A PUSH socket to process `name`'s inbox (one per destination: PUSH to several peers would
    round-robin)."""
    sock = ctx.socket(zmq.PUSH, socket_class=Pipe)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint(run_dir, name))
    return sock


def worker_name(index: int) -> str:
    """The inbox name of worker `index`."""
    return f"worker-{index}"


def poller_of(sock: zmq.Socket) -> zmq.Poller:
    """A poller of `sock` alone, for drain."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    return poller


def drain(sock: zmq.Socket, poller: zmq.Poller, limit: int = MAX_DRAIN, *,
          copy: bool = True, first: list[Any] | None = None) -> Iterator[list[Any]]:
    """The messages waiting on `sock`, at most `limit`, for a caller told that one is there (if
    none is, a zmq.Again ends it), or that received `first` already. `poller` polls `sock` alone
    (poller_of): asking it whether another message waits costs less than a receive that raises
    zmq.Again. Each message is a list of bytes, or with copy=False of zmq.Frame (which carry the
    sender's ZAP User-Id)."""
    recv = sock.recv_multipart
    if first is None:
        try:
            first = recv(zmq.NOBLOCK, copy=copy)
        except zmq.Again:
            return
    yield first
    poll = poller.poll
    for _ in range(limit - 1):
        if not poll(0):
            return
        yield recv(zmq.NOBLOCK, copy=copy)


def serve(sock: zmq.Socket, dispatch: Callable[[list[bytes]], None], idle: Callable[[], float | None], after: Callable[[], None]) -> None:
    """A process's main loop: wait for messages on `sock` (at most until `idle()` seconds, or 1 s),
    hand each to `dispatch` (at most MAX_DRAIN before `after` runs, so output is never held back
    by a flood of input), then call `after`."""
    poller = poller_of(sock)
    wait = Waiter(sock)
    while True:
        timeout = idle()
        frames = wait(1.0 if timeout is None else timeout)
        if frames is not None:
            for frames in drain(sock, poller, first=frames):
                dispatch(frames)
        after()


class Waiter:
    """Waits for the next message on one socket for up to a given time: in a receive with a
    timeout (RCVTIMEO), not in a poll followed by a receive, which costs a system call and a
    pass through the poller's Python more per wake-up."""

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock
        self.recv = sock.recv_multipart
        self.timeout = -1  # the RCVTIMEO set now (ms)

    def __call__(self, seconds: float) -> list[bytes] | None:
        """The next message, or None if none came within `seconds` (at most 1 s)."""
        timeout = int(min(max(seconds, 0.0), 1.0) * 1000 + 0.5)
        if timeout != self.timeout:
            self.sock.setsockopt(zmq.RCVTIMEO, timeout)
            self.timeout = timeout
        try:
            return self.recv()
        except zmq.Again:
            return None
