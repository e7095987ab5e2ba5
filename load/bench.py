"""The benchmark: closed-loop workloads against a real node and, in the same run with the same
compiled client (load/cbench.c), against beanstalkd and redis when they are installed. Prints
the machine, a table, and writes a JSON file. A benchmark, not a test.

One file, over 600 lines, because it is the one benchmark command: every workload is a short
function over the same Server, client runner and report, and the summary compares their rows
with each other and with the peers'. The workloads with machinery of their own are apart
(load/durability_bench.py, memory_bench.py, http_bench.py, tls_bench.py, hop_floor.py, ...).

Workloads (each on a freshly started server):

  unloaded      per-request cycles on one connection (the latency target: p50 <= 250 us)
  per-request   produce -> consume -> confirm cycles, one request in flight per connection, at
                each --sweep connection count (8, 64, 256)
  pipelined     the same cycles, --depths requests in flight per connection (1, 10, 100, 1000)
  batched       the same cycles with --batches messages per request (1, 10, 100, 1000; queue-server only)
  long-poll     producer/consumer pairs, one queue each; consumers long-poll (wait) and confirm;
                reports the delivery latency (produce sent -> message received) too
  quorum        per-request and pipelined cycles against a 3-node cluster (replication quorum):
                clients on the leader, then spread over the three nodes (followers forward);
                skipped, with the reason, while the nodes do not form a cluster; then `brokers`
  brokers       the 3-node cluster beside NATS JetStream R3 and RabbitMQ quorum queues, 3 nodes
                each, Python clients in --client-processes processes for all, per request at each
                --broker-sweep count (8, 64) and in batches of --broker-batch (100), with server
                and client CPU and when each acknowledgement is durable (load/broker_bench.py);
                a broker whose program or client package is missing is skipped with a note
  durability    per-request cycles with each setting of load/durability_bench.py (fsync always,
                everysec, no; no WAL; frequent snapshots), beside beanstalkd's binlog
  scaling       per-request cycles with 1, 2, 4 workers; spread over 1 and 10,000 queues; with
                1k and 1M messages stored in another queue (--scale-*)
  memory        memory per stored message at 1M (load/memory_bench.py), beside the peers
  subscribe     consumed messages/s with push subscriptions (credit 100) against a consume +
                confirm loop, Python client, same connections (load/subscribe_bench.py)
  http          per-request cycles over the HTTP API (POST, GET, DELETE; wrk, load/http_bench.py)
                beside the same cycles over TCP (cbench), same connections, one node with
                http_port on; skipped, with the reason, without wrk
  security      per-request cycles without and with a client token (auth_token_file; cbench
                authenticates each connection before the clock starts), in --repeat pairs run
                back to back (which goes first alternates), each pair's ratio printed; then the same cycles with the Python
                QueueClient plain and over TLS, also in pairs (load/tls_bench.py: cbench has no
                TLS, so that ratio includes the Python client's own TLS cost)
  floor         the hop floor (load/hop_floor.py): a skeleton node with our processes and
                transports and no queue work, at --hops 0, 2, 3, 4, beside beanstalkd, at 1
                connection, each --sweep count and --depth in flight

It ends with a summary: every target ("target: X, measured: Y, met / not met") and each
comparison (peers, quorum against a single node, durability settings, scaling) with p99 and the
server's CPU per request beside every throughput.

    python load/bench.py                        # every workload, 10 s each, 8 connections
    python load/bench.py --seconds 2 --only unloaded,per-request --sweep 8 --no-peers   # quick
    python load/bench.py --metrics              # node with metrics_port on, scraped every second
    python load/bench.py --repo /tmp/old-checkout --only pipelined --repeat 3   # another version
    python load/bench.py --only brokers --seconds 5 --repeat 3   # against NATS and RabbitMQ, 3 rounds
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from statistics import median_high
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from load.options import number_options  # noqa: E402
from load.peers import argv as peer_argv, installed as installed_peers  # noqa: E402
from load.procs import cpu_seconds, descendants, process_name, stop  # noqa: E402
from tests.harness import free_port  # noqa: E402  (one definition for tests and benchmarks)
WORKLOADS = ("unloaded", "per-request", "pipelined", "batched", "long-poll", "quorum", "brokers", "durability",
             "scaling", "memory", "subscribe", "http", "security", "floor")


class Target(NamedTuple):
    """One of the issues' targets (12, 29), printed in the summary as "target: ..., measured: ..., met / not
    met": `figure` of row `key` (with `peer`, as a ratio to that row's figure) must be at most
    `bound` when `at_most`, else at least. A row of fewer than `messages` stored messages gets no
    verdict: the target is about that size."""

    what: str
    key: str
    figure: str
    bound: float
    unit: str
    peer: str | None = None
    at_most: bool = False
    messages: int = 0


TARGETS = (
    Target("unloaded single-connection p50", "unloaded", "p50_ms", 0.250, "ms", at_most=True),
    Target("per request, 8 connections, vs beanstalkd", "per-request/queue-server/8", "ops_per_s", 0.25, "x",
           "per-request/beanstalkd/8"),
    Target("per request, 64 connections, vs beanstalkd", "per-request/queue-server/64", "ops_per_s", 0.5, "x",
           "per-request/beanstalkd/64"),
    Target("per request, 256 connections, vs beanstalkd", "per-request/queue-server/256", "ops_per_s", 0.6, "x",
           "per-request/beanstalkd/256"),
    Target("pipelined, depth 16, vs beanstalkd", "pipelined/queue-server/16", "ops_per_s", 1.0, "x",
           "pipelined/beanstalkd/16"),
    Target("batched, 100 messages per request", "batched/100", "messages_per_s", 90_000, "messages/s"),
    Target("3-node quorum, per request, vs single node", "quorum/leader/1", "ops_per_s", 0.5, "x", "quorum/single/1"),
    Target("3-node quorum, pipelined, vs single node", "quorum/leader/16", "ops_per_s", 0.5, "x", "quorum/single/16"),
    # issue 29: against the replicated brokers (load/broker_bench.py), Python clients, 3 nodes each
    Target("3 nodes, per request, 8 connections, vs NATS JetStream R3", "brokers/queue-server/8", "ops_per_s", 1.0,
           "x", "brokers/nats/8"),
    Target("3 nodes, per request, 64 connections, vs NATS JetStream R3", "brokers/queue-server/64", "ops_per_s", 1.0,
           "x", "brokers/nats/64"),
    Target("3 nodes, batches of 100, vs NATS JetStream R3", "brokers/queue-server/b100", "messages_per_s", 1.0,
           "x", "brokers/nats/b100"),
    Target("3 nodes, per request, 8 connections, vs RabbitMQ quorum", "brokers/queue-server/8", "ops_per_s", 2.0,
           "x", "brokers/rabbitmq/8"),
    Target("3 nodes, per request, 64 connections, vs RabbitMQ quorum", "brokers/queue-server/64", "ops_per_s", 2.0,
           "x", "brokers/rabbitmq/64"),
    Target("3 nodes, batches of 100, vs RabbitMQ quorum", "brokers/queue-server/b100", "messages_per_s", 2.0,
           "x", "brokers/rabbitmq/b100"),
    Target("3 nodes, per request, 64 connections, server CPU per message vs NATS JetStream R3",
           "brokers/queue-server/64", "server_cpu_us_per_msg", 1.0, "x", "brokers/nats/64", at_most=True),
    Target("3 nodes, batches of 100, server CPU per message vs NATS JetStream R3", "brokers/queue-server/b100",
           "server_cpu_us_per_msg", 1.0, "x", "brokers/nats/b100", at_most=True),
    Target("memory per 100-byte message at 1M, summed over the node's processes", "memory/queue-server",
           "pss_per_msg", 300, "B", at_most=True, messages=1_000_000),
)
PROTOCOLS = {"queue-server": "qs", "floor": "qs", "queue-server x3": "qs", "beanstalkd": "beanstalk", "redis": "redis"}


def machine() -> dict:
    """What this ran on."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 1024 / 1024:.0f} GiB"
    except OSError:
        pass
    return {
        "cpu": model or platform.processor(),
        "cores": os.cpu_count(),
        "nproc": len(os.sched_getaffinity(0)),
        "memory": mem,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "load_average": os.getloadavg()[0],
    }


def print_machine() -> dict:
    """Print what this runs on in one line; returns it (machine())."""
    info = machine()
    print(f"machine: {info['cpu']}, nproc {info['nproc']} ({info['cores']} cores), {info['memory']}, "
          f"Python {info['python']}, Linux {info['kernel']}, load average {info['load_average']:.2f} at start")
    return info


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """Wait until something accepts TCP connections on `port` (or `proc` died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {port}")


def build_client(workdir: str) -> str:
    """Compile cbench; returns its path."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        sys.exit("bench: a C compiler (cc) is needed to build the load client")
    out = os.path.join(workdir, "cbench")
    subprocess.run([cc, "-O2", "-o", out, os.path.join(HERE, "cbench.c")], check=True)
    return out


class Server:
    """A server process started for one measurement and stopped after it."""

    def __init__(self, argv: list[str], port: int, cwd: str = REPO, log: str | None = None,
                 start_timeout: float = 30.0) -> None:
        self.log_path = log
        self.log = open(log, "ab") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, cwd=cwd)
        self.port = port
        self.addresses = [f"127.0.0.1:{port}"]
        try:
            wait_port(port, self.proc, start_timeout)
        except Exception:
            self.stop()
            raise

    def stop(self) -> None:
        stop(self.proc)
        if self.log is not subprocess.DEVNULL:
            self.log.close()

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) so far of the server process and each of its children, by
        name (queue-server: acceptor, worker-0, ..., coordinator)."""
        return process_cpu(self.proc.pid)

    def log_tail(self, lines: int = 5) -> str:
        """The end of the server's log, if it has one."""
        return tail_of(self.log_path, lines) if self.log_path else ""


def tail_of(path: str, lines: int = 5) -> str:
    """The last `lines` lines of the log file at `path`."""
    with open(path, "rb") as f:
        return b"".join(f.readlines()[-lines:]).decode(errors="replace")


def start_peer(name: str, *extra: str) -> Server:
    """Peer `name` (load/peers.py) on a free loopback port, with `extra` arguments."""
    port = free_port()
    return Server(peer_argv(name, port, *extra), port)


class QueueServer(Server):
    """A queue-server node from `repo` on free ports (with metrics_port when asked)."""

    def __init__(self, repo: str, workdir: str, workers: int, metrics: bool, config: dict | None = None, name: str = "node",
                 start_timeout: float = 30.0) -> None:
        port = free_port()
        cfg = {"host": "127.0.0.1", "port": port, "workers": workers, "log_level": 1, "http_port": 0,
               "queue_data_dir": tempfile.mkdtemp(prefix=f"{name}-data-", dir=workdir)}
        if metrics:
            cfg["metrics_port"] = free_port()
        cfg.update(config or {})
        self.config = cfg
        self.scraper = None
        path = os.path.join(workdir, f"{name}-{port}.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        super().__init__([sys.executable, "-m", "queue_server.server.main", "--config", path], port, cwd=repo,
                         log=os.path.join(workdir, f"{name}-{port}.log"), start_timeout=start_timeout)
        self.scraper = Scraper(cfg["metrics_port"]) if metrics else None

    def stop(self) -> None:
        if self.scraper is not None:
            self.scraper.stop()
        super().stop()


class Scraper(threading.Thread):
    """Scrapes /metrics once a second while a measurement runs (what a busy Prometheus does)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.done = threading.Event()
        self.scrapes = 0
        self.start()

    def run(self) -> None:
        while not self.done.wait(1.0):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    r.read()
                self.scrapes += 1
            except OSError:
                pass

    def stop(self) -> None:
        self.done.set()
        self.join()


class Cluster:
    """Queue-server nodes configured as one cluster (three unless told: from
    config/examples/node1..3.json, a fourth and more from node1.json with its own node_id), on
    free ports, with data directories in `workdir`."""

    def __init__(self, repo: str, workdir: str, workers: int, metrics: bool, extra: dict | None = None,
                 n: int = 3) -> None:
        """extra: config keys every node gets besides the example's (e.g. queue_groups)."""
        sys.path.insert(0, repo)
        from queue_server.config.loader import strip_comments

        examples = []
        for i in range(1, n + 1):
            with open(os.path.join(repo, "config", "examples", f"node{i if i <= 3 else 1}.json")) as f:
                examples.append({**json.loads(strip_comments(f.read())), "node_id": i})
        internal = [free_port() for _ in examples]
        node_list = [{"node_id": e["node_id"], "host": "127.0.0.1", "port": internal[i]} for i, e in enumerate(examples)]
        self.nodes: list[QueueServer] = []
        try:
            for i, example in enumerate(examples):
                cfg = dict(example)
                cfg.update(cluster_node_list=node_list, log_prefix="", log_level=1, **(extra or {}))
                for key in ("queue_data_dir", "port", "http_port"):  # QueueServer's own: free ports, HTTP off
                    cfg.pop(key, None)
                self.nodes.append(QueueServer(repo, workdir, workers, metrics, cfg, name=f"node{i + 1}"))
        except Exception:
            self.stop()
            raise
        self.addresses = [n.addresses[0] for n in self.nodes]

    def leader(self, timeout: float = 15.0) -> str | None:
        """The leader's client address once every node names the same one, else None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            answers = set()
            for addr in self.addresses:
                try:
                    reply = request(addr, {"action": 8})
                    answers.add((reply.get("code"), reply.get("leader_node_id"), reply.get("leader_host"), reply.get("leader_port")))
                except OSError:
                    answers.add(None)
            if len(answers) == 1:
                answer = answers.pop()
                if answer is not None and answer[0] == 0:
                    return f"{answer[2]}:{answer[3]}"
            time.sleep(0.2)
        return None

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds of every process of the nodes, by name (node<i>/<process>)."""
        total: dict[str, float] = {}
        for i, node in enumerate(self.nodes, 1):
            for name, seconds in node.cpu_seconds().items():
                total[f"node{i}/{name}"] = seconds
        return total

    def log_tail(self, lines: int = 5) -> str:
        return "\n".join(f"node{i}: {n.log_tail(lines)}" for i, n in enumerate(self.nodes, 1))


def process_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of process `pid` and of its descendants, by name ("server" for `pid` itself;
    a queue-server child by its module and index: acceptor, worker-0, coordinator)."""
    found: dict[str, float] = {}
    for p in descendants(pid):
        name = "server" if p == pid else process_name(p)
        found[name] = found.get(name, 0.0) + cpu_seconds(p)
    if len(found) > 1 and "server" in found:
        found["supervisor"] = found.pop("server")
    return found


def request(addr: str, req: dict, timeout: float = 2.0) -> dict:
    """One request over a fresh TCP connection."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(json.dumps(req).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
    return json.loads(buf)


def run_client(client: str, proto: str, addresses: list[str], args: argparse.Namespace, *, mode: str = "cycle",
               batch: int = 1, depth: int = 1, token: str | None = None, conns: int | None = None,
               queues: int = 0) -> dict:
    """One closed-loop run of cbench (`conns` connections, default args.conns; cycles spread over
    `queues` queues, 0: one per connection); returns its figures."""
    argv = [client, "-p", proto, "-a", ",".join(addresses), "-c", str(conns or args.conns), "-t", str(args.seconds),
            "-b", str(batch), "-d", str(depth), "-m", mode, "-s", str(args.payload), "-q", str(queues)]
    if token is not None:
        argv += ["-k", token]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=args.seconds + 90)
    if out.returncode != 0:
        raise RuntimeError(f"cbench failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def comparison_options(parser: argparse.ArgumentParser) -> None:
    """The options of a benchmark that runs a queue-server checkout beside its peers: --no-peers
    and --repo."""
    parser.add_argument("--no-peers", action="store_true", help="skip beanstalkd and redis")
    parser.add_argument("--repo", default=REPO, help="queue-server checkout to run (default: this one)")


def main(argv: list[str] | None = None) -> None:
    parser = number_options(__doc__, seconds=(10.0, "per measurement"),
                            conns=(8, "connections (long-poll: half as many producer/consumer pairs)"),
                            depth=(16, "quorum, floor: requests in flight per connection, pipelined"),
                            memory_messages=(1_000_000, "memory: messages of 100 bytes stored (load/memory_bench.py)"),
                            payload=(64, "message bytes"), workers=(2, "queue-server workers"),
                            repeat=(1, "measure each workload N times, report the median ops/s"))
    parser.add_argument("--sweep", type=int_list, default=[8, 64, 256], help="per-request: connection counts (default 8,64,256)")
    parser.add_argument("--depths", type=int_list, default=[1, 10, 16, 100, 1000],
                        help="pipelined: requests in flight per connection (default 1,10,16,100,1000; 16 is the target's)")
    parser.add_argument("--batches", type=int_list, default=[1, 10, 100, 1000],
                        help="batched: messages per request (default 1,10,100,1000)")
    parser.add_argument("--hops", type=_hops, default=[0, 2, 3, 4],
                        help="floor: the skeleton's variants, ZeroMQ hops per request (default 0,2,3,4)")
    parser.add_argument("--scale-workers", type=int_list, default=[1, 2, 4], help="scaling: worker counts (default 1,2,4)")
    parser.add_argument("--scale-queues", type=int_list, default=[1, 10000],
                        help="scaling: queues the cycles are spread over, all created first (default 1,10000)")
    parser.add_argument("--scale-stored", type=int_list, default=[1000, 1000000],
                        help="scaling: messages stored in another queue during the cycles (default 1000,1000000)")
    parser.add_argument("--only", default=",".join(WORKLOADS), help=f"comma-separated subset of {','.join(WORKLOADS)}")
    comparison_options(parser)
    from load import broker_bench

    broker_bench.options(parser)
    parser.add_argument("--metrics", action="store_true", help="run queue-server with metrics_port on, scraped every second")
    parser.add_argument("--json", default="bench-results.json", help="where to write the results")
    args = parser.parse_args(argv)
    only = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = set(only) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workload(s): {', '.join(sorted(unknown))}")
    if "quorum" in only and "brokers" not in only:
        only.append("brokers")  # the quorum workload includes the comparison with the replicated brokers
    repo = os.path.abspath(args.repo)
    from load import durability_bench, memory_bench  # they import this module


    info = print_machine()
    print(f"client: load/cbench.c (compiled, one thread, epoll), {args.conns} connections, {args.seconds:g} s per measurement"
          + (f", median of {args.repeat}" if args.repeat > 1 else ""))
    print(f"queue-server: {repo}, {args.workers} workers" + (", metrics on (scraped every second)" if args.metrics else ""))
    print(f"config: {node_config(repo, args.workers)} (the rest default; a workload's own keys are in its row)")
    rows: list[dict] = []
    memory_rows: list[dict] = []
    notes: list[str] = []
    peers = [] if args.no_peers else installed_peers(notes)

    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        client = build_client(tmp)

        def start(server: str, config: dict | None = None):
            if server == "queue-server":
                return QueueServer(repo, tmp, args.workers, args.metrics, config)
            return start_peer(server)

        def measure(workload: str, server: str, what: str, starter, runner=None, repeat: int | None = None,
                    key: str | None = None, prepare=None, **kw) -> None:
            """runner(server) -> figures replaces the cbench run (the HTTP workload's wrk);
            prepare(server) runs before the clock starts; `key` names the row for the summary."""
            runs = []
            try:
                for _ in range(repeat or args.repeat):
                    srv = starter()
                    try:
                        if prepare:
                            prepare(srv)
                        cpu_before = srv.cpu_seconds()
                        run = runner(srv) if runner else run_client(client, PROTOCOLS[server], srv.addresses, args, **kw)
                        cpu_after = srv.cpu_seconds()
                        run["cpu_us_per_op"] = cpu_per_op(cpu_before, cpu_after, run["ops"])
                        runs.append(run)
                    except RuntimeError as exc:
                        raise RuntimeError(f"{exc}; server log: {srv.log_tail().strip() or '(empty)'}") from None
                    finally:
                        srv.stop()
            except (RuntimeError, TimeoutError, OSError) as exc:
                notes.append(f"{workload}, {server}, {what}: failed: {exc}")
                print(f"  {workload:<12} {server:<14} {what:<42} FAILED: {exc}", flush=True)
                return
            result = sorted(runs, key=lambda r: r["ops_per_s"])[len(runs) // 2]
            result.update(workload=workload, server=server, what=what, runs=[r["ops_per_s"] for r in runs], key=key)
            rows.append(result)
            delivery = f"  delivery p50 {result['delivery_p50_ms']:.3f} p99 {result['delivery_p99_ms']:.3f} ms" if "delivery_p50_ms" in result else ""
            print(f"  {workload:<12} {server:<14} {what:<42} {result['ops_per_s']:>9,.0f} ops/s {result['messages_per_s']:>9,.0f} msg/s"
                  f"  p50 {result['p50_ms']:.3f} p99 {result['p99_ms']:.3f} ms{delivery}", flush=True)
            cpu = result.get("cpu_us_per_op") or {}
            if cpu:
                by_node: dict[str, float] = {}
                for name, us in cpu.items():
                    if "/" in name:
                        by_node[name.split("/")[0]] = by_node.get(name.split("/")[0], 0.0) + us
                parts = by_node if by_node else {k: v for k, v in cpu.items() if k != "supervisor"}
                print("      server CPU us/op: " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
                      + f"; total {sum(cpu.values()):.1f}", flush=True)

        servers = ["queue-server"] + peers
        what = {
            "queue-server": ("produce/consume/confirm, retry 30", "consume wait 1 s, confirm"),
            "beanstalkd": ("put/reserve-with-timeout 0/delete", "reserve-with-timeout 1, delete; tube per pair"),
            "redis": ("LPUSH/LMOVE/LREM", "BLMOVE 1 s, LREM; list per pair"),
        }
        if "unloaded" in only:
            measure("unloaded", "queue-server", f"{what['queue-server'][0]}, 1 connection", lambda: start("queue-server"),
                    conns=1, key="unloaded")
        if "per-request" in only:
            for conns in args.sweep:
                for s in servers:
                    measure("per-request", s, f"{what[s][0]}, {conns} connections", lambda s=s: start(s), conns=conns,
                            key=f"per-request/{s}/{conns}")
        if "pipelined" in only:
            for depth in args.depths:
                for s in servers:
                    measure("pipelined", s, f"{what[s][0]}, depth {depth}", lambda s=s: start(s), depth=depth,
                            key=f"pipelined/{s}/{depth}")
        if "batched" in only:
            for batch in args.batches:
                measure("batched", "queue-server", f"{what['queue-server'][0]}, {batch} per request",
                        lambda: start("queue-server"), batch=batch, key=f"batched/{batch}")
            if peers:
                notes.append("batched: the peers have no batch produce/consume/delete in their protocols; queue-server only")
        if "long-poll" in only:
            for s in servers:
                measure("long-poll", s, what[s][1], lambda s=s: start(s), mode="longpoll")
        if "quorum" in only:
            cluster = Cluster(repo, tmp, args.workers, args.metrics)
            leader = cluster.leader()
            if leader is None:
                cluster.stop()
                notes.append("quorum: skipped -- the three nodes of config/examples/node1..3.json did not agree on one "
                             "leader (the cluster is not built yet: each node answers itself as leader)")
                print("  " + notes[-1])
            else:
                cluster.stop()

                def started_cluster(on_leader: bool) -> Cluster:
                    c = Cluster(repo, tmp, args.workers, args.metrics)
                    lead = c.leader()
                    if lead is None:
                        c.stop()
                        raise RuntimeError("the cluster elected no leader")
                    if on_leader:
                        c.addresses = [lead]
                    return c

                for label, depth in (("per request", 1), (f"depth {args.depth}", args.depth)):
                    measure("quorum", "queue-server", f"single node, {label}", lambda: start("queue-server"), depth=depth,
                            key=f"quorum/single/{depth}")
                    measure("quorum", "queue-server x3", f"clients on the leader, {label}",
                            lambda: started_cluster(True), depth=depth, key=f"quorum/leader/{depth}")
                    measure("quorum", "queue-server x3", f"clients spread over 3 nodes, {label}",
                            lambda: started_cluster(False), depth=depth, key=f"quorum/spread/{depth}")

        if "brokers" in only:
            broker_bench.workload(args, tmp, repo, rows, notes)
        if "durability" in only:
            for label, config in durability_bench.SETTINGS:
                measure("durability", "queue-server", f"{what['queue-server'][0]}, {label}",
                        lambda config=config: start("queue-server", config), key=f"durability/{label}")
            if "beanstalkd" in peers:
                for every_write in (True, False):
                    label, extra = durability_bench.beanstalkd_binlog(tempfile.mkdtemp(dir=tmp), every_write)
                    measure("durability", "beanstalkd", f"{what['beanstalkd'][0]}, {label}",
                            lambda extra=extra: start_peer("beanstalkd", *extra))
        if "scaling" in only:
            scaling(args, what["queue-server"][0], start, measure)
        if "memory" in only:
            for s in servers:
                try:
                    row = memory_bench.measure(s, repo, tmp, args.workers, ["mem0"], args.memory_messages, b"x" * 100)
                except (RuntimeError, TimeoutError, OSError) as exc:
                    notes.append(f"memory, {s}: failed: {exc}")
                    continue
                row.update(workload="memory", server=s, key=f"memory/{s}",
                           what=f"{args.memory_messages:,} messages of 100 bytes, one queue")
                memory_rows.append(row)
                print("  memory       " + memory_bench.describe(row).replace("\n", "\n      "), flush=True)

        if "http" in only:
            from load import http_bench

            reason = http_bench.available()
            if reason:
                notes.append(reason)
                print("  " + reason)
            else:
                def http_node() -> QueueServer:
                    return QueueServer(repo, tmp, args.workers, args.metrics, {"http_port": free_port()})

                measure("http", "queue-server", f"{what['queue-server'][0]}, over TCP (cbench)", http_node)
                measure("http", "queue-server", f"{what['queue-server'][0]}, over HTTP (wrk)", http_node,
                        runner=lambda srv: http_bench.run(srv.config["http_port"], args.conns, args.seconds,
                                                          args.payload, tmp))
        if "security" in only:
            security(args, tmp, start, measure, rows, notes)
        if "floor" in only:
            from load import hop_floor

            hop_floor.workload(args, tmp, peers, start, measure)

        if "subscribe" in only:
            from load import subscribe_bench

            for mode, what in (("consume", "consume + confirm loop, Python client (latency: per request)"),
                               ("subscribe", f"subscribe credit {subscribe_bench.CREDIT} + confirm, Python client "
                                             "(latency: the wait for each next message)")):
                measure("subscribe", "queue-server", what, lambda: start("queue-server"), repeat=1,
                        prepare=lambda srv, mode=mode: subscribe_bench.fill_queue(srv.addresses[0], mode),
                        runner=lambda srv, mode=mode: subscribe_bench.run(srv.addresses[0], args.conns, args.seconds,
                                                                          mode, fill=0))

    info["load_average_end"] = os.getloadavg()[0]
    print()
    print("| workload | server | what | ops/s | messages/s | p50 ms | p99 ms | delivery p50 / p99 ms | server CPU us/op (by process) |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        delivery = f"{r['delivery_p50_ms']:.3f} / {r['delivery_p99_ms']:.3f}" if "delivery_p50_ms" in r else ""
        cpu = cpu_cell(r.get("cpu_us_per_op") or {})
        print(f"| {r['workload']} | {r['server']} | {r['what']} | {r['ops_per_s']:,.0f} | {r['messages_per_s']:,.0f} | "
              f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {delivery} | {cpu} |")
    if memory_rows:
        print()
        print("| memory | messages | B per message (PSS) | B per message (RSS) | B per message by process (PSS) |")
        print("|---|---:|---:|---:|---|")
        for r in memory_rows:
            by = ", ".join(f"{n} {b:,.0f}" for n, b in r["by_process"].items())
            print(f"| {r['server']} | {r['messages']:,} | {r['pss_per_msg']:,.0f} | {r['rss_per_msg']:,.0f} | {by} |")
    if any(r["workload"] == "brokers" for r in rows):
        print()
        print("\n".join(broker_bench.table(rows)))
    if "floor" in only:
        from load import hop_floor

        print()
        print("\n".join(hop_floor.table(rows)))
    print()
    for line in summary(rows + memory_rows, only):
        print(line)
    for note in notes:
        print(f"\nnote: {note}")
    print(f"\nload average at the end: {info['load_average_end']:.2f}")
    with open(args.json, "w") as f:
        json.dump({"machine": info, "args": vars(args), "results": rows, "memory": memory_rows, "notes": notes}, f, indent=2)
    print(f"wrote {args.json}")


def int_list(text: str) -> list[int]:
    """A comma-separated list of positive integers (an argparse type)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _hops(text: str) -> list[int]:
    """The floor's variants: a comma-separated subset of 0, 2, 3, 4 (an argparse type)."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or not set(values) <= {"0", "2", "3", "4"}:
        raise argparse.ArgumentTypeError(f"expected some of 0,2,3,4, got {text!r}")
    return [int(v) for v in values]


def node_config(repo: str, workers: int) -> str:
    """The settings of the benchmarked node that decide its figures, as the node resolves them."""
    sys.path.insert(0, repo)
    from queue_server.config.loader import parse_config

    config, _ = parse_config(json.dumps({"workers": workers}))
    keys = ("workers", "fsync", "in_memory", "snapshot_every", "replication", "queue_size", "max_queues",
            "max_memory_mb", "queue_log_size")
    return ", ".join(f"{k} {getattr(config, k)}" for k in keys if hasattr(config, k))


def scaling(args: argparse.Namespace, what: str, start, measure) -> None:
    """How the per-request cost grows: with the worker count, with the queues the cycles are
    spread over (all created before the clock starts), and with messages stored elsewhere."""
    from load.memory_bench import fill_queue_server, room_for

    for workers in args.scale_workers:
        measure("scaling", "queue-server", f"{what}, {workers} workers", lambda w=workers: start("queue-server", {"workers": w}),
                key=f"scaling/workers/{workers}")
    for queues in args.scale_queues:
        names = [f"bench{i}" for i in range(queues)]
        measure("scaling", "queue-server", f"{what}, spread over {queues:,} queues",
                lambda: start("queue-server", {"max_queues": 0}), queues=queues, key=f"scaling/queues/{queues}",
                prepare=lambda srv, names=names: fill_queue_server(srv.port, names, 1, b"x" * args.payload))
    for stored in args.scale_stored:
        measure("scaling", "queue-server", f"{what}, {stored:,} messages stored",
                lambda n=stored: start("queue-server", room_for(n)),
                key=f"scaling/stored/{stored}",
                prepare=lambda srv, n=stored: fill_queue_server(srv.port, ["stored"], n, b"x" * args.payload))


def cpu_cell(cpu: dict[str, float]) -> str:
    """Server CPU µs per operation: the total, then by process (a node's children; a cluster's
    by node, "node1: acceptor 12.0, ...; node2: ..."). A supervisor's, which only waits, and a
    process's that used none measurable are in the total alone."""
    if not cpu:
        return ""
    nodes: dict[str, list[str]] = {}
    for name, us in cpu.items():
        node, _, process = name.rpartition("/")
        if process != "supervisor" and round(us, 1):
            nodes.setdefault(node, []).append(f"{process} {us:.1f}")
    if list(nodes) in ([], [""]):
        parts = nodes.get("", [])
        return f"{sum(cpu.values()):.1f}" + (f" ({', '.join(parts)})" if len(parts) > 1 else "")
    return f"{sum(cpu.values()):.1f} ({'; '.join(f'{n}: ' * bool(n) + ', '.join(p) for n, p in nodes.items())})"


def cpu_per_op(before: dict[str, float], after: dict[str, float], ops: int) -> dict[str, float]:
    """CPU µs per operation of each process, from its CPU seconds before and after `ops` operations."""
    return {name: round((after[name] - before.get(name, 0.0)) / max(1, ops) * 1e6, 2) for name in sorted(after)}


def latency_ms(seconds: list[float]) -> dict[str, float]:
    """p50_ms and p99_ms of latencies given in seconds (0.0 for none)."""
    ordered = sorted(seconds)

    def pick(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000 if ordered else 0.0

    return {"p50_ms": pick(0.5), "p99_ms": pick(0.99)}


def _figures(row: dict) -> str:
    cpu = f", server CPU {sum(row['cpu_us_per_op'].values()):.1f} us/op" if row.get("cpu_us_per_op") else ""
    return f"{row['ops_per_s']:,.0f} ops/s, p99 {row['p99_ms']:.3f} ms{cpu}"


def _against(rows: dict, label: str, base: str, others: list[tuple[str, str]]) -> list[str]:
    """Lines comparing the rows `others` (key, name) with row `base`: ops/s ratio and p99 beside."""
    if base not in rows:
        return []
    b = rows[base]
    lines = [f"{label}: {_figures(b)}"]
    for key, name in others:
        if key in rows:
            r = rows[key]
            lines.append(f"  {name}: {_figures(r)} ({r['ops_per_s'] / b['ops_per_s']:.2f}x the ops/s, "
                         f"p99 {r['p99_ms'] - b['p99_ms']:+.3f} ms)")
    return lines


def _figure(value: float) -> str:
    """A target's figure: whole with thousands separators from 100 up, else 3 significant digits."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _steps(rows: dict, prefix: str) -> list[int]:
    """The numbers that end the row keys starting with `prefix` (connections, depths, ...), ascending."""
    return sorted({int(k.rsplit("/", 1)[1]) for k in rows if k.startswith(prefix)})


def summary(results: list[dict], only: list[str]) -> list[str]:
    """The closing summary: every target with what was measured and whether it is met, then what
    each comparison the issue asks for came to."""
    rows = {r["key"]: r for r in results if r.get("key")}
    lines = ["summary"]
    for t in TARGETS:
        row, base = rows.get(t.key), rows.get(t.peer) if t.peer else None
        wanted = f"{'<=' if t.at_most else '>='} {_figure(t.bound)} {t.unit}"
        if row is None or (t.peer and base is None):
            missing = t.key if row is None else t.peer
            measured = "not run" if missing.split("/")[0] not in only else "not measured (failed or skipped)"
            lines.append(f"target: {t.what} {wanted}, measured: {measured}")
            continue
        value = row[t.figure] / base[t.figure] if t.peer else row[t.figure]
        verdict = "met" if (value <= t.bound if t.at_most else value >= t.bound) else "not met"
        if row["messages"] < t.messages:
            verdict = f"at {row['messages']:,} messages, not the target's {t.messages / 1e6:g}M: no verdict"
        lines.append(f"target: {t.what} {wanted}, measured: {_figure(value)} {t.unit}, {verdict}")
    servers = ("beanstalkd", "redis")
    for conns in _steps(rows, "per-request/"):
        lines += _against(rows, f"per request, {conns} connections, queue-server", f"per-request/queue-server/{conns}",
                          [(f"per-request/{s}/{conns}", s) for s in servers])
    for depth in _steps(rows, "pipelined/"):
        lines += _against(rows, f"pipelined, depth {depth}, queue-server", f"pipelined/queue-server/{depth}",
                          [(f"pipelined/{s}/{depth}", s) for s in servers])
    batches = _steps(rows, "batched/")
    if batches:
        lines.append("batched, messages/s (p99 ms): " + ", ".join(
            f"{b} per request {rows[f'batched/{b}']['messages_per_s']:,.0f} ({rows[f'batched/{b}']['p99_ms']:.3f})"
            for b in batches))
    for depth in _steps(rows, "quorum/single/"):
        lines += _against(rows, f"quorum, depth {depth}: single node", f"quorum/single/{depth}",
                          [(f"quorum/leader/{depth}", "3 nodes, clients on the leader"),
                           (f"quorum/spread/{depth}", "3 nodes, clients spread")])
    if any(k.startswith("brokers/") for k in rows):
        from load import broker_bench

        lines += broker_bench.summary(rows)
    durability = [k for k in rows if k.startswith("durability/")]
    default = next((k for k in durability if "(default)" in k), None)
    if default:
        lines += _against(rows, f"durability, {default.split('/', 1)[1]}", default,
                          [(k, k.split("/", 1)[1]) for k in durability if k != default])
    for axis, unit in (("workers", "workers"), ("queues", "queues"), ("stored", "messages stored")):
        steps = _steps(rows, f"scaling/{axis}/")
        if steps:
            lines += _against(rows, f"scaling, {steps[0]:,} {unit}", f"scaling/{axis}/{steps[0]}",
                              [(f"scaling/{axis}/{n}", f"{n:,} {unit}") for n in steps[1:]])
    for r in results:
        if r.get("workload") == "memory":
            lines.append(f"memory per message at {r['messages']:,}, {r['server']}: {r['pss_per_msg']:,.0f} B (PSS)")
    return lines


BENCH_TOKEN = "bench-token-0123456789abcdef"


def security(args: argparse.Namespace, tmp: str, start, measure, rows: list[dict], notes: list[str]) -> None:
    """The security workload: token vs none (cbench), then TLS vs plain (Python client), each as
    --repeat pairs measured back to back (the machine may be loaded: a pair shares its load)."""
    from load import tls_bench
    from tests.tls_certs import make_tls_files

    token_file = os.path.join(tmp, "bench.token")
    with open(token_file, "w") as f:
        f.write(BENCH_TOKEN)
    what = "produce/consume/confirm, retry 30"
    ratios = []
    for i in range(args.repeat):  # alternate which goes first, so that order is no bias
        before = len(rows)
        plain = lambda: measure("security", "queue-server", f"{what}, no token", lambda: start("queue-server"), repeat=1)
        token = lambda: measure("security", "queue-server", f"{what}, token",
                                lambda: start("queue-server", {"auth_token_file": token_file}), repeat=1, token=BENCH_TOKEN)
        for run in ((plain, token) if i % 2 == 0 else (token, plain)):
            run()
        if len(rows) == before + 2:
            by = {r["what"].rsplit(", ", 1)[1]: r["ops_per_s"] for r in rows[-2:]}
            ratios.append(by["token"] / by["no token"])
    if ratios:
        _note_ratios("token / no token", ratios, notes)
        # On a loaded machine ops/s swings by tens of percent between runs; CPU per request
        # swings less, and the workers' (which never see the token) say how much is noise.
        runs = [r for r in rows if r.get("workload") == "security" and r.get("cpu_us_per_op")]
        for process in ("acceptor", "worker-0", "worker-1"):
            medians = {}
            for mode in ("no token", "token"):
                values = sorted(r["cpu_us_per_op"].get(process, 0.0) for r in runs if r["what"].endswith(", " + mode))
                if values:
                    medians[mode] = median_high(values)
            if len(medians) == 2:
                notes.append(f"{process} CPU us/op, median of {args.repeat}: no token {medians['no token']:.1f}, "
                             f"token {medians['token']:.1f}")
                print("  " + notes[-1], flush=True)

    files = make_tls_files(tmp)
    tls_config = {"tls_cert_file": files.server_cert, "tls_key_file": files.server_key}
    ratios = []
    for i in range(args.repeat):
        pair = {}
        runs = (("plain", None, None), ("TLS", tls_config, ssl.create_default_context(cafile=files.ca)))
        for label, config, ctx in (runs if i % 2 == 0 else runs[::-1]):
            before = len(rows)
            measure("security", "queue-server", f"{what}, Python client, {label}",
                    lambda config=config: start("queue-server", config), repeat=1,
                    runner=lambda srv, ctx=ctx: tls_bench.run(srv.addresses[0], args.conns, args.seconds, args.payload, ctx))
            if len(rows) == before:
                break
            pair[label] = rows[-1]["ops_per_s"]
        if len(pair) == 2:
            ratios.append(pair["TLS"] / pair["plain"])
    if ratios:
        _note_ratios("TLS / plain (Python client)", ratios, notes)


def _note_ratios(label: str, ratios: list[float], notes: list[str]) -> None:
    """Note and print the per-pair ratios of a security comparison and their median."""
    notes.append(f"{label}, per pair: " + ", ".join(f"{r:.3f}" for r in ratios)
                 + f" (median {median_high(ratios):.3f})")
    print("  " + notes[-1], flush=True)


if __name__ == "__main__":
    main()
