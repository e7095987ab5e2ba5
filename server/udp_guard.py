"""The UDP amplification guard (config udp_amplification_limit): on a UDP address others can
reach, a reply to a datagram whose sender is not authenticated is at most `factor` times the
datagram's size, as QUIC does before it has validated an address, so that a spoofed source
address cannot turn the node into an amplifier. Pure."""
from __future__ import annotations


def reply_limit(request_bytes: int, udp_max_response: int, factor: int, guarded: bool,
                authenticated: bool) -> int:
    """The largest reply (bytes) a datagram of `request_bytes` may get. guarded: the UDP port
    listens on a non-loopback address; factor 0 turns the guard off."""
    if not guarded or authenticated or factor <= 0:
        return udp_max_response
    return min(udp_max_response, factor * request_bytes)
