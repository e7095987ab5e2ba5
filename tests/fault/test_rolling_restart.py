"""A rolling restart of a 3-node cluster under load: each node in turn gets SIGTERM and is
started again while producers and consumers run against every node. A leader hands leadership
over before it stops, so nothing acknowledged is lost, no at-most-once message is delivered
twice, and no client sees an error: only answers the client retries by itself (redirects, "no
leader", a request the old leader refused unapplied), which are counted and printed."""
from __future__ import annotations

import re
import signal
import time
from collections import Counter

from queue_server.client import protocol as client_protocol
from tests.fault.history import History, Workload, drain
from tests.harness import Cluster, wait_for

GRACE = 10.0
PROGRESS = 30  # acknowledged produces between two restarts


def test_rolling_restart_loses_nothing_and_clients_see_no_error(tmp_path, monkeypatch):
    retried: Counter = Counter()
    retry_elsewhere = client_protocol.retry_elsewhere

    def counting(req: dict, reply: dict) -> bool:
        again = retry_elsewhere(req, reply)
        if again:
            retried[str(reply.get("reason"))] += 1
        return again

    redirect_target = client_protocol.redirect_target

    def counting_redirect(reply: dict, host: str):
        retried["redirect"] += 1
        return redirect_target(reply, host)

    monkeypatch.setattr(client_protocol, "retry_elsewhere", counting)
    monkeypatch.setattr(client_protocol, "redirect_target", counting_redirect)

    cluster = Cluster(str(tmp_path), shutdown_grace=GRACE)
    workloads: list[Workload] = []
    try:
        cluster.start()
        leader = cluster.wait_serving(60)
        history = History()
        hosts = [node.hosts for node in cluster.nodes.values()]
        # Each workload starts on a different node: clients of every node see each restart.
        workloads = [Workload(",".join(hosts[k:] + hosts[:k]), history, producers=1, prefix=f"w{k}-").start()
                     for k in range(len(hosts))]
        handoffs = []
        for node_id, node in cluster.nodes.items():
            _wait_progress(history)
            was_leader = cluster.role(node_id) == "leader"
            started = time.monotonic()
            node.signal(signal.SIGTERM)
            assert node.proc.wait(GRACE + 10) == 0, node.log()[-3000:]
            stopped = time.monotonic() - started
            node.stop()
            if was_leader:
                found = re.findall(r"stopping: node (\d+) leads now \(hand-off took (\d+) ms\)", node.log())
                assert found, f"node {node_id} led but did not hand leadership over:\n{node.log()[-3000:]}"
                handoffs.append((node_id, int(found[-1][0]), int(found[-1][1])))
            print(f"node {node_id} ({'leader' if was_leader else 'follower'}) stopped in {stopped:.2f} s")
            node.start()
            cluster.wait_leader(60)
        _wait_progress(history)
        for w in workloads:
            w.stop()
        drain(cluster.hosts, history, timeout=60)
        print(f"acknowledged {history.acked_count()}, delivered "
              f"{sum(len(v) for v in history.delivered.values())}; hand-offs (from, to, ms): {handoffs}; "
              f"retried by the clients: {dict(retried)}; errors: {dict(history.errors)}")
        history.check()
        assert not history.errors, (f"clients saw errors: {dict(history.errors)}\n"
                                    + "\n".join(history.error_texts) + f"\n{_roles(cluster)}")
        assert handoffs, "no node was leading when it got SIGTERM"
    finally:
        for w in workloads:
            w.stopping.set()
        cluster.stop()


def _roles(cluster: Cluster) -> str:
    """Each node's changes of role and its hand-off lines, from its log: where a client's error
    came from when a leader stepped down."""
    lines = []
    for node_id, node in cluster.nodes.items():
        lines += [f"node {node_id}: {line}" for line in node.log().splitlines()
                  if re.search(r"role: |stopping: |recovered in ", line)]
    return "\n".join(lines)


def _wait_progress(history: History) -> None:
    """Wait until the workload has had PROGRESS more produces acknowledged."""
    target = history.acked_count() + PROGRESS
    wait_for(lambda: history.acked_count() >= target, 60, f"{PROGRESS} more acknowledged produces")
