"""RabbitMQ, three nodes on loopback, for the comparison with the replicated brokers
(load/broker_bench.py). Everything the nodes use is private to one temporary directory: an
Erlang port mapper (epmd) on a port chosen at run time, HOME with the cookie the nodes share,
each node's name, AMQP and distribution ports, database and logs, and a config file that forms
the cluster from the three names (classic_config peer discovery: node 1 starts first, 2 and 3
join it). No system RabbitMQ, epmd or cookie is used or left behind; stop() stops every process
started. The quorum queue is declared by the client side (load/broker_client.py).
"""
from __future__ import annotations

import glob
import json
import os
import secrets
import shutil
import subprocess

from load.bench import process_cpu, tail_of, wait_port
from load.procs import cpu_seconds, stop
from tests.harness import free_port

LIB = "/usr/lib/rabbitmq"  # Debian's: /usr/sbin/rabbitmq-server would switch to the rabbitmq user
SERVER = os.path.join(LIB, "bin", "rabbitmq-server")
CTL = os.path.join(LIB, "bin", "rabbitmqctl")
# Quorum queues confirm a publish once a majority of members has it in Ra's write-ahead log,
# which is fsynced before that.
DURABILITY = "publish confirmed once 2 of 3 members fsynced it (Ra's WAL); fsync before each confirm"


def missing() -> str | None:
    """Why RabbitMQ cannot run here, in one line, or None."""
    for program in (SERVER, shutil.which("epmd") or "epmd"):
        if not os.access(program, os.X_OK):
            return f"{os.path.basename(program)} not installed (.ci/install-tools installs rabbitmq-server): RabbitMQ skipped"
    return None


def version() -> str:
    """The installed RabbitMQ's version, e.g. "3.10.8" (from its library folder)."""
    found = sorted(glob.glob(os.path.join(LIB, "lib", "rabbitmq_server-*")))
    return found[-1].rsplit("-", 1)[1] if found else "?"


class RabbitCluster:
    """Three RabbitMQ nodes joined into one cluster; `addresses` are their AMQP URLs."""

    label = "RabbitMQ quorum"
    durability = DURABILITY

    def __init__(self, workdir: str, timeout: float = 120.0) -> None:
        self.dir = workdir
        self.names = [f"bench{i}@localhost" for i in (1, 2, 3)]
        self.procs: list[subprocess.Popen] = []
        self.logs: list[str] = []
        home = os.path.join(workdir, "home")
        os.makedirs(home)
        cookie = os.path.join(home, ".erlang.cookie")
        with open(os.open(cookie, os.O_WRONLY | os.O_CREAT, 0o400), "w") as f:
            f.write(secrets.token_hex(16))
        epmd_port = free_port()
        self.env = {**os.environ, "HOME": home, "ERL_EPMD_PORT": str(epmd_port), "ERL_EPMD_ADDRESS": "127.0.0.1",
                    "RABBITMQ_CONF_ENV_FILE": os.path.join(workdir, "rabbitmq-env.conf")}
        open(self.env["RABBITMQ_CONF_ENV_FILE"], "w").close()  # not Debian's /etc/rabbitmq one
        config = os.path.join(workdir, "rabbitmq.conf")
        with open(config, "w") as f:
            f.write("cluster_formation.peer_discovery_backend = classic_config\n"
                    + "".join(f"cluster_formation.classic_config.nodes.{i} = {n}\n" for i, n in enumerate(self.names, 1))
                    + "distribution.listener.interface = 127.0.0.1\n"
                    "log.console = false\nlog.file.level = warning\ndisk_free_limit.absolute = 10MB\n")
        plugins = os.path.join(workdir, "enabled_plugins")
        with open(plugins, "w") as f:
            f.write("[].\n")
        ports = [free_port() for _ in self.names]
        self.epmd = subprocess.Popen(["epmd", "-port", str(epmd_port), "-address", "127.0.0.1"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env)
        try:
            wait_port(epmd_port, self.epmd)
            for i, (name, port) in enumerate(zip(self.names, ports)):
                node_dir = os.path.join(workdir, f"node{i + 1}")
                env = {**self.env, "RABBITMQ_NODENAME": name, "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                       "RABBITMQ_NODE_PORT": str(port), "RABBITMQ_DIST_PORT": str(free_port()),
                       "RABBITMQ_CONFIG_FILE": config, "RABBITMQ_ENABLED_PLUGINS_FILE": plugins,
                       "RABBITMQ_MNESIA_BASE": os.path.join(node_dir, "mnesia"),
                       "RABBITMQ_LOG_BASE": os.path.join(node_dir, "log"),
                       "RABBITMQ_PID_FILE": os.path.join(node_dir, "pid")}
                os.makedirs(node_dir)
                self.logs.append(os.path.join(node_dir, "log", f"{name}.log"))
                with open(os.path.join(node_dir, "stdout.log"), "ab") as out:
                    self.procs.append(subprocess.Popen([SERVER], stdout=out, stderr=subprocess.STDOUT, env=env,
                                                       cwd=node_dir, start_new_session=True))
                if i == 0:  # the others join the first once it runs
                    wait_port(port, self.procs[0], timeout)
            for proc, port in zip(self.procs[1:], ports[1:]):
                wait_port(port, proc, timeout)
            running = self.running_nodes()
            if sorted(running) != self.names:
                raise RuntimeError(f"the RabbitMQ nodes did not form one cluster: {self.names[0]} runs with {running}")
        except Exception:
            self.stop()
            raise
        self.addresses = [f"amqp://guest:guest@127.0.0.1:{p}/" for p in ports]

    def running_nodes(self) -> list[str]:
        """The nodes the first node sees running in its cluster (rabbitmqctl cluster_status)."""
        out = subprocess.run([CTL, "-n", self.names[0], "cluster_status", "--formatter", "json"], env=self.env,
                             capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"rabbitmqctl cluster_status failed: {(out.stderr or out.stdout).strip()[-300:]}")
        return json.loads(out.stdout).get("running_nodes", [])

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds of every process of the three nodes (beam.smp and its helpers; the start
        script as "supervisor"), by node and name, and of the port mapper."""
        total = {f"node{i}/{name}": s for i, proc in enumerate(self.procs, 1) for name, s in process_cpu(proc.pid).items()}
        total["epmd"] = cpu_seconds(self.epmd.pid)
        return total

    def stop(self) -> None:
        for proc in self.procs:
            stop(proc, group=True)
        stop(self.epmd)

    def log_tail(self, lines: int = 5) -> str:
        return "\n".join(f"{name}: {tail_of(log, lines) if os.path.exists(log) else '(no log)'}"
                         for name, log in zip(self.names, self.logs))
