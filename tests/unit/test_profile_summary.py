"""load/profile.py's reading of py-spy's raw stacks: own time is counted for the innermost
function of each stack, by function (not by line), and the table is ordered by it."""
from __future__ import annotations

from load.profile import own_time, summary

RAW = """\
main (a.py:1);run (a.py:10);send (zmq.py:713) 30
main (a.py:1);run (a.py:10);send (zmq.py:715) 10
main (a.py:1);run (a.py:11) 20
main (a.py:1);poll (zmq.py:106) 40
"""


def test_own_time_by_innermost_function():
    leaves, total = own_time(RAW)
    assert total == 100
    assert leaves == {"send (zmq.py)": 40, "run (a.py)": 20, "poll (zmq.py)": 40}


def test_summary_lists_the_most_expensive_first():
    rows = [line for line in summary("coordinator", RAW, 2).splitlines() if line.startswith("| 4")]
    assert len(rows) == 2 and all("40.0" in r for r in rows)
