"""The peer-message check (server/peer_check.py) and the key derivation (server/peer_keys.py)."""
from __future__ import annotations

import os

import pytest

from queue_server.server import peer_keys
from queue_server.server.peer_check import NOT_SENDER, OTHER_CLUSTER, UNKNOWN_SRC, peer_rejection

PEERS = {2, 3}


def check(src, sender, cluster=10, authenticated=True):
    return peer_rejection(src, sender, cluster, peers=PEERS, my_cluster=10, authenticated=authenticated)


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


def test_keys_are_derived_from_the_secret_and_the_node_id():
    secret = peer_keys.new_secret().encode()
    a1 = peer_keys.keypair(secret, 1)
    assert peer_keys.keypair(secret, 1) == a1  # every node computes the same keys
    assert peer_keys.keypair(secret, 2) != a1
    assert peer_keys.keypair(peer_keys.new_secret().encode(), 1) != a1
    assert len(a1[0]) == len(a1[1]) == 40  # z85 of 32 bytes
    assert peer_keys.public_keys(secret, [1, 2]) == {a1[0]: 1, peer_keys.keypair(secret, 2)[0]: 2}


def test_secret_file(tmp_path):
    path = str(tmp_path / "secret")
    peer_keys.write_secret(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert len(peer_keys.read_secret(path)) == 64
    with pytest.raises(OSError):
        peer_keys.write_secret(path)  # never overwritten
    (tmp_path / "short").write_text("abc\n")
    with pytest.raises(ValueError, match="config key 'cluster_secret_file'"):
        peer_keys.read_secret(str(tmp_path / "short"))
    with pytest.raises(ValueError, match="cannot read"):
        peer_keys.read_secret(str(tmp_path / "missing"))
