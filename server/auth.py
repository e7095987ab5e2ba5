"""Client authentication (config `auth_token_file`): the shared tokens (one per line: any of
them passes, so that a token can be rotated without downtime), compared in constant time, and a
limit on failed attempts per source address. Pure but for reading the file: the time comes in as
an argument."""
from __future__ import annotations

import hmac
from collections import deque
from collections.abc import Sequence
from typing import Any

from queue_server.protocol.vocabulary import AUTH_REFUSED
from queue_server.server import secret_file

AUTH_REQUIRED = AUTH_REFUSED + "required: send {\"action\": \"auth\", \"token\": ...} first"
AUTH_FAILED = AUTH_REFUSED + "failed"
AUTH_THROTTLED = AUTH_FAILED + ": too many failures from this address, retry later"

MAX_FAILURES = 5  # failed attempts per address within WINDOW before it is refused unchecked
WINDOW = 10.0  # seconds


def read_token_file(path: str) -> tuple[bytes, ...]:
    """The tokens in `path`, one per line. ValueError with a one-line reason if the file cannot
    be read or holds no token."""
    return tuple(secret_file.read(path, "auth_token_file", "token"))


class Authenticator:
    """Checks client credentials; None as the tokens means authentication is off."""

    def __init__(self, tokens: Sequence[bytes] | None, max_failures: int = MAX_FAILURES, window: float = WINDOW) -> None:
        self.tokens = tuple(tokens) if tokens is not None else None
        self.max_failures = max_failures
        self.window = window
        self.failures: dict[Any, deque[float]] = {}
        self.failed_total = 0  # wrong or missing credentials, all transports
        self.throttled_total = 0  # attempts refused unchecked

    @property
    def required(self) -> bool:
        return self.tokens is not None

    def valid(self, candidate: Any) -> bool:
        """The candidate (a str or bytes) is one of the tokens. Every token is compared, each in
        constant time: the time taken says nothing of the tokens' content, nor which one matched."""
        if self.tokens is None:
            return True
        if type(candidate) is str:
            candidate = candidate.encode()
        if type(candidate) is not bytes:
            return False
        matched = False
        for token in self.tokens:
            matched |= hmac.compare_digest(candidate, token)
        return matched

    def attempt(self, address: Any, candidate: Any, now: float) -> str | None:
        """A TCP auth request from `address`: None if it passes, else the reason to answer."""
        recent = self.failures.get(address)
        if recent is not None:
            while recent and recent[0] <= now - self.window:
                recent.popleft()
            if not recent:
                del self.failures[address]
                recent = None
        if recent is not None and len(recent) >= self.max_failures:
            self.throttled_total += 1
            return AUTH_THROTTLED
        if self.valid(candidate):
            return None
        self.failed_total += 1
        self.failures.setdefault(address, deque()).append(now)
        if len(self.failures) > 100_000:  # bound the memory a scan of many addresses can take
            self.failures.pop(next(iter(self.failures)))
        return AUTH_FAILED

    def datagram(self, value: Any) -> bool:
        """A UDP request passes: it carries a valid `auth_token` (removed from it), or
        authentication is off. A datagram that fails gets no reply at all (no amplification, no
        oracle): the caller drops it."""
        candidate = value.pop("auth_token", None) if type(value) is dict else None
        if self.tokens is None:
            return True
        if type(value) is not dict or not self.valid(candidate):
            self.failed_total += 1
            return False
        return True
