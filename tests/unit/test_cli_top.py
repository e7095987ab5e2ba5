"""queue-cli's --json and readable output, and `queue-cli top` rendered once at a fixed width
(a fake client stands in for the cluster: no sockets)."""
from __future__ import annotations

import io

import orjson
import pytest
from rich.console import Console

from queue_server.client import cli, top


class FakeClient:
    """Answers list and monitor like a node whose queue `busy` takes 10 messages and loses 4
    between two samples, while `idle` stays as it is."""

    def __init__(self, *args, **kwargs) -> None:
        self.samples = 0

    def __enter__(self) -> "FakeClient":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def monitor(self, queue: str | None = None) -> dict:
        if queue is None:
            self.samples += 1
            return {"code": 0, "node_id": 2, "role": "leader", "leader_node_id": 2, "queue_count": 2}
        late = self.samples > 1
        if queue == "busy":
            return {"code": 0, "queue": queue, "max_id": 110 if late else 100, "size": 26 if late else 20,
                    "ready": 5, "in_flight": 21 if late else 15, "delayed": 0, "waiters": 0, "paused": False}
        return {"code": 0, "queue": queue, "max_id": 7, "size": 3, "ready": 3, "in_flight": 0, "delayed": 0,
                "waiters": 1, "paused": True}

    def list_queues(self, pattern: str = "") -> list[str]:
        return [q for q in ("idle", "busy") if pattern in q]


def test_rates_from_two_samples():
    before = {"a": {"max_id": 10, "size": 5}, "b": {"max_id": 3, "size": 3}}
    after = {"a": {"max_id": 30, "size": 15}, "b": {"max_id": 3, "size": 1}, "new": {"max_id": 4, "size": 4}}
    rows = {r.queue: r for r in top.rates(before, after, 2.0)}
    assert (rows["a"].in_per_s, rows["a"].out_per_s) == (10.0, 5.0)  # 20 in, size +10: 10 out
    assert (rows["b"].in_per_s, rows["b"].out_per_s) == (0.0, 1.0)  # purged/expired/consumed
    assert (rows["new"].in_per_s, rows["new"].out_per_s) == (2.0, 0.0)
    assert [r.queue for r in top.rates(before, after, 2.0, limit=2)] == ["a", "new"]  # busiest first


def test_top_once_renders_the_table_at_a_fixed_width(monkeypatch, capsys):
    screen = io.StringIO()
    monkeypatch.setattr(cli, "QueueClient", FakeClient)
    monkeypatch.setattr(top, "Console", lambda: Console(file=screen, width=100, color_system=None))
    assert cli.main(["top", "--once", "--interval", "0.01"]) == 0
    text = screen.getvalue()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "node 2 (leader, leader 2) - 2 queues" in text
    for header in ("queue", "in/s", "out/s", "size", "ready", "in flight", "delayed", "waiters", "on disk"):
        assert header in text
    busy = next(line for line in lines if "busy" in line)
    idle = next(line for line in lines if "idle" in line)
    assert lines.index(busy) < lines.index(idle)  # the busiest queue first
    assert busy.split("│")[4].strip() == "26" and "paused" in idle and "paused" not in busy
    in_rate = float(busy.split("│")[2])
    assert in_rate > 0  # 10 messages over the measured interval


def test_top_json_gives_the_rows(monkeypatch, capsys):
    monkeypatch.setattr(cli, "QueueClient", FakeClient)
    assert cli.main(["top", "--json", "--interval", "0.01", "bu"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["node"]["node_id"] == 2
    assert [q["queue"] for q in out["queues"]] == ["busy"]
    assert out["queues"][0]["size"] == 26 and out["queues"][0]["in_per_s"] > 0


def test_readable_output_drops_the_echo_and_json_keeps_the_reply():
    req = {"action": 2, "queue": "q", "count": 2}
    reply = {"action": 2, "queue": "q", "count": 2, "code": 0, "node_id": 1,
             "messages": [{"msg_id": 4, "data": "hello", "delivery_count": 1}]}
    assert cli.human(req, reply) == "node_id: 1\nmessages: 1\n  msg_id=4  data=hello  delivery_count=1"
    assert cli.human({"action": 7}, {"action": 7, "code": 0, "queue_list": ["a", "b"]}) == "a\nb"
    assert cli.human({"action": 5, "queue": "q"}, {"action": 5, "queue": "q", "code": 0}) == "ok"


@pytest.mark.parametrize("as_json", [False, True])
def test_errors_are_one_line_or_json(monkeypatch, capsys, as_json):
    class Refusing(FakeClient):
        def request(self, req):
            raise cli.QueueError(-1, "queue full", {"code": -1, "reason": "queue full"})
    monkeypatch.setattr(cli, "QueueClient", Refusing)
    args = ["--json"] if as_json else []
    assert cli.main([*args, "produce", "q", "x"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err == ('{"code":-1,"reason":"queue full"}\n' if as_json else "queue-cli: queue full\n")


def test_with_queue_groups_the_table_names_each_group_s_leader_and_each_queue_s_group():
    rows = top.rates({}, {"a": {"max_id": 2, "size": 2, "group": 2}, "b": {"max_id": 1, "size": 1, "group": 0}}, 1.0)
    node = {"node_id": 2, "role": "follower", "leader_node_id": 1, "queue_count": 2,
            "groups": [{"group": 0, "leader_node_id": 1}, {"group": 1, "leader_node_id": 2}, {"group": 2, "leader_node_id": 0}]}
    screen = io.StringIO()
    Console(file=screen, width=120, color_system=None).print(top.table(rows, node, 1.0))
    text = screen.getvalue()
    assert "node 2 (follower, leaders 0: 1, 1: 2, 2: ?) - 2 queues" in text
    line_a = next(line for line in text.splitlines() if "│ a " in line)
    assert [c.strip() for c in line_a.split("│")][1:3] == ["a", "2"]  # the queue, then its group
    assert "group" in text


def test_the_title_says_what_the_node_holds_in_memory_and_on_disk_when_it_counts_it():
    node = {"node_id": 1, "role": "leader", "leader_node_id": 1, "queue_count": 0,
            "memory_bytes": 3 * 2**20, "overflow_bytes": 2**29}
    screen = io.StringIO()
    Console(file=screen, width=160, color_system=None).print(top.table([], node, 1.0))
    assert "0 queues - 3.0 MiB in memory, 512.0 MiB on disk - rates over 1.0 s" in screen.getvalue()
    screen = io.StringIO()  # overflow off: the node counts neither
    Console(file=screen, width=160, color_system=None).print(top.table([], {"node_id": 1, "queue_count": 0}, 1.0))
    assert "in memory" not in screen.getvalue()
