"""Which worker owns a queue: a stable hash of the queue's routing key (protocol/placement.py).
Queues bound together by a virtual queue share one routing key, so a produce to the virtual queue
is served by one worker and can be all-or-none. A dead-letter queue `<q><suffix>` has the routing
key of `<q>`, so that moving a message into it or back is one worker's one replicated write."""
from __future__ import annotations

from typing import Any, Iterable

from queue_server.protocol import ipc_frames
from queue_server.protocol.placement import RoutingKeys
from queue_server.protocol import vocabulary as p
from queue_server.protocol.origin import Origin

_MONITORS = frozenset({p.MONITOR, p.LOCAL_MONITOR})
SCATTER_ACTIONS = frozenset({p.MONITOR, p.LOCAL_MONITOR, p.LIST, p.LOCAL_LIST})


class Router:
    """Maps queue names (real or virtual) to worker indexes; the same on every node."""

    def __init__(self, workers: int, virtual_queues: Iterable[tuple[str, Iterable[str]]] = (),
                 dead_letter_suffix: str = "", *, first_gather: int = 0, groups: int = 1) -> None:
        """dead_letter_suffix: config `dead_letter_suffix` ("" for none); it must be the same on
        every node, like `workers` and `groups` (config `queue_groups`). first_gather: the gather id of the first scatter request this
        router plans; the next ones follow in steps of two, so that the acceptor (even, from 0) and
        the coordinator (odd, from 1) never tag two gathers alike."""
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.workers = workers
        self.groups = groups
        self.keys = RoutingKeys(virtual_queues, dead_letter_suffix)
        self._cache: dict[str, int] = {}
        self._next_gather = first_gather

    def worker_for(self, queue: str) -> int:
        """The index of the worker owning `queue`. Of the routing key's hash, the queue group takes
        the rest mod `groups` (Placement.group_of) and the worker the quotient's rest mod
        `workers`, so that each group's queues spread over every worker."""
        index = self._cache.get(queue)
        if index is None:
            index = (self.keys.hash(queue) // self.groups) % self.workers
            if len(self._cache) < 1_000_000:
                self._cache[queue] = index
        return index

    def owner(self, action: Any, request: dict) -> int | None:
        """The worker serving `request` if it is a well-formed queue request (an action of
        QUEUE_ACTIONS, a queue named by a string): the common case, decided without a plan. None
        for any other request: plan decides it, or says why it cannot be routed."""
        if type(action) is int and action in p.QUEUE_ACTIONS:
            queue = request.get("queue")
            if type(queue) is str:
                return self.worker_for(queue)
        return None

    def plan(self, action: int, request: dict, origin: Origin, req_no: int,
             groups: int = 1, remote: int = 0) -> list[tuple[int, tuple]] | str:
        """Where a queue or scatter request goes: (worker index, item for that worker's batch)
        pairs, or the reason it cannot be routed. A scatter item carries the gather tag the
        coordinator merges the workers' parts by, under a gather id of this router's own; it
        counts a part from each worker for each of `groups` queue groups (the caller sends the
        item to each worker once per group), and one from the leader of each of `remote` more."""
        queue = request.get("queue")
        if action in p.QUEUE_ACTIONS:
            if type(queue) is not str:
                return "queue: missing" if queue is None else "queue: must be a string"
            return [(self.worker_for(queue), ipc_frames.req_item(origin, req_no, request))]
        if action in _MONITORS and queue is not None:
            if type(queue) is not str:
                return "queue: must be a string"
            targets: Iterable[int] = (self.worker_for(queue),)
        else:
            targets = range(self.workers)
        targets = list(targets)
        gather_id = 0
        if action in SCATTER_ACTIONS:
            gather_id = self._next_gather
            self._next_gather += 2
        tag = [gather_id, origin.wire(), req_no, len(targets) * groups + remote, request]
        return [(index, ipc_frames.req_item(origin, req_no, request, tag)) for index in targets]
