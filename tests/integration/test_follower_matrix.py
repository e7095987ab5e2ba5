"""On a real 3-node cluster: every kind of request, good and bad, sent to a follower is answered
as the leader answers it (docs/protocol.md section 2, "Forwarding"), at once, exactly once and in
order, over TCP and UDP; with client authentication on too. Where a follower answers by design
from its own state (`leader`, `auth`, the local_* actions, a `subscribe`), that is asserted."""
from __future__ import annotations

import itertools
import signal
import socket
import time
from typing import Any, Callable

import orjson
import pytest

from queue_server.protocol import framing
from queue_server.protocol import vocabulary as p
from tests.harness import Cluster, RawTcp, wait_for

TOKEN = "follower-matrix-token"
# Well under the follower's 10 s forward grace (server/forwarding.py FORWARD_GRACE): a reply that
# takes this long was lost on the way and failed by the follower's timer.
PROMPT = 3.0
_runs = itertools.count()

# Fields that differ between two nodes or two runs by nature: who answered, ids, times, the
# node's own log position, counters of the whole node.
_VOLATILE = frozenset({"node_id", "msg_id", "msg_ids", "ready", "ttl", "lease_until", "cursor",
                       "leader_node_id", "trans_id", "commit_trans_id", "log_size", "max_log_size",
                       "role", "vote_id", "followers", "confirmed_ids", "produced", "consumed"})
# A node-wide monitor sums every queue of the cluster, which other rows change meanwhile.
_NODE_TOTALS = frozenset({"size", "ready", "delayed", "in_flight", "waiters", "queue_count",
                          "wait_status", "max_id", "dead", "overflowed", "overflow_bytes", "memory_bytes"})

Q = "{q}"  # stands for the queue of the run, so that the leader's and the follower's runs share no state


def _swap(value: Any, old: str, new: str) -> Any:
    """`value` with `old` replaced by `new` in every string, keys included."""
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [_swap(v, old, new) for v in value]
    if isinstance(value, dict):
        return {_swap(k, old, new): _swap(v, old, new) for k, v in value.items()}
    return value


def comparable(reply: dict, q: str) -> dict:
    """What must be the same whichever node the request reached: the reply without the fields
    that name the answering node, ids and times, with the run's queue name put back to Q."""
    out = {k: v for k, v in _swap(reply, q, Q).items() if k not in _VOLATILE}
    if "messages" in out:
        out["messages"] = [{k: v for k, v in m.items() if k not in _VOLATILE} for m in out["messages"]]
    if isinstance(reply.get("msg_ids"), dict):  # a virtual queue's produce: which real queues got it
        out["msg_ids"] = sorted(reply["msg_ids"])
    if reply.get("action") in (4, "monitor", 104, "local_monitor") and reply.get("queue") is None:
        out = {k: v for k, v in out.items() if k not in _NODE_TOTALS}
    if type(out.get("reason")) is str and out["reason"].startswith("malformed JSON"):
        out["reason"] = "malformed JSON"  # the parser's detail names a column, the same either way
    return out


# --------------------------------------------------------------------------- the requests
# Raw bytes are sent as they are (bad framing); a dict gets a `seq` (its row number) and Q filled.
VALID = [
    {"action": 1, "queue": Q, "data": "a", "retry": 30},
    {"action": "produce", "queue": Q, "data": ["b", "c", "d"], "retry": 30, "delay": 0, "ttl": 600},
    {"action": 1, "queue": Q, "data": "p", "priority": 5, "producer": "prod", "sequence": 1},
    {"action": 1, "queue": Q, "data": "p", "priority": 5, "producer": "prod", "sequence": 1},  # duplicate
    {"action": 1, "queue": Q + ".later", "data": "later", "delay": 3600, "max_deliveries": 2},
    {"action": 2, "queue": Q},
    {"action": "consume", "queue": Q, "count": 2, "times": True},
    {"action": 3, "queue": Q, "msg_id": 1},
    {"action": 5, "queue": Q, "msg_ids": [2, 99]},
    {"action": 6, "queue": Q, "msg_id": 2, "retry": 60},
    {"action": 2, "queue": Q, "count": 1, "lease": 60, "token": "tok/1"},
    {"action": 2, "queue": Q, "count": 1, "lease": 60, "token": "tok/1"},  # replayed
    {"action": "extend", "queue": Q, "token": "tok/1", "retry": 120},
    {"action": "release", "queue": Q, "token_prefix": "tok/"},
    {"action": 2, "queue": Q, "count": 5, "lease": 30},
    {"action": "confirm", "queue": Q, "msg_ids": [2, 3], "delivery_counts": [2, 1], "report_ids": True},
    {"action": 4, "queue": Q},
    {"action": "monitor", "queue": Q + ".later"},
    {"action": 4},
    {"action": 7, "pattern": Q},
    {"action": "list", "pattern": Q + "."},
    {"action": 20, "queue": Q, "state": "leased"},
    {"action": "peek", "queue": Q + ".later", "state": "delayed", "count": 1},
    {"action": "peek", "queue": Q, "state": "dead"},
    {"action": 23, "queue": Q},
    {"action": "pause", "queue": Q},
    {"action": 2, "queue": Q, "count": 3},  # paused: nothing
    {"action": 4, "queue": Q},
    {"action": "resume", "queue": Q},
    {"action": 25, "queue": Q},
    {"action": "dlq_replay", "queue": Q + ".dlq"},
    {"action": 21, "queue": Q},
    {"action": "purge", "queue": Q + ".never"},
    {"action": 22, "queue": Q + ".later"},
    {"action": "delete_queue", "queue": Q + ".never"},
    {"action": 1, "queue": "fan", "data": "to both"},
    {"action": 1, "queue": "fan", "data": ["x", "y"]},
    {"action": 1, "queue": Q, "data": [str(i) for i in range(1001)]},  # over MAX_BATCH: a produce is not bounded by it
    {"action": 2, "queue": Q, "count": 1000},
    {"action": 2, "queue": Q, "wait": 0.2},  # a long poll that ends empty
    {"action": 2, "queue": Q, "count": 2, "wait": 0.2},
    {"action": 1, "queue": Q, "data": "unknown fields are echoed", "extra": {"k": [1, None]}},
]

BAD = [
    {"action": 1, "data": "x"},
    {"action": 1, "queue": None, "data": "x"},
    {"action": 1, "queue": "", "data": "x"},
    {"action": 1, "queue": 5, "data": "x"},
    {"action": 1, "queue": ["q"], "data": "x"},
    {"action": 1, "queue": "x" * 257, "data": "x"},
    {"action": 1, "queue": "\u00e9" * 129, "data": "x"},
    {"action": 1, "queue": "a\x01b", "data": "x"},
    {"action": 1, "queue": "a\x7fb", "data": "x"},
    {"action": 1, "queue": Q},
    {"action": 1, "queue": Q, "data": 5},
    {"action": 1, "queue": Q, "data": []},
    {"action": 1, "queue": Q, "data": ["a", 1]},
    {"action": 1, "queue": Q, "data": "x", "retry": "1"},
    {"action": 1, "queue": Q, "data": "x", "retry": -1},
    {"action": 1, "queue": Q, "data": "x", "retry": True},
    {"action": 1, "queue": Q, "data": "x", "delay": -1},
    {"action": 1, "queue": Q, "data": "x", "delay": 100, "ttl": 10},
    {"action": 1, "queue": Q, "data": "x", "priority": 1.5},
    {"action": 1, "queue": Q, "data": "x", "priority": 2 ** 31},
    {"action": 1, "queue": Q, "data": "x", "producer": "p"},
    {"action": 1, "queue": Q, "data": "x", "sequence": 1},
    {"action": 1, "queue": Q, "data": "x", "producer": "", "sequence": 1},
    {"action": 1, "queue": Q, "data": "x", "producer": "p", "sequence": -1},
    {"action": 1, "queue": Q, "data": "x", "max_deliveries": -1},
    {"action": 1, "queue": "fan_a.dlq", "data": "x", "delay": "soon"},
    {"action": 2},
    {"action": 2, "queue": "fan"},
    {"action": 2, "queue": Q, "count": 0},
    {"action": 2, "queue": Q, "count": 1001},
    {"action": 2, "queue": Q, "count": "2"},
    {"action": 2, "queue": Q, "wait": -1},
    {"action": 2, "queue": Q, "wait": "5"},
    {"action": 2, "queue": Q, "wait": True},
    {"action": 2, "queue": Q, "lease": 0},
    {"action": 2, "queue": Q, "token": ""},
    {"action": 2, "queue": Q, "token": "t" * 257},
    {"action": 2, "queue": Q, "times": "yes"},
    {"action": 3, "queue": Q},
    {"action": 3, "msg_id": 1},
    {"action": 3, "queue": Q, "msg_id": "1"},
    {"action": 3, "queue": Q, "msg_ids": "1"},
    {"action": 3, "queue": Q, "msg_ids": [1, "2"]},
    {"action": 3, "queue": Q, "tokens": [""]},
    {"action": 3, "queue": Q, "token": "a", "token_prefix": "b"},
    {"action": 3, "queue": Q, "msg_ids": [1], "delivery_count": 1},
    {"action": 3, "queue": Q, "msg_ids": [1, 2], "delivery_counts": [1]},
    {"action": 3, "queue": Q, "msg_id": 1, "report_ids": 1},
    {"action": 5, "queue": Q},
    {"action": 5, "queue": 7, "msg_id": 1},
    {"action": 6, "queue": Q, "msg_id": 1},
    {"action": 6, "queue": Q, "msg_id": 1, "retry": 0},
    {"action": 4, "queue": 5},
    {"action": 4, "queue": ""},
    {"action": 4, "queue": "x" * 300},
    {"action": 4, "queue": "fan"},
    {"action": "monitor", "queue": None},
    {"action": 7, "pattern": 5},
    {"action": 20},
    {"action": 20, "queue": Q, "count": 0},
    {"action": 20, "queue": Q, "state": "bogus"},
    {"action": 20, "queue": Q, "after": [1]},
    {"action": 20, "queue": "fan"},
    {"action": 21},
    {"action": 21, "queue": 1},
    {"action": 22, "queue": "fan"},
    {"action": 23, "queue": ""},
    {"action": 24, "queue": ["x"]},
    {"action": 25, "queue": "x" * 257},
    {"action": 25, "queue": "fan_a.dlq"},
    {"action": 26, "queue": Q},
    {"action": 26},
    {"action": 99, "queue": Q},
    {"action": 100},
    {"action": 0},
    {"action": -1},
    {"action": "bogus", "queue": Q},
    {"action": "Produce", "queue": Q, "data": "x"},
    {"action": 1.0, "queue": Q, "data": "x"},
    {"action": True, "queue": Q, "data": "x"},
    {"action": None, "queue": Q},
    {"action": [1], "queue": Q},
    {"queue": Q, "data": "x"},
    {},
    # numbers at the edges of what JSON and the node's records carry
    {"action": 1, "queue": Q, "data": "x", "delay": 1e308},
    {"action": 1, "queue": Q, "data": "x", "retry": 1e308, "ttl": 1e308},
    {"action": 2, "queue": Q, "lease": 1e308, "times": True},
    {"action": 6, "queue": Q, "msg_ids": [2, 2 ** 64 - 1], "retry": 1e308},
    {"action": 3, "queue": Q, "msg_ids": [2 ** 64 - 1, -2 ** 63], "report_ids": True},
    {"action": 1, "queue": Q, "data": "x", "producer": "p", "sequence": 2 ** 64 - 1},
    {"action": 1, "queue": Q, "data": "x", "max_deliveries": 2 ** 64 - 1},
    {"action": 20, "queue": Q, "after": [2 ** 64 - 1, 1e308, 2 ** 64 - 1]},
    {"action": 2, "queue": Q, "count": 2 ** 64 - 1},
    {"action": 2 ** 64 - 1, "queue": Q},
    b"[1, 2]\n",
    b"\"produce\"\n",
    b"5\n",
    b"null\n",
    b"{bad json\n",
    b"{\"action\":1,\"queue\":}\n",
    b"{\"action\":1,\"queue\":\"\xff\xfe\",\"data\":\"x\"}\n",
    b"{\"action\":1,\"queue\":\"q\",\"data\":\"x\",\"n\":123456789012345678901234567890}\n",
    # Nested deeper than the node re-encodes (orjson writes at most 254 levels): such a request
    # once wedged the node that read it, which then answered nothing more.
    b"{\"action\":1,\"queue\":\"deep\",\"data\":\"x\",\"extra\":" + b"[" * 300 + b"]" * 300 + b"}\n",
    b"{\"action\":4,\"extra\":" + b"{\"a\":" * 200 + b"0" + b"}" * 200 + b"}\n",
    b"{\"action\":\"local_list\",\"extra\":" + b"[" * 1000 + b"]" * 1000 + b"}\n",
    b"{\"action\":1,\"queue\":\"deep\",\"data\":\"x\",\"extra\":" + b"[" * 120 + b"]" * 120 + b"}\n",
]

# Answered by the node that received it, by design (docs/protocol.md section 2, the table's
# "served by" column and "Forwarding": actions 100 and above, and `auth`, are the node's own;
# dispatch.py answers `leader` from what the node knows of the leader).
OWN = [
    {"action": 8},
    {"action": "leader", "queue": Q},
    {"action": 9},
    {"action": "auth", "token": "not echoed"},
    {"action": 104},
    {"action": "local_monitor", "queue": Q},
    {"action": 107, "pattern": Q},
    {"action": 120, "queue": Q},
    {"action": "local_peek"},
    {"action": 120, "queue": Q, "count": 0},
    {"action": 104, "queue": 5},
    {"action": 104, "queue": "fan"},
    {"action": 107, "pattern": 1},
]


def _payload(request: dict | bytes, q: str, seq: int) -> bytes:
    if isinstance(request, bytes):
        return request
    return orjson.dumps({**_swap(request, Q, q), "seq": seq}) + b"\n"


def serving(c: Cluster):
    """Start `c`, yield it once every node serves, stop it whatever happens."""
    try:
        c.start()
        c.wait_serving()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from serving(Cluster(str(tmp_path_factory.mktemp("matrix")), udp_max_response=60000, queue_size=5000,
                               max_wait=5, virtual_queue_list=[{"name": "fan", "queue_list": ["fan_a", "fan_b"]}]))


def _queue(side: str) -> str:
    return f"mx-{next(_runs)}-{side}"


def run_tcp(address: tuple[str, int], requests: list, q: str, *, first: list[bytes] = ()) -> list[dict]:
    """Send every request on one connection at once, read exactly that many replies (each in
    PROMPT seconds), check each answers its own request in order, and that nothing more comes:
    the next reply is the one to a probe sent after them."""
    conn = RawTcp(*address, timeout=PROMPT)
    try:
        for line in first:
            conn.send(line)
            assert conn.recv()["code"] == 0
        conn.send(b"".join(_payload(r, q, seq) for seq, r in enumerate(requests)))
        got = []
        for seq, request in enumerate(requests):
            started = time.monotonic()
            reply = conn.recv()
            assert time.monotonic() - started < PROMPT
            if isinstance(request, bytes):
                assert "seq" not in reply, (request, reply)
            else:
                assert reply.get("seq") == seq, f"reply out of order or missing for {request}: {reply}"
            got.append(reply)
        assert conn.call({"action": 8, "seq": "probe"})["seq"] == "probe", "a request got two replies"
        return got
    finally:
        conn.close()


def run_udp(address: tuple[str, int], requests: list, q: str, extra: dict | None = None) -> list[dict]:
    """Each request as a datagram from one socket, one at a time (with `extra` fields); the next
    datagram that comes back must be its reply, within PROMPT seconds, and after the last one
    the reply to a probe (a second reply to any request would come before it)."""
    probe = {"action": 8, "seq": "probe"}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(PROMPT)
        got = []
        for seq, request in enumerate([*requests, probe]):
            if isinstance(request, bytes):
                data = request
            else:
                fields = probe if request is probe else {**_swap(request, Q, q), "seq": seq}
                data = orjson.dumps({**fields, **(extra or {})})
            s.sendto(data, address)
            try:
                reply = orjson.loads(s.recvfrom(1 << 16)[0])
            except socket.timeout:
                raise AssertionError(f"no reply in {PROMPT} s over UDP to {request!r:.200}") from None
            if not isinstance(request, bytes):
                assert reply.get("seq") == ("probe" if request is probe else seq), \
                    f"not the reply to {request!r:.200}: {reply}"
            got.append(reply)
        return got[:-1]


def compare(leader_replies: list[dict], lq: str, follower_replies: list[dict], fq: str,
            requests: list, leader: int, follower: int) -> None:
    """The follower relayed the leader's answer: same code, reason and result fields, from the
    leader (node_id) whenever the leader made it."""
    assert len(leader_replies) == len(follower_replies) == len(requests)
    mismatches = []
    for request, lr, fr in zip(requests, leader_replies, follower_replies):
        if comparable(lr, lq) != comparable(fr, fq):
            mismatches.append(f"{request!r:.120}\n  leader:   {comparable(lr, lq)}\n  follower: {comparable(fr, fq)}")
        elif fr.get("node_id") != (leader if forwarded(request) else follower):
            mismatches.append(f"{request!r:.120}: answered by node {fr.get('node_id')}")
    assert not mismatches, "\n".join(mismatches)
    assert all(r.get("node_id") == leader for r in leader_replies)


def forwarded(request: dict | bytes) -> bool:
    """Whether a follower passes the request to the leader (docs/protocol.md section 2,
    "Forwarding": actions below 100 but `leader` and `auth`); anything without an action it
    knows, it answers itself, as dispatch.py decides."""
    if isinstance(request, bytes):
        try:
            value = orjson.loads(request)
        except orjson.JSONDecodeError:
            return False
        if framing.too_deep(value, request):  # refused by the node that read it
            return False
        request = value
    action = p.request_action(request)
    return type(action) is int and action < 100 and action not in (p.LEADER, p.AUTH)


def _both(cluster, roles, runner: Callable[..., list[dict]], requests: list, **kw) -> None:
    leader, follower = roles
    lq, fq = _queue("L"), _queue("F")
    lr = runner(cluster.nodes[leader].address, requests, lq, **kw)
    fr = runner(cluster.nodes[follower].address, requests, fq, **kw)
    compare(lr, lq, fr, fq, requests, leader, follower)


def test_valid_requests_over_tcp(cluster, roles):
    _both(cluster, roles, run_tcp, VALID)


def test_valid_requests_over_udp(cluster, roles):
    # UDP: `wait` is ignored (section 1), the 1001-message batch still fits a datagram
    _both(cluster, roles, run_udp, VALID)


def test_bad_requests_over_tcp(cluster, roles):
    _both(cluster, roles, run_tcp, BAD)


def test_bad_requests_over_udp(cluster, roles):
    _both(cluster, roles, run_udp, BAD)


def test_many_pipelined_requests_through_a_follower_keep_their_order(cluster, roles):
    """Hundreds in flight on one connection, forwarded in several batches, mixed with requests
    the follower answers itself: each answered once, in order (section 1, Pipelining). (Its
    local_monitor answers from its own copy, which may lag: only a refused one compares.)"""
    mixed = [{"action": 1, "queue": Q, "data": "m"}, {"action": 2, "queue": Q},
             {"action": "bogus"}, {"action": 8}, {"action": 104, "queue": 5}, b"{bad\n",
             {"action": 1, "data": "x"}, {"action": 3, "queue": Q, "msg_id": 1}]
    _both(cluster, roles, run_tcp, mixed * 60)


@pytest.mark.parametrize("transport", ["tcp", "udp"])
def test_a_follower_answers_its_own_actions_itself(cluster, roles, transport):
    """leader, auth and the local_* actions are answered by the node asked (docs/protocol.md
    section 2): the same result fields on the leader and a follower, but each node's own
    node_id and role."""
    leader, follower = roles
    runner = run_tcp if transport == "tcp" else run_udp
    lq, fq = _queue("L"), _queue("F")
    lr = runner(cluster.nodes[leader].address, OWN, lq)
    fr = runner(cluster.nodes[follower].address, OWN, fq)
    for request, a, b in zip(OWN, lr, fr):
        assert comparable(a, lq) == comparable(b, fq), request
        assert (a.get("node_id"), b.get("node_id")) == (leader, follower), request
        if a["code"] == 0:
            assert "token" not in a and "token" not in b
            if "role" in a:
                assert (a["role"], b["role"]) == ("leader", "follower")
            if "leader_node_id" in a:
                assert a["leader_node_id"] == b["leader_node_id"] == leader


def test_local_peek_on_a_follower_shows_the_replicated_queue(cluster, roles):
    """local_peek answers from the node's own copy (section 5b): once replicated, the same
    messages the leader's peek shows."""
    leader, follower = roles
    q = _queue("local")
    assert cluster.ask(leader, {"action": 1, "queue": q, "data": ["1", "2"], "retry": 5})["code"] == 0
    seen = cluster.ask(leader, {"action": "peek", "queue": q})["messages"]
    got = wait_for(lambda: (r := cluster.ask(follower, {"action": "local_peek", "queue": q}))
                   and r["messages"] and r, 10, "the follower to replicate the queue")
    assert got["messages"] == seen and got["node_id"] == follower


@pytest.mark.parametrize("transport", ["tcp", "udp"])
def test_subscribe_is_served_on_a_tcp_connection_to_the_leader_only(cluster, roles, transport):
    """Section 5c: subscribe is not forwarded; a follower relays the leader's refusal."""
    leader, follower = roles
    request = {"action": "subscribe", "queue": Q, "credit": 0}
    runner = run_tcp if transport == "tcp" else run_udp
    q = _queue("sub")
    on_leader = runner(cluster.nodes[leader].address, [request], q)[0]
    on_follower = runner(cluster.nodes[follower].address, [request], q)[0]
    refused = "subscribe: only on a TCP connection to the leader (not forwarded, not UDP)"
    assert (on_follower["code"], on_follower["reason"], on_follower["node_id"]) == (-1, refused, leader)
    if transport == "tcp":
        assert (on_leader["code"], on_leader["subscribed"]) == (0, 0)
    else:
        assert comparable(on_leader, q) == comparable(on_follower, q)


@pytest.mark.parametrize("side", ["leader", "follower"])
def test_a_long_poll_through_a_follower_is_answered_when_a_message_comes(cluster, roles, side):
    """Pipelined behind a long poll on the same connection, the produce that serves it: the poll
    is answered with that message, then the produce (replies keep request order, section 1)."""
    leader, follower = roles
    q = _queue("poll")
    node = cluster.nodes[leader if side == "leader" else follower]
    conn = RawTcp(*node.address, timeout=PROMPT)
    try:
        started = time.monotonic()
        conn.send({"action": 2, "queue": q, "wait": 4, "seq": 0})
        wait_for(lambda: cluster.ask(leader, {"action": 4, "queue": q}).get("waiters") == 1, 5,
                 "the poll to park on the leader")
        conn.send({"action": 1, "queue": q, "data": "woke", "seq": 1})
        poll, produced = conn.recv(), conn.recv()
        elapsed = time.monotonic() - started
    finally:
        conn.close()
    assert (poll["seq"], poll["code"], poll["data"], poll["node_id"]) == (0, 0, "woke", leader)
    assert (produced["seq"], produced["code"], produced["msg_id"]) == (1, 0, poll["msg_id"])
    assert elapsed < 3.0, "the poll was answered by its wait ending, not by the message"


@pytest.mark.parametrize("side", ["leader", "follower"])
def test_a_long_poll_through_a_follower_ends_empty_with_its_wait(cluster, roles, side):
    leader, follower = roles
    node = cluster.nodes[leader if side == "leader" else follower]
    conn = RawTcp(*node.address, timeout=PROMPT)
    try:
        started = time.monotonic()
        replies = [conn.call({"action": 2, "queue": _queue("empty"), "wait": 1, "seq": 0}),
                   conn.call({"action": 2, "queue": _queue("empty"), "count": 3, "wait": 0.5, "seq": 1})]
        elapsed = time.monotonic() - started
    finally:
        conn.close()
    assert [(r["seq"], r["code"], "msg_id" in r, r.get("messages"), r["node_id"]) for r in replies] == [
        (0, 0, False, None, leader), (1, 0, False, [], leader)]
    assert 1.4 <= elapsed < 1.5 + PROMPT


def test_a_stopping_follower_answers_its_long_polls_at_once_as_a_leader_does(tmp_path):
    """On SIGTERM a node answers its pending long polls at once, empty (README, "A cluster"). A
    follower's polls wait on the leader, which is not told: they went unanswered, and the
    connection was closed shutdown_grace (10 s) later; and a message that served one of them
    after the follower stopped was lost."""
    c = Cluster(str(tmp_path), workers=1)
    try:
        c.start()
        leader = c.wait_serving()
        follower = next(i for i in c.nodes if i != leader)
        conn = RawTcp(*c.nodes[follower].address, timeout=PROMPT)
        q = _queue("stop")
        conn.send({"action": 2, "queue": q, "wait": 20, "seq": 0})
        conn.send({"action": "consume", "queue": q, "count": 3, "wait": 20, "seq": 1})
        wait_for(lambda: (c.ask(leader, {"action": 4, "queue": q}) or {}).get("waiters") == 2, 10,
                 "the polls to park on the leader")
        c.nodes[follower].signal(signal.SIGTERM)
        replies = [conn.recv(), conn.recv()]
        assert conn.closed_by_peer()
        conn.close()
        assert [(r["seq"], r["code"], "msg_id" in r, r.get("messages")) for r in replies] == [
            (0, 0, False, None), (1, 0, False, [])]
        assert c.nodes[follower].proc.wait(PROMPT) == 0
        # The leader still holds the polls until their wait ends; the message that serves one
        # cannot reach the stopped follower and must not be lost with its reply.
        assert c.ask(leader, {"action": 1, "queue": q, "data": "kept"})["code"] == 0

        def back() -> dict | None:
            r = c.ask(leader, {"action": 2, "queue": q})
            return r if r and r.get("data") == "kept" else None
        assert wait_for(back, 10, "the message to be given back")["delivery_count"] == 1
    finally:
        c.stop()


# --------------------------------------------------------------------------- with authentication
@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("matrix-auth")
    (workdir / "token").write_text(TOKEN + "\n")
    c = Cluster(str(workdir), workers=1, auth_token_file=str(workdir / "token"))
    c.token = TOKEN
    yield from serving(c)


AUTHED = [
    {"action": 1, "queue": Q, "data": "a", "retry": 30},
    {"action": 2, "queue": Q, "count": 2},
    {"action": 3, "queue": Q, "msg_id": 1},
    {"action": 4, "queue": Q},
    {"action": 7, "pattern": Q},
    {"action": 20, "queue": Q},
    {"action": 9, "token": TOKEN},
    {"action": 1, "data": "no queue"},
    {"action": 1, "queue": "x" * 257, "data": "x"},
    {"action": "bogus"},
    b"{bad json\n",
]


def test_requests_through_a_follower_with_auth_over_tcp(secured):
    first = [orjson.dumps({"action": "auth", "token": TOKEN}) + b"\n"]
    _both(secured, secured.roles(), run_tcp, AUTHED, first=first)


def test_requests_through_a_follower_with_auth_over_udp(secured):
    _both(secured, secured.roles(), run_udp, AUTHED[:-1], extra={"auth_token": TOKEN})


@pytest.mark.parametrize("side", ["leader", "follower"])
def test_a_datagram_without_a_valid_auth_token_gets_no_reply_from_a_follower_either(secured, side):
    """Section 9: no reply at all. The datagram after them, with the token, is the first answered."""
    leader, follower = secured.roles()
    address = secured.nodes[leader if side == "leader" else follower].address
    unanswered = [{"action": 1, "queue": "nope", "data": "x", "seq": 1},
                  {"action": 1, "queue": "nope", "data": "x", "seq": 2, "auth_token": "guess"},
                  {"action": "bogus", "seq": 3}, {"action": 8, "seq": 4, "auth_token": 5}]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(PROMPT)
        for request in unanswered:
            s.sendto(orjson.dumps(request), address)
        s.sendto(b"{bad json", address)
        s.sendto(orjson.dumps({"action": 4, "queue": "nope", "seq": 5, "auth_token": TOKEN}), address)
        reply = orjson.loads(s.recvfrom(1 << 16)[0])
    assert (reply["seq"], reply["code"], reply["size"], reply["node_id"]) == (5, 0, 0, leader)


@pytest.mark.parametrize("side", ["leader", "follower"])
@pytest.mark.parametrize("first, refusal", [
    ({"action": 4, "seq": 1}, "authentication required"),
    ({"action": "auth", "token": "guess", "seq": 1}, "authentication failed"),
], ids=["no-auth", "wrong-token"])
def test_a_connection_without_auth_is_refused_by_a_follower_as_by_the_leader(secured, side, first, refusal):
    """Section 9: answered by the node asked, which then closes the connection; nothing after it
    is read, let alone forwarded."""
    leader, follower = secured.roles()
    node = secured.nodes[leader if side == "leader" else follower]
    conn = RawTcp(*node.address, timeout=PROMPT)
    try:
        conn.send(orjson.dumps(first) + b"\n" + orjson.dumps({"action": 1, "queue": "nope", "data": "x"}) + b"\n")
        reply = conn.recv()
        assert (reply["code"], reply["seq"], reply["node_id"]) == (-1, 1, node.config["node_id"])
        assert reply["reason"].startswith(refusal) and "token" not in reply
        assert conn.closed_by_peer()
    finally:
        conn.close()
    assert secured.ask(leader, {"action": 4, "queue": "nope"})["size"] == 0
