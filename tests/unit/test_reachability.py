"""The no-leader report (server/reachability.py), with a fake clock."""
from __future__ import annotations

from queue_server.server.reachability import REPORT_EVERY, Reachability


def test_reports_every_interval_without_a_leader_naming_silent_peers():
    r = Reachability({2: "10.0.0.2:1101", 3: "10.0.0.3:1101"}, started=100.0)
    assert r.report(False, 105.0) is None  # not yet: one line per interval
    r.heard(3, "VoteReply", 109.5)
    r.heard(9, "Heartbeat", 109.5)  # not a configured peer: ignored
    line = r.report(False, 100.0 + REPORT_EVERY)
    assert line == ("no leader for 10 s: 2 of 3 nodes reachable, a majority is 2; "
                    "node 2 (10.0.0.2:1101) never heard from")
    assert r.report(False, 111.0) is None
    line = r.report(False, 120.0)
    assert "node 3 (10.0.0.3:1101) last heard 10.5 s ago (VoteReply)" in line
    assert line.startswith("no leader for 20 s: 1 of 3 nodes reachable")


def test_quiet_while_a_leader_is_known_and_counts_again_after():
    r = Reachability({2: "b:1", 3: "c:1"}, started=0.0)
    assert r.report(True, 50.0) is None
    assert r.report(False, 55.0) is None
    assert r.report(False, 64.9) is None
    assert r.report(False, 65.0).startswith("no leader for 10 s")
