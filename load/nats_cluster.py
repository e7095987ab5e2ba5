"""NATS JetStream, three nodes on loopback, for the comparison with the replicated brokers
(load/broker_bench.py): three nats-server processes with JetStream on, each with its own store
directory in a temporary directory and a cluster block routing to the other two, on ports
chosen at run time; stopped, every one, by stop(). The stream (replicas 3) is made by the
client side (load/broker_client.py).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

from load.bench import tail_of, wait_port
from load.procs import cpu_seconds, stop
from tests.harness import free_port

PROGRAM = "nats-server"
# When a publish is acknowledged and when the store reaches the disk (nats-server 2.9's file
# store syncs on a timer of 2 minutes; 2.10 made it the `sync_interval` option, same default).
DURABILITY = ("publish acked once 2 of 3 replicas stored it, written to the OS; "
              "fsync every 2 minutes (the file store's sync interval)")


def missing() -> str | None:
    """Why NATS cannot run here, in one line, or None."""
    if shutil.which(PROGRAM) is None:
        return f"{PROGRAM} not installed (.ci/install-tools installs it): NATS JetStream skipped"
    return None


def version() -> str:
    """nats-server's version, e.g. "2.9.10"."""
    out = subprocess.run([PROGRAM, "--version"], capture_output=True, text=True, timeout=30).stdout
    found = re.search(r"v?(\d+\.\d+\.\d+)", out)
    return found.group(1) if found else out.strip()


class NatsCluster:
    """Three JetStream nodes routed to each other on loopback; `addresses` are their client URLs."""

    label = "NATS JetStream R3"
    durability = DURABILITY

    def __init__(self, workdir: str) -> None:
        self.dir = workdir
        client, route = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in route)
        self.procs: list[subprocess.Popen] = []
        self.logs: list[str] = []
        try:
            for i in range(3):
                conf = os.path.join(workdir, f"nats{i + 1}.conf")
                with open(conf, "w") as f:
                    f.write(f"server_name: nats{i + 1}\n"
                            f"listen: 127.0.0.1:{client[i]}\n"
                            f'jetstream {{ store_dir: "{os.path.join(workdir, f"store{i + 1}")}", '
                            "max_memory_store: 64MB, max_file_store: 4GB }\n"
                            f"cluster {{ name: bench, listen: 127.0.0.1:{route[i]}, routes: [{routes}] }}\n")
                self.logs.append(os.path.join(workdir, f"nats{i + 1}.log"))
                with open(self.logs[-1], "ab") as log:
                    self.procs.append(subprocess.Popen([PROGRAM, "-c", conf], stdout=log, stderr=subprocess.STDOUT))
            for proc, port in zip(self.procs, client):
                wait_port(port, proc)
        except Exception:
            self.stop()
            raise
        self.addresses = [f"nats://127.0.0.1:{p}" for p in client]

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds of each node's process, by node."""
        return {f"node{i}/nats-server": cpu_seconds(p.pid) for i, p in enumerate(self.procs, 1)}

    def stop(self) -> None:
        for proc in self.procs:
            stop(proc)

    def log_tail(self, lines: int = 5) -> str:
        return "\n".join(f"nats{i}: {tail_of(log, lines)}" for i, log in enumerate(self.logs, 1))
