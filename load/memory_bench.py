"""Memory per stored message: fill a freshly started server with N messages of --payload bytes
(over --queues queues), and report what the server's processes grew by, divided by N. The same
fill, in the same run, for beanstalkd (jobs in tubes) and redis (lists). A benchmark, not a test.

Memory is read from /proc: RSS, and PSS (proportional set size: a page shared by several
processes counts once in the sum), summed over the server process and all its children. The
figure to compare is PSS growth per message; RSS is printed beside it.

    python load/memory_bench.py                                   # 1M messages, one queue
    python load/memory_bench.py --messages 10000000 --queues 10   # 10M over 10 queues
    python load/memory_bench.py --messages 100000 --no-peers      # a quick look
"""
from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator

import orjson

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from load.bench import QueueServer, Server, comparison_options, print_machine, start_peer  # noqa: E402
from load.options import number_options  # noqa: E402
from load.peers import installed as installed_peers  # noqa: E402
from load.procs import descendants, process_name  # noqa: E402

BATCH = 1000  # messages per request / command while filling


def memory(pid: int) -> dict:
    """RSS and PSS in bytes, summed over `pid` and its descendants; PSS by process name too, and
    how many processes there were."""
    pids = descendants(pid)
    total: dict = {"rss": 0, "pss": 0, "by_process": {}, "processes": len(pids)}
    for p in pids:
        found = {"rss": 0, "pss": 0}
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    key, _, rest = line.partition(":")
                    if key in ("Rss", "Pss"):
                        found[key.lower()] = int(rest.split()[0]) * 1024
        except OSError:
            continue
        total["rss"] += found["rss"]
        total["pss"] += found["pss"]
        name = process_name(p)
        total["by_process"][name] = total["by_process"].get(name, 0) + found["pss"]
    return total


def settled(pid: int, seconds: float = 1.0, processes: int | None = None) -> dict[str, int]:
    """Memory once it stops moving and, given `processes`, once no more processes than that run
    (a worker's snapshot writer, a fork whose pages its worker shares, has ended: while it runs
    RSS counts those pages twice): within 30 s, or 300 s while such a process runs."""
    most = processes if processes is not None else 1 << 30
    last = memory(pid)
    began = time.monotonic()
    while time.monotonic() - began < (30 if last["processes"] <= most else 300):
        time.sleep(seconds)
        now = memory(pid)
        if abs(now["pss"] - last["pss"]) < 1 << 20 and now["processes"] <= most:
            return now
        last = now
    return last


def recv_until(sock: socket.socket, buf: bytearray, count: int, sep: bytes) -> bytearray:
    """Read until `buf` holds at least `count` `sep`-terminated replies; returns `buf`."""
    while buf.count(sep) < count:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk
    return buf


def batch_sizes(count: int) -> Iterator[int]:
    """The sizes of the requests that send `count` messages, BATCH at a time."""
    for start in range(0, count, BATCH):
        yield min(BATCH, count - start)


def fill_queue_server(port: int, queues: list[str], per_queue: int, payload: bytes) -> None:
    body = payload.decode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for q in queues:
            for n in batch_sizes(per_queue):
                sock.sendall(orjson.dumps({"action": 1, "queue": q, "data": [body] * n, "retry": 30}) + b"\n")
                buf = recv_until(sock, bytearray(), 1, b"\n")
                reply = orjson.loads(bytes(buf).split(b"\n", 1)[0])
                if reply.get("code") != 0:
                    raise RuntimeError(f"queue-server refused a produce: {reply}")


def fill_beanstalkd(port: int, queues: list[str], per_queue: int, payload: bytes) -> None:
    put = b"put 0 0 120 %d\r\n%s\r\n" % (len(payload), payload)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for q in queues:
            sock.sendall(b"use %s\r\n" % q.encode())
            recv_until(sock, bytearray(), 1, b"\r\n")
            for n in batch_sizes(per_queue):
                sock.sendall(put * n)
                buf = recv_until(sock, bytearray(), n, b"\r\n")
                if buf.count(b"INSERTED") != n:
                    raise RuntimeError(f"beanstalkd refused a put: {bytes(buf[:200])!r}")


def fill_redis(port: int, queues: list[str], per_queue: int, payload: bytes) -> None:
    item = b"$%d\r\n%s\r\n" % (len(payload), payload)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for q in queues:
            key = q.encode()
            for n in batch_sizes(per_queue):
                head = b"*%d\r\n$5\r\nRPUSH\r\n$%d\r\n%s\r\n" % (n + 2, len(key), key)
                sock.sendall(head + item * n)
                buf = recv_until(sock, bytearray(), 1, b"\r\n")
                if not buf.startswith(b":"):
                    raise RuntimeError(f"redis refused an RPUSH: {bytes(buf[:200])!r}")


FILLS = {"queue-server": fill_queue_server, "beanstalkd": fill_beanstalkd, "redis": fill_redis}


def room_for(per_queue: int) -> dict:
    """queue-server config keys over the defaults for `per_queue` messages a queue, filled BATCH at a time."""
    return {"queue_size": per_queue + 1, "max_memory_mb": 0, "max_request_size": 1 << 24}


def start(name: str, repo: str, workdir: str, workers: int, per_queue: int) -> Server:
    """Server `name` (queue-server or a peer), fresh, with room for `per_queue` messages a queue."""
    if name == "queue-server":
        return QueueServer(repo, workdir, workers, False, room_for(per_queue))
    return start_peer(name, *(("-z", str(1 << 20)) if name == "beanstalkd" else ()))


def measure(name: str, repo: str, workdir: str, workers: int, queues: list[str], per_queue: int,
            payload: bytes) -> dict:
    """Fill a fresh server `name` and return what it grew by: PSS and RSS per message, idle and full
    PSS, the fill's seconds and, for several processes, PSS per message by process."""
    total = per_queue * len(queues)
    server = start(name, repo, workdir, workers, per_queue)
    try:
        idle = settled(server.proc.pid)
        began = time.monotonic()
        FILLS[name](server.port, queues, per_queue, payload)
        took = time.monotonic() - began
        full = settled(server.proc.pid, processes=idle["processes"])
    finally:
        server.stop()
    row = {"server": name, "messages": total, "idle_pss": idle["pss"], "full_pss": full["pss"],
           "pss_per_msg": (full["pss"] - idle["pss"]) / total,
           "rss_per_msg": (full["rss"] - idle["rss"]) / total, "fill_s": took, "by_process": {}}
    if len(full["by_process"]) > 1:
        row["by_process"] = {n: (b - idle["by_process"].get(n, 0)) / total for n, b in sorted(full["by_process"].items())}
    return row


def describe(row: dict) -> str:
    """One row as the lines this benchmark prints."""
    text = (f"{row['server']}: idle {row['idle_pss'] / 2**20:,.0f} MiB, full {row['full_pss'] / 2**20:,.0f} MiB (PSS); "
            f"{row['pss_per_msg']:,.0f} B/msg PSS, {row['rss_per_msg']:,.0f} B/msg RSS; "
            f"filled in {row['fill_s']:.1f} s ({row['messages'] / row['fill_s']:,.0f} msg/s)")
    if row["by_process"]:
        text += "\n  per process, B/msg (PSS): " + ", ".join(f"{n} {g:,.0f}" for n, g in row["by_process"].items())
    return text


def main(argv: list[str] | None = None) -> None:
    parser = number_options(__doc__, messages=(1_000_000, "messages in all"),
                            queues=(1, "spread over this many queues"), payload=(100, "message bytes"),
                            workers=(2, "queue-server workers"))
    comparison_options(parser)
    args = parser.parse_args(argv)
    per_queue = args.messages // args.queues
    queues = [f"mem{i}" for i in range(args.queues)]
    print_machine()
    print(f"fill: {per_queue * args.queues:,} messages of {args.payload} bytes over {args.queues} queue(s)")
    notes: list[str] = []
    servers = ["queue-server"] + ([] if args.no_peers else installed_peers(notes))
    for note in notes:
        print(note)
    rows = []
    with tempfile.TemporaryDirectory(prefix="memory-bench-") as tmp:
        for name in servers:
            rows.append(measure(name, args.repo, tmp, args.workers, queues, per_queue, b"x" * args.payload))
            print(describe(rows[-1]), flush=True)
    print()
    print("| server | idle MiB | full MiB | B per message (PSS) | B per message (RSS) | ratio to beanstalkd |")
    print("|---|---:|---:|---:|---:|---:|")
    base = next((r["pss_per_msg"] for r in rows if r["server"] == "beanstalkd"), None)
    for r in rows:
        ratio = f"{r['pss_per_msg'] / base:.2f}x" if base else ""
        print(f"| {r['server']} | {r['idle_pss'] / 2**20:,.0f} | {r['full_pss'] / 2**20:,.0f} | "
              f"{r['pss_per_msg']:,.0f} | {r['rss_per_msg']:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
