"""What both clients are made with: hosts, transport, timeout, redirects, idempotent produces,
token and TLS, checked and kept the same way by QueueClient and AsyncQueueClient."""
from __future__ import annotations

from collections.abc import Sequence

from . import protocol as p
from . import tls as tls_
from .failover import Route
from .protocol import Address


class ClientSettings:
    """A client's settings and its route through the host list (client/failover.py)."""

    hosts: list[Address]

    def _settle(self, hosts: str | Sequence[str | Address], transport: str, timeout: float,
                follow_redirects: bool, max_redirects: int, idempotent: bool, token: str | None,
                tls: tls_.TlsOption) -> None:
        """Check and keep the settings both clients' constructors take."""
        if transport not in ("tcp", "udp"):
            raise ValueError(f"transport must be 'tcp' or 'udp', not {transport!r}")
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        self.hosts, self.transport, self.timeout = p.parse_hosts(hosts), transport, float(timeout)
        self.follow_redirects = follow_redirects
        self.max_redirects = max_redirects
        # Gives every produce a (producer, sequence): a retried produce is stored once.
        self._producer = p.ProducerSequence() if idempotent else None
        self._udp = transport == "udp"
        self._udp_seq = 0
        # Its epoch is bumped whenever the current host changes; connections remember the epoch they serve.
        self._route = Route(self.hosts)
        self.token = token
        self.tls = tls
        self._ssl = tls_.context(tls)

    def _next_udp_seq(self) -> int:
        """The seq of the next UDP request (its reply carries it back)."""
        self._udp_seq = (self._udp_seq + 1) & 0x7FFFFFFF
        return self._udp_seq

    @property
    def address(self) -> Address:
        """The host the next request goes to."""
        return self._route.address

    def __repr__(self) -> str:
        hosts = ",".join(p.format_address(a) for a in self.hosts)
        return f"{type(self).__name__}({hosts!r}, transport={self.transport!r})"
