"""The cluster fail-over scenario: locust users spread over the three nodes of a cluster (followers
forward to the leader), one node is killed and later restarted, and the errors the users saw
are reported per phase (before the kill, while the node is down, after its restart) with the
time the survivors took to agree on a leader.

    # start three nodes from config/examples/node1..3.json (on free ports, data in a temp dir)
    python load/cluster_scenario.py
    python load/cluster_scenario.py --victim follower --users 40 --run-time 60 --kill-after 15 --down-for 15

    # an already running cluster: the script runs your commands to kill and restart a node
    python load/cluster_scenario.py --hosts 10.0.0.1:1111,10.0.0.2:1111,10.0.0.3:1111 \\
        --kill-cmd 'ssh 10.0.0.2 systemctl kill -s KILL queue-server' \\
        --restart-cmd 'ssh 10.0.0.2 systemctl start queue-server'

Exit status 0 when the scenario ran (errors during the fail-over are expected and reported),
2 when it could not run (no leader at the start, a node that would not start).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from queue_server.config.loader import strip_comments  # noqa: E402
from load.bench import request  # noqa: E402
from load.procs import kill_tree, stop_tree, wait_until  # noqa: E402
from tests.harness import free_port  # noqa: E402


class ScenarioError(Exception):
    """The scenario could not run."""



def ask(addr: str, req: dict, timeout: float = 1.0) -> dict | None:
    """One request on a fresh TCP connection; None if the node did not answer."""
    try:
        return request(addr, req, timeout)
    except (OSError, ValueError):
        return None


def agreed_leader(addresses: list[str], need: int | None = None) -> int | None:
    """The leader's node_id if at least `need` (default: all) of the addresses answer action 8
    and every node that answers names the same leader."""
    leaders = set()
    answered = 0
    for addr in addresses:
        reply = ask(addr, {"action": 8}, timeout=0.5)
        if reply is None:
            continue
        if reply.get("code") != 0:
            return None
        answered += 1
        leaders.add(reply.get("leader_node_id"))
    if answered < (len(addresses) if need is None else need) or len(leaders) != 1:
        return None
    return leaders.pop()


class LocalNode:
    """One node started by this script from a config file."""

    def __init__(self, node_id: int, config: dict, workdir: str) -> None:
        self.node_id = node_id
        self.config = config
        self.address = f"{config['host']}:{config['port']}"
        self.path = os.path.join(workdir, f"node{node_id}.json")
        self.log_path = os.path.join(workdir, f"node{node_id}.log")
        with open(self.path, "w") as f:
            json.dump(config, f)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "queue_server.server.main", "--config", self.path],
                                     cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        if not wait_until(lambda: self.proc.poll() is not None or ask(self.address, {"action": 104}) is not None, timeout):
            raise ScenarioError(f"node {self.node_id} did not start listening on {self.address} (log {self.log_path})")
        if self.proc.poll() is not None:
            raise ScenarioError(f"node {self.node_id} exited with {self.proc.returncode} (log {self.log_path})")

    def kill(self) -> None:
        """SIGKILL the whole node, supervisor and children at once: a crash, no clean stop."""
        if self.proc is not None:
            kill_tree(self.proc)

    def stop(self) -> None:
        """A clean stop (SIGTERM); SIGKILL to the whole node after 15 s."""
        if self.proc is not None:
            stop_tree(self.proc, 15.0)


def local_cluster(configs: list[str], keep_ports: bool, workdir: str) -> list[LocalNode]:
    """Nodes from the example configs: ports made free (client, internal and HTTP; unless
    keep_ports), data dirs in workdir."""
    loaded = []
    for path in configs:
        with open(path) as f:
            loaded.append(json.loads(strip_comments(f.read())))
    if not keep_ports:
        internal = {c["node_id"]: free_port() for c in loaded}
        web = {c["node_id"]: free_port() for c in loaded}  # http_port
        for c in loaded:
            c["port"], c["http_port"] = free_port(), web[c["node_id"]]
            c["cluster_node_list"] = [dict(n, port=internal[n["node_id"]], http_port=web[n["node_id"]])
                                      for n in c["cluster_node_list"]]
    nodes = []
    for c in loaded:
        c.update(log_prefix="", log_level=2, queue_data_dir=os.path.join(workdir, f"data{c['node_id']}"))
        nodes.append(LocalNode(c["node_id"], c, workdir))
    return nodes


def phases(timeline: dict, events: dict[str, float]) -> list[dict]:
    """Requests and failures before the kill, while the node was down, and after its restart.
    Failures are placed by the time they were seen; requests by the second they ended in."""
    bounds = [("before the kill", float("-inf"), events["kill"]),
              ("node down", events["kill"], events.get("restart", float("inf"))),
              ("after the restart", events.get("restart", float("inf")), float("inf"))]
    seconds = timeline["per_second"]
    out = []
    for name, lo, hi in bounds:
        inside = [(t, n) for t, n, _ in seconds if lo <= t + 0.5 < hi]
        failures = [f for f in timeline["failures"] if lo <= f["end"] < hi]
        requests = sum(n for _, n in inside)
        span = min(hi, seconds[-1][0] + 1 if seconds else lo) - max(lo, seconds[0][0] if seconds else hi)
        out.append({"phase": name, "seconds": round(max(span, 0.0), 1), "requests": requests,
                    "requests_per_s": round(requests / span, 1) if span > 0 else 0.0,
                    "failures": len(failures),
                    "failure_percent": round(100.0 * len(failures) / requests, 3) if requests else 0.0,
                    "first_failure": round(failures[0]["end"] - events["kill"], 2) if failures else None,
                    "last_failure": round(failures[-1]["end"] - events["kill"], 2) if failures else None})
    return out


def error_counts(failures: list[dict]) -> list[dict]:
    """Failures grouped by (type, name, error), most frequent first."""
    counts: dict[tuple[str, str, str], int] = {}
    for f in failures:
        key = (f["type"], f["name"], f["error"])
        counts[key] = counts.get(key, 0) + 1
    return [{"type": t, "name": n, "error": e, "count": c}
            for (t, n, e), c in sorted(counts.items(), key=lambda kv: -kv[1])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(os.path.join(REPO, "config", "examples", f"node{i}.json") for i in (1, 2, 3)),
                        help="node config files to start (default: config/examples/node1..3.json)")
    parser.add_argument("--keep-ports", action="store_true", help="use the configs' ports as written (default: free ports)")
    parser.add_argument("--hosts", help="an already running cluster's client addresses (then --kill-cmd/--restart-cmd)")
    parser.add_argument("--kill-cmd", help="shell command that kills a node of --hosts")
    parser.add_argument("--restart-cmd", help="shell command that restarts it")
    parser.add_argument("--victim", default="leader", help="leader, follower, or a node_id (default leader)")
    parser.add_argument("--users", type=int, default=30)
    parser.add_argument("--spawn-rate", type=float, default=30)
    parser.add_argument("--run-time", type=float, default=40, help="seconds of load")
    parser.add_argument("--kill-after", type=float, default=10, help="seconds into the load")
    parser.add_argument("--down-for", type=float, default=10, help="seconds before the restart")
    parser.add_argument("--user-classes", default="TcpQueueUser,UdpQueueUser")
    parser.add_argument("--locust-args", default="", help="more locust arguments, e.g. '--payload-size 500'")
    parser.add_argument("--json", default="cluster-scenario.json")
    args = parser.parse_args(argv)

    workdir = tempfile.mkdtemp(prefix="cluster-scenario-")
    nodes: list[LocalNode] = []
    load: subprocess.Popen | None = None
    try:
        if args.hosts:
            addresses = [h.strip() for h in args.hosts.split(",") if h.strip()]
            if not (args.kill_cmd and args.restart_cmd):
                raise ScenarioError("--hosts needs --kill-cmd and --restart-cmd")
        else:
            nodes = local_cluster(args.configs.split(","), args.keep_ports, workdir)
            for node in nodes:
                node.start()
            addresses = [n.address for n in nodes]
        print(f"nodes: {', '.join(addresses)} (work dir {workdir})", flush=True)
        started = time.monotonic()
        leader = wait_until(lambda: agreed_leader(addresses), 30)
        if leader is None:
            raise ScenarioError("the nodes did not agree on a leader within 30 s: is the cluster working?")
        print(f"leader: node {leader} (agreed after {time.monotonic() - started:.1f} s)", flush=True)

        prefix = os.path.join(workdir, "locust")
        timeline_path = os.path.join(workdir, "timeline.json")
        locust = [sys.executable, "-m", "locust", "-f", os.path.join(HERE, "locustfile.py"), "--headless",
                  "-u", str(args.users), "-r", str(args.spawn_rate), "-t", f"{args.run_time:g}s",
                  "--host", ",".join(addresses), "--csv", prefix, "--csv-full-history", "--only-summary",
                  "--exit-code-on-error", "0", "--loglevel", "WARNING", "--stop-timeout", "5",
                  "--timeline", timeline_path,
                  *args.locust_args.split(), *args.user_classes.split(",")]
        events: dict[str, float] = {}
        load = subprocess.Popen(locust, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output: list[str] = []
        reader = threading.Thread(target=lambda: output.extend(load.stdout), daemon=True)
        reader.start()
        events["start"] = time.time()
        time.sleep(args.kill_after)

        current = agreed_leader(addresses) or leader
        majority = len(addresses) // 2 + 1
        events["kill"] = time.time()
        if nodes:
            if args.victim == "leader":
                victim_id = current
            elif args.victim == "follower":
                victim_id = next(n.node_id for n in nodes if n.node_id != current)
            else:
                victim_id = int(args.victim)
            victim = next(n for n in nodes if n.node_id == victim_id)
            victim.kill()
            print(f"killed node {victim_id} at +{events['kill'] - events['start']:.1f} s", flush=True)
        else:
            victim_id = None
            subprocess.run(args.kill_cmd, shell=True, check=True)
            print(f"ran --kill-cmd at +{events['kill'] - events['start']:.1f} s", flush=True)
        new_leader = wait_until(
            lambda: (l := agreed_leader(addresses, majority)) is not None and (l != victim_id or victim_id != current) and l,
            args.down_for, longest=0.02)
        if new_leader:
            events["new_leader"] = time.time()
            print(f"leader agreed by a majority: node {new_leader}, {events['new_leader'] - events['kill']:.2f} s after the kill", flush=True)
        else:
            print(f"no new leader among the survivors within {args.down_for:g} s", flush=True)
        remaining = args.down_for - (time.time() - events["kill"])
        if remaining > 0:
            time.sleep(remaining)
        events["restart"] = time.time()
        if nodes:
            victim.start()
        else:
            subprocess.run(args.restart_cmd, shell=True, check=True)
        back = wait_until(lambda: agreed_leader(addresses), 30, longest=0.05)
        events["rejoined"] = time.time()
        print(f"restarted node {victim_id or '(--restart-cmd)'} at +{events['restart'] - events['start']:.1f} s; "
              + (f"all three agree on leader node {back} after {events['rejoined'] - events['restart']:.2f} s" if back
                 else "the nodes did not agree on a leader within 30 s"), flush=True)

        load.wait(args.run_time + 120)
        reader.join(5)
        if not os.path.exists(timeline_path):
            raise ScenarioError("locust wrote no timeline:\n" + "".join(output[-30:]))
        with open(timeline_path) as f:
            timeline = json.load(f)
        failures = error_counts(timeline["failures"])
        report = {
            "addresses": addresses,
            "first_leader": leader,
            "leader_at_kill": current,
            "victim": victim_id,
            "events": {k: round(v - events["start"], 2) for k, v in events.items()},
            "leaderless_seconds": round(events["new_leader"] - events["kill"], 3) if "new_leader" in events else None,
            "phases": phases(timeline, events),
            "failures": failures,
            "locust_exit": load.returncode,
        }
        print()
        print("| phase | seconds | requests | requests/s | failures | failure % | failures seen (s after the kill) |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for p in report["phases"]:
            seen = f"{p['first_failure']} .. {p['last_failure']}" if p["failures"] else ""
            print(f"| {p['phase']} | {p['seconds']} | {p['requests']:,} | {p['requests_per_s']:,} | {p['failures']:,} "
                  f"| {p['failure_percent']} | {seen} |")
        print()
        print("errors the users saw:" if failures else "errors the users saw: none")
        for f in report["failures"]:
            print(f"  {f['count']:>7,}  {f['type']} {f['name']}: {f['error'][:160]}")
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"\nwrote {args.json}; locust CSVs and node logs in {workdir}")
        if load.returncode not in (0, None):
            print("locust output:\n" + "".join(output[-30:]))
        return 0
    except ScenarioError as exc:
        print(f"cluster scenario: {exc}", file=sys.stderr)
        return 2
    finally:
        if load is not None and load.poll() is None:
            load.terminate()
            try:
                load.wait(10)
            except subprocess.TimeoutExpired:
                load.kill()
                load.wait()
        for node in nodes:
            node.stop()


if __name__ == "__main__":
    sys.exit(main())
