"""election/balance.py: when a group's leader hands the group to its preferred leader."""
from __future__ import annotations

from queue_server.election.balance import BALANCE_LAG, BALANCE_SETTLE, Balance

T0 = 1_000.0


def test_the_preferred_leader_gets_the_group_once_it_has_kept_up_for_the_settle_time():
    b = Balance(1, preferred=2)
    assert b.check(T0, True, 500, {2: 500, 3: 500}, live=True, busy=False) is None  # caught up from now
    assert b.check(T0 + BALANCE_SETTLE - 0.1, True, 600, {2: 590}, live=True, busy=False) is None
    assert b.check(T0 + BALANCE_SETTLE, True, 600, {2: 590}, live=True, busy=False) == 2
    assert b.check(T0 + BALANCE_SETTLE + 1, True, 600, {2: 600}, live=True, busy=False) is None  # the clock starts again


def test_falling_behind_or_going_silent_starts_the_settle_time_again():
    b = Balance(1, preferred=2)
    b.check(T0, True, 500, {2: 500}, live=True, busy=False)
    assert b.check(T0 + 3, True, 500 + BALANCE_LAG + 1, {2: 500}, live=True, busy=False) is None  # behind
    b.check(T0 + 4, True, 600, {2: 600}, live=True, busy=False)
    assert b.check(T0 + 6, True, 600, {2: 600}, live=False, busy=False) is None  # silent
    b.check(T0 + 7, True, 600, {2: 600}, live=True, busy=False)
    assert b.check(T0 + 7 + BALANCE_SETTLE, True, 600, {2: 600}, live=True, busy=False) == 2


def test_no_move_by_the_preferred_leader_itself_a_follower_a_group_without_one_or_during_a_hand_off():
    assert Balance(2, preferred=2).check(T0 + 99, True, 1, {1: 1}, live=True, busy=False) is None
    assert Balance(1, preferred=None).check(T0 + 99, True, 1, {}, live=False, busy=False) is None
    b = Balance(1, preferred=2)
    b.check(T0, True, 1, {2: 1}, live=True, busy=False)
    assert b.check(T0 + BALANCE_SETTLE, True, 1, {2: 1}, live=True, busy=True) is None  # one move at a time
    assert b.check(T0 + BALANCE_SETTLE + 1, True, 1, {2: 1}, live=True, busy=False) == 2  # its turn now
    b.check(T0 + 20, True, 1, {2: 1}, live=True, busy=False)
    assert b.check(T0 + 30, False, 1, {2: 1}, live=True, busy=False) is None  # no longer leads
    assert b.caught_up_since is None
