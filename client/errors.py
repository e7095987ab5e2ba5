"""Exceptions raised by the queue clients."""
from __future__ import annotations

from typing import Any


class QueueError(Exception):
    """A request failed: the server answered with a non-zero code, or no usable answer came.

    `code` is the reply's code (-1 error, -2 redirect not followed), `reason` its reason and
    `reply` the whole reply (for client-side failures, a reply-shaped dict made by the client).
    """

    def __init__(self, code: int, reason: str, reply: dict[str, Any] | None = None) -> None:
        super().__init__(f"[{code}] {reason}")
        self.code = code
        self.reason = reason
        self.reply: dict[str, Any] = reply if reply is not None else {"code": code, "reason": reason}


class NoServerAvailable(QueueError):
    """Every configured host failed this call (connect error, closed connection or timeout)."""


class QueueTimeout(QueueError):
    """No reply came in time from any host (the last host tried timed out).

    The request may still have been carried out by a server that answered too late.
    """


class ConnectTimeout(ConnectionError):
    """Connecting to a host took longer than the timeout (used inside the clients' fail-over)."""
