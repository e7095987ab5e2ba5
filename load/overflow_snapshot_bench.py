"""What a worker's snapshot of a queue with most bodies overflowed costs, with the part referring
to the segments (REFS, issue 26 step 3) and with every body written into it (as before step 3),
in-process on the real code: the peak RSS of the forked writer and its seconds, the part's size,
and the peak RSS and seconds of a fresh process loading the part. A benchmark, not a test.

    python load/overflow_snapshot_bench.py                       # 1M of 100 B, 25 MiB in memory
    python load/overflow_snapshot_bench.py --messages 10000000 --overflow-mb 256

The writer's peak is ru_maxrss of the forked child (os.wait4): the worker's pages it touched
(copy on write) and what it built; the loader's is ru_maxrss of a child process that starts
empty, loads the part into a service with the same budget and exits.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from queue_server.replication.snapshot import iter_frames, write_part  # noqa: E402
from queue_server.server.overflow_files import DiskSegments, PartSegments, link_segments, sync_segments  # noqa: E402
from queue_server.workers.body_budget import BodyBudget  # noqa: E402
from queue_server.workers.overflow import Overflow  # noqa: E402
from queue_server.workers.service import PartitionService  # noqa: E402

T0 = 1_700_000_000.0


def service(where: str, share: int) -> PartitionService:
    return PartitionService(node_id=1, queue_size=10**9, overflow=Overflow(BodyBudget(share), DiskSegments(where)))


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def in_child(fn) -> tuple[float, float]:
    """Run fn() in a forked child: (its peak RSS in MiB, its seconds)."""
    began = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            fn()
        finally:
            os._exit(0)
    _, status, usage = os.wait4(pid, 0)
    if status:
        raise RuntimeError(f"the child failed ({status})")
    return usage.ru_maxrss / 1024, time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--overflow-mb", type=int, default=25)
    parser.add_argument("--dir", help="where the segments and parts go (default: a tmp folder)")
    args = parser.parse_args()
    root = tempfile.mkdtemp(dir=args.dir)
    try:
        s = service(os.path.join(root, "w0"), args.overflow_mb << 20)
        body = "x" * (args.payload - 10)
        for k in range(0, args.messages, 1000):
            batch = [body + f"{i:010d}" for i in range(k, min(k + 1000, args.messages))]
            s.queues.setdefault("q", s.queue_class("q", 10**9))
            s._configure(s.queues["q"])
            s.queues["q"].produce_many([(d, T0, T0 + 3600, 30.0, 0) for d in batch], T0)
        ov = s.overflow
        print(f"{args.messages:,} messages of {args.payload} B, {ov.live_bytes / args.messages / args.payload:.0%} of the bodies"
              f" on disk in {ov.segments} segments; the worker {rss_mib():,.0f} MiB RSS", flush=True)
        for refs in (False, True):
            tmp = os.path.join(root, f"cut-{refs}")
            os.makedirs(tmp)
            part = os.path.join(tmp, "part-0.qsp")
            if refs:
                link_segments(ov, tmp, "part-0.qsp")

            def write() -> None:
                write_part(part, s.snapshot_frames(refs=refs))
                if refs:
                    sync_segments(part, ov.live)
            peak, took = in_child(write)

            # The loader starts from an empty process: fork from a child that dropped the worker's
            # queues would still share them; exec a fresh interpreter instead.
            load_peak, load_took = in_child(lambda: os.execv(sys.executable, [sys.executable, __file__, "--load", part,
                                                                                str(args.overflow_mb), str(args.messages),
                                                                                os.path.join(root, f"load-{refs}")]))
            print(f"{'refs  ' if refs else 'bodies'}: the writer's peak {peak:,.0f} MiB RSS, {took:.1f} s, part "
                  f"{os.path.getsize(part) / 2**20:,.0f} MiB; a fresh loader's peak {load_peak:,.0f} MiB RSS, {load_took:.1f} s",
                  flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def load_only(part: str, overflow_mb: int, messages: int, where: str) -> None:
    fresh = service(where, overflow_mb << 20)
    loading = PartSegments(fresh.overflow)
    fresh.load_frames(loading.frames(part, iter_frames(part)))
    loading.adopt()
    assert len(fresh.queues["q"]) == messages, len(fresh.queues["q"])


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--load":
        load_only(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        main()
