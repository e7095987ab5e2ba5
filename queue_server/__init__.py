"""queue-server: a distributed in-memory message queue speaking the JSON protocol of the C++
queue_server.

    from queue_server import QueueClient

    with QueueClient("127.0.0.1:1111") as q:
        q.produce("jobs", "hello", retry=30)

The installed package maps the repository's folders into one namespace, layered bottom-up:
queue_server.protocol (the wire vocabulary, codecs and log records), queue_server.config, the
pure cores in queue_server.workers, queue_server.replication and queue_server.election, the
processes in queue_server.server (acceptor, worker, coordinator, supervisor), and on top the
clients: queue_server.client and queue_server.spark. docs/architecture.md follows a request through them.
"""
import os as _os

_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isdir(_os.path.join(_root, "client")):
    # Imported from a source checkout (Python started in the repository, which shadows an
    # installed copy): the checkout's top-level folders are the subpackages, as installed.
    __path__.append(_root)

# The clients are the package's public face, imported at first use (PEP 562): the node's
# processes import queue_server too, and the clients' asyncio and TLS cost each of them ~0.3 s
# of start-up.
__all__ = ["AsyncQueueClient", "Message", "NoServerAvailable", "QueueClient", "QueueError", "QueueTimeout",
           "TlsFiles", "TokenFile"]


def __getattr__(name: str) -> object:
    if name in __all__:
        from queue_server import client
        return getattr(client, name)
    raise AttributeError(f"module 'queue_server' has no attribute {name!r}")
