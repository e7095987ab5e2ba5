"""The peer-message check (server/peer_check.py) and the key derivation (server/peer_keys.py)."""
from __future__ import annotations

import os

import pytest
import zmq

from queue_server.server import peer_keys
from queue_server.server.peer_check import NOT_SENDER, OTHER_CLUSTER, OTHER_PLACEMENT, UNKNOWN_SRC, peer_rejection

PEERS = {2, 3}


def check(src, sender, cluster=10, authenticated=True, placement=0, my_placement=0):
    return peer_rejection(src, sender, cluster, peers=PEERS, my_cluster=10, authenticated=authenticated,
                          placement_hash=placement, my_placement=my_placement)


def test_a_peer_speaking_for_itself_passes():
    assert check(2, 2) is None
    assert check(3, 3) is None


@pytest.mark.parametrize("src", [0, 1, 4, 2**32 - 1])
def test_src_must_be_another_configured_node(src):
    assert check(src, src) == UNKNOWN_SRC  # 1 is this node: never a peer message's src


def test_src_must_be_the_authenticated_node():
    assert check(3, 2) == NOT_SENDER
    assert check(2, None) == NOT_SENDER  # authenticated wire, but no User-Id: refused


def test_without_authentication_the_sender_is_not_checked():
    assert check(3, None, authenticated=False) is None
    assert check(4, None, authenticated=False) == UNKNOWN_SRC


def test_cluster_id_must_match():
    assert check(2, 2, cluster=11) == OTHER_CLUSTER
    assert check(2, 2, cluster=0) == OTHER_CLUSTER
    assert check(2, None, cluster=11, authenticated=False) == OTHER_CLUSTER


def test_placement_hash_must_match():
    """A peer that puts queues in other groups (or on other replicas) is dropped, whichever side
    has the default placement (hash 0)."""
    assert check(2, 2, placement=0xDEADBEEF, my_placement=0xDEADBEEF) is None
    assert check(2, 2, placement=0xDEADBEEF) == OTHER_PLACEMENT
    assert check(2, 2, my_placement=0xDEADBEEF) == OTHER_PLACEMENT
    assert check(2, 2, placement=1, my_placement=2) == OTHER_PLACEMENT
    assert check(2, 2, cluster=11, placement=1) == OTHER_CLUSTER  # the first reason names it


def test_keys_are_derived_from_the_secret_and_the_node_id():
    secret = peer_keys.new_secret().encode()
    a1 = peer_keys.keypair(secret, 1)
    assert peer_keys.keypair(secret, 1) == a1  # every node computes the same keys
    assert peer_keys.keypair(secret, 2) != a1
    assert peer_keys.keypair(peer_keys.new_secret().encode(), 1) != a1
    assert len(a1[0]) == len(a1[1]) == 40  # z85 of 32 bytes
    assert peer_keys.public_keys([secret], [1, 2]) == {a1[0]: 1, peer_keys.keypair(secret, 2)[0]: 2}


def test_during_a_rotation_every_pair_of_nodes_has_a_link_that_handshakes_and_is_admitted():
    """A rotation's files: [old] -> [old, new] -> [new, old] -> [new], a node at a time. A
    node's own keys are its first secret's, it admits the keys of every line (ZAP), and it
    connects once per line (PeerLink): A reaches B when one of A's secrets is B's first (that
    connection's server key is right), and B admits A's own key."""
    old, new = peer_keys.new_secret().encode(), peer_keys.new_secret().encode()
    steps = [[old], [old, new], [new, old], [new]]

    def reaches(a: list[bytes], b: list[bytes]) -> bool:
        admitted = peer_keys.public_keys(b, [1])
        served = peer_keys.keypair(b[0], 2)[0]
        return peer_keys.keypair(a[0], 1)[0] in admitted and any(peer_keys.keypair(s, 2)[0] == served for s in a)

    for before, after in zip(steps, steps[1:]):  # mid-step: some nodes restarted, others not
        for a, b in ((before, after), (after, before), (before, before), (after, after)):
            assert reaches(a, b), (a, b)
    assert not reaches([old], [new]) and not reaches([new], [old])  # skipping a step cuts the link
    assert not reaches([old], [new, old])  # ...so does swapping before every node has both


def test_secret_file_lines(tmp_path):
    path = tmp_path / "secret"
    path.write_text("# rotation, step 2\n" + "n" * 64 + "\n\n  " + "o" * 64 + "  \n")
    assert peer_keys.read_secrets(str(path)) == [b"n" * 64, b"o" * 64]
    path.write_text("o" * 64 + "\nshort\n")
    with pytest.raises(ValueError, match="holds a line that is no secret of at least 16"):
        peer_keys.read_secrets(str(path))


class FakeSocket:
    def __init__(self, connected: bool) -> None:
        self.connected, self.sent = connected, []

    def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
        if not self.connected:
            raise zmq.Again()
        self.sent.append(frames)


def test_a_peer_link_sends_on_the_socket_that_handshook_and_keeps_to_it():
    wrong_key, right_key = FakeSocket(False), FakeSocket(True)
    link = peer_keys.PeerLink([wrong_key, right_key])
    link.send([b"a"])
    link.send([b"b", b"c"])  # one message of two frames
    assert right_key.sent == [[b"a"], [b"b", b"c"]] and link.sockets[0] is right_key
    right_key.connected = False  # the peer restarted with the other secret first
    wrong_key.connected = True
    link.send([b"c"])
    assert wrong_key.sent == [[b"c"]]
    wrong_key.connected = False
    with pytest.raises(zmq.Again):  # not connected: the caller counts it unsent
        link.send([b"d"])


def test_secret_file(tmp_path):
    path = str(tmp_path / "secret")
    peer_keys.write_secret(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert peer_keys.read_secrets(path) == [open(path, "rb").read().strip()] and len(peer_keys.read_secrets(path)[0]) == 64
    with pytest.raises(OSError):
        peer_keys.write_secret(path)  # never overwritten
    (tmp_path / "short").write_text("abc\n")
    with pytest.raises(ValueError, match="config key 'cluster_secret_file'"):
        peer_keys.read_secrets(str(tmp_path / "short"))
    with pytest.raises(ValueError, match="cannot read"):
        peer_keys.read_secrets(str(tmp_path / "missing"))
