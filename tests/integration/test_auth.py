"""Client authentication on a real node (config auth_token_file): over TCP an auth request
first, over UDP an auth_token in every datagram; the clients and queue-cli present the token."""
from __future__ import annotations

import asyncio
import io
import socket
import sys

import pytest

from queue_server.client import AsyncQueueClient, QueueClient, QueueError, cli
from tests.harness import NodeProcess, RawTcp, udp_call, wait_for

TOKEN = "correct horse battery staple"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("auth")
    (workdir / "token").write_text(TOKEN + "\n")
    node = NodeProcess(str(workdir), {"auth_token_file": str(workdir / "token")}).start()
    yield node
    node.stop()


def closed(conn: RawTcp) -> bool:
    conn.sock.settimeout(5)
    return conn.sock.recv(1) == b""


def test_a_request_before_auth_is_refused_and_the_connection_closed(secured):
    conn = RawTcp(*secured.address)
    conn.send({"action": 1, "queue": "q", "data": "x", "seq": 1})
    conn.send({"action": 1, "queue": "q", "data": "y", "seq": 2})
    conn.send(b"x" * 100_000)  # more unread input: closing must still not reset the connection
    reply = conn.recv()
    assert (reply["code"], reply["seq"]) == (-1, 1) and reply["reason"].startswith("authentication required")
    assert closed(conn)  # a FIN after the reply, not a reset that could have destroyed it
    conn.close()
    assert monitor_size(secured, "q") == 0  # neither was stored


def test_a_wrong_token_is_refused_without_echoing_it(secured):
    conn = RawTcp(*secured.address)
    reply = conn.call({"action": "auth", "token": "guess", "seq": 7})
    assert (reply["code"], reply["reason"], reply["seq"]) == (-1, "authentication failed", 7)
    assert "token" not in reply
    assert closed(conn)
    conn.close()


def test_the_right_token_opens_the_connection(secured):
    conn = RawTcp(*secured.address)
    reply = conn.call({"action": 9, "token": TOKEN})
    assert reply["code"] == 0 and "token" not in reply
    assert conn.call({"action": 1, "queue": "tcp-ok", "data": "x"})["code"] == 0
    conn.close()


def test_repeated_failures_from_one_address_are_refused_unchecked(tmp_path):
    (tmp_path / "token").write_text(TOKEN)
    node = NodeProcess(str(tmp_path), {"auth_token_file": str(tmp_path / "token")}).start()
    try:
        reasons = []
        for _ in range(6):
            conn = RawTcp(*node.address)
            reasons.append(conn.call({"action": "auth", "token": "guess"})["reason"])
            conn.close()
        conn = RawTcp(*node.address)
        reasons.append(conn.call({"action": "auth", "token": TOKEN}).get("reason"))
        conn.close()
        assert reasons[:5] == ["authentication failed"] * 5
        assert all(r.startswith("authentication failed: too many failures") for r in reasons[5:])
    finally:
        node.stop()


def test_udp_without_a_valid_auth_token_gets_no_reply(secured):
    host, port = secured.address
    for request in ({"action": 1, "queue": "u", "data": "x"},
                    {"action": 1, "queue": "u", "data": "x", "auth_token": "guess"},
                    {"action": 1, "queue": "u", "data": "x", "token": TOKEN}):
        with pytest.raises(socket.timeout):
            udp_call(host, port, request, timeout=0.5)
    reply = udp_call(host, port, {"action": 1, "queue": "u", "data": "x", "auth_token": TOKEN})
    assert reply["code"] == 0 and "auth_token" not in reply
    assert monitor_size(secured, "u") == 1


def test_queue_cli_over_udp_without_a_token_says_a_token_may_be_missing(secured, monkeypatch):
    monkeypatch.delenv("QUEUE_TOKEN", raising=False)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert cli.main(["--hosts", secured.hosts, "--udp", "--timeout", "0.5", "list"]) == 2
    [line] = err.getvalue().splitlines()
    assert line.startswith("queue-cli: ") and line.endswith(
        "(over UDP, a node that requires a token does not answer without one: --token-file FILE, or $QUEUE_TOKEN)")


@pytest.mark.parametrize("transport", ["tcp", "udp"])
def test_clients_present_their_token(secured, transport):
    with QueueClient(secured.hosts, transport=transport, token=TOKEN) as q:
        q.produce(f"clients-{transport}", "x")
        assert q.consume(f"clients-{transport}").data == "x"
    with pytest.raises(QueueError, match="authentication failed"):
        with QueueClient(secured.hosts, token="guess") as q:
            q.produce("clients", "x")

    async def main() -> str:
        async with AsyncQueueClient(secured.hosts, transport=transport, token=TOKEN) as q:
            await q.produce(f"aio-{transport}", "y")
            return (await q.consume(f"aio-{transport}")).data
    assert asyncio.run(main()) == "y"


def test_queue_cli_reads_the_token_from_a_file_or_the_environment(secured, tmp_path, monkeypatch):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert cli.main(["--hosts", secured.hosts, "--token-file", str(token_file), "produce", "cli", "x"]) == 0
    monkeypatch.setenv("QUEUE_TOKEN", TOKEN)
    assert cli.main(["--hosts", secured.hosts, "produce", "cli", "y"]) == 0
    monkeypatch.setenv("QUEUE_TOKEN", "guess")
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert cli.main(["--hosts", secured.hosts, "produce", "cli", "z"]) == 1


@pytest.mark.parametrize("token", [None, "guess"], ids=["no token", "wrong token"])
def test_queue_cli_refused_says_how_to_give_the_token(secured, monkeypatch, token):
    monkeypatch.delenv("QUEUE_TOKEN", raising=False)
    if token:
        monkeypatch.setenv("QUEUE_TOKEN", token)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert cli.main(["--hosts", secured.hosts, "list"]) == 1
    [line] = err.getvalue().splitlines()
    assert line.startswith("queue-cli: authentication ")
    assert line.endswith("(queue-cli gives the nodes' token from --token-file FILE, or $QUEUE_TOKEN)")


def test_with_auth_off_an_auth_request_is_answered_ok(node):
    conn = RawTcp(*node.address)
    assert conn.call({"action": "auth", "token": "anything"})["code"] == 0
    conn.close()
    with QueueClient(node.hosts, token="anything") as q:
        q.produce("auth-off", "x")


def monitor_size(node: NodeProcess, queue: str) -> int:
    with QueueClient(node.hosts, token=TOKEN) as q:
        return wait_for(lambda: q.monitor(queue), 5, "monitor")["size"]
