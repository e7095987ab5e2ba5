"""The acceptor's connection limits (server/limits.py), with a fake clock."""
from queue_server.server.limits import idle, over_connection_limit, too_many_connections


def test_connection_limit():
    assert not over_connection_limit(10, 10)
    assert over_connection_limit(11, 10)
    assert not over_connection_limit(10**6, 0)  # 0: no limit
    assert "max_connections (10)" in too_many_connections(10)


def test_idle_connections():
    conns = [(1, 100.0, False), (2, 100.0, True), (3, 150.0, False)]
    assert idle(conns, 159.9, 60) == []
    assert idle(conns, 160.0, 60) == [1]  # 2 waits on a long poll or a subscription
    assert idle(conns, 1000.0, 60) == [1, 3]
    assert idle(conns, 1000.0, 0) == []  # 0: never
