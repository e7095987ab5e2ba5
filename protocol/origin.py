"""Where a request came from. A request keeps its transport's rules wherever it is served (over
UDP there is no long poll, and a reply must fit in udp_max_response), and its reply goes back the
way the request came: to one of this node's TCP connections or UDP senders, or to the node that
forwarded it to this leader."""
from __future__ import annotations

from typing import NamedTuple


class Origin(NamedTuple):
    """A request's origin.

    conn: this node's TCP connection id, or the number of the UDP datagram the request came in;
    for a forwarded request, the forward id that node `node` gave it.
    udp: it came over UDP (at `node`, when forwarded).
    node: 0 for a client of this node; N for a request node N forwarded to this leader.
    """

    conn: int
    udp: bool = False
    node: int = 0

    def wire(self) -> list:
        """The JSON-able form that crosses ZeroMQ (see from_wire)."""
        return [self.conn, self.udp, self.node]

    @staticmethod
    def from_wire(value: list) -> "Origin":
        """An Origin from its wire() form."""
        conn, udp, node = value
        return Origin(conn, udp, node)

    @property
    def forwarded(self) -> bool:
        """Served here for another node's client."""
        return self.node != 0
