"""The node a load script measures: one the user named, or one it starts in memory."""
from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from tests.harness import NodeProcess  # starts a node and waits for it


@contextlib.contextmanager
def node_at(hosts: str | None, config: dict[str, Any] | None = None) -> Iterator[tuple[str, int | None]]:
    """(hosts, pid): `hosts` as given (pid None), or a fresh in-memory node with `config` that
    is stopped on exit (pid: its main process, for CPU readings)."""
    if hosts:
        yield hosts, None
        return
    with tempfile.TemporaryDirectory() as tmp:
        node = NodeProcess(tmp, config, command=[sys.executable, "-m", "queue_server.server.main", "--in-memory"])
        try:
            node.start()
            assert node.proc is not None
            yield node.hosts, node.proc.pid
        finally:
            node.stop()
