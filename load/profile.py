"""Profile a node under load in one command: start a node (as load/bench.py does), run one of
the benchmark's workloads against it with the compiled client (load/cbench.c), record every
process of the node with py-spy meanwhile, and print the functions with the most own time
(samples where the function itself, not what it calls, was running), per process: acceptor,
worker-N, coordinator (and the supervisor with --supervisor). A benchmark tool, not a test.

    pip install -e '.[bench]'                          # py-spy
    python load/profile.py                              # per-request, 8 connections, 10 s, top 15
    python load/profile.py --workload pipelined --depth 16 --seconds 5 --top 25
    python load/profile.py --workers 4 --config '{"fsync": "always"}' --keep /tmp/profiles

py-spy samples without stopping the processes (--nonblocking) unless --blocking is given; with
--keep, each process's raw stacks (py-spy's collapsed format, for flame graphs) stay in that
directory.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from load.bench import REPO, QueueServer, build_client, print_machine, run_client  # noqa: E402
from load.options import number_options  # noqa: E402
from load.procs import descendants, process_name, stop, thread_cpu  # noqa: E402

WORKLOADS = ("per-request", "pipelined", "batched", "long-poll")


def cbench_options(workload: str, args: argparse.Namespace) -> dict:
    """run_client's keyword arguments for `workload`."""
    return {"per-request": {}, "pipelined": {"depth": args.depth}, "batched": {"batch": args.batch},
            "long-poll": {"mode": "longpoll"}}[workload]


def own_time(collapsed: str) -> Counter:
    """Samples per function where it was the innermost frame, from py-spy's raw (collapsed)
    output: one `frame;frame;...;frame count` a line, a frame `function (file:line)`."""
    found: Counter = Counter()
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        leaf = stack.rsplit(";", 1)[-1]
        function, _, where = leaf.partition(" (")
        file = where.rsplit(":", 1)[0] if where else ""
        found[f"{function} ({_short(file)})" if file else function] += int(count)
    return found


def _short(path: str) -> str:
    """A source path from the repository or a library, without the directories before it."""
    for marker in ("/site-packages/", "/lib/python3", REPO + "/"):
        if marker in path:
            return path.split(marker, 1)[1].split("/", 1)[1] if marker.startswith("/lib/") else path.split(marker, 1)[1]
    return path


def top_lines(name: str, samples: Counter, top: int) -> list[str]:
    """The report of one process: its `top` functions by own time, with their share of its samples."""
    total = sum(samples.values())
    lines = [f"{name}: {total:,} samples with the process busy"]
    for function, count in samples.most_common(top):
        lines.append(f"  {100 * count / total:5.1f}%  {count:>7,}  {function}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = number_options(__doc__, seconds=(10.0, "load and recording time"), conns=(8, "connections"),
                            depth=(16, "pipelined: requests in flight per connection"),
                            batch=(100, "batched: messages per request"), payload=(64, "message bytes"),
                            workers=(2, "queue-server workers"), top=(15, "functions per process"),
                            rate=(200, "py-spy samples per second"))
    parser.add_argument("--workload", choices=WORKLOADS, default="per-request", help="what the client does (default per-request)")
    parser.add_argument("--config", type=json.loads, default={}, help="config keys over the defaults, as JSON")
    parser.add_argument("--blocking", action="store_true", help="stop each process while sampling it (exact, slower)")
    parser.add_argument("--native", action="store_true", help="C frames too (uvloop, zmq, orjson; implies --blocking)")
    parser.add_argument("--supervisor", action="store_true", help="profile the supervisor too")
    parser.add_argument("--keep", help="directory to keep the raw stacks in")
    args = parser.parse_args(argv)
    pyspy = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
    if not pyspy:
        sys.exit("profile: py-spy is needed: pip install -e '.[bench]' (or pip install py-spy)")
    print_machine()
    print(f"workload: {args.workload}, {args.conns} connections, {args.seconds:g} s, {args.workers} workers"
          + (f", config {json.dumps(args.config)}" if args.config else ""))
    with tempfile.TemporaryDirectory(prefix="profile-") as tmp:
        out_dir = args.keep or tmp
        os.makedirs(out_dir, exist_ok=True)
        client = build_client(tmp)
        node = QueueServer(REPO, tmp, args.workers, False, args.config)
        recorders: list[tuple[str, str, subprocess.Popen]] = []
        try:
            procs = [("supervisor" if pid == node.proc.pid else process_name(pid), pid) for pid in descendants(node.proc.pid)]
            for name, pid in procs if args.supervisor else procs[1:]:
                path = os.path.join(out_dir, f"{name}.txt")
                cmd = [pyspy, "record", "--pid", str(pid), "--format", "raw", "--output", path,
                       "--rate", str(args.rate), "--duration", str(int(args.seconds + 2))]
                if args.native:
                    cmd.append("--native")
                elif not args.blocking:
                    cmd.append("--nonblocking")
                recorders.append((name, path, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
            threads_before = {pid: thread_cpu(pid) for _, pid in procs[1:]}
            result = run_client(client, "qs", node.addresses, args, **cbench_options(args.workload, args))
            print(f"client: {result['ops_per_s']:,.0f} ops/s, {result['messages_per_s']:,.0f} messages/s, "
                  f"p50 {result['p50_ms']:.3f} ms, p99 {result['p99_ms']:.3f} ms (while being profiled)")
            ops = max(1, result["ops"])
            print("CPU us per operation by thread (main: the process's Python; ZMQbg: ZeroMQ's I/O threads):")
            for name, pid in sorted(procs[1:]):
                used = {t: s - threads_before[pid].get(t, 0.0) for t, s in sorted(thread_cpu(pid).items())}
                print(f"  {name}: " + ", ".join(f"{t} {s / ops * 1e6:.1f}" for t, s in used.items() if s > 0))
            for name, path, recorder in recorders:
                _, err = recorder.communicate(timeout=args.seconds + 60)
                if recorder.returncode != 0 or not os.path.exists(path):
                    print(f"\n{name}: py-spy failed: {err.decode(errors='replace').strip().splitlines()[-1:]}")
                    continue
                with open(path) as f:
                    print()
                    print("\n".join(top_lines(name, own_time(f.read()), args.top)))
        finally:
            for _, _, recorder in recorders:
                stop(recorder)
            node.stop()
        if args.keep:
            print(f"\nraw stacks (collapsed, for flame graphs) in {args.keep}")


if __name__ == "__main__":
    main()
