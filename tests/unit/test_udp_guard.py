"""The UDP amplification guard's arithmetic (server/udp_guard.py)."""
from queue_server.server.udp_guard import reply_limit


def test_guarded_unauthenticated_replies_are_bounded_by_the_request():
    assert reply_limit(40, 60000, 3, guarded=True, authenticated=False) == 120
    assert reply_limit(30000, 60000, 3, guarded=True, authenticated=False) == 60000  # never above udp_max_response


def test_loopback_authenticated_or_off_is_udp_max_response():
    assert reply_limit(40, 60000, 3, guarded=False, authenticated=False) == 60000
    assert reply_limit(40, 60000, 3, guarded=True, authenticated=True) == 60000
    assert reply_limit(40, 60000, 0, guarded=True, authenticated=False) == 60000
