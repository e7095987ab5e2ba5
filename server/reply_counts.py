"""Replies counted by their (action, code) in a plain dict, where they are made: the workers, the
acceptor, and the coordinator's pure cores (server/forwarding.py, server/cluster.py).
server/metrics.py folds such dicts into queue_server_requests_total. Pure: no prometheus_client,
so that the cores may count too."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from queue_server.protocol import vocabulary as p


def count_replies(counts: dict, replies: Iterable[tuple[Any, Any, Any]]) -> None:
    """Count (conn, req_no, reply dict) triples by the reply's (action, code) into `counts`
    (a subscription's pushes are not replies to requests: they are not counted)."""
    for _, req_no, reply in replies:
        if req_no == p.PUSH_REQ_NO:
            continue
        try:
            key = (reply.get("action"), reply.get("code"))
            counts[key] = counts.get(key, 0) + 1
        except TypeError:  # an unhashable action echoed from a bad request
            count_one(counts, reply)


def count_one(counts: dict, reply: Any) -> None:
    """Count one reply dict by its (action, code)."""
    if type(reply) is not dict:
        key: tuple[Any, Any] = ("unknown", "none")
    else:
        action, code = reply.get("action"), reply.get("code")
        key = (action if type(action) in (int, str) or action is None else "unknown", code if type(code) is int else None)
    counts[key] = counts.get(key, 0) + 1
