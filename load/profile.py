"""Where a node's CPU goes under load: starts a queue-server node (as load/bench.py does), drives
it with the compiled client (per-request or pipelined cycles), samples every child process with
py-spy meanwhile, and prints each process's functions by their own time (the time a function
spends outside the functions it calls). A profiling tool, not a test.

    python load/profile.py --workload per-request --seconds 10
    python load/profile.py --workload pipelined --top 15 --out /tmp/prof   # also keeps the raw stacks
    python load/profile.py --repo /tmp/other-checkout                       # another version

py-spy counts a thread that is runnable but not running (preempted, e.g. by the ZeroMQ I/O thread
a send just woke) as busy where it stands, so a ZeroMQ send or poll looks dearer than the CPU it
uses; the CPU time per thread printed first is read from /proc and is the CPU truth.

Needs py-spy (pip install py-spy; in the test extra) and the right to trace the node's processes
(root, or kernel.yama.ptrace_scope 0).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

_TICK = os.sysconf("SC_CLK_TCK")
_LINE = re.compile(r":\d+\)$")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from load.bench import REPO, QueueServer, build_client, run_client  # noqa: E402
from load.procs import descendants, process_name  # noqa: E402


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread of process `pid`, by thread name (the main thread is "main";
    ZeroMQ's I/O thread is "ZMQbg/IO/0"); threads of one name are summed."""
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = "main" if tid == str(pid) else f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / _TICK
    return out


def own_time(raw: str) -> tuple[collections.Counter, int]:
    """py-spy's raw (collapsed) stacks as samples per leaf function, and the total samples."""
    leaves: collections.Counter = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        leaf = _LINE.sub(")", stack.rsplit(";", 1)[-1])  # by function, not by line
        leaves[leaf] += int(count)
        total += int(count)
    return leaves, total


def summary(name: str, raw: str, top: int) -> str:
    """A process's top functions by own time, as Markdown table rows under a title line."""
    leaves, total = own_time(raw)
    lines = [f"{name}: {total} samples", "", "| own % | function |", "|---:|---|"]
    for leaf, count in leaves.most_common(top):
        lines.append(f"| {100 * count / max(1, total):.1f} | `{leaf}` |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("per-request", "pipelined"), default="per-request")
    parser.add_argument("--seconds", type=float, default=10.0, help="of load, sampled (default 10)")
    parser.add_argument("--conns", type=int, default=8)
    parser.add_argument("--depth", type=int, default=16, help="requests in flight per connection, pipelined")
    parser.add_argument("--payload", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second per process")
    parser.add_argument("--top", type=int, default=10, help="functions per process")
    parser.add_argument("--repo", default=REPO, help="queue-server checkout to run (default: this one)")
    parser.add_argument("--out", help="a directory to keep each process's raw stacks in")
    args = parser.parse_args(argv)
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        sys.exit("profile: py-spy is needed (pip install py-spy)")
    with tempfile.TemporaryDirectory(prefix="profile-") as tmp:
        out_dir = args.out or tmp
        os.makedirs(out_dir, exist_ok=True)
        client = build_client(tmp)
        node = QueueServer(os.path.abspath(args.repo), tmp, args.workers, False)
        try:
            children = {process_name(pid): pid for pid in descendants(node.proc.pid)[1:]}
            spies = {}
            for name, pid in sorted(children.items()):
                path = os.path.join(out_dir, f"{args.workload}-{name}.txt")
                spies[name] = (path, subprocess.Popen(
                    [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", str(args.rate),
                     "--nonblocking", "--duration", str(int(args.seconds)), "--output", path],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            load = argparse.Namespace(conns=args.conns, seconds=args.seconds, payload=args.payload)
            result: dict = {}
            runner = threading.Thread(target=lambda: result.update(run_client(
                client, "qs", node.addresses, load,
                depth=args.depth if args.workload == "pipelined" else 1)))
            before = {name: thread_cpu(pid) for name, pid in children.items()}
            runner.start()
            runner.join()
            ops = max(1, result.get("ops", 0))
            print(f"{args.workload}: {result.get('ops_per_s', 0):,.0f} ops/s while sampled at {args.rate}/s "
                  f"(py-spy's own cost included)")
            print("CPU us/op per thread: " + "; ".join(
                f"{name} " + ", ".join(f"{t} {(cpu - before[name].get(t, 0.0)) / ops * 1e6:.1f}"
                                       for t, cpu in sorted(thread_cpu(pid).items()))
                for name, pid in sorted(children.items())))
            for name, (path, proc) in spies.items():
                _, err = proc.communicate(timeout=args.seconds + 60)
                if not os.path.exists(path):
                    print(f"{name}: py-spy failed: {err.decode(errors='replace').strip()}")
                    continue
                with open(path) as f:
                    print("\n" + summary(name, f.read(), args.top))
        finally:
            node.stop()


if __name__ == "__main__":
    main()
