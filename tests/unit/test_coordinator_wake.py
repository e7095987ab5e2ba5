"""A coordinator alone waits in a receive on its inbox (ipc.Waiter), which a signal interrupts
but does not end (pyzmq retries it): its SIGTERM and SIGUSR1 handlers end the wait with a WAKE
sent to its own inbox, which the loop then takes as a message that does nothing. Real ZeroMQ
sockets over inproc, the handlers called as a signal would call them."""
from __future__ import annotations

import logging

import zmq

from queue_server.protocol import ipc_frames
from queue_server.server import ipc
from queue_server.server.coordinator import Coordinator


def _coordinator(waker) -> Coordinator:
    coordinator = Coordinator.__new__(Coordinator)  # its handlers and dispatch only
    coordinator.waker, coordinator.handoff_asked, coordinator.stop_asked = waker, False, False
    coordinator.log = logging.getLogger(__name__)
    return coordinator


def test_a_signal_ends_the_wait_of_a_coordinator_alone(caplog):
    ctx = zmq.Context()
    try:
        inbox = ctx.socket(zmq.PULL, socket_class=ipc.Pipe)
        inbox.bind("inproc://coordinator")
        waker = ctx.socket(zmq.PUSH, socket_class=ipc.Pipe)
        waker.connect("inproc://coordinator")
        coordinator = _coordinator(waker)
        wait = ipc.Waiter(inbox)
        assert wait(0.0) is None  # nothing waits
        coordinator._ask_handoff(10, None)
        frames = wait(5.0)
        assert frames == ipc_frames.WAKE_FRAMES and coordinator.handoff_asked
        coordinator._ask_stop(15, None)
        assert wait(5.0) == ipc_frames.WAKE_FRAMES and coordinator.stop_asked
        with caplog.at_level(logging.WARNING):
            coordinator.dispatch(frames, 0.0)
        assert caplog.records == []  # not an unknown kind: it does nothing
    finally:
        ctx.destroy(linger=0)


def test_a_coordinator_of_a_cluster_has_no_waker():
    """It polls the signals' wake-up pipe with its sockets instead (set_wakeup_fd)."""
    coordinator = _coordinator(None)
    coordinator._ask_stop(15, None)
    assert coordinator.stop_asked
