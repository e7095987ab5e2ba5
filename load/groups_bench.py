"""Queue groups against one group (issue 28's first target): a 3-node cluster with `queue_groups`
3 (every group on every node, one led by each node) beside the same cluster with one group, in
one run. The load is uniform over 30 queues, from clients connected to every node (cbench, the
compiled closed-loop client of load/bench.py: produce, consume, confirm cycles; connection k on
node k mod 3; the clients go to any node, which forwards a request to its group's leader). For
each setting it prints requests/s, p99, the cluster's CPU per request and each node's share of
the cluster's CPU: with one group the leader does every write and the followers only apply
them; with three, each node leads a third. The settings alternate over --repeat rounds, each on
a fresh cluster. A benchmark, not a test.

    python load/groups_bench.py --seconds 10 --repeat 3
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from statistics import median

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from load.bench import REPO, Cluster, build_client, print_machine, request, run_client  # noqa: E402

QUEUES = 30
TARGET_SHARE = 0.37  # the busiest node's share of the cluster's CPU with 3 groups (issue 28)


def leaders(cluster: Cluster) -> list[int] | None:
    """Each group's leader (one group: [its leader]) once every node names the same ones, else None."""
    views = []
    for address in cluster.addresses:
        try:
            reply = request(address, {"action": 8})
        except OSError:
            return None
        if reply.get("code") != 0:
            return None
        views.append([row["leader_node_id"] for row in reply.get("groups", [reply])])
    return views[0] if all(views[0]) and all(v == views[0] for v in views) else None


def wait_spread(cluster: Cluster, groups: int, timeout: float = 60.0) -> list[int]:
    """Wait for a leader of every group, and with several groups for one per node."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = leaders(cluster)
        if found is not None and (groups == 1 or sorted(found) == [1, 2, 3]):
            return found
        time.sleep(0.2)
    raise SystemExit(f"groups_bench: the cluster with {groups} group(s) did not spread its leaders in {timeout:g} s: "
                     f"{leaders(cluster)}\n{cluster.log_tail()}")


def measure(client: str, args: argparse.Namespace, groups: int, workdir: str) -> dict:
    """One run on a fresh cluster with `groups` queue groups."""
    cluster = Cluster(args.repo, workdir, args.workers, False, {"queue_groups": groups})
    try:
        spread = wait_spread(cluster, groups)
        before = cluster.cpu_seconds()
        result = run_client(client, "qs", cluster.addresses, args, queues=QUEUES)
        after = cluster.cpu_seconds()
    finally:
        cluster.stop()
    per_node = {i: sum(after[k] - before.get(k, 0.0) for k in after if k.startswith(f"node{i}/")) for i in (1, 2, 3)}
    total = sum(per_node.values()) or 1e-9
    ops = result["ops"]
    by_kind: dict[str, float] = {}  # acceptor, coordinator, worker, supervisor: over the three nodes
    for k in after:
        kind = k.split("/", 1)[1].split("-")[0]
        by_kind[kind] = by_kind.get(kind, 0.0) + (after[k] - before.get(k, 0.0)) / max(ops, 1) * 1e6
    return {"groups": groups, "leaders": spread, "ops_per_s": ops / result["seconds"], "p99_ms": result["p99_ms"],
            "cpu_us_per_op": total / max(ops, 1) * 1e6, "shares": {i: per_node[i] / total for i in per_node},
            "busiest": max(per_node.values()) / total, "by_kind": by_kind}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each measurement")
    parser.add_argument("--conns", type=int, default=24, help="client connections, spread over the three nodes")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (the settings alternate; medians kept)")
    parser.add_argument("--workers", type=int, default=2, help="workers per node")
    parser.add_argument("--payload", type=int, default=100, help="message body bytes")
    parser.add_argument("--repo", default=REPO, help="the queue-server checkout to run")
    args = parser.parse_args(argv)
    print_machine()
    rows: dict[int, list[dict]] = {1: [], 3: []}
    with tempfile.TemporaryDirectory(prefix="groups-bench-") as tmp:
        client = build_client(tmp)
        for r in range(args.repeat):
            for groups in ((1, 3) if r % 2 == 0 else (3, 1)):
                row = measure(client, args, groups, tmp)
                rows[groups].append(row)
                shares = " ".join(f"node{i} {s:.0%}" for i, s in row["shares"].items())
                print(f"round {r + 1}, queue_groups {groups} (leaders {row['leaders']}): {row['ops_per_s']:,.0f} req/s, "
                      f"p99 {row['p99_ms']:.2f} ms, cluster CPU {row['cpu_us_per_op']:.0f} us/req; {shares}; "
                      f"busiest {row['busiest']:.0%}; us/req by process: "
                      + ", ".join(f"{k} {v:.0f}" for k, v in sorted(row["by_kind"].items())), flush=True)
    print(f"\nmedians of {args.repeat} round(s), {args.conns} connections over {QUEUES} queues, {args.seconds:g} s each:")
    for groups, got in rows.items():
        print(f"queue_groups {groups}: {median(r['ops_per_s'] for r in got):,.0f} req/s, "
              f"p99 {median(r['p99_ms'] for r in got):.2f} ms, cluster CPU {median(r['cpu_us_per_op'] for r in got):.0f} "
              f"us/req, busiest node {median(r['busiest'] for r in got):.0%} of the cluster's CPU")
    busiest = median(r["busiest"] for r in rows[3])
    print(f"target: with 3 groups the busiest node uses <= {TARGET_SHARE:.0%} of the cluster's CPU, measured: "
          f"{busiest:.0%}, {'met' if busiest <= TARGET_SHARE else 'not met'}")


if __name__ == "__main__":
    main()
