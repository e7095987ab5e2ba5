"""The benchmark: closed-loop produce -> consume -> confirm cycles against a real node and, in the
same run with the same compiled client (load/cbench.c), against beanstalkd and redis when they
are installed. Prints the machine, a table and writes a JSON file. A benchmark, not a test.

    python load/bench.py                 # 10 s per workload, 8 connections
    python load/bench.py --seconds 3 --json bench.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


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
        "memory": mem,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
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


def run_client(client: str, proto: str, port: int, conns: int, seconds: float, batch: int) -> dict:
    """One closed-loop run; returns the client's figures."""
    out = subprocess.run(
        [client, proto, "127.0.0.1", str(port), str(conns), str(seconds), str(batch)],
        check=True, capture_output=True, text=True, timeout=seconds + 60,
    )
    return json.loads(out.stdout)


class Server:
    """A server process started for the benchmark and stopped after it."""

    def __init__(self, argv: list[str], port: int, env: dict | None = None) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO, env=env)
        self.port = port
        wait_port(port)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def queue_server(workers: int, extra: list[str] | None = None) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "server.main", "--port", str(port), "--workers", str(workers)] + (extra or [])
    return Server(argv, port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--conns", type=int, default=8)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", default="bench-results.json")
    parser.add_argument("--no-peers", action="store_true", help="skip beanstalkd and redis")
    args = parser.parse_args(argv)

    info = machine()
    print(f"machine: {info['cpu']}, {info['cores']} cores, {info['memory']}, Python {info['python']}, Linux {info['kernel']}")
    print(f"client: load/cbench.c (compiled, epoll, one request in flight per connection), {args.conns} connections, {args.seconds:g} s per workload")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        client = build_client(tmp)

        def measure(name: str, server: Server, proto: str, batch: int) -> None:
            try:
                result = run_client(client, proto, server.port, args.conns, args.seconds, batch)
            finally:
                server.stop()
            result.update(workload=name, batch=batch)
            rows.append(result)
            print(f"  {name:<40} {result['ops_per_s']:>10,.0f} ops/s {result['messages_per_s']:>10,.0f} msg/s  p50 {result['p50_ms']:.3f} ms  p99 {result['p99_ms']:.3f} ms", flush=True)

        measure("queue-server, per request", queue_server(args.workers), "qs", 1)
        measure(f"queue-server, batches of {args.batch}", queue_server(args.workers), "qs", args.batch)
        if not args.no_peers:
            if shutil.which("beanstalkd"):
                port = free_port()
                measure("beanstalkd (put/reserve/delete)", Server(["beanstalkd", "-l", "127.0.0.1", "-p", str(port)], port), "beanstalk", 1)
            else:
                print("  beanstalkd not installed (apt-get install beanstalkd): peer skipped")
            if shutil.which("redis-server"):
                port = free_port()
                redis = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
                measure("redis (LPUSH/LMOVE/LREM)", Server(redis, port), "redis", 1)
            else:
                print("  redis-server not installed: peer skipped")

    print()
    print(f"| workload | ops/s | messages/s | p50 ms | p99 ms |")
    print(f"|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workload']} | {r['ops_per_s']:,.0f} | {r['messages_per_s']:,.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} |")
    with open(args.json, "w") as f:
        json.dump({"machine": info, "conns": args.conns, "seconds": args.seconds, "results": rows}, f, indent=2)
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
