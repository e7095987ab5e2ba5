"""What both clients are made with: hosts, transport, timeout, redirects, idempotent produces,
token and TLS, checked and kept the same way by QueueClient and AsyncQueueClient, and how a
client pickles (its settings, to be made again where it is unpickled)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import protocol as p
from . import tls as tls_
from .credentials import TokenOption, token_of
from .failover import Route
from .protocol import Address


class ClientSettings:
    """A client's settings and its route through the host list (client/failover.py).

    A client pickles as its settings only (e.g. shipped to Spark executors, or to a
    multiprocessing worker): the copy connects anew, with a producer id of its own, presenting
    the same token (a TokenFile's file is read again there) over the same TLS (TlsFiles' files
    are loaded again there; an ssl.SSLContext does not pickle: TypeError saying so)."""

    hosts: list[Address]

    def _settle(self, hosts: str | Sequence[str | Address], transport: str, timeout: float,
                follow_redirects: bool, max_redirects: int, idempotent: bool, token: TokenOption,
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
        self._token_option = token
        self.token = token_of(token)
        self.tls = tls
        self._ssl = tls_.context(tls)

    def _settings(self) -> dict[str, Any]:
        """The keyword arguments that make this client again (its constructor's, but hosts)."""
        refused = tls_.pickling_refused(self.tls)
        if refused is not None:
            raise refused
        return {"transport": self.transport, "timeout": self.timeout, "follow_redirects": self.follow_redirects,
                "max_redirects": self.max_redirects, "idempotent": self._producer is not None,
                "token": self._token_option, "tls": self.tls}

    def __getstate__(self) -> dict[str, Any]:
        return {"hosts": self.hosts, **self._settings()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        hosts = state.pop("hosts")
        self.__init__(hosts, **state)  # type: ignore[misc]

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
