"""`queue-server`: the supervisor of one node. It loads the config, starts the coordinator, the
workers and the acceptor as child processes wired by ZeroMQ in a private run directory, and stops
them all together: on SIGTERM or SIGINT after handing leadership over (if it leads) and letting
the acceptor drain, within shutdown_grace (exit 0; a second signal stops at once), and when any
child dies unexpectedly by
stopping the rest and exiting non-zero -- never a half-alive node."""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import orjson

from queue_server.config.loader import ConfigError, NodeConfig, load_config
from queue_server.server import logs, metrics, metrics_http, preflight, secret_file
from queue_server.server.child import CONFIG_FILE, HANDOFF_DONE
from queue_server.version import add_version_option

STOP_GRACE = 5.0
HANDOFF_POLL = 0.01


class _Shutdown(Exception):
    pass


def _raise_shutdown(signum: int, frame: object) -> None:
    raise _Shutdown(signum)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="queue-server",
        description="Run one queue-server node (with no arguments: a single node on 127.0.0.1:1111, TCP and UDP, "
                    "its status page and HTTP API on http://127.0.0.1:8111/). "
                    "`queue-server keygen --out FILE` writes a new cluster secret.",
    )
    add_version_option(parser)
    parser.add_argument("--config", help="JSON config file (the original's keys; // comments allowed)")
    parser.add_argument("--host", help="client host to listen on")
    parser.add_argument("--port", type=int, help="client TCP and UDP port")
    parser.add_argument("--node-id", type=int, help="this node's id in cluster_node_list")
    parser.add_argument("--workers", type=int, help="number of worker processes")
    parser.add_argument("--data-dir", help="queue_data_dir")
    parser.add_argument("--metrics-port", type=int, help="metrics_port: /metrics, /healthz, /readyz over HTTP")
    parser.add_argument("--http-port", type=int, help="http_port: the HTTP API and status page (default 8111; 0 = off)")
    parser.add_argument("--in-memory", action="store_true", default=None, help="no data dir (a snapshot for a follower goes through the run dir)")
    parser.add_argument("--repair", action="store_true", default=None,
                        help="cut a change log that is corrupt in the middle at the damage, losing what follows")
    return parser.parse_args(argv)


def overrides_from(args: argparse.Namespace) -> dict:
    """Config keys given on the command line."""
    pairs = {
        "host": args.host,
        "port": args.port,
        "node_id": args.node_id,
        "workers": args.workers,
        "queue_data_dir": args.data_dir,
        "metrics_port": args.metrics_port,
        "http_port": args.http_port,
        "in_memory": args.in_memory,
        "repair": args.repair,
    }
    return {k: v for k, v in pairs.items() if v is not None}


def child_commands(config: NodeConfig, run_dir: str) -> list[tuple[str, list[str]]]:
    """(name, argv) of every child process, in start order."""
    # -P: the working directory stays off sys.path, so that a server.py (or any module) lying
    # where the node was started cannot stand in for the node's own code.
    base = [sys.executable, "-P", "-m"]
    common = ["--run-dir", run_dir, "--parent", str(os.getpid())]
    children = [("coordinator", base + ["queue_server.server.coordinator"] + common)]
    for i in range(config.workers):
        children.append((f"worker-{i}", base + ["queue_server.server.worker", "--index", str(i)] + common))
    children.append(("acceptor", base + ["queue_server.server.acceptor"] + common))
    return children


class Supervisor:
    """Starts and watches a node's processes."""

    def __init__(self, config: NodeConfig, log) -> None:
        self.config = config
        self.log = log
        self.run_dir = tempfile.mkdtemp(prefix="queue-server-")
        self.children: dict[int, tuple[str, subprocess.Popen]] = {}
        self.metrics_server = None
        self.stop_by: float | None = None  # a graceful stop ends by then (shutdown_grace)

    def start(self) -> None:
        """Write the resolved config to the run directory and start every child."""
        with open(os.path.join(self.run_dir, CONFIG_FILE), "wb") as f:
            f.write(orjson.dumps(self.config.to_dict()))
        env = self.start_metrics()
        for name, argv in child_commands(self.config, self.run_dir):
            proc = subprocess.Popen(argv, start_new_session=True, env=env)
            self.children[proc.pid] = (name, proc)
        self.log.info(
            "node %d starting on %s:%d with %d workers (run dir %s)",
            self.config.node_id, self.config.host, self.config.port, self.config.workers, self.run_dir,
        )

    def start_metrics(self) -> dict[str, str] | None:
        """With metrics_port set: serve /metrics and return the children's environment (their
        prometheus_client multi-process directory). OSError if the port cannot be bound."""
        cfg = self.config
        if not cfg.metrics_port:
            return None
        env = metrics.child_env(self.run_dir)
        registry = metrics.registry_for(
            env[metrics.ENV], cfg.node_id, cfg.node_type,
            lambda: {name: pid for pid, (name, _) in list(self.children.items())},
        )
        try:
            self.metrics_server = metrics_http.serve(cfg.host, cfg.metrics_port, registry)
        except OSError as exc:
            raise OSError(f"metrics_port {cfg.metrics_port}: {exc.strerror or exc}") from None
        self.log.info("metrics on http://%s:%d/metrics (health: /healthz, /readyz)", cfg.host, cfg.metrics_port)
        return env

    def watch(self) -> int:
        """Block until a signal asks us to stop (exit status 0) or a child dies (1)."""
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid in self.children:
                name, _ = self.children.pop(pid)
                self.log.error(
                    "child %s (pid %d) exited unexpectedly (%s); stopping the node",
                    name, pid, _describe(status),
                )
                return 1

    def _child(self, name: str) -> subprocess.Popen | None:
        for child, proc in self.children.values():
            if child == name and proc.poll() is None:
                return proc
        return None

    def hand_off(self) -> None:
        """Ask the coordinator to hand leadership to an up-to-date follower (SIGUSR1) and wait
        until it says it is done (it gives up after half of shutdown_grace). A signal during the
        wait raises _Shutdown: the caller then stops at once."""
        self.stop_by = time.monotonic() + self.config.shutdown_grace
        coordinator = self._child("coordinator")
        if coordinator is None or not self.config.is_cluster:
            return
        done = os.path.join(self.run_dir, HANDOFF_DONE)
        coordinator.send_signal(signal.SIGUSR1)
        give_up = time.monotonic() + self.config.shutdown_grace / 2 + 0.5
        while not os.path.exists(done) and coordinator.poll() is None and time.monotonic() < give_up:
            time.sleep(HANDOFF_POLL)

    def drain(self) -> None:
        """Let the acceptor finish what its clients are owed (it stops taking connections and has
        long polls answered at once), until shutdown_grace is up; the other processes keep
        serving it meanwhile. A signal during the wait raises _Shutdown: the caller then stops
        at once."""
        acceptor = self._child("acceptor")
        if acceptor is None:
            return
        acceptor.terminate()
        stop_by = self.stop_by if self.stop_by is not None else time.monotonic() + self.config.shutdown_grace
        try:
            acceptor.wait(max(0.0, stop_by - time.monotonic()) + 0.5)
        except subprocess.TimeoutExpired:
            self.log.warning("the acceptor did not finish within shutdown_grace")

    def stop(self) -> None:
        """Terminate every child (SIGKILL after a grace period) and remove the run directory."""
        for _, proc in self.children.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + STOP_GRACE
        for name, proc in self.children.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.log.warning("child %s (pid %d) did not stop; killing it", name, proc.pid)
                proc.kill()
                proc.wait()
        self.children.clear()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
        shutil.rmtree(self.run_dir, ignore_errors=True)


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def _file_mode(value: str) -> int:
    """--mode: permissions in octal, as chmod takes them."""
    try:
        mode = int(value, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise argparse.ArgumentTypeError(f"expected permissions in octal such as 600 or 644, got {value!r}")
    return mode


def keygen(argv: list[str]) -> int:
    """`queue-server keygen --out FILE`: write a new cluster secret (config cluster_secret_file)."""
    parser = argparse.ArgumentParser(prog="queue-server keygen",
                                     description="Write a new random cluster secret (mode 0600) for cluster_secret_file.")
    parser.add_argument("--out", required=True, help="the file to create (never overwritten)")
    parser.add_argument("--mode", type=_file_mode, default=0o600,
                        help="its permissions, octal (default 600; docker-compose.yml needs 644: the "
                             "containers' user must read the bind-mounted file)")
    args = parser.parse_args(argv)
    try:
        secret_file.write_secret(args.out, args.mode)
    except OSError as exc:
        print(f"queue-server keygen: cannot create {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote a new cluster secret to {args.out}; give every node a copy and set cluster_secret_file")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run a node until told to stop; returns the process exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["keygen"]:
        return keygen(argv[1:])
    args = parse_args(argv)
    try:
        config, warnings = load_config(args.config, overrides_from(args))
        warnings += preflight.check(config)
    except (ConfigError, preflight.StartError, OSError) as exc:
        # One line a person can act on, never a traceback; 2 stays argparse's (a bad command line).
        print(f"queue-server: {exc}", file=sys.stderr)
        return 1
    log = logs.setup("supervisor", config.node_id, config.log_level, config.log_prefix)
    for warning in warnings:
        log.warning("config: %s", warning)
    signal.signal(signal.SIGTERM, _raise_shutdown)
    signal.signal(signal.SIGINT, _raise_shutdown)
    supervisor = Supervisor(config, log)
    status = 0
    try:
        supervisor.start()
        status = supervisor.watch()
    except _Shutdown as exc:
        log.info("signal %d: stopping (a second signal stops at once)", exc.args[0])
        try:
            supervisor.hand_off()
            supervisor.drain()
        except _Shutdown:
            log.info("second signal: stopping at once")
    except OSError as exc:
        log.error("cannot start: %s", exc)
        status = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        supervisor.stop()
        log.info("stopped")
    return status


if __name__ == "__main__":
    sys.exit(main())
