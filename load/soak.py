"""Soak runner: run the fault tests and the randomized cluster simulation(s) many times, optionally
while a CPU hog keeps every core busy, and report every run that failed. A tool, not part of CI.

    python load/soak.py --runs 30 --stress                 # 30 fault runs + 30 sim runs, cores busy
    python load/soak.py --runs 10 --sim-runs 0 -k kill_leader --stop-on-fail
    python load/soak.py --runs 0 --sim-runs 5 --sim-seeds 2000       # the simulations only
    python load/soak.py --runs 5 tests/fault/test_cluster_faults.py::test_no_majority_answers_no_leader
    python load/soak.py --runs 30 --sim-runs 0 --stress --queue-groups 3   # the clusters with 3 queue groups

Suites:

  fault  python -m pytest tests/fault (or the paths / -k expression given), --runs times
  sim    python -m pytest tests/unit/test_cluster_sim.py and every other tests/unit/test_*sim*.py,
         --sim-runs times, with SIM_SEEDS=--sim-seeds when given

Each run is one pytest subprocess in a process group of its own, with a time limit (--timeout).
A run fails if pytest exits non-zero, if it runs out of time, or if it leaves processes of its
group running after it exits (tests must stop every process they start). On a timeout the runner
dumps pytest's thread stacks into the run's log (faulthandler, SIGUSR1), interrupts pytest
(SIGINT, so fixtures stop their nodes), and after a grace period kills what is left of the group.
Ctrl-C or SIGTERM stops the run in progress the same way. The CPU hog is stopped whenever the
runner ends, however it ends (if it is killed outright, the hog and the pytest run in progress
are signalled by the kernel: PR_SET_PDEATHSIG).

Every run gets a random PYTHONHASHSEED, printed with its failure so that the run can be repeated.
The simulation is deterministic for a given seed count: repeated sim runs differ only by that
hash seed and by the CPU load, so raise --sim-seeds to explore more schedules.

Output: one line per run, then per-suite pass/fail counts, then for every failed run its failing
test ids with the assertion text and captured output from pytest's report. Each failed run's full
output is kept in --out/<timestamp>/ (passing runs' logs are deleted). Exit status 1 if any run
failed, 2 for bad arguments or a selection that matches no tests, 130 when interrupted.

One file, over 600 lines, because it is one command meant to be copied nowhere and run as a
script (`python load/soak.py`): options, the pytest runs, the CPU hog and the report are the
steps of that one command, and its pure parts (options, summarising pytest's output, the
report) are tested in tests/unit/test_soak.py.
"""
from __future__ import annotations

import argparse
import atexit
import ctypes
import glob
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from load.procs import group_members, signal_each, signal_group, stop, wait_until  # noqa: E402
FAULT = "fault"
GROUPS_ENV = "QUEUE_SERVER_TEST_QUEUE_GROUPS"  # tests/harness.py Cluster's queue_groups
SIM = "sim"
SIM_GLOB = "tests/unit/test_*sim*.py"
DEFAULT_TIMEOUT = 1200.0
INTERRUPT_GRACE = 60.0  # after SIGINT: time for pytest's teardown to stop the nodes
TERM_GRACE = 10.0
LEAK_GRACE = 5.0  # after pytest exits: time for its children to go
DETAIL_LINES = 40  # per failing test, in the printed report (the log has everything)
CAPTURED_LINES = 15

# The pytest child: pytest with a SIGUSR1 handler that dumps every thread's stack to the log
# (a dup of stdout taken before pytest captures fd 1), so that a hang shows where it hangs.
_CHILD = (
    "import faulthandler, os, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"  # even if started with it ignored
    "faulthandler.register(signal.SIGUSR1, file=os.fdopen(os.dup(1), 'w'), all_threads=True)\n"
    "import pytest\n"
    "sys.exit(pytest.main(sys.argv[1:]))\n"
)
_PYTEST_FLAGS = ["-vv", "-rfE", "--color=no", "-p", "no:cacheprovider"]
# A busy loop that also ends when its parent goes (belt and braces with PR_SET_PDEATHSIG).
_BUSY = "import os\nppid = os.getppid()\nwhile os.getppid() == ppid:\n    for _ in range(2_000_000): pass\n"
_PR_SET_PDEATHSIG = 1


# ------------------------------------------------------------------------------- arguments


@dataclass(frozen=True)
class Options:
    """What a soak session runs."""

    runs: int
    sim_runs: int
    sim_seeds: int | None
    stress: bool
    timeout: float
    out: str
    stop_on_fail: bool
    keyword: str | None
    paths: tuple[str, ...]
    queue_groups: int = 1


def _non_negative(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {n}")
    return n


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {n}")
    return n


def _seconds(text: str) -> float:
    x = float(text)
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return x


def build_parser() -> argparse.ArgumentParser:
    """The command line of the soak runner."""
    parser = argparse.ArgumentParser(
        prog="python load/soak.py",
        description=(
            "Run the fault tests (tests/fault) and the randomized cluster simulation(s)\n"
            "(tests/unit/test_*sim*.py) many times, optionally with every core busy, and report\n"
            "each failed run: its failing tests, their assertion text and captured output, and\n"
            "the path of its saved log.\n\n"
            "A run fails when pytest exits non-zero, when it exceeds --timeout (its thread stacks\n"
            "are dumped into the log, then it is interrupted so that fixtures stop their nodes),\n"
            "or when it leaves processes running. Each run has a random PYTHONHASHSEED, printed\n"
            "with its failure together with the command that repeats it."),
        epilog=(
            "examples:\n"
            "  python load/soak.py --runs 30 --stress                # 30 fault + 30 sim runs\n"
            "  python load/soak.py --runs 10 --sim-runs 0 -k kill_leader --stop-on-fail\n"
            "  python load/soak.py --runs 0 --sim-runs 5 --sim-seeds 2000\n"
            "  python load/soak.py --runs 5 tests/fault/test_cluster_faults.py::test_no_majority_answers_no_leader\n\n"
            "The simulation is deterministic for a given seed count: repeated sim runs differ\n"
            "only by the hash seed and the CPU load, so raise --sim-seeds to explore more.\n\n"
            "exit status: 0 every run passed, 1 a run failed, 2 bad arguments or a selection\n"
            "with no tests, 130 interrupted (^C or SIGTERM; the CPU hog is always stopped)"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="fault-test files or node ids to run instead of tests/fault")
    parser.add_argument("--runs", type=_non_negative, default=10, metavar="N",
                        help="how many times to run the fault tests (default 10; 0 skips them)")
    parser.add_argument("--sim-runs", type=_non_negative, default=None, metavar="N",
                        help="how many times to run the simulation(s) (default: --runs; 0 skips them)")
    parser.add_argument("--sim-seeds", type=_positive, default=None, metavar="N",
                        help="seeds per simulation run, passed as SIM_SEEDS (default: the "
                             "simulation's own, 200)")
    parser.add_argument("-k", dest="keyword", default=None, metavar="EXPR",
                        help="pytest -k expression selecting fault tests (the simulations are not "
                             "filtered)")
    parser.add_argument("--queue-groups", type=_positive, default=1, metavar="N",
                        help="run the fault tests' clusters with queue_groups N (tests/harness.py reads "
                             "QUEUE_SERVER_TEST_QUEUE_GROUPS); default 1")
    parser.add_argument("--stress", action="store_true",
                        help="keep every core busy while the tests run: stress-ng --cpu <nproc> "
                             "if installed, else <nproc> Python busy loops")
    parser.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"time limit of one pytest run; a run that exceeds it fails "
                             f"(default {DEFAULT_TIMEOUT:.0f})")
    parser.add_argument("--out", default="soak-out", metavar="DIR",
                        help="where failed runs' full output is kept, in a subdirectory per "
                             "session (default ./soak-out)")
    parser.add_argument("--stop-on-fail", action="store_true",
                        help="stop after the first failed run")
    return parser


def parse_args(argv: list[str] | None = None) -> Options:
    """Options from the command line (argparse exits with status 2 on bad arguments)."""
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.sim_runs is None:
        a.sim_runs = a.runs
    if a.runs == 0 and a.sim_runs == 0:
        parser.error("nothing to run: --runs and --sim-runs are both 0")
    return Options(a.runs, a.sim_runs, a.sim_seeds, a.stress, a.timeout, a.out, a.stop_on_fail,
                   a.keyword, tuple(a.paths), a.queue_groups)


@dataclass(frozen=True)
class Suite:
    """One pytest command run repeatedly."""

    name: str
    runs: int
    args: tuple[str, ...]  # pytest arguments: targets and selection
    env: tuple[tuple[str, str], ...] = ()


def plan(opts: Options, sim_files: list[str]) -> list[Suite]:
    """The suites a session runs, in order (a suite with no runs is left out)."""
    suites = []
    if opts.runs:
        args = list(opts.paths or ["tests/fault"])
        if opts.keyword:
            args += ["-k", opts.keyword]
        env = ((GROUPS_ENV, str(opts.queue_groups)),) if opts.queue_groups > 1 else ()
        suites.append(Suite(FAULT, opts.runs, tuple(args), env))
    if opts.sim_runs:
        env = (("SIM_SEEDS", str(opts.sim_seeds)),) if opts.sim_seeds else ()
        suites.append(Suite(SIM, opts.sim_runs, tuple(sim_files), env))
    return suites


def schedule(suites: list[Suite]) -> list[tuple[Suite, int]]:
    """(suite, run number from 1) in the order they run: the suites interleaved, so that each is
    spread over the whole session."""
    order = []
    for i in range(max((s.runs for s in suites), default=0)):
        order.extend((s, i + 1) for s in suites if i < s.runs)
    return order


# ------------------------------------------------------------------------------- pytest output


@dataclass
class FailedTest:
    """One failing test as pytest reported it."""

    test_id: str
    kind: str  # "FAILED" or "ERROR"
    message: str = ""  # from the short summary line
    details: list[str] = field(default_factory=list)  # location, E lines, captured output


@dataclass
class Summary:
    """What one pytest run's output says."""

    counts: dict[str, int] = field(default_factory=dict)  # "passed", "failed", "error", ...
    failures: list[FailedTest] = field(default_factory=list)
    running: str | None = None  # the test that had started but not finished (interrupted run)
    interrupted_at: list[str] = field(default_factory=list)  # pytest's KeyboardInterrupt lines
    stacks: list[str] = field(default_factory=list)  # a faulthandler dump, pytest's frames left out


_RESULT = r"(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)"
# "path::test PASSED [ 50%]"; a test still running shows no result (maybe a stack dump after it)
_PROGRESS = re.compile(r"^(\S+::\S+)(?:\s+" + _RESULT + r"\b)?")
_STACK = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ |^  File \"")
_STACK_NOISE = ("/_pytest/", "/pluggy/", '"<string>"')
_SECTION = re.compile(r"^=+ (.+?) =+$")
_HEADER = re.compile(r"^_{3,} (.+?) _{3,}$")
_SUBSECTION = re.compile(r"^-{3,} (.+?) -{3,}$")
_SHORT = re.compile(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$")
_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)")
_FINAL = re.compile(r"^=+ (.*\bin [\d.]+s\b.*?) =+$")
_LOCATION = re.compile(r"^\S+:\d+: \w")


def _header_key(header: str) -> str:
    for prefix in ("ERROR at setup of ", "ERROR at teardown of ", "ERROR collecting "):
        if header.startswith(prefix):
            return header[len(prefix):]
    return header


def _id_key(test_id: str) -> str:
    """The name pytest puts in a failure's section header for a node id."""
    if "::" not in test_id:
        return test_id  # a collection error names the file
    return test_id.split("::", 1)[1].replace("::", ".")


def _details(body: list[str]) -> list[str]:
    """The lines of one failure section worth printing: where it failed, the E lines, and the
    tail of the captured output."""
    keep: list[str] = []
    captured: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in body:
        sub = _SUBSECTION.match(line)
        if sub:
            current = captured.setdefault(sub.group(1), [])
            continue
        if current is not None:
            current.append(line)
        elif line.startswith("E "):
            keep.append(line)
        elif _LOCATION.match(line):
            keep.append(line)
    for title, lines in captured.items():
        lines = [ln for ln in lines if ln.strip()]
        if lines:
            shown = lines[-CAPTURED_LINES:]
            more = f" (last {len(shown)} of {len(lines)} lines)" if len(lines) > len(shown) else ""
            keep.append(f"--- {title}{more}")
            keep.extend(shown)
    return keep


def summarise(output: str) -> Summary:
    """Counts, failing tests (with their assertion text) and, for an interrupted run, the test
    that was running, from the output of `pytest -vv -rfE`."""
    s = Summary()
    lines = output.splitlines()
    section = ""
    sections: dict[str, list[tuple[str, list[str]]]] = {"FAILURES": [], "ERRORS": []}
    body: list[str] | None = None
    last_started: str | None = None
    last_finished = False
    short: list[tuple[str, str, str]] = []
    for i, line in enumerate(lines):
        if line.startswith("!") and "KeyboardInterrupt" in line:
            section = "INTERRUPT"
            body = None
            continue
        m = _SECTION.match(line)
        if m and not line.startswith("_"):
            section = m.group(1)
            body = None
            final = _FINAL.match(line)
            if final:
                s.counts = {}
                for n, word in _COUNT.findall(final.group(1)):
                    key = {"errors": "error", "warning": "warnings"}.get(word, word)
                    s.counts[key] = s.counts.get(key, 0) + int(n)
            continue
        if section in sections:
            h = _HEADER.match(line)
            if h:
                body = []
                sections[section].append((h.group(1), body))
            elif body is not None:
                body.append(line)
            continue
        if section == "short test summary info":
            sm = _SHORT.match(line)
            if sm:
                short.append((sm.group(1), sm.group(2), sm.group(3) or ""))
            continue
        if section == "INTERRUPT":
            if line.strip() and not line.startswith("(to show a full traceback"):
                s.interrupted_at.append(line)
            continue
        if section.startswith("test session starts"):
            pm = _PROGRESS.match(line)
            if pm:
                last_started, last_finished = pm.group(1), pm.group(2) is not None
                line = line[pm.end():].lstrip()  # a stack dump may follow on the same line
            if _STACK.match(line) and not any(noise in line for noise in _STACK_NOISE):
                s.stacks.append(line)
    if last_started is not None and not last_finished:
        s.running = last_started

    # Pair each short-summary entry with its section: same kind, in order, when the names agree.
    pools = {"FAILED": list(sections["FAILURES"]), "ERROR": list(sections["ERRORS"])}
    for kind, test_id, message in short:
        pool = pools[kind]
        match = next((j for j, (h, _) in enumerate(pool) if _header_key(h) == _id_key(test_id)), None)
        details = _details(pool.pop(match)[1]) if match is not None else []
        s.failures.append(FailedTest(test_id, kind, message, details))
    for kind, pool in pools.items():  # sections without a summary line (no -r, or cut short)
        for header, body_lines in pool:
            s.failures.append(FailedTest(_header_key(header), kind, "", _details(body_lines)))
    return s


# ------------------------------------------------------------------------------- reporting


@dataclass
class RunResult:
    """The outcome of one pytest run."""

    suite: str
    number: int
    passed: bool
    duration: float
    returncode: int | None
    timed_out: bool
    summary: Summary
    log: str  # path of the saved output ("" once deleted)
    command: str  # to repeat it by hand
    leaked: list[str] = field(default_factory=list)  # processes the run left behind
    note: str = ""


def counts_text(counts: dict[str, int]) -> str:
    """'3 passed, 1 failed' in pytest's order."""
    order = ["failed", "passed", "skipped", "deselected", "xfailed", "xpassed", "error"]
    parts = [f"{counts[k]} {k}" for k in order if counts.get(k)]
    return ", ".join(parts) or "no tests ran"


def run_line(r: RunResult, total: int) -> str:
    """The line printed when a run ends."""
    width = len(str(total))
    status = "PASS" if r.passed else "FAIL"
    extra = counts_text(r.summary.counts)
    if r.timed_out:
        extra += f"; TIMED OUT in {r.summary.running or 'an unknown test'}"
    elif r.returncode not in (0, 1) and not r.passed:
        extra += f"; pytest exit status {r.returncode}"
    if r.leaked:
        extra += f"; left {len(r.leaked)} process(es) running"
    return f"[{r.suite:<5} {r.number:>{width}}/{total}] {status} {r.duration:7.1f}s  ({extra})"


def report(results: list[RunResult], planned: dict[str, int]) -> list[str]:
    """The end-of-session report: per-suite counts, then every failed run in detail."""
    out = ["", "== summary =="]
    for name, runs in planned.items():
        mine = [r for r in results if r.suite == name]
        ok = sum(r.passed for r in mine)
        durations = [r.duration for r in mine]
        timing = (f"; {min(durations):.1f}-{max(durations):.1f}s per run" if durations else "")
        missing = f" ({runs - len(mine)} not run)" if len(mine) < runs else ""
        out.append(f"{name:<5}: {ok} passed, {len(mine) - ok} failed of {len(mine)} runs{missing}{timing}")
    failed = [r for r in results if not r.passed]
    if not failed:
        return out
    out += ["", "== failures =="]
    for r in failed:
        out.append(f"-- {r.suite} run {r.number} ({r.duration:.1f}s, exit status "
                   f"{'timeout' if r.timed_out else r.returncode}): {r.log}")
        out.append(f"   repeat: {r.command}")
        if r.note:
            out.append(f"   {r.note}")
        if r.timed_out:
            out.append(f"   timed out while running {r.summary.running or '(unknown)'}")
            out.extend(f"     {ln}" for ln in r.summary.interrupted_at[:DETAIL_LINES])
            if r.summary.stacks:
                out.append("     stacks at the timeout (pytest's own frames left out):")
                out.extend(f"       {ln}" for ln in r.summary.stacks[:DETAIL_LINES])
        for f in r.summary.failures:
            out.append(f"   {f.kind} {f.test_id}" + (f" - {f.message}" if f.message else ""))
            shown = f.details[:DETAIL_LINES]
            out.extend(f"     {ln}" for ln in shown)
            if len(f.details) > len(shown):
                out.append(f"     ... {len(f.details) - len(shown)} more lines in the log")
        for p in r.leaked:
            out.append(f"   left running: {p}")
    return out


# ------------------------------------------------------------------------------- processes


def _die_with_parent(sig: int = signal.SIGTERM) -> None:
    """In a child before exec: send it sig when the soak runner dies, even by SIGKILL."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass


def _interrupt_with_parent() -> None:
    """A pytest child is interrupted (SIGINT: its fixtures stop their nodes) if the runner dies."""
    _die_with_parent(signal.SIGINT)


class CpuHog:
    """Keeps every core busy: stress-ng when installed, else Python busy loops."""

    def __init__(self, cores: int) -> None:
        self.cores = cores
        self.procs: list[subprocess.Popen] = []
        self.description = ""

    def start(self) -> "CpuHog":
        stress_ng = shutil.which("stress-ng")
        common = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                      start_new_session=True, preexec_fn=_die_with_parent)
        if stress_ng:
            self.procs.append(subprocess.Popen([stress_ng, "--cpu", str(self.cores), "--quiet"], **common))
            self.description = f"stress-ng --cpu {self.cores} (pid {self.procs[0].pid})"
        else:
            for _ in range(self.cores):
                self.procs.append(subprocess.Popen([sys.executable, "-c", _BUSY], **common))
            pids = ", ".join(str(p.pid) for p in self.procs)
            self.description = (f"stress-ng not installed: {self.cores} Python busy-loop "
                                f"process(es) (pids {pids})")
        return self

    def alive(self) -> bool:
        """Whether every hog process is still running."""
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        """Kill the hog (each process and the group it leads: stress-ng forks its workers)."""
        procs, self.procs = self.procs, []
        for p in procs:
            stop(p, 3.0, group=True)


def stop_run(proc: subprocess.Popen, grace: float = INTERRUPT_GRACE) -> None:
    """End a pytest run: stacks to its log, SIGINT (fixtures stop their nodes), then SIGTERM and
    SIGKILL to its whole process group."""
    if proc.poll() is None:
        signal_each([proc.pid], signal.SIGUSR1)
        time.sleep(0.2)  # the dump is written by the signal handler itself
        signal_each([proc.pid], signal.SIGINT)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    stop(proc, TERM_GRACE, group=True)


class Session:
    """Runs the scheduled pytest runs one after another and collects their results."""

    def __init__(self, opts: Options, session_dir: str) -> None:
        self.opts = opts
        self.dir = session_dir
        self.results: list[RunResult] = []
        self.current: subprocess.Popen | None = None
        self.current_log = ""

    def run(self, suite: Suite, number: int) -> RunResult:
        """One pytest run of suite; its log is kept only if it fails."""
        hash_seed = str(random.randrange(1, 2**32))
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONHASHSEED=hash_seed)
        env.update(suite.env)
        argv = [sys.executable, "-c", _CHILD, *_PYTEST_FLAGS, *suite.args]
        shown_env = " ".join(f"{k}={v}" for k, v in (*suite.env, ("PYTHONHASHSEED", hash_seed)))
        command = f"{shown_env} python -m pytest {shlex.join(suite.args)}"
        log_path = os.path.join(self.dir, f"{suite.name}-{number:03d}.log")
        started = time.monotonic()
        timed_out = False
        with open(log_path, "wb") as log:
            log.write(f"# {command}\n".encode())
            log.flush()
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=_interrupt_with_parent)
            self.current = proc  # until it ends: a Ctrl-C meanwhile stops it (abort_current)
            self.current_log = log_path
            try:
                proc.wait(self.opts.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                stop_run(proc)
            self.current = None
        duration = time.monotonic() - started
        leaked: list[str] = []
        if not wait_until(lambda: not group_members(proc.pid), LEAK_GRACE):
            leaked = group_members(proc.pid)
            signal_group(proc.pid, signal.SIGKILL)
        with open(log_path, "rb") as f:
            output = f.read().decode(errors="replace")
        summary = summarise(output)
        rc = proc.returncode
        passed = rc == 0 and not timed_out and not leaked
        note = ""
        if rc == 5:
            note = "pytest collected no tests (exit status 5)"
        elif rc not in (0, 1, None) and not timed_out:
            note = f"pytest exit status {rc} (2 interrupted, 3 internal error, 4 usage error)"
        if passed:
            os.unlink(log_path)
            log_path = ""
        result = RunResult(suite.name, number, passed, duration, rc, timed_out, summary, log_path,
                           command, leaked, note)
        self.results.append(result)
        return result

    def abort_current(self) -> str:
        """Stop the run in progress (on Ctrl-C), letting its fixtures clean up; its log's path."""
        proc, log = self.current, self.current_log
        if proc is None:
            return ""
        print(f"\ninterrupted: stopping pytest (pid {proc.pid}) and its processes "
              f"(^C again to kill them at once) ...", flush=True)
        stop_run(proc, grace=30.0)
        self.current = None
        return log


def collect(suite: Suite) -> tuple[int, str]:
    """How many tests suite selects, and pytest's output when that is none."""
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
            *suite.args]
    done = subprocess.run(argv, cwd=REPO, env=dict(os.environ, **dict(suite.env)),
                          capture_output=True, text=True, timeout=300)
    ids = [ln for ln in done.stdout.splitlines() if "::" in ln]
    return len(ids), (done.stdout + done.stderr) if not ids or done.returncode not in (0, 5) else ""


# ------------------------------------------------------------------------------- main


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run a soak session; the exit status (0 all passed, 1 a failure, 2 usage, 130 interrupted)."""
    opts = parse_args(argv)
    sim_files = sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, SIM_GLOB)))
    if opts.sim_runs and not sim_files:
        print(f"no simulation found ({SIM_GLOB})", file=sys.stderr)
        return 2
    suites = plan(opts, sim_files)
    for suite in suites:
        n, output = collect(suite)
        if output:
            print(f"{suite.name}: `pytest {shlex.join(suite.args)}` selects no tests:\n{output}",
                  file=sys.stderr)
            return 2
        print(f"{suite.name}: {n} test(s) from {shlex.join(suite.args)}"
              + (f" with {' '.join(f'{k}={v}' for k, v in suite.env)}" if suite.env else "")
              + f", {suite.runs} run(s)")

    stamp = time.strftime("%Y%m%d-%H%M%S")
    session_dir = os.path.abspath(os.path.join(opts.out, stamp))
    os.makedirs(session_dir, exist_ok=True)
    print(f"logs of failed runs: {session_dir}")
    session = Session(opts, session_dir)
    hog: CpuHog | None = None
    interrupted = False
    aborted_log = ""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGHUP, _raise_interrupt)
    started = time.monotonic()
    order = schedule(suites)
    totals = {s.name: s.runs for s in suites}
    try:
        if opts.stress:
            hog = CpuHog(os.cpu_count() or 1).start()
            atexit.register(hog.stop)
            print(f"stress: {hog.description}")
        print(flush=True)
        for suite, number in order:
            if hog is not None and not hog.alive():
                print("stress: the CPU hog died; restarting it", flush=True)
                hog.stop()
                hog.start()
            result = session.run(suite, number)
            print(run_line(result, totals[suite.name]), flush=True)
            if not result.passed and opts.stop_on_fail:
                print("stopping at the first failure (--stop-on-fail)")
                break
    except KeyboardInterrupt:
        interrupted = True
        try:
            aborted_log = session.abort_current()
        except KeyboardInterrupt:  # a second ^C: no more grace
            aborted_log = session.current_log
            if session.current is not None:
                signal_group(session.current.pid, signal.SIGKILL)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the cleanup below is not interrupted
        if hog is not None:
            hog.stop()
            print("stress: stopped")

    lines = report(session.results, totals)
    elapsed = time.monotonic() - started
    if aborted_log:
        lines.append(f"the run stopped by the interruption: {aborted_log}")
    lines.append("")
    lines.append(f"{len(session.results)} run(s) in {elapsed:.0f}s"
                 + (" (interrupted)" if interrupted else "")
                 + (f"; failed runs' logs in {session_dir}" if any(not r.passed for r in session.results)
                    else ""))
    print("\n".join(lines))
    with open(os.path.join(session_dir, "summary.txt"), "w") as f:
        f.write("\n".join(lines).lstrip("\n") + "\n")
    if interrupted:
        return 130
    return 0 if all(r.passed for r in session.results) else 1


if __name__ == "__main__":
    sys.exit(main())
