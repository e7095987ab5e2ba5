"""TLS on the client TCP port (tls_cert_file, tls_key_file, tls_ca_file) on real nodes, with a CA
and certificates made for the test run: round trips for every client, a client certificate
required and missing, and the clean errors of a plain client on a TLS port and the reverse."""
from __future__ import annotations

import asyncio
import ssl
import time

import pytest

from queue_server.client import AsyncQueueClient, NoServerAvailable, QueueClient, cli
from tests.harness import NodeProcess, free_port
from tests.tls_certs import make_tls_files


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_tls_files(str(tmp_path_factory.mktemp("tls")))


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory, certs):
    node = NodeProcess(str(tmp_path_factory.mktemp("tls-node")), {
        "in_memory": True, "tls_cert_file": certs.server_cert, "tls_key_file": certs.server_key}).start(serving=True)
    yield node
    node.stop()


@pytest.fixture(scope="module")
def mtls_node(tmp_path_factory, certs):
    node = NodeProcess(str(tmp_path_factory.mktemp("mtls-node")), {
        "in_memory": True, "tls_cert_file": certs.server_cert, "tls_key_file": certs.server_key,
        "tls_ca_file": certs.ca}, tls=trusting(certs, client_cert=True)).start(serving=True)
    yield node
    node.stop()


def trusting(certs, client_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=certs.ca)
    if client_cert:
        ctx.load_cert_chain(certs.client_cert, certs.client_key)
    return ctx


def test_tls_round_trip_with_every_client(tls_node, certs, capsys):
    with QueueClient(tls_node.hosts, tls=trusting(certs)) as q:
        q.produce("secure", "one", retry=30)
        m = q.consume("secure")
        assert m.data == "one" and q.confirm("secure", m.msg_id)
        q.produce("pushed", "two")
        with q.subscribe("pushed", credit=1) as sub:
            pushed = next(iter(sub))
            assert pushed.data == "two"

    async def aio() -> str:
        async with AsyncQueueClient(tls_node.hosts, tls=trusting(certs)) as q:
            await q.produce("secure", "three")
            got = await q.consume("secure", wait=2)
            return got.data

    assert asyncio.run(aio()) == "three"
    capsys.readouterr()
    assert cli.main(["--hosts", tls_node.hosts, "--tls-ca", certs.ca, "produce", "cli", "four"]) == 0
    assert cli.main(["--json", "--hosts", tls_node.hosts, "--tls-ca", certs.ca, "consume", "cli"]) == 0
    assert '"data":"four"' in capsys.readouterr().out


def test_a_plain_client_on_a_tls_port_gets_a_clean_error_at_once(tls_node, certs):
    started = time.monotonic()
    with QueueClient(tls_node.hosts, timeout=5) as plain:
        with pytest.raises(NoServerAvailable) as err:
            plain.produce("secure", "x")
    assert time.monotonic() - started < 4  # not a hang until the timeout
    assert "closed by the server before any reply (a node with TLS closes plain connections" in err.value.reason

    async def aio() -> None:
        async with AsyncQueueClient(tls_node.hosts, timeout=5) as q:
            await q.produce("secure", "x")

    with pytest.raises(NoServerAvailable, match="before any reply"):
        asyncio.run(aio())
    with QueueClient(tls_node.hosts, tls=trusting(certs)) as q:  # the node serves on
        assert q.monitor("secure")["code"] == 0


def test_a_tls_client_on_a_plain_port_and_an_untrusted_certificate_are_named(tmp_path, tls_node, certs):
    plain = NodeProcess(str(tmp_path), {"in_memory": True}).start()
    try:
        with QueueClient(plain.hosts, tls=trusting(certs), timeout=5) as q:
            with pytest.raises(NoServerAvailable, match="does not speak TLS on this port"):
                q.produce("x", "y")
    finally:
        plain.stop()
    with QueueClient(tls_node.hosts, tls=True, timeout=5) as q:  # the system's CAs: not ours
        with pytest.raises(NoServerAvailable, match="certificate is not trusted"):
            q.produce("x", "y")


def test_a_client_certificate_is_required_with_tls_ca_file(mtls_node, certs):
    with QueueClient(mtls_node.hosts, tls=trusting(certs), timeout=5) as q:
        with pytest.raises(NoServerAvailable, match="client certificate"):
            q.produce("mtls", "x")
    with QueueClient(mtls_node.hosts, tls=trusting(certs, client_cert=True)) as q:
        q.produce("mtls", "kept")
        assert q.consume("mtls").data == "kept"


def test_a_tls_file_that_cannot_be_loaded_stops_the_start_in_one_line(tmp_path, certs):
    from tests.integration.test_start_errors import assert_one_line, start
    path = tmp_path / "node.json"
    path.write_text(f'{{"in_memory": true, "tls_cert_file": "{certs.server_cert}", '
                    f'"tls_key_file": "{tmp_path / "missing.key"}"}}')
    code, out = start("--config", str(path), "--port", str(free_port()))
    assert code == 1
    assert_one_line(out, f"queue-server: config key 'tls_cert_file'/'tls_key_file': cannot load "
                         f"{certs.server_cert} with {tmp_path / 'missing.key'}: No such file or directory")


def test_the_http_port_speaks_tls_with_the_client_ports_certificate(tmp_path, certs):
    import json
    import urllib.error
    import urllib.request

    node = NodeProcess(str(tmp_path), {
        "in_memory": True, "tls_cert_file": certs.server_cert, "tls_key_file": certs.server_key,
        "http_port": free_port()}).start()
    try:
        base = f"127.0.0.1:{node.config['http_port']}"
        req = urllib.request.Request(f"https://{base}/v1/queues/web/messages", method="POST",
                                     data=json.dumps({"data": "over https"}).encode())
        with urllib.request.urlopen(req, context=trusting(certs), timeout=5) as r:
            assert r.status == 201 and json.loads(r.read())["code"] == 0
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP is not served
            urllib.request.urlopen(f"http://{base}/healthz", timeout=5)
    finally:
        node.stop()
