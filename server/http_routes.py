"""The HTTP API's vocabulary: each route, the protocol request it becomes, and the HTTP status a
protocol reply gets. Pure: no sockets, no asyncio; server/http_api.py moves the bytes.

A route only translates. Every field goes to the node as the JSON protocol request the same
action takes over TCP, so validation, routing, forwarding and replies are the protocol's own
(docs/protocol.md); the reply body is the protocol reply unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import orjson

from queue_server.protocol import vocabulary as p
from queue_server.protocol.framing import TOO_DEEP, too_deep
AUTH_MISSING = p.AUTH_REFUSED + "required: send the header Authorization: Bearer <token>"
BEARER = "bearer "
TOO_LARGE = "request exceeds max_request_size"
LEADER_HEADER = "X-Queue-Leader"  # the leader's client address, host:port
LEADER_NODE_HEADER = "X-Queue-Leader-Node"
LEADER_HTTP_HEADER = "X-Queue-Leader-Http"  # the leader's HTTP API, http://host:port, when known


@dataclass(frozen=True)
class Route:
    """One HTTP route: `method path` does protocol `action`.

    path: an aiohttp-style template ({queue}, {msg_id}); body: the request takes a JSON object
    body whose fields become request fields; ok: the status of a code 0 reply; query: the
    query parameters it documents (any other is passed on too, as the protocol ignores and echoes
    unknown fields)."""

    method: str
    path: str
    action: str
    summary: str
    body: bool = False
    ok: int = 200
    query: tuple[str, ...] = ()


QUEUE = "/v1/queues/{queue}"
MESSAGE = QUEUE + "/messages/{msg_id}"
_SELECT = ("token", "delivery_count")

ROUTES: tuple[Route, ...] = (
    Route("POST", QUEUE + "/messages", "produce",
          "Store a message ({\"data\": \"...\"}) or a batch ({\"data\": [...]}), all or none.", body=True, ok=201),
    Route("GET", QUEUE + "/messages", "consume",
          "Take the first ready message, or up to `count`; `wait` long-polls for up to that many seconds.",
          query=("count", "wait", "lease", "token", "times")),
    Route("DELETE", MESSAGE, "confirm", "Confirm (delete) a consumed message.", query=_SELECT),
    Route("POST", MESSAGE + "/release", "release", "Give a message's lease back: it is ready again at once.",
          body=True, query=_SELECT),
    Route("POST", MESSAGE + "/extend", "extend", "Move a lease's end to now + `retry` seconds.",
          body=True, query=("retry",) + _SELECT),
    Route("GET", "/v1/queues", "list", "The queue names (`pattern`: keep names containing it).", query=("pattern",)),
    Route("GET", QUEUE, "monitor", "A queue's counts: ready, delayed, in_flight, dead, produced, consumed, overflowed."),
    Route("DELETE", QUEUE, "delete_queue", "Remove a queue and its messages."),
    Route("GET", QUEUE + "/peek", "peek", "Look at messages without taking them.",
          query=("count", "state", "after")),
    Route("POST", QUEUE + "/purge", "purge", "Delete every message of a queue."),
    Route("POST", QUEUE + "/pause", "pause", "Stop deliveries from a queue."),
    Route("POST", QUEUE + "/resume", "resume", "Deliver from a paused queue again."),
    Route("POST", QUEUE + "/dlq_replay", "dlq_replay", "Move a queue's dead letters back into it."),
)


def scalar(text: str) -> Any:
    """A query or path value as the JSON value it spells: an integer, a number, true/false, a JSON
    list (a peek cursor), else the string itself (the protocol then names the field it refuses)."""
    if text in ("true", "false"):
        return text == "true"
    if text[:1] == "[":
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            return text
        return text if too_deep(value, text) else value
    value = p.number(text)
    return text if value is None else value


def build(route: Route, path_params: Mapping[str, str], query: Mapping[str, str], body: bytes) -> dict | str:
    """The protocol request for one HTTP request, or the reason it cannot be one (a 400)."""
    request: dict[str, Any] = {}
    if body.strip():
        if not route.body:
            return "body: this route takes no body (use query parameters)"
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return f"malformed JSON: {exc}"
        if too_deep(value, body):
            return TOO_DEEP
        if type(value) is not dict:
            return "request: must be a JSON object"
        request.update(value)
    for name, text in query.items():
        request[name] = scalar(text)
    request["action"] = route.action
    if "queue" in path_params:
        request["queue"] = path_params["queue"]
    if "msg_id" in path_params:
        request["msg_id"] = scalar(path_params["msg_id"])
    return request


def bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (None when there is none)."""
    if header is None or not header[:len(BEARER)].lower() == BEARER:
        return None
    return header[len(BEARER):].strip()


def status_of(reply: Mapping[str, Any], ok: int = 200) -> int:
    """The HTTP status of a protocol reply: `ok` for code 0, 409 for a redirect to the leader, and
    for an error 503 (try again: no leader, queue full, ...), 413 (too large) or 400."""
    code = reply.get("code")
    if code == p.CODE_OK:
        return ok
    if code == p.CODE_REDIRECT:
        return 409
    if p.try_again(reply):
        return 503
    reason = reply.get("reason")
    reason = reason if isinstance(reason, str) else ""
    if reason.startswith(TOO_LARGE):
        return 413
    if reason.startswith("authentication"):
        return 401 if reason == AUTH_MISSING else 403
    return 400


def leader_http(reply: Mapping[str, Any], http_ports: Mapping[int, int]) -> str | None:
    """For a redirect (code -2): the leader's HTTP API, http://<its client host>:<its http_port>,
    when `http_ports` (node_id -> http_port, as the coordinator knows them) has it (else None)."""
    if reply.get("code") != p.CODE_REDIRECT:
        return None
    port = http_ports.get(reply.get("leader_node_id"))  # type: ignore[arg-type]
    host = reply.get("leader_host")
    if not port or not isinstance(host, str):
        return None
    return url(host, port)


def url(host: str, port: int, scheme: str = "http") -> str:
    """scheme://host:port, an IPv6 address in brackets."""
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def leader_headers(reply: Mapping[str, Any], http: str | None = None) -> dict[str, str]:
    """For a redirect (code -2): headers naming the leader's node id, client address and, when
    known, its HTTP address (`http`, from leader_http)."""
    if reply.get("code") != p.CODE_REDIRECT:
        return {}
    headers = {LEADER_NODE_HEADER: str(reply.get("leader_node_id", "")),
               LEADER_HEADER: f"{reply.get('leader_host', '')}:{reply.get('leader_port', '')}"}
    if http is not None:
        headers[LEADER_HTTP_HEADER] = http
    return headers


def cluster_view(local: Mapping[str, Any], leader: Mapping[str, Any] | None, members: list[int]) -> dict:
    """GET /v1/cluster: every node with its role, vote_id, trans_id and replication lag, from this
    node's own monitor reply (action 104) and the leader's (action 4, None when it gave none);
    the answering node's row also has its `memory_bytes` and `overflow_bytes` (with overflow on); with queue
    groups, `groups`: this node's row of each group (monitor's `groups`).

    A node is known as well as the answering node and the leader know it: the leader's followers
    have the trans_id the leader knows they hold (its `match_trans_id`) and its vote_id (they
    follow it); a member the leader does not list is "unknown"."""
    node_id = local.get("node_id")
    leader_id = leader.get("node_id") if leader and leader.get("code") == p.CODE_OK else None
    nodes: dict[int, dict] = {m: {"node_id": m, "role": "unknown", "vote_id": None, "trans_id": None,
                                  "commit_trans_id": None, "lag": None} for m in members or [node_id]}
    if leader and leader_id is not None:
        for row in leader.get("followers", ()):
            nodes[row["node_id"]] = {"node_id": row["node_id"], "role": "follower", "vote_id": leader.get("vote_id"),
                                     "trans_id": row["match_trans_id"], "commit_trans_id": None,
                                     "lag": row["lag"], "client": _address(row)}
        nodes[leader_id] = _self_row(leader, lag=0)
    if node_id is not None:
        nodes[node_id] = _self_row(local, lag=nodes.get(node_id, {}).get("lag"))
        # What the answering node holds for its messages: in memory (bodies and their
        # bookkeeping, as its workers count it) and on disk (overflowed bodies); a node with
        # overflow off (overflow_mb 0, or no disk) counts neither.
        nodes[node_id].update((key, local[key]) for key in _HELD if key in local)
    view = {
        "code": p.CODE_OK,
        "node_id": node_id,
        "leader_node_id": leader_id or local.get("leader_node_id") or None,
        "nodes": [nodes[k] for k in sorted(nodes)],
    }
    if local.get("groups"):  # queue groups: each group's leader and log as this node sees them
        view["groups"] = local["groups"]
    return view


_HELD = ("memory_bytes", "overflow_bytes")


def _self_row(reply: Mapping[str, Any], lag: int | None) -> dict:
    return {"node_id": reply.get("node_id"), "role": reply.get("role", "unknown"), "vote_id": reply.get("vote_id"),
            "trans_id": reply.get("trans_id"), "commit_trans_id": reply.get("commit_trans_id"), "lag": lag}


def _address(row: Mapping[str, Any]) -> str | None:
    return f"{row['client_host']}:{row['client_port']}" if row.get("client_port") else None
