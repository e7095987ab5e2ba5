"""One frame per message between a node's processes (server/ipc.py pack / unpack): every part
survives, empty parts and an empty message included, and a frame that is not a packed message
is refused with ValueError rather than read as parts."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from queue_server.protocol import ipc_frames
from queue_server.server import ipc


@given(st.lists(st.binary(max_size=300), max_size=8))
def test_pack_round_trip(parts):
    assert ipc.unpack(ipc.pack(parts)) == parts


def test_a_real_message_round_trips():
    frames = ipc_frames.batch_frames(b"[]", b"[[1,false,0,5,3]]", b"{}\n", b"[]", 7)
    assert ipc.unpack(ipc.pack(frames)) == frames


@pytest.mark.parametrize("data", [b"", b"\x02\x01\x00\x00\x00", ipc.pack([b"abc"])[:-1], ipc.pack([b"abc"]) + b"x"])
def test_not_a_packed_message(data):
    with pytest.raises(ValueError):
        ipc.unpack(data)
