"""Clients for queue-server: QueueClient (blocking), AsyncQueueClient (asyncio), queue-cli."""
from .aio import AsyncQueueClient
from .credentials import TokenFile
from .errors import NoServerAvailable, QueueError, QueueTimeout
from .protocol import Message
from .sync import QueueClient
from .tls import TlsFiles

__all__ = [
    "AsyncQueueClient",
    "Message",
    "NoServerAvailable",
    "QueueClient",
    "QueueError",
    "QueueTimeout",
    "TlsFiles",
    "TokenFile",
]
