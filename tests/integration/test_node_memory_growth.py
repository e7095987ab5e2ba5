"""Where a node's memory grows as it fills (issue 25): the workers own the queues; the
coordinator keeps only a log window bounded in bytes and the WAL writer's copy of what is not yet
fsync'd (replication/wal.py MAX_UNSYNCED), so its resident memory stays flat while the workers'
grows with every stored message."""
from __future__ import annotations

from load.memory_bench import fill_queue_server, room_for
from queue_server.replication.wal import MAX_UNSYNCED
from queue_server.server.node_memory import resident_bytes
from tests.harness import NodeProcess

STEP = 50_000  # messages per fill step
STEPS = 6
PAYLOAD = b"x" * 100
LOG_BYTES = 1 << 20  # a small log window, so that what else grows in the coordinator shows
# The coordinator may hold the window and the WAL's copy, plus what the allocator keeps around
# them; before the WAL's copy was bounded it held a second of records as small objects, and the
# allocator kept their memory: 22-34 MiB here.
COORDINATOR_MAX = LOG_BYTES + MAX_UNSYNCED + (3 << 20)
COORDINATOR_BYTES_PER_MESSAGE = 16  # the budget, asked of its growth after the first step
WORKER_BYTES_PER_MESSAGE = 100  # the payload alone; a worker holds ~200 B per message


def test_filling_a_node_grows_its_workers_and_not_its_coordinator(tmp_path):
    node = NodeProcess(str(tmp_path), {**room_for(STEP * STEPS), "queue_log_bytes": LOG_BYTES}).start(serving=True)
    try:
        coordinator = node.child_pid("coordinator")
        acceptor = node.child_pid("acceptor")
        workers = [pid for pid in node.child_pids() if pid not in (coordinator, acceptor)]
        idle_coordinator = resident_bytes(coordinator)
        idle_workers = sum(map(resident_bytes, workers))
        growth = []
        for _ in range(STEPS):
            fill_queue_server(node.config["port"], ["mem"], STEP, PAYLOAD)
            growth.append(resident_bytes(coordinator) - idle_coordinator)
        worker_growth = sum(map(resident_bytes, workers)) - idle_workers
        mib = [round(g / (1 << 20), 1) for g in growth]
        assert max(growth) <= COORDINATOR_MAX, f"the coordinator grew by {mib} MiB, step by step"
        assert growth[-1] - growth[0] <= COORDINATOR_BYTES_PER_MESSAGE * STEP * (STEPS - 1), (
            f"the coordinator grew with the messages: {mib} MiB, step by step")
        assert worker_growth >= WORKER_BYTES_PER_MESSAGE * STEP * STEPS, (
            f"the workers grew by only {worker_growth / (STEP * STEPS):.0f} B per message")
    finally:
        node.stop()
