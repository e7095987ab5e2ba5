"""load/bench.py's closing summary: each target's verdict from the rows of a run, and the
comparisons beside a base row."""
from __future__ import annotations

from load.bench import cpu_cell, summary


def _row(key: str, ops: float, **figures: float) -> dict:
    row = {"key": key, "workload": key.split("/")[0], "ops_per_s": ops, "messages_per_s": ops, "p50_ms": 0.2,
           "p99_ms": 1.0, "messages": 10}
    row.update(figures)
    return row


def _target(lines: list[str], what: str) -> str:
    return next(line for line in lines if line.startswith(f"target: {what}"))


def test_targets_are_met_or_not_by_their_direction_and_ratio_to_the_peer():
    lines = summary([_row("unloaded", 1, p50_ms=0.31), _row("per-request/queue-server/8", 1000),
                     _row("per-request/beanstalkd/8", 3000), _row("batched/100", 10, messages_per_s=95_000)],
                    ["unloaded", "per-request", "batched"])
    assert _target(lines, "unloaded single-connection p50").endswith("<= 0.25 ms, measured: 0.31 ms, not met")
    assert _target(lines, "per request, 8 connections, vs beanstalkd").endswith(">= 0.25 x, measured: 0.333 x, met")
    assert _target(lines, "batched, 100 messages per request").endswith(
        ">= 90,000 messages/s, measured: 95,000 messages/s, met")
    assert _target(lines, "per request, 64 connections, vs beanstalkd").endswith("measured: not measured (failed or skipped)")
    assert _target(lines, "3-node quorum, per request, vs single node").endswith("measured: not run")


def test_memory_gets_a_verdict_only_at_the_targets_size_and_prints_whole_numbers():
    memory = {"key": "memory/queue-server", "workload": "memory", "server": "queue-server", "messages": 2000,
              "pss_per_msg": 250.4}
    small = _target(summary([memory], ["memory"]), "memory per 100-byte message at 1M")
    assert small.endswith("measured: 250 B, at 2,000 messages, not the target's 1M: no verdict")
    full = _target(summary([dict(memory, messages=1_000_000, pss_per_msg=999.7)], ["memory"]),
                   "memory per 100-byte message at 1M")
    assert full.endswith("<= 300 B, measured: 1,000 B, not met")


def test_comparisons_give_each_step_against_the_first():
    lines = summary([_row("scaling/queues/10000", 700), _row("scaling/queues/1", 1000), _row("batched/100", 5),
                     _row("batched/10", 5)], ["scaling", "batched"])
    i = lines.index("scaling, 1 queues: 1,000 ops/s, p99 1.000 ms")
    assert lines[i + 1] == "  10,000 queues: 700 ops/s, p99 1.000 ms (0.70x the ops/s, p99 +0.000 ms)"
    assert "batched, messages/s (p99 ms): 10 per request 5 (1.000), 100 per request 5 (1.000)" in lines


def test_cpu_cells_list_each_process_by_node():
    assert cpu_cell({"acceptor": 1.0, "worker-0": 0.0, "supervisor": 0.3, "coordinator": 2.0}) == \
        "3.3 (acceptor 1.0, coordinator 2.0)"
    assert cpu_cell({"server": 5.0}) == "5.0"
    assert cpu_cell({"node1/acceptor": 1.0, "node1/supervisor": 0.2, "node2/acceptor": 3.0, "epmd": 0.1}) == \
        "4.3 (node1: acceptor 1.0; node2: acceptor 3.0; epmd 0.1)"
