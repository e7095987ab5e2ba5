"""Stopping processes (load/procs.py): grace then SIGKILL, and nothing of a group or a tree left
behind. Real short-lived processes (sleep, python -c), no sockets."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from load.procs import group_members, kill_tree, signal_each, stop, stop_tree, wait_until
from tests.harness import alive

# A parent that starts a child that ignores SIGTERM (in a session of its own with argument 1, else
# in the parent's group), prints the child's pid and waits; SIGTERM ends the parent at once and
# leaves the child running.
_PARENT = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen(['sh', '-c', 'trap \"\" TERM; exec sleep 60'], start_new_session=sys.argv[1] == '1')\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(60)\n"
)
# Ignores SIGTERM: only SIGKILL ends it.
_STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint(flush=True)\ntime.sleep(60)\n"


def _parent(own_session: bool, new_session: bool = False) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", _PARENT, "1" if own_session else "0"],
                            stdout=subprocess.PIPE, text=True, start_new_session=new_session)
    return proc, int(proc.stdout.readline())


def _gone(pid: int) -> bool:
    return not alive(pid)


def test_stop_terminates_and_returns_the_exit_status():
    proc = subprocess.Popen(["sleep", "60"])
    try:
        assert stop(proc, 5.0) == -signal.SIGTERM
    finally:
        kill_tree(proc)


def test_stop_kills_what_ignores_sigterm_once_the_grace_is_over():
    proc = subprocess.Popen([sys.executable, "-c", _STUBBORN], stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()  # the handler is in place
        started = time.monotonic()
        assert stop(proc, 0.5) == -signal.SIGKILL
        assert time.monotonic() - started < 5
    finally:
        kill_tree(proc)


def test_stop_of_a_group_stops_the_orphans_its_leader_leaves():
    proc, child = _parent(own_session=False, new_session=True)
    try:
        stop(proc, 0.5, group=True)
        assert _gone(child)
        assert group_members(proc.pid) == []
    finally:
        kill_tree(proc)
        signal_each([child], signal.SIGKILL)


@pytest.mark.parametrize("end, status", [(lambda proc: stop_tree(proc, 5.0), -signal.SIGTERM),
                                         (kill_tree, -signal.SIGKILL)], ids=["stop_tree", "kill_tree"])
def test_a_tree_ends_with_children_in_sessions_of_their_own(end: Callable[[subprocess.Popen], int], status: int):
    proc, child = _parent(own_session=True)
    try:
        assert end(proc) == status
        assert wait_until(lambda: _gone(child), 5.0)
    finally:
        kill_tree(proc)
        signal_each([child], signal.SIGKILL)


def test_stop_of_a_group_stops_a_process_that_leads_no_group_of_its_own():
    proc = subprocess.Popen([sys.executable, "-c", _STUBBORN], stdout=subprocess.PIPE)  # in pytest's group
    try:
        proc.stdout.readline()
        started = time.monotonic()
        assert stop(proc, 0.5, group=True, kill_wait=2.0) == -signal.SIGKILL
        assert time.monotonic() - started < 5
    finally:
        kill_tree(proc)
