"""Logging setup shared by a node's processes: one line per event, to stderr and, when
log_prefix is set, to a file named from it."""
from __future__ import annotations

import logging
import sys

from queue_server.config.loader import LOG_LEVELS


def setup(process: str, node_id: int, log_level: int = 3, log_prefix: str = "") -> logging.Logger:
    """Configure the root logger for this process and return the node's logger."""
    fmt = logging.Formatter(
        f"%(asctime)s.%(msecs)03d node={node_id} {process}[%(process)d] %(levelname)s %(message)s",
        "%Y-%m-%dT%H:%M:%S",
    )
    root = logging.getLogger()
    root.handlers.clear()
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_prefix:
        handlers.append(logging.FileHandler(f"{log_prefix}.log"))
    for h in handlers:
        h.setFormatter(fmt)
        root.addHandler(h)
    root.setLevel(LOG_LEVELS.get(log_level, logging.INFO))
    return logging.getLogger("queue-server")
