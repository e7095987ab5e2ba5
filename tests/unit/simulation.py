"""Running a randomized simulation over many seeds (tests/unit/test_*sim.py)."""
from __future__ import annotations

from typing import Any, Callable


def run_seeds(make: Callable[[int, int], Any], n: int, seeds: range) -> list[str]:
    """Run make(seed, n).run() for every seed; one line per seed that failed, with its first
    violation (a crash of the code under test counts as one)."""
    failures = []
    for seed in seeds:
        sim = make(seed, n)
        try:
            sim.run()
        except Exception as exc:
            failures.append(f"N={n} seed={seed} t={sim.now:.3f}: {type(exc).__name__}: {exc}")
    return failures


def assert_seeds_pass(make: Callable[[int, int], Any], n: int, seeds: range) -> None:
    """Fail, listing every failed seed with its first violation, unless all seeds pass."""
    failures = run_seeds(make, n, seeds)
    assert not failures, "\n".join(failures)
