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


def _broker(system: str, key: str, messages_per_s: float, cpu_per_msg: float) -> dict:
    return _row(f"brokers/{system}/{key}", messages_per_s * 3, messages_per_s=messages_per_s,
                server_cpu_us_per_msg=cpu_per_msg, client_cpu_us_per_msg=50.0, what=f"setting {key}")


def test_the_replicated_brokers_targets_compare_throughput_and_cpu_per_message():
    lines = summary([_broker("queue-server", "64", 1000, 400), _broker("nats", "64", 1250, 500),
                     _broker("rabbitmq", "64", 400, 900), _broker("queue-server", "b100", 9000, 90),
                     _broker("nats", "b100", 6000, 80)], ["quorum", "brokers"])
    assert _target(lines, "3 nodes, per request, 64 connections, vs NATS JetStream R3").endswith(
        ">= 1 x, measured: 0.8 x, not met")
    assert _target(lines, "3 nodes, per request, 64 connections, vs RabbitMQ quorum").endswith(
        ">= 2 x, measured: 2.5 x, met")
    assert _target(lines, "3 nodes, batches of 100, vs NATS JetStream R3").endswith(">= 1 x, measured: 1.5 x, met")
    assert _target(lines, "3 nodes, per request, 64 connections, server CPU per message vs NATS").endswith(
        "<= 1 x, measured: 0.8 x, met")
    assert _target(lines, "3 nodes, batches of 100, server CPU per message vs NATS").endswith(
        "<= 1 x, measured: 1.12 x, not met")
    assert _target(lines, "3 nodes, batches of 100, vs RabbitMQ quorum").endswith("not measured (failed or skipped)")
    i = lines.index("replicated, setting 64: queue-server x3 1,000 messages/s, p99 1.000 ms, server CPU 400.0 "
                    "us/message, client CPU 50.0 us/message")
    assert lines[i + 1].startswith("  NATS JetStream R3: 1,250 messages/s") and lines[i + 1].endswith(
        "queue-server x3 has 0.80x its messages/s and 0.80x its server CPU per message")


def test_cpu_cells_list_each_process_by_node():
    assert cpu_cell({"acceptor": 1.0, "worker-0": 0.0, "supervisor": 0.3, "coordinator": 2.0}) == \
        "3.3 (acceptor 1.0, coordinator 2.0)"
    assert cpu_cell({"server": 5.0}) == "5.0"
    assert cpu_cell({"node1/acceptor": 1.0, "node1/supervisor": 0.2, "node2/acceptor": 3.0, "epmd": 0.1}) == \
        "4.3 (node1: acceptor 1.0; node2: acceptor 3.0; epmd 0.1)"
