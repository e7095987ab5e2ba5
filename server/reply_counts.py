"""Replies counted in plain dicts where they are made: by (action, code) in the workers, the
acceptor and the coordinator's server/forwarding.py; and the workers' replies the coordinator
refused (server/cluster.py ClusterNode.refuse), by reason. server/metrics.py folds such dicts into
queue_server_requests_total and queue_server_writes_refused_total. Pure: no prometheus_client,
so that the coordinator's pure cores may count too."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from queue_server.protocol import vocabulary as p

# Why the coordinator replaced a worker's replies with an error (ClusterNode.refuse), and the
# `reason` label each is counted under in queue_server_writes_refused_total.
REFUSALS = {
    p.LEADERSHIP_LOST: "leadership_lost",
    p.LEADERSHIP_CHANGED: "leadership_changed",
    p.MODE_CHANGED: "mode_changed",
    p.STORAGE_UNAVAILABLE: "storage_unavailable",
    p.NOT_LEADER_RETRY: "not_leader",
}
REFUSAL_LABELS = tuple(REFUSALS.values())


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


def count_refused(counts: dict[str, int], reason: str, n: int) -> None:
    """`n` replies of a worker were refused for `reason` (a key of REFUSALS): counted by its
    label ("other" for a reason REFUSALS lacks: a metric's label never stops the coordinator)."""
    label = REFUSALS.get(reason, "other")
    counts[label] = counts.get(label, 0) + n
