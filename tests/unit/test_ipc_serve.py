"""ipc.serve, a worker's loop: the messages waiting are handed to dispatch in order (at most
MAX_DRAIN before `after` runs), and `after` also runs when idle()'s wait passes with none.
Real ZeroMQ sockets over inproc; the loop is left by an exception from `after`."""
from __future__ import annotations

import time

import pytest
import zmq

from queue_server.server import ipc


class Stop(Exception):
    pass


@pytest.fixture
def pair():
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL, socket_class=ipc.Pipe)
    pull.bind("inproc://serve")
    push = ctx.socket(zmq.PUSH, socket_class=ipc.Pipe)
    push.connect("inproc://serve")
    yield push, pull
    ctx.destroy(linger=0)


def run(pull, idle, turns):
    """Serve until `after` has run `turns` times; what dispatch got before each `after`."""
    got: list = []
    seen: list[list[bytes]] = []

    def after():
        got.append(list(seen))
        seen.clear()
        if len(got) == turns:
            raise Stop

    with pytest.raises(Stop):
        ipc.serve(pull, lambda frames: seen.append(frames[1]), idle, after)
    return got


def test_waiting_messages_are_dispatched_in_order_then_after_runs(pair):
    push, pull = pair
    for i in range(5):
        push.send_multipart([b"m", b"%d" % i])
    ipc.poller_of(pull).poll(5000)  # the first has arrived; inproc queued all five before it
    assert run(pull, lambda: 1.0, 1) == [[b"0", b"1", b"2", b"3", b"4"]]


def test_after_runs_at_most_max_drain_messages_apart(pair):
    push, pull = pair
    for i in range(ipc.MAX_DRAIN + 3):
        push.send_multipart([b"m", b"%d" % i])
    ipc.poller_of(pull).poll(5000)
    first, second = run(pull, lambda: 1.0, 2)
    assert len(first) == ipc.MAX_DRAIN
    assert second == [b"%d" % i for i in range(ipc.MAX_DRAIN, ipc.MAX_DRAIN + 3)]


def test_after_runs_when_the_wait_passes_with_nothing(pair):
    _, pull = pair
    waits = iter([0.02, 0.0, None])  # a wait, none at all, and the longest (1 s)
    started = time.monotonic()
    assert run(pull, lambda: next(waits), 2) == [[], []]
    assert time.monotonic() - started >= 0.02


def test_a_message_ends_the_wait_early(pair):
    push, pull = pair
    push.send_multipart([b"m", b"x"])
    started = time.monotonic()
    assert run(pull, lambda: 0.9, 1) == [[b"x"]]
    assert time.monotonic() - started < 0.9
