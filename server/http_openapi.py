"""The OpenAPI 3 document of the HTTP API (GET /v1/openapi.json), made from the route table so
that the two cannot disagree. Pure."""
from __future__ import annotations

import re
from typing import Any, Iterable

from queue_server.server.http_routes import Route

_REPLY = {"$ref": "#/components/schemas/Reply"}
_ERRORS = {
    "400": "bad input: `reason` names the field",
    "401": "no `Authorization: Bearer <token>` (the node has auth_token_file set)",
    "403": "wrong token, or too many failures from this address",
    "409": "this node is a follower with forward_request 0: the leader's address is in the headers "
           "X-Queue-Leader (host:port of its client port), X-Queue-Leader-Node and in the body",
    "413": "request body larger than max_request_size",
    "503": "not now: no leader, queue full, the leader changed or did not answer; retry",
}
_PARAM_DOCS = {
    "count": ("integer", "how many messages (1..1000)"),
    "wait": ("number", "long poll: seconds to wait for a message (up to the node's max_wait)"),
    "lease": ("number", "lease every delivered message for this many seconds"),
    "token": ("string", "lease token (docs/protocol.md section 5a)"),
    "times": ("boolean", "add ready, ttl and lease_until to each message"),
    "delivery_count": ("integer", "act only if the message was not delivered again since"),
    "retry": ("number", "extend: the lease ends this many seconds from now"),
    "pattern": ("string", "keep queue names containing this"),
    "state": ("string", "peek: ready, delayed, leased or dead"),
    "after": ("string", "peek: the cursor of the previous page, as JSON"),
}
_BODY_SCHEMA = {
    "type": "object",
    "description": "request fields of the action (docs/protocol.md section 5)",
    "properties": {
        "data": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "delay": {"type": "number"}, "ttl": {"type": "number"}, "retry": {"type": "number"},
        "priority": {"type": "integer"},
    },
}


def _operation(route: Route) -> dict[str, Any]:
    params = [{"name": name, "in": "path", "required": True,
               "schema": {"type": "integer" if name == "msg_id" else "string"}}
              for name in re.findall(r"{(\w+)}", route.path)]
    for name in route.query:
        kind, doc = _PARAM_DOCS[name]
        params.append({"name": name, "in": "query", "required": False, "schema": {"type": kind}, "description": doc})
    op: dict[str, Any] = {
        "operationId": f"{route.action}",
        "summary": route.summary,
        "description": f"The protocol's `{route.action}` action (docs/protocol.md).",
        "parameters": params,
        "responses": {str(route.ok): {"description": "done (code 0)", "content": {"application/json": {"schema": _REPLY}}},
                      **{status: {"description": text, "content": {"application/json": {"schema": _REPLY}}}
                         for status, text in _ERRORS.items()}},
    }
    if route.body:
        op["requestBody"] = {"required": route.action == "produce",
                             "content": {"application/json": {"schema": _BODY_SCHEMA}}}
    return op


def openapi(routes: Iterable[Route]) -> dict[str, Any]:
    """The OpenAPI 3.0 document of `routes` plus GET /v1/cluster."""
    paths: dict[str, dict] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    paths["/v1/cluster"] = {"get": {
        "operationId": "cluster", "summary": "Every node's role, vote_id, trans_id and replication lag; the answering "
                   "node's memory_bytes and overflow_bytes.",
        "responses": {"200": {"description": "the nodes", "content": {"application/json": {"schema": {"type": "object"}}}}},
    }}
    return {
        "openapi": "3.0.3",
        "info": {"title": "queue-server HTTP API", "version": "1",
                 "description": "Each route is one action of the JSON protocol (docs/protocol.md); "
                                "the response body is the protocol reply."},
        "paths": paths,
        "components": {
            "schemas": {"Reply": {"type": "object", "required": ["code"], "properties": {
                "code": {"type": "integer", "description": "0 ok, -1 error, -2 redirect"},
                "reason": {"type": "string"}, "node_id": {"type": "integer"}}}},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
    }
