"""What every child process of a node does first: read the supervisor's resolved config from the
run directory, set up logging, and arrange to die with the supervisor."""
from __future__ import annotations

import argparse
import ctypes
import gc
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

from queue_server.config.loader import NodeConfig, parse_config
from queue_server.server import logs

CONFIG_FILE = "config.json"
# Written in the run directory by the coordinator once a hand-off asked for by SIGUSR1 is over (or
# there was nothing to hand over): the supervisor then lets the acceptor drain.
HANDOFF_DONE = "handoff-done"
_PR_SET_PDEATHSIG = 1
# A full collection walks every live object: with a million stored messages that is a pause longer
# than an election timeout. Young cycles are still collected; old ones are rare here.
GC_THRESHOLDS = (100_000, 50, 100_000)


@dataclass(frozen=True)
class ChildContext:
    """A child process's view of its node."""

    config: NodeConfig
    run_dir: str
    index: int
    log: Any


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies, so a killed supervisor leaves no
    orphans."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def start(process: str, argv: list[str] | None = None) -> ChildContext:
    """Parse the child's arguments, load the node config, set up logging and signals."""
    parser = argparse.ArgumentParser(prog=f"queue-server {process}")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--parent", type=int, default=0, help="supervisor pid; exit if it is gone")
    args = parser.parse_args(argv)
    die_with_parent()
    gc.set_threshold(*GC_THRESHOLDS)
    if args.parent and os.getppid() != args.parent:
        sys.exit(0)  # the supervisor died before we could ask to die with it
    with open(os.path.join(args.run_dir, CONFIG_FILE), encoding="utf-8") as f:
        config, _ = parse_config(f.read())
    name = process if process != "worker" else f"worker-{args.index}"
    log = logs.setup(name, config.node_id, config.log_level, config.log_prefix)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides; ^C reaches the whole group
    return ChildContext(config, args.run_dir, args.index, log)
