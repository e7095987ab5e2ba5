"""docs/metrics.md names every field a monitor reply has: the replies are built here by the code
that builds them on a node (each worker's part, workers/service.py partial; the coordinator's
merge, server/gather.py, with the node's own fields, ClusterNode.node_fields), on a leader of a
cluster, a follower and a single node, with and without `queue`, for `monitor` and
`local_monitor`, over queues in every state."""
from __future__ import annotations

import re
from pathlib import Path

from queue_server.protocol import vocabulary as p
from queue_server.server.cluster import ClusterNode
from queue_server.server.gather import Gatherer, merge
from tests.unit.test_cluster_node import _follower, _leader, _leader_of_three
from tests.unit.test_overflow import FakeFiles
from tests.unit.test_service import Svc
from queue_server.workers.body_budget import BodyBudget
from queue_server.workers.overflow import Overflow

METRICS_MD = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
SECTION = "## The monitor action's fields"
FORMS = ("queue", "node")  # the table's "in" column: with `queue`, without it ("both": either)


def documented() -> dict[str, tuple[set[str], str]]:
    """The table of docs/metrics.md's monitor section: field -> (the forms it is in, its meaning)."""
    text = METRICS_MD.read_text()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n#", 1)] if "\n#" in section[1:] else section
    fields: dict[str, tuple[set[str], str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        forms = set(FORMS) if cells[1] == "both" else {f.strip() for f in cells[1].split(",")}
        assert forms <= set(FORMS), f"{line}: 'in' must be queue, node, both or 'queue, node'"
        for name in re.findall(r"`([a-z_]+)`", cells[0]):
            fields[name] = (forms, cells[2])
    return fields


def _workers() -> list[Svc]:
    """Two workers: one holds queue "q" with a message in every state (ready, delayed, leased, a
    dead letter, a parked long poll; paused) and its dead-letter queue; the other holds neither."""
    t = Svc(dead_letter_suffix=".dlq", overflow=Overflow(BodyBudget(8), FakeFiles()))
    t.call({"action": 1, "queue": "q", "data": ["a", "b", "c"], "retry": 10})
    t.call({"action": 1, "queue": "q", "data": "later", "delay": 60})
    t.call({"action": 1, "queue": "q", "data": "doomed", "retry": 1, "max_deliveries": 1})
    assert t.call({"action": 2, "queue": "q"})["data"] == "a"  # leased
    t.call({"action": 1, "queue": "other", "data": "x", "max_deliveries": 1, "retry": 1})
    t.call({"action": 2, "queue": "other"})
    t.now += 2  # "other"'s lease ends: its only delivery was its last, so it is a dead letter
    t.tick()
    t.call({"action": "pause", "queue": "q"})
    t.call({"action": 2, "queue": "q", "wait": 30}, conn=2)  # parked: the queue is paused
    return [t, Svc(dead_letter_suffix=".dlq")]


def _reply(workers: list[Svc], request: dict, node: ClusterNode) -> dict:
    """The monitor reply a node built from every worker's part, as ClusterNode._gather does."""
    gatherer = Gatherer()
    tag = [1, [3, False, 0], 5, len(workers), request]
    done = None
    for w in workers:
        w.s.partial(tag, request, w.now)
        done = gatherer.add(*w.s.partials.pop())
    assert done is not None
    reply = merge(request, done[3], node.node_fields())
    assert reply["code"] == p.CODE_OK, reply
    return reply


def _answered() -> dict[str, dict[str, list]]:
    """Every field a monitor reply has, by form: {form: {field: the values it had}}."""
    workers = _workers()
    seen: dict[str, dict[str, list]] = {form: {} for form in FORMS}
    for node in (_leader_of_three(), _follower(), _leader()):
        for action in (p.MONITOR, p.LOCAL_MONITOR):
            for form, request in (("queue", {"action": action, "queue": "q", "seq": 1}),
                                  ("queue", {"action": action, "queue": "other", "seq": 1}),
                                  ("node", {"action": action, "seq": 1})):
                reply = _reply(workers, request, node)
                for key in set(reply) - set(p.echo(request)) - {"code"}:
                    seen[form].setdefault(key, []).append(reply[key])
    return seen


def test_every_field_a_monitor_reply_has_is_documented_in_metrics_md():
    doc = documented()
    seen = _answered()
    for key in ("size", "ready", "delayed", "in_flight", "waiters", "dead", "produced", "consumed"):
        assert max(seen["queue"][key]) > 0, f"no queue state shows in {key}"
    assert True in seen["queue"]["paused"]
    for form in FORMS:
        answered = set(seen[form])
        in_doc = {name for name, (forms, _) in doc.items() if form in forms}
        assert answered - in_doc == set(), f"monitor {form} fields not in docs/metrics.md ({SECTION})"
        assert in_doc - answered == set(), f"docs/metrics.md documents {form} fields monitor does not answer"


def test_every_key_of_a_follower_row_is_documented():
    rows = [row for rows in _answered()["node"]["followers"] for row in rows]
    assert rows, "a leader of three has followers"
    meaning = documented()["followers"][1]
    assert {key for row in rows for key in row} <= set(re.findall(r"`([a-z_]+)`", meaning))
