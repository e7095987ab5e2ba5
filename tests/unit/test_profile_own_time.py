"""load/profile.py's reading of py-spy's collapsed stacks: own time is the innermost frame's."""
from __future__ import annotations

from load.profile import own_time, top_lines


def test_own_time_counts_the_innermost_frame_by_function_and_file():
    collapsed = (
        "<module> (server/acceptor.py:529);main (server/acceptor.py:521) 120\n"
        "<module> (server/acceptor.py:529);main (server/acceptor.py:521);Connection.flush (server/acceptor.py:201) 30\n"
        "<module> (server/acceptor.py:529);main (server/acceptor.py:500);Connection.flush (server/acceptor.py:207) 10\n"
        "main (/x/lib/python3.11/site-packages/zmq/sugar/socket.py:10);Socket.send (/x/lib/python3.11/site-packages/zmq/sugar/socket.py:700) 5\n"
        "\n"
    )
    found = own_time(collapsed)
    assert found == {"main (server/acceptor.py)": 120, "Connection.flush (server/acceptor.py)": 40,
                     "Socket.send (zmq/sugar/socket.py)": 5}
    lines = top_lines("acceptor", found, 2)
    assert lines[0] == "acceptor: 165 samples with the process busy"
    assert lines[1].split() == ["72.7%", "120", "main", "(server/acceptor.py)"]
    assert len(lines) == 3
