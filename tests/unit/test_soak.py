"""The soak runner's pure parts (load/soak.py): its command line, its schedule, and what it reads
out of pytest's output."""
from __future__ import annotations

import pytest

from load.soak import (
    FAULT,
    SIM,
    RunResult,
    Summary,
    parse_args,
    plan,
    report,
    run_line,
    schedule,
    summarise,
)

SIMS = ["tests/unit/test_cluster_sim.py"]

# The output of `pytest -vv -rfE` (pytest 9) on a file with a pass, an assertion with captured
# output, a parametrized failure, a method failure and a fixture error.
FAILING_RUN = """\
============================= test session starts ==============================
platform linux -- Python 3.11.7, pytest-9.0.3, pluggy-1.6.0
rootdir: /work/main
collecting ... collected 7 items / 1 deselected / 6 selected

tests/fault/test_x.py::test_ok PASSED                                    [ 16%]
tests/fault/test_x.py::test_fail FAILED                                  [ 33%]
tests/fault/test_x.py::test_param[1] PASSED                              [ 50%]
tests/fault/test_x.py::test_param[2] FAILED                              [ 66%]
tests/fault/test_x.py::TestK::test_m FAILED                              [ 83%]
tests/fault/test_x.py::test_err ERROR                                    [100%]

==================================== ERRORS ====================================
__________________________ ERROR at setup of test_err __________________________

    @pytest.fixture
    def bad():
>       raise ValueError("setup broke")
E       ValueError: setup broke

tests/fault/test_x.py:15: ValueError
=================================== FAILURES ===================================
__________________________________ test_fail ___________________________________

    def test_fail():
        print("history: a b c")
>       assert x == {"a": 2}, "the history says so"
E       AssertionError: the history says so
E       assert {'a': 1} == {'a': 2}

tests/fault/test_x.py:6: AssertionError
----------------------------- Captured stdout call -----------------------------
history: a b c
________________________________ test_param[2] _________________________________

n = 2

>       assert n == 1
E       assert 2 == 1

tests/fault/test_x.py:9: AssertionError
_________________________________ TestK.test_m _________________________________

>       raise RuntimeError("boom\\nsecond line")
E       RuntimeError: boom
E       second line

tests/fault/test_x.py:12: RuntimeError
=========================== short test summary info ============================
FAILED tests/fault/test_x.py::test_fail - AssertionError: the history says so
assert {'a': 1} == {'a': 2}
FAILED tests/fault/test_x.py::test_param[2] - assert 2 == 1
FAILED tests/fault/test_x.py::TestK::test_m - RuntimeError: boom
second line
ERROR tests/fault/test_x.py::test_err - ValueError: setup broke
============== 3 failed, 2 passed, 1 deselected, 1 error in 1.14s ==============
"""

# A run stopped at its time limit: a faulthandler dump (SIGUSR1) lands on the running test's
# progress line, then SIGINT makes pytest print where it was.
TIMED_OUT_RUN = """\
============================= test session starts ==============================
collecting ... collected 3 items

tests/fault/test_f.py::test_a PASSED                                     [ 33%]
tests/fault/test_f.py::test_hang Thread 0x00007f950e8f56c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007f951091eb80 (most recent call first):
  File "/work/main/tests/harness.py", line 45 in wait_for
  File "/work/main/tests/fault/test_f.py", line 9 in test_hang
  File "/usr/lib/python3.11/site-packages/_pytest/python.py", line 166 in pytest_pyfunc_call
  File "/usr/lib/python3.11/site-packages/pluggy/_callers.py", line 121 in _multicall
  File "<string>", line 5 in <module>


!!!!!!!!!!!!!!!!!!!!!!!!!!!!!! KeyboardInterrupt !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
/work/main/tests/harness.py:45: KeyboardInterrupt
(to show a full traceback on KeyboardInterrupt use --full-trace)
========================= 1 passed in 1200.03s (0:20:00) =========================
"""


# -- command line ---------------------------------------------------------------------------


def test_defaults() -> None:
    o = parse_args([])
    assert (o.runs, o.sim_runs, o.sim_seeds, o.stress, o.stop_on_fail) == (10, 10, None, False, False)
    assert o.out == "soak-out" and o.timeout > 600 and o.keyword is None and o.paths == ()
    assert [(s.name, s.runs, s.args, s.env) for s in plan(o, SIMS)] == [
        (FAULT, 10, ("tests/fault",), ()),
        (SIM, 10, tuple(SIMS), ()),
    ]


def test_selection_applies_to_the_fault_tests_only() -> None:
    o = parse_args(["--runs", "2", "--sim-runs", "1", "--sim-seeds", "20", "-k", "no_majority",
                    "--stress", "--timeout", "90", "--out", "/tmp/x", "--stop-on-fail",
                    "tests/fault/test_cluster_faults.py"])
    fault, sim = plan(o, SIMS + ["tests/unit/test_other_sim.py"])
    assert fault.args == ("tests/fault/test_cluster_faults.py", "-k", "no_majority")
    assert (fault.runs, fault.env) == (2, ())
    assert sim.args == (*SIMS, "tests/unit/test_other_sim.py")
    assert (sim.runs, sim.env) == (1, (("SIM_SEEDS", "20"),))
    assert o.stress and o.stop_on_fail and o.timeout == 90.0 and o.out == "/tmp/x"


def test_queue_groups_reach_the_fault_tests_clusters_through_the_environment() -> None:
    fault, sim = plan(parse_args(["--runs", "2", "--sim-runs", "1", "--queue-groups", "3"]), SIMS)
    assert fault.env == (("QUEUE_SERVER_TEST_QUEUE_GROUPS", "3"),) and sim.env == ()
    (fault,) = plan(parse_args(["--sim-runs", "0"]), SIMS)
    assert fault.env == ()  # one group: the harness's default


def test_a_suite_with_no_runs_is_left_out() -> None:
    assert [s.name for s in plan(parse_args(["--runs", "0", "--sim-runs", "3"]), SIMS)] == [SIM]
    assert [s.name for s in plan(parse_args(["--sim-runs", "0"]), SIMS)] == [FAULT]


@pytest.mark.parametrize("argv", [
    ["--runs", "-1"], ["--runs", "x"], ["--sim-seeds", "0"], ["--timeout", "0"],
    ["--timeout", "nan"], ["--runs", "0", "--sim-runs", "0"], ["--bogus"],
])
def test_bad_arguments_exit_with_status_2(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_suites_are_interleaved() -> None:
    suites = plan(parse_args(["--runs", "3", "--sim-runs", "1"]), SIMS)
    assert [(s.name, n) for s, n in schedule(suites)] == [
        (FAULT, 1), (SIM, 1), (FAULT, 2), (FAULT, 3)]


# -- pytest output ------------------------------------------------------------------------


def test_counts_and_failures_with_their_assertion_text() -> None:
    s = summarise(FAILING_RUN)
    assert s.counts == {"failed": 3, "passed": 2, "deselected": 1, "error": 1}
    assert s.running is None and s.interrupted_at == [] and s.stacks == []
    assert [(f.kind, f.test_id) for f in s.failures] == [
        ("FAILED", "tests/fault/test_x.py::test_fail"),
        ("FAILED", "tests/fault/test_x.py::test_param[2]"),
        ("FAILED", "tests/fault/test_x.py::TestK::test_m"),
        ("ERROR", "tests/fault/test_x.py::test_err"),
    ]
    fail, param, method, error = s.failures
    assert fail.message == "AssertionError: the history says so"
    assert fail.details == [
        "E       AssertionError: the history says so",
        "E       assert {'a': 1} == {'a': 2}",
        "tests/fault/test_x.py:6: AssertionError",
        "--- Captured stdout call",
        "history: a b c",
    ]
    assert param.details == ["E       assert 2 == 1", "tests/fault/test_x.py:9: AssertionError"]
    assert method.details[:2] == ["E       RuntimeError: boom", "E       second line"]
    assert error.details == ["E       ValueError: setup broke", "tests/fault/test_x.py:15: ValueError"]


def test_same_test_name_in_two_files_pairs_in_order() -> None:
    out = """\
=================================== FAILURES ===================================
___________________________________ test_a ___________________________________
E       assert 1 == 2
a.py:3: AssertionError
___________________________________ test_a ___________________________________
E       assert 3 == 4
b.py:3: AssertionError
=========================== short test summary info ============================
FAILED tests/a.py::test_a - assert 1 == 2
FAILED tests/b.py::test_a - assert 3 == 4
============================== 2 failed in 0.10s ===============================
"""
    a, b = summarise(out).failures
    assert (a.test_id, a.details[0]) == ("tests/a.py::test_a", "E       assert 1 == 2")
    assert (b.test_id, b.details[0]) == ("tests/b.py::test_a", "E       assert 3 == 4")


def test_a_failure_and_a_teardown_error_of_one_test() -> None:
    out = """\
==================================== ERRORS ====================================
_____________________ ERROR at teardown of test_t ______________________________
E       RuntimeError: node still running
h.py:1: RuntimeError
=================================== FAILURES ===================================
___________________________________ test_t ___________________________________
E       assert False
t.py:2: AssertionError
=========================== short test summary info ============================
FAILED t.py::test_t - assert False
ERROR t.py::test_t - RuntimeError: node still running
===================== 1 failed, 1 error in 0.10s =====================
"""
    s = summarise(out)
    assert s.counts == {"failed": 1, "error": 1}
    assert [(f.kind, f.details[0]) for f in s.failures] == [
        ("FAILED", "E       assert False"), ("ERROR", "E       RuntimeError: node still running")]


def test_sections_without_a_short_summary_are_still_reported() -> None:
    out = """\
=================================== FAILURES ===================================
___________________________________ test_a ___________________________________
E       assert 0
"""
    (f,) = summarise(out).failures
    assert (f.test_id, f.kind, f.message, f.details) == ("test_a", "FAILED", "", ["E       assert 0"])


def test_collection_error() -> None:
    out = """\
==================================== ERRORS ====================================
__________________ ERROR collecting tests/unit/test_bad_sim.py __________________
E   ModuleNotFoundError: No module named 'nope'
=========================== short test summary info ============================
ERROR tests/unit/test_bad_sim.py
!!!!!!!!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!!!!!!!!!!!!
=============================== 1 error in 0.12s ===============================
"""
    s = summarise(out)
    assert s.counts == {"error": 1}
    (f,) = s.failures
    assert f.test_id == "tests/unit/test_bad_sim.py"
    assert f.details == ["E   ModuleNotFoundError: No module named 'nope'"]


def test_timed_out_run_names_the_running_test_and_its_stacks() -> None:
    s = summarise(TIMED_OUT_RUN)
    assert s.counts == {"passed": 1}
    assert s.running == "tests/fault/test_f.py::test_hang"
    assert s.interrupted_at == ["/work/main/tests/harness.py:45: KeyboardInterrupt"]
    assert s.stacks == [
        "Thread 0x00007f950e8f56c0 (most recent call first):",
        '  File "/usr/lib/python3.11/threading.py", line 982 in run',
        "Current thread 0x00007f951091eb80 (most recent call first):",
        '  File "/work/main/tests/harness.py", line 45 in wait_for',
        '  File "/work/main/tests/fault/test_f.py", line 9 in test_hang',
    ]


def test_output_cut_short_and_empty_output() -> None:
    s = summarise("=== test session starts ===\ntests/fault/t.py::test_a PASSED [50%]\n"
                  "tests/fault/t.py::test_b ")
    assert s.running == "tests/fault/t.py::test_b" and s.counts == {} and s.failures == []
    assert summarise("") == Summary()


# -- report ----------------------------------------------------------------------------------


def _result(number: int, passed: bool, output: str = "", **kw) -> RunResult:
    fields = dict(suite=FAULT, number=number, passed=passed, duration=12.5,
                  returncode=0 if passed else 1, timed_out=False, summary=summarise(output),
                  log="" if passed else f"/o/fault-{number:03d}.log",
                  command="PYTHONHASHSEED=7 python -m pytest tests/fault")
    fields.update(kw)
    return RunResult(**fields)


def test_report_counts_per_suite_and_details_each_failure() -> None:
    results = [
        _result(1, True, "== 3 passed in 1.0s =="),
        _result(2, False, FAILING_RUN),
        _result(3, False, TIMED_OUT_RUN, timed_out=True, returncode=2, duration=1200.0),
        _result(4, False, "== 3 passed in 1.0s ==", leaked=["4242 python -m server.main"]),
    ]
    assert run_line(results[0], 10) == "[fault  1/10] PASS    12.5s  (3 passed)"
    assert run_line(results[2], 10).endswith(
        "(1 passed; TIMED OUT in tests/fault/test_f.py::test_hang)")
    assert run_line(results[3], 10).endswith("(3 passed; left 1 process(es) running)")
    text = "\n".join(report(results, {FAULT: 5, SIM: 2}))
    assert "fault: 1 passed, 3 failed of 4 runs (1 not run); 12.5-1200.0s per run" in text
    assert "sim  : 0 passed, 0 failed of 0 runs (2 not run)" in text
    assert "-- fault run 2 (12.5s, exit status 1): /o/fault-002.log" in text
    assert "   repeat: PYTHONHASHSEED=7 python -m pytest tests/fault" in text
    assert "   FAILED tests/fault/test_x.py::test_fail - AssertionError: the history says so" in text
    assert "     E       assert {'a': 1} == {'a': 2}" in text
    assert "   timed out while running tests/fault/test_f.py::test_hang" in text
    assert 'line 9 in test_hang' in text and "_pytest" not in text
    assert "   left running: 4242 python -m server.main" in text
    assert "== failures ==" not in "\n".join(report(results[:1], {FAULT: 1}))
