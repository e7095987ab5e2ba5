"""A node with most bodies overflowed against the same node with every body in memory (issue 26's
targets), in the same run: RSS once full, the peak RSS while its worker cuts a snapshot and while
a restart loads it, produce and consume + confirm rates, restart time. A benchmark, not a test.

    python load/overflow_node_bench.py                                   # 1M of 100 B, overflow_mb 25
    python load/overflow_node_bench.py --messages 10000000 --overflow-mb 256
    python load/overflow_node_bench.py --code /tmp/base   # another checkout (its queue_server/ inside)

Each mode starts a fresh one-worker node (`--overflow-mb` for "overflow", 0 for "memory"), fills
one queue with produces of --batch messages (a few requests in flight on one connection), lets
it cut one snapshot at the end of the fill (snapshot_every = the fill's records: one a message,
not one a request), stops it and
starts it again on the same data (restart: until the queue's size is back), then consumes
everything --batch at a time and confirms each batch (at least once). RSS is summed over the
node's processes from /proc/<pid>/status, sampled every 50 ms (so a snapshot writer child's
pages are counted while it lives: its pages shared with the worker count twice; the peak PSS,
sampled every 0.5 s, counts them once); "full" is the
RSS once the fill has settled and the snapshot writer has exited, "after the restart" once the
queue is back and no writer is running. The target:
full RSS <= overflow_mb + 64 B a message + the idle RSS.
"""
from __future__ import annotations

import argparse
import glob
import os
import socket
import sys
import tempfile
import threading
import time

import orjson

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from load.bench import QueueServer  # noqa: E402
from load.memory_bench import recv_until  # noqa: E402
from load.procs import descendants, process_name, wait_until  # noqa: E402

WINDOW = 8  # produce requests in flight


def rss(pid: int) -> tuple[int, dict[str, int]]:
    """RSS in bytes summed over `pid` and its descendants, and by process name."""
    total = 0
    by: dict[str, int] = {}
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                kb = next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
        except OSError:
            continue
        total += kb * 1024
        name = process_name(p)
        by[name] = by.get(name, 0) + kb * 1024
    return total, by


def pss(pid: int) -> int:
    """PSS in bytes summed over `pid` and its descendants: pages a forked snapshot writer shares
    with its worker counted once (slower to read than RSS)."""
    total = 0
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0) * 1024
        except OSError:
            continue
    return total


class Peak(threading.Thread):
    """The highest summed RSS (and the worker processes' highest) seen while it runs, and the
    highest summed PSS (sampled every PSS_EVERY samples)."""

    PSS_EVERY = 10

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.total = self.workers = self.pss = 0
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        k = 0
        while not self.done.wait(0.05):
            total, by = rss(self.pid)
            self.total = max(self.total, total)
            self.workers = max(self.workers, sum(b for n, b in by.items() if "worker" in n))
            k += 1
            if k % self.PSS_EVERY == 0:
                self.pss = max(self.pss, pss(self.pid))

    def stop(self) -> tuple[int, int]:
        self.done.set()
        self.join()
        return self.total, self.workers


def call(sock: socket.socket, request: dict) -> dict:
    sock.sendall(orjson.dumps(request) + b"\n")
    return orjson.loads(bytes(recv_until(sock, bytearray(), 1, b"\n")).split(b"\n", 1)[0])


def fill(port: int, n: int, payload: int, batch: int) -> float:
    """Produce n messages of `payload` bytes, `batch` a request, WINDOW requests in flight; seconds."""
    body = "x" * payload
    requests = [orjson.dumps({"action": 1, "queue": "q", "data": [body] * min(batch, n - k), "retry": 60}) + b"\n"
                for k in range(0, min(n, batch * 64), batch)]
    total = -(-n // batch)
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        buf = bytearray()
        sent = done = 0
        while done < total:
            while sent < total and sent - done < WINDOW:
                last = sent == total - 1 and n % batch
                sock.sendall(orjson.dumps({"action": 1, "queue": "q", "data": [body] * (n % batch), "retry": 60}) + b"\n"
                             if last else requests[0])
                sent += 1
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the node closed the connection")
            buf += chunk
            while b"\n" in buf:
                line, _, rest = bytes(buf).partition(b"\n")
                buf = bytearray(rest)
                if orjson.loads(line).get("code") != 0:
                    raise RuntimeError(f"a produce was refused: {line[:200]!r}")
                done += 1
    return time.monotonic() - began


def drain(port: int, n: int, batch: int, first: int) -> tuple[float, float]:
    """Consume and confirm every message, `batch` at a time: seconds for all, and for those after
    the `first` (the ones that overflowed, in the overflow mode)."""
    got = 0
    began = time.monotonic()
    split = None
    with socket.create_connection(("127.0.0.1", port)) as sock:
        while got < n:
            reply = call(sock, {"action": 2, "queue": "q", "count": batch})
            messages = reply.get("messages") or []
            if not messages:
                raise RuntimeError(f"{got} of {n} came back: {reply}")
            ids = [m["msg_id"] for m in messages]
            if call(sock, {"action": "confirm", "queue": "q", "msg_ids": ids}).get("code") != 0:
                raise RuntimeError("a confirm was refused")
            got += len(messages)
            if split is None and got >= first:
                split = time.monotonic()
    end = time.monotonic()
    return end - began, end - (split or began)


def settled(pid: int) -> bool:
    """No snapshot writer (a worker's forked child) is running under node `pid`."""
    workers = [p for p in descendants(pid) if process_name(p).startswith("worker")]
    return len(workers) == len({process_name(p) for p in workers})


def size(port: int) -> int:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            return call(sock, {"action": 4, "queue": "q"}).get("size", -1)
    except (OSError, ValueError):
        return -1


def run(mode: str, args: argparse.Namespace, workdir: str) -> dict:
    n = args.messages
    data_dir = tempfile.mkdtemp(prefix=f"{mode}-data-", dir=workdir)
    config = {"overflow_mb": args.overflow_mb if mode == "overflow" else 0, "queue_size": n + 1,
              "max_memory_mb": 0, "max_request_size": 1 << 24, "snapshot_every": n,
              "queue_data_dir": data_dir}
    row: dict = {"mode": mode}
    node = QueueServer(args.repo, workdir, 1, False, config, name=mode)
    try:
        time.sleep(1.0)
        row["idle"] = rss(node.proc.pid)[0]
        peak = Peak(node.proc.pid)
        row["fill_s"] = fill(node.port, n, args.payload, args.batch)
        snaps = os.path.join(data_dir, "snapshots", "*.snap")
        wait_until(lambda: glob.glob(snaps), 600, 0.2)
        wait_until(lambda: settled(node.proc.pid), 600, 0.2)
        time.sleep(1.0)
        row["peak_fill_snapshot"], row["peak_workers"] = peak.stop()
        row["peak_fill_pss"] = peak.pss
        row["full"], row["full_by"] = rss(node.proc.pid)
    finally:
        node.stop()
    print(f"  {mode}: filled, {row['full'] / 2**20:,.0f} MiB RSS full ({', '.join(f'{k} {v >> 20}' for k, v in sorted(row['full_by'].items()) if v)}),"
          f" idle {row['idle'] >> 20}, produce {n / row['fill_s']:,.0f} msg/s; restarting", flush=True)
    started = time.monotonic()
    node = QueueServer(args.repo, workdir, 1, False, config, name=mode, start_timeout=900)
    try:
        peak = Peak(node.proc.pid)
        wait_until(lambda: size(node.port) == n, 900, 0.2)
        row["restart_s"] = time.monotonic() - started
        row["peak_restart"], row["peak_restart_workers"] = peak.stop()
        wait_until(lambda: settled(node.proc.pid), 600, 0.2)
        row["after_restart"], row["restart_by"] = rss(node.proc.pid)
        in_memory = min(n, (args.overflow_mb << 20) // args.payload) if mode == "overflow" else 0
        row["overflowed"] = n - in_memory
        row["drain_s"] = row["drain_overflowed_s"] = 0.0
        if not args.no_drain:
            row["drain_s"], row["drain_overflowed_s"] = drain(node.port, n, args.batch, in_memory)
    finally:
        node.stop()
    return row


def describe(row: dict, n: int, overflow_mb: int) -> str:
    mib = 1 << 20
    text = (f"{row['mode']}: idle {row['idle'] / mib:,.0f} MiB, full {row['full'] / mib:,.0f} MiB RSS "
            f"({(row['full'] - row['idle']) / n:,.0f} B/msg over idle); peak while filling and cutting the snapshot "
            f"{row['peak_fill_snapshot'] / mib:,.0f} MiB (worker + its writer {row['peak_workers'] / mib:,.0f}; "
            f"PSS, shared pages once, {row['peak_fill_pss'] / mib:,.0f}); "
            f"produce {n / row['fill_s']:,.0f} msg/s; restart {row['restart_s']:.1f} s, peak "
            f"{row['peak_restart'] / mib:,.0f} MiB (worker {row['peak_restart_workers'] / mib:,.0f}), then "
            f"{row['after_restart'] / mib:,.0f} MiB")
    if row["drain_s"]:
        text += f"; consume + confirm {n / row['drain_s']:,.0f} msg/s"
    if row["mode"] == "overflow":
        target = overflow_mb * mib + 64 * n + row["idle"]
        if row["drain_s"]:
            text += (f" (the {row['overflowed']:,} overflowed: "
                     f"{row['overflowed'] / max(row['drain_overflowed_s'], 1e-9):,.0f} msg/s)")
        text += (f"; target RSS {target / mib:,.0f} MiB: {'met' if row['full'] <= target else 'NOT met'}")
    for key, label in (("full_by", "full"), ("restart_by", "after the restart")):
        text += f"\n  {label}, MiB RSS by process: " + ", ".join(
            f"{k} {v / mib:,.0f}" for k, v in sorted(row[key].items()) if v)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--payload", type=int, default=100, help="bytes a message")
    parser.add_argument("--overflow-mb", type=int, default=25)
    parser.add_argument("--batch", type=int, default=100, help="messages a produce / consume")
    parser.add_argument("--modes", default="overflow,memory")
    parser.add_argument("--no-drain", action="store_true", help="skip consuming everything at the end")
    parser.add_argument("--code", help="run the node from this folder's queue_server/ (PYTHONPATH)")
    parser.add_argument("--dir", help="where the nodes' data go (default: a tmp folder)")
    args = parser.parse_args(argv)
    args.repo = os.path.dirname(HERE)
    if args.code:  # the node starts in that folder: `python -m` puts its cwd ahead of PYTHONPATH
        args.repo = os.path.abspath(args.code)
        os.environ["PYTHONPATH"] = args.repo
    with tempfile.TemporaryDirectory(dir=args.dir) as workdir:
        for mode in args.modes.split(","):
            print(describe(run(mode, args, workdir), args.messages, args.overflow_mb), flush=True)


if __name__ == "__main__":
    main()
