"""The comparison with the replicated brokers users would pick instead (issue 29), part of
load/bench.py's quorum workload (`--only brokers` runs it alone): queue-server's 3-node cluster,
NATS JetStream with a stream of 3 replicas (load/nats_cluster.py) and RabbitMQ with a quorum
queue (load/rabbit_cluster.py), 3 nodes each on loopback, one after another in one run.

The same cycle and client style for all: produce with the broker's acknowledgement, consume,
acknowledge, on one queue shared by every connection, from Python clients on asyncio in
--client-processes processes (load/broker_client.py), connection k on node k mod 3; per request
at each --broker-sweep connection count and in batches of --broker-batch messages. Each system
gets a fresh cluster per round (--repeat rounds, the systems' order rotated each round, the
median kept) and a fresh queue per setting. Each row has requests/s, messages/s, p50/p99 (a
cycle's time / 3), the server CPU per request and per message summed over the cluster's
processes (and by process), the clients' CPU beside it (a row whose clients used more CPU per
message than the servers is marked client-bound: the two shared cores are mostly the client's),
and when each system's acknowledgement is durable.

    python load/bench.py --only brokers --seconds 5 --repeat 3
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, wait
from statistics import median_high
from typing import Any, NamedTuple

from load import broker_client, nats_cluster, rabbit_cluster
from load.bench import REPO, Cluster, cpu_cell, cpu_per_op, int_list, latency_ms
from load.procs import stop

SYSTEMS = ("queue-server", "nats", "rabbitmq")
LABELS = {"queue-server": "queue-server x3", "nats": nats_cluster.NatsCluster.label,
          "rabbitmq": rabbit_cluster.RabbitCluster.label}
SERVERS = {"nats": nats_cluster, "rabbitmq": rabbit_cluster}


class Setting(NamedTuple):
    """One measurement of each system: `conns` connections, `batch` messages per cycle."""

    key: str
    what: str
    conns: int
    batch: int


def options(parser: argparse.ArgumentParser) -> None:
    """This comparison's options of load/bench.py."""
    parser.add_argument("--brokers", default=",".join(SYSTEMS),
                        help=f"brokers: the systems compared, a subset of {','.join(SYSTEMS)} (default all)")
    parser.add_argument("--broker-sweep", type=int_list, default=[8, 64],
                        help="brokers: connection counts of the per-request cycles (default 8,64)")
    parser.add_argument("--broker-batch", type=int, default=100,
                        help="brokers: messages per cycle of the batched setting, at --conns connections (default 100)")
    parser.add_argument("--client-processes", type=int, default=4,
                        help="brokers: Python client processes the connections are spread over (default 4)")


def settings(args: argparse.Namespace) -> list[Setting]:
    """Per request at each --broker-sweep count, then batched at --conns connections."""
    return ([Setting(str(c), f"per request, {c} connections", c, 1) for c in args.broker_sweep]
            + [Setting(f"b{args.broker_batch}", f"batches of {args.broker_batch}, {args.conns} connections",
                       args.conns, args.broker_batch)])


def available(wanted: list[str], notes: list[str]) -> list[str]:
    """The systems of `wanted` whose servers and client package are here; a note for each other."""
    found = []
    for system in wanted:
        server = SERVERS.get(system)
        reason = (server.missing() if server else None) or broker_client.missing_package(system)
        if reason:
            notes.append(f"brokers: {reason}")
            print("  " + notes[-1], flush=True)
        else:
            found.append(system)
    return found


def versions(systems: list[str]) -> str:
    """The servers' versions, for the header."""
    return ", ".join(f"{LABELS[s]} {SERVERS[s].version()}" for s in systems if s in SERVERS)


class QueueServerCluster(Cluster):
    """bench.py's 3-node cluster, with its leader elected before it is used, and what its
    acknowledgement means."""

    label = LABELS["queue-server"]

    def __init__(self, repo: str, workdir: str, workers: int) -> None:
        self.dir = workdir
        super().__init__(repo, workdir, workers, False)
        if self.leader() is None:
            self.stop()
            raise RuntimeError("the three queue-server nodes elected no leader")
        sys.path.insert(0, repo)
        from queue_server.config.loader import parse_config

        config, _ = parse_config(json.dumps(self.nodes[0].config))
        self.durability = (f"reply once 2 of 3 nodes have it in their log ({config.replication}), written to the "
                           f"OS; fsync {config.fsync}")


def start(system: str, repo: str, workdir: str, workers: int) -> Any:
    """A fresh 3-node cluster of `system` with its data in a new directory under `workdir`."""
    where = tempfile.mkdtemp(prefix=f"{system}-", dir=workdir)
    if system == "queue-server":
        return QueueServerCluster(repo, where, workers)
    if system == "nats":
        return nats_cluster.NatsCluster(where)
    return rabbit_cluster.RabbitCluster(where)


def _lines(children: list[subprocess.Popen], timeout: float) -> list[str]:
    """The next line of each child's output; TimeoutError (the children killed) past `timeout`."""
    with ThreadPoolExecutor(len(children)) as pool:
        futures = [pool.submit(c.stdout.readline) for c in children]  # type: ignore[union-attr]
        _, pending = wait(futures, timeout)
        if pending:
            for c in children:
                c.kill()
            raise TimeoutError(f"a client process said nothing within {timeout:g} s")
        return [f.result() for f in futures]


def _expect(children: list[subprocess.Popen], files: list[str], word: str, timeout: float, failed: str) -> None:
    """Wait until every child says `word`; RuntimeError with what the first that did not said
    (its error, else the end of its log), and its exit status once stopped."""
    for line, child, name in zip(_lines(children, timeout), children, files):
        if line.strip() == word:
            continue
        try:
            said = "; ".join(json.loads(line)["errors"])
        except (ValueError, KeyError, TypeError):
            said = line.strip()[:300] or "nothing"
        status = stop(child, grace=5)
        with open(name + ".log", "rb") as log:
            tail = log.read()[-600:].decode(errors="replace").strip()
        raise RuntimeError(f"a client process {failed}: {said} (exit status {status}"
                           + (f"; its log ends: {tail}" if tail else "") + ")")


def measure_once(system: str, cluster: Any, setting: Setting, args: argparse.Namespace, queue: str,
                 workdir: str) -> dict:
    """One measurement: prepare `queue`, start the client processes, let them connect, run them
    for args.seconds; the row's figures."""
    asyncio.run(broker_client.prepare(system, cluster.addresses, queue))
    procs = max(1, min(args.client_processes, setting.conns))
    argv = [sys.executable, "-m", "load.broker_client", "--system", system, "--addresses", ",".join(cluster.addresses),
            "--queue", queue, "--batch", str(setting.batch), "--payload", str(args.payload)]
    files = [os.path.join(workdir, f"{queue}-client{p}") for p in range(procs)]
    children = []
    for p, name in enumerate(files):
        with open(name + ".log", "ab") as log:
            children.append(subprocess.Popen(
                argv + ["--out", name + ".json", "--conns", ",".join(str(k) for k in range(p, setting.conns, procs))],
                cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True))
    try:
        _expect(children, files, "ready", 120, "failed to connect")
        before = cluster.cpu_seconds()
        started = time.monotonic()
        for c in children:
            c.stdin.write(f"{started + args.seconds}\n")  # type: ignore[union-attr]
            c.stdin.flush()  # type: ignore[union-attr]
        _expect(children, files, "done", args.seconds + 120, "failed")
        after = cluster.cpu_seconds()
    finally:
        for c in children:
            stop(c, grace=5)
    results = []
    for name in files:
        with open(name + ".json") as f:
            results.append(json.load(f))
    errors = sorted({e for r in results for e in r.get("errors", ())})
    if errors:
        raise RuntimeError(f"client errors: {'; '.join(errors)}")
    elapsed = max(r["finished"] for r in results) - started
    ops, messages = sum(r["ops"] for r in results), sum(r["messages"] for r in results)
    client_cpu = sum(r["cpu_seconds"] for r in results)
    server_cpu = sum(after.values()) - sum(before.values())
    return {"ops": ops, "messages": messages, "seconds": elapsed, "ops_per_s": ops / elapsed,
            "messages_per_s": messages / elapsed,
            **latency_ms([t / 3 for r in results for t in r["latencies"]]),
            "cpu_us_per_op": cpu_per_op(before, after, ops),
            "server_cpu_us_per_msg": server_cpu / max(1, messages) * 1e6,
            "client_cpu_us_per_op": client_cpu / max(1, ops) * 1e6,
            "client_cpu_us_per_msg": client_cpu / max(1, messages) * 1e6,
            "client_cores": client_cpu / elapsed, "client_processes": procs,
            "empty_consumes": sum(r["empty"] for r in results), "durability": cluster.durability}


def describe(row: dict) -> str:
    """The printed line of one measurement."""
    by_node: dict[str, float] = {}
    for name, us in row["cpu_us_per_op"].items():
        node = name.split("/")[0]
        by_node[node] = by_node.get(node, 0.0) + us
    return (f"{row['ops_per_s']:>9,.0f} ops/s {row['messages_per_s']:>9,.0f} msg/s  p50 {row['p50_ms']:.3f} "
            f"p99 {row['p99_ms']:.3f} ms\n      server CPU us/op: "
            + ", ".join(f"{k} {v:.1f}" for k, v in by_node.items())
            + f"; total {sum(by_node.values()):.1f}; client CPU us/op {row['client_cpu_us_per_op']:.1f} "
            f"({row['client_cores']:.2f} cores in {row['client_processes']} processes)"
            + (f"; {row['empty_consumes']} consumes found nothing" if row["empty_consumes"] else ""))


def workload(args: argparse.Namespace, tmp: str, repo: str, rows: list[dict], notes: list[str]) -> None:
    """Run the comparison: args.repeat rounds, each system on a fresh cluster per round; append
    one row per system and setting (the median round by ops/s) to `rows`."""
    wanted = [s.strip() for s in args.brokers.split(",") if s.strip()]
    unknown = set(wanted) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"bench: unknown --brokers {', '.join(sorted(unknown))} (known: {', '.join(SYSTEMS)})")
    systems = available(wanted, notes)
    if not systems:
        return
    print(f"  brokers: {versions(systems) or 'queue-server only'}; Python clients in {args.client_processes} "
          f"processes, {args.seconds:g} s per setting, {args.repeat} round(s)", flush=True)
    runs: dict[tuple[str, str], list[dict]] = {}
    plan = settings(args)
    for rnd in range(args.repeat):
        for system in systems[rnd % len(systems):] + systems[:rnd % len(systems)]:
            began = time.monotonic()
            try:
                cluster = start(system, repo, tmp, args.workers)
            except (RuntimeError, TimeoutError, OSError) as exc:
                notes.append(f"brokers, {LABELS[system]}: failed to start: {exc}")
                print("  " + notes[-1], flush=True)
                continue
            print(f"  {'brokers':<12} {LABELS[system]:<18} 3 nodes up in {time.monotonic() - began:.1f} s", flush=True)
            try:
                for s in plan:
                    what = f"{s.what}, round {rnd + 1}" if args.repeat > 1 else s.what
                    try:
                        row = measure_once(system, cluster, s, args, f"bench-{s.key}", cluster.dir)
                    except (RuntimeError, TimeoutError, OSError) as exc:
                        notes.append(f"brokers, {LABELS[system]}, {what}: failed: {exc}; "
                                     f"server log: {cluster.log_tail().strip() or '(empty)'}")
                        print(f"  {'brokers':<12} {LABELS[system]:<18} {what:<36} FAILED: {exc}", flush=True)
                        continue
                    runs.setdefault((system, s.key), []).append(row)
                    print(f"  {'brokers':<12} {LABELS[system]:<18} {what:<36} {describe(row)}", flush=True)
            finally:
                cluster.stop()
    for system in systems:
        for s in plan:
            done = runs.get((system, s.key))
            if done:
                row = sorted(done, key=lambda r: r["ops_per_s"])[len(done) // 2]
                row.update(workload="brokers", server=LABELS[system], what=f"{s.what}, Python clients",
                           key=f"brokers/{system}/{s.key}", runs=[r["ops_per_s"] for r in done])
                rows.append(row)


def table(rows: list[dict]) -> list[str]:
    """The comparison's own table: every figure of each row, with its durability."""
    lines = ["| system | setting | requests/s | messages/s | p50 ms | p99 ms | server CPU µs per request: total "
             "(by process) | server CPU µs per message | client CPU µs per message (cores) | when the ack is durable |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for r in rows:
        if r.get("workload") != "brokers":
            continue
        bound = ", client-bound" if r["client_cpu_us_per_msg"] > r["server_cpu_us_per_msg"] else ""
        lines.append(f"| {r['server']} | {r['what'].rsplit(', Python', 1)[0]} | {r['ops_per_s']:,.0f} | "
                     f"{r['messages_per_s']:,.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {cpu_cell(r['cpu_us_per_op'])} | "
                     f"{r['server_cpu_us_per_msg']:,.1f} | {r['client_cpu_us_per_msg']:,.1f} ({r['client_cores']:.2f}{bound}) | "
                     f"{r['durability']} |")
    return lines


def summary(rows: dict[str, dict]) -> list[str]:
    """The summary's lines: queue-server's figures at each setting, and each broker's ratio to them."""
    lines = []
    for key in sorted({k.rsplit("/", 1)[1] for k in rows if k.startswith("brokers/")}, key=lambda k: (k[0] == "b", k)):
        base = rows.get(f"brokers/queue-server/{key}")
        if base is None:
            continue
        lines.append(f"replicated, {base['what']}: queue-server x3 {_figures(base)}")
        for system in SYSTEMS[1:]:
            r = rows.get(f"brokers/{system}/{key}")
            if r:
                lines.append(f"  {LABELS[system]}: {_figures(r)}; queue-server x3 has "
                             f"{base['messages_per_s'] / r['messages_per_s']:.2f}x its messages/s and "
                             f"{base['server_cpu_us_per_msg'] / r['server_cpu_us_per_msg']:.2f}x its server CPU per message")
    return lines


def _figures(row: dict) -> str:
    return (f"{row['messages_per_s']:,.0f} messages/s, p99 {row['p99_ms']:.3f} ms, server CPU "
            f"{row['server_cpu_us_per_msg']:,.1f} us/message, client CPU {row['client_cpu_us_per_msg']:,.1f} us/message")
