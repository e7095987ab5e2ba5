"""Every reply a PartitionService made, for tests that drive one as a worker does."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from queue_server.protocol.origin import Origin
    from queue_server.workers.service import PartitionService


def take_replies(service: PartitionService) -> list[tuple[Origin, int, dict]]:
    """The replies `service` made since they were last taken, whichever way each leaves (through
    the coordinator: `replies`, or straight to the acceptor: `direct`); both are emptied."""
    taken = service.replies + service.direct
    service.replies.clear()
    service.direct.clear()
    return taken
