"""load/bench.py keeps working: a very short run of some workloads (and of the peers when they are
installed) produces figures for every row. A benchmark run, not a performance test."""
from __future__ import annotations

import json
import re
import os
import shutil
import signal
import subprocess
import sys

import pytest

from load.procs import signal_group
from tests.harness import REPO

pytestmark = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler for load/cbench.c")


def bench(tmp_path, *args: str, timeout: float, script: str = "load/bench.py") -> tuple[str, dict]:
    """Run `script` (load/bench.py or a script that runs bench.py's workloads) with `args`; its
    output and JSON report, once it exited 0 with no workload failed. It runs in a session of
    its own, whose processes (nodes, peers, client) are killed whole once it ends, overran or not."""
    out = tmp_path / "bench.json"
    proc = subprocess.Popen([sys.executable, script, *args, "--json", str(out)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        signal_group(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.communicate()
    assert proc.returncode == 0, stdout + stderr
    report = json.loads(out.read_text())
    assert not [n for n in report["notes"] if "failed" in n], report["notes"]
    return stdout, report


def test_short_benchmark_run(tmp_path):
    stdout, report = bench(tmp_path, "--seconds", "0.5", "--conns", "4", "--depths", "4", "--batches", "10",
                           "--only", "pipelined,batched,long-poll", timeout=120)
    rows = {(r["workload"], r["server"]): r for r in report["results"]}
    expected = {("pipelined", "queue-server"), ("batched", "queue-server"), ("long-poll", "queue-server")}
    for peer, binary in (("beanstalkd", "beanstalkd"), ("redis", "redis-server")):
        if shutil.which(binary):
            expected |= {("pipelined", peer), ("long-poll", peer)}
    assert expected <= set(rows), sorted(rows)
    for row in rows.values():
        assert row["ops"] > 0 and row["messages"] > 0, row
    assert rows[("batched", "queue-server")]["messages"] >= 10 * rows[("batched", "queue-server")]["ops"] // 3
    assert rows[("long-poll", "queue-server")]["delivery_p50_ms"] > 0
    assert "| workload | server |" in stdout


def test_short_run_prints_the_summary_with_its_targets(tmp_path):
    """The issue-12 figures: unloaded p50 against its target, durability settings against the
    default, scaling against its first step, memory per message; each in the closing summary."""
    stdout, report = bench(tmp_path, "--seconds", "0.5", "--conns", "2", "--no-peers",
                           "--only", "unloaded,durability,scaling,memory", "--scale-workers", "1",
                           "--scale-queues", "1,50", "--scale-stored", "10,200", "--memory-messages", "2000",
                           timeout=300)
    keys = {r["key"] for r in report["results"]}
    assert {"unloaded", "scaling/queues/50", "scaling/stored/200", "durability/fsync always",
            "durability/no WAL (in_memory)"} <= keys, sorted(keys)
    assert report["memory"][0]["server"] == "queue-server" and report["memory"][0]["pss_per_msg"] > 0
    summary = stdout.split("\nsummary\n", 1)[1]
    assert re.search(r"target: unloaded single-connection p50 <= 0.25 ms, measured: [\d.]+ ms, (not )?met\n", summary)
    assert "target: per request, 8 connections, vs beanstalkd >= 0.25 x, measured: not run" in summary
    assert re.search(r"target: memory per 100-byte message at 1M, summed over the node's processes <= 300 B, "
                     r"measured: [\d,.]+ B, at 2,000 messages, not the target's 1M: no verdict\n", summary)
    assert "fsync always: " in summary and "50 queues: " in summary and "200 messages stored: " in summary
    assert "memory per message at 2,000, queue-server: " in summary


def test_hop_floor_gives_figures_for_every_variant(tmp_path):
    """load/hop_floor.py: every skeleton variant (and beanstalkd when installed) at 1 connection,
    the sweep and pipelined, with CPU per process, in its table."""
    stdout, report = bench(tmp_path, "--seconds", "0.3", "--conns", "2", "--sweep", "2", "--depth", "4",
                           timeout=180, script="load/hop_floor.py")
    rows = {r["key"]: r for r in report["results"]}
    variants = ["hops=0", "hops=2", "hops=3", "hops=4"] + (["beanstalkd"] if shutil.which("beanstalkd") else [])
    assert set(rows) == {f"floor/{v}/{s}" for v in variants for s in ("1", "2", "d4")}, sorted(rows)
    for row in rows.values():
        assert row["ops"] > 0 and row["messages"] > 0, row
    assert set(rows["floor/hops=3/2"]["cpu_us_per_op"]) >= {"acceptor", "worker-0", "worker-1", "coordinator"}
    table = stdout.split("| variant | setting |", 1)[1]
    for v in variants:
        assert f"\n| {v} | 2 connections, depth 4 | " in table, table


@pytest.mark.skipif(shutil.which("wrk") is None, reason="no wrk (.ci/install-tools installs it) for the HTTP workload")
def test_short_http_benchmark_run(tmp_path):
    _, report = bench(tmp_path, "--seconds", "1", "--conns", "2", "--only", "http", "--no-peers", timeout=120)
    rows = [r for r in report["results"] if r["workload"] == "http"]
    assert [("over TCP" in r["what"], "over HTTP" in r["what"]) for r in rows] == [(True, False), (False, True)]
    assert all(r["ops"] > 0 and r["messages"] > 0 for r in rows), rows


def test_the_coordinator_bench_runs(tmp_path):
    """load/coordinator_bench.py keeps up with the Coordinator it drives: a tiny run of each shape
    answers every batch (it exits non-zero if a reply batch is left pending) and prints its figure."""
    for extra in ([], ["--requests", "4", "--profile", "3"], ["--count", "10", "--in-memory"], ["--requests", "2", "--drain", "3"]):
        proc = subprocess.run([sys.executable, os.path.join(REPO, "load", "coordinator_bench.py"), "--cycles", "20", "--rounds", "1", *extra],
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""}, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "CPU us per batch: median" in proc.stdout, proc.stdout


def test_the_worker_bench_runs(tmp_path):
    """load/worker_bench.py drives a Worker through whole cycles (a confirm needs the msg_id its
    consume got) at one and at several requests per REQ, and prints its figure."""
    for extra in (["--conns", "1"], ["--conns", "3", "--profile", "3"]):
        proc = subprocess.run([sys.executable, os.path.join(REPO, "load", "worker_bench.py"), "--cycles", "20", "--rounds", "1", *extra],
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""}, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "CPU us per request: median" in proc.stdout, proc.stdout


def test_the_replicated_brokers_give_figures_side_by_side(tmp_path):
    """bench.py's comparison with the replicated brokers (load/broker_bench.py): queue-server's
    3-node cluster and each broker installed here, with Python clients, per request and batched,
    with server CPU by process, the clients' CPU and durability; targets with a verdict."""
    from load import broker_bench

    notes: list[str] = []
    present = broker_bench.available(list(broker_bench.SYSTEMS), notes)
    stdout, report = bench(tmp_path, "--only", "brokers", "--seconds", "0.5", "--conns", "2", "--broker-sweep", "8",
                           "--broker-batch", "100", "--client-processes", "2", timeout=400)
    rows = {r["key"]: r for r in report["results"] if r["workload"] == "brokers"}
    assert set(rows) == {f"brokers/{s}/{k}" for s in present for k in ("8", "b100")}, (sorted(rows), report["notes"])
    for row in rows.values():
        assert row["ops"] > 0 and row["messages"] > 0 and row["p99_ms"] > 0, row
        assert row["cpu_us_per_op"] and row["client_cpu_us_per_msg"] > 0 and row["durability"], row
    assert rows["brokers/queue-server/b100"]["messages"] >= 100
    table = stdout.split("| system | setting |", 1)[1]
    for system in present:
        assert f"\n| {broker_bench.LABELS[system]} | per request, 8 connections | " in table, table
    summary = stdout.split("\nsummary\n", 1)[1]
    for system in ("nats", "rabbitmq"):
        name = broker_bench.LABELS[system]
        line = f"target: 3 nodes, per request, 8 connections, vs {name} >= "
        if system in present:
            assert re.search(re.escape(line) + r"[\d.]+ x, measured: [\d.]+ x, (not )?met\n", summary), summary
        else:
            assert line in summary and f"{name}" in " ".join(report["notes"]), report["notes"]
    if len(present) < len(broker_bench.SYSTEMS):
        pytest.skip("only " + ", ".join(present) + " measured: " + "; ".join(notes))


def test_the_queue_groups_bench_runs_both_comparisons(tmp_path):
    """load/groups_bench.py: 3 nodes with 3 groups against 1, and 6 nodes with 6 groups of 3
    replicas against 5 (each connection on its queue's group leader), each with its target line."""
    for extra, said in ((["--nodes", "3"], "busiest node uses <= 37%"),
                        (["--nodes", "6"], "CPU per message with 3 replicas <= 0.6x that with 5")):
        proc = subprocess.run([sys.executable, os.path.join(REPO, "load", "groups_bench.py"), "--seconds", "0.5",
                               "--repeat", "1", "--conns", "6", "--workers", "1", *extra],
                              cwd=REPO, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert said in proc.stdout and "round 1," in proc.stdout, proc.stdout
