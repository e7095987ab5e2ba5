"""Clients pickled into another process (multiprocessing's spawn: a fresh interpreter, as a Spark
executor is) keep their token and TLS settings: against a real node that requires a token and a
client certificate (auth_token_file, tls_ca_file), the copies of a QueueClient, an
AsyncQueueClient and a Subscription authenticate and work there. Given as files (TokenFile,
TlsFiles), what travels is the paths, not the token or the key."""
from __future__ import annotations

import asyncio
import multiprocessing
import pickle
import ssl
from typing import Any

import pytest

from queue_server.client import AsyncQueueClient, QueueClient
from queue_server.client.credentials import TokenFile
from queue_server.client.tls import TlsFiles
from tests.harness import NodeProcess
from tests.tls_certs import make_tls_files

TOKEN = "pickled-token"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A node with a client token and TLS requiring a client certificate; (node, certs, token file)."""
    workdir = tmp_path_factory.mktemp("pickle-node")
    certs = make_tls_files(str(workdir))
    token_file = workdir / "token"
    token_file.write_text(TOKEN + "\n")
    harness_tls = ssl.create_default_context(cafile=certs.ca)
    harness_tls.load_cert_chain(certs.client_cert, certs.client_key)
    node = NodeProcess(str(workdir), {
        "in_memory": True, "auth_token_file": str(token_file), "tls_cert_file": certs.server_cert,
        "tls_key_file": certs.server_key, "tls_ca_file": certs.ca}, tls=harness_tls).start(serving=True)
    yield node, certs, str(token_file)
    node.stop()


def _use(sync: QueueClient, aio: AsyncQueueClient, sub: Any, out: Any) -> None:
    """In the spawned process: each copy produces, consumes or is pushed to; what it got, or the
    error, goes back on `out`."""
    try:
        got = {}
        with sync:
            sync.produce("pickled", "sync")
            got["sync"] = sync.consume("pickled").data

        async def aio_round() -> str:
            async with aio:
                await aio.produce("pickled", "async")
                return (await aio.consume("pickled", wait=5)).data
        got["async"] = asyncio.run(aio_round())
        with sub:
            got["subscription"] = next(iter(sub)).data
        out.put(got)
    except BaseException as exc:  # the parent shows it
        out.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.parametrize("given", ["files", "token string"])
def test_pickled_clients_authenticate_over_tls_in_a_spawned_process(secured, given):
    node, certs, token_file = secured
    files = TlsFiles(ca_file=certs.ca, cert_file=certs.client_cert, key_file=certs.client_key)
    token: Any = TokenFile(token_file) if given == "files" else TOKEN
    sync = QueueClient(node.hosts, token=token, tls=files)
    aio = AsyncQueueClient(node.hosts, token=token, tls=files)
    sync.produce("pushed", "first")
    sync.produce("pushed", "second")
    sub = sync.subscribe("pushed", credit=1)
    assert next(iter(sub)).data == "first"  # subscribed here: its connection is open (and "first" gone: at most once)
    blob = pickle.dumps((sync, aio, sub))
    assert b"PRIVATE KEY" not in blob
    assert (TOKEN.encode() in blob) == (given == "token string")

    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    child = spawn.Process(target=_use, args=(sync, aio, sub, out))
    child.start()  # pickles them (the subscription still open here: its copy is not closed)
    sub.close()  # its credit was held by "first": "second" is pushed to the copy
    sync.close()
    try:
        got = out.get(timeout=60)
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
            child.join()
    assert got == {"sync": "sync", "async": "async", "subscription": "second"}, got
    assert child.exitcode == 0
