"""The cluster's peer keys (config `cluster_secret_file`): every node's CURVE keypair is derived
from the shared secret and its node id, so that each node can compute every peer's public key.
The coordinator's peer sockets run CURVE (authenticated and encrypted); a ZAP authenticator
admits only the cluster's keys and names each connection by its node id (the frames' User-Id).

The file may hold several secrets, one per line, for a rotation without downtime
(docs/security.md): a node's own keys are those of the first (it serves and connects with them),
it admits peers holding the keys of any line, and it connects to each peer once per line, each
connection expecting the peer's server key under that line's secret (PeerLink): whichever of
them the peer serves with, one connection completes its handshake.
"""
from __future__ import annotations

import hashlib
import logging

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

# The secret file's functions, here too as the peer wire's: the secrets its keys derive from.
from queue_server.server.secret_file import new_secret, read_secrets, write_secret  # noqa: F401

_PERSON = b"qs-peer-curve"  # domain separation: these keys are for the peer wire only


def keypair(secret: bytes, node_id: int) -> tuple[bytes, bytes]:
    """(public, secret) CURVE keys of node `node_id`, z85-encoded."""
    raw = hashlib.blake2b(str(node_id).encode(), key=hashlib.sha256(secret).digest(), person=_PERSON, digest_size=32).digest()
    secret_key = z85.encode(raw)
    return zmq.curve_public(secret_key), secret_key


def public_keys(secrets_: list[bytes], node_ids: list[int]) -> dict[bytes, int]:
    """The public key (z85) of each node under each secret -> its node id."""
    return {keypair(secret, n)[0]: n for secret in secrets_ for n in node_ids}


class PeerAuthenticator(ThreadAuthenticator):
    """ZAP for the peer socket: admits the cluster's keys, names each by its node id."""

    def __init__(self, ctx: zmq.Context, keys: dict[bytes, int]) -> None:
        super().__init__(ctx, log=logging.getLogger("queue_server.zap"))
        self.keys = keys
        self.refused = 0  # connections that did not hold a cluster key

    def start(self) -> None:
        super().start()
        self.configure_curve_callback("*", credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP: is `key` (z85) one of the cluster's?"""
        if key in self.keys:
            return True
        self.refused += 1
        return False

    def curve_user_id(self, client_public_key: bytes) -> str:
        return str(self.keys[z85.encode(client_public_key)])


def serve_curve(sock: zmq.Socket, secret: bytes, node_id: int) -> None:
    """Make `sock` (before bind) a CURVE server with node `node_id`'s keys."""
    public, secret_key = keypair(secret, node_id)
    sock.curve_secretkey = secret_key
    sock.curve_publickey = public
    sock.curve_server = True


def connect_curve(sock: zmq.Socket, secret: bytes, node_id: int, server_secret: bytes, server_id: int) -> None:
    """Make `sock` (before connect) a CURVE client, as node `node_id` with `secret`'s keys, of node
    `server_id` serving with `server_secret`'s."""
    public, secret_key = keypair(secret, node_id)
    sock.curve_secretkey = secret_key
    sock.curve_publickey = public
    sock.curve_serverkey = keypair(server_secret, server_id)[0]


class PeerLink:
    """The way to one peer: a DEALER per secret, each expecting the peer's server key under that
    secret. The peer serves with one of them, so only that socket completes its handshake; with
    IMMEDIATE set the others take no message (Again), and send() uses the one that does."""

    def __init__(self, sockets: list[zmq.Socket]) -> None:
        self.sockets = sockets

    def send(self, frames: list[bytes]) -> None:
        """Send the frames as one message, without blocking, on the first socket that takes it
        (and try that one first next time). zmq.Again if none does: not connected yet, or too
        far behind. ZeroMQ delivers a message's frames all or none."""
        sockets = self.sockets
        for i, sock in enumerate(sockets):
            try:
                sock.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                continue
            if i:
                sockets.insert(0, sockets.pop(i))
            return
        raise zmq.Again()

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(linger=0)
