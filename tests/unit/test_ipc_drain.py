"""ipc.drain: the messages waiting on a socket, in order, at most `limit`, and nothing (no
exception) when the caller was woken with none there. Real ZeroMQ sockets over inproc."""
from __future__ import annotations

import pytest
import zmq

from queue_server.server import ipc


@pytest.fixture
def pair():
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL, socket_class=ipc.Pipe)
    pull.bind("inproc://drain")
    push = ctx.socket(zmq.PUSH, socket_class=ipc.Pipe)
    push.connect("inproc://drain")
    yield push, pull
    ctx.destroy(linger=0)


def send(push, count):
    for i in range(count):
        push.send_multipart([b"m", str(i).encode()])


def ready(pull):
    poller = ipc.poller_of(pull)
    assert poller.poll(5000)  # the first message has arrived
    return poller


def test_takes_every_waiting_message_in_order(pair):
    push, pull = pair
    send(push, 5)
    poller = ready(pull)
    # inproc delivers in order, and by the time the first is readable all five were queued
    assert [f[1] for f in ipc.drain(pull, poller)] == [b"0", b"1", b"2", b"3", b"4"]
    assert not poller.poll(0)


def test_stops_at_the_limit_and_leaves_the_rest(pair):
    push, pull = pair
    send(push, 5)
    poller = ready(pull)
    assert [f[1] for f in ipc.drain(pull, poller, 3)] == [b"0", b"1", b"2"]
    assert [f[1] for f in ipc.drain(pull, poller, 3)] == [b"3", b"4"]


def test_nothing_waiting_gives_nothing(pair):
    _, pull = pair
    assert list(ipc.drain(pull, ipc.poller_of(pull))) == []


def test_frames_without_a_copy():
    """As the coordinator drains its peers' ROUTER: zmq.Frame, which carry the ZAP User-Id."""
    ctx = zmq.Context()
    try:
        pull = ctx.socket(zmq.PULL)
        pull.bind("inproc://frames")
        push = ctx.socket(zmq.PUSH)
        push.connect("inproc://frames")
        send(push, 2)
        poller = ready(pull)
        drained = list(ipc.drain(pull, poller, copy=False))
        assert all(isinstance(f, zmq.Frame) for frames in drained for f in frames)
        assert [frames[1].bytes for frames in drained] == [b"0", b"1"]
    finally:
        ctx.destroy(linger=0)
