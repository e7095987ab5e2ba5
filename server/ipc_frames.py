"""The messages between a node's processes: their kinds (the first frame of every ZeroMQ
multipart message) and frame layouts, shared by the sender and the receiver of each (see
docs/architecture.md). Pure: no sockets here (server/ipc.py has them)."""
from __future__ import annotations

# Message kinds (first frame of every multipart message).
REQ = b"req"  # -> worker: [REQ, json [[origin, req_no, request] | [origin, req_no, request, gather], ...], epoch]
# (origin: server/origin.py Origin.wire(); replies travel as server/replies.py batches)
CLOSE = b"close"  # acceptor -> worker: [CLOSE, json conn] (a TCP connection id)
UNDELIVER = b"undeliver"  # acceptor -> coordinator -> leader's worker: [UNDELIVER, json [queue, [[msg_id, delivery_count], ...]]]
APPLY = b"apply"  # coordinator -> worker: [APPLY, json [record, ...]] (replicas replay the leader's log)
BATCH = b"batch"  # worker -> coordinator: [BATCH, records json, reply header json, reply blob, partials json, epoch]
REP = b"rep"  # coordinator -> acceptor: [REP, reply header, reply blob] (server/replies.py)
STATUS = b"status"  # coordinator -> acceptor: [STATUS, json {role, leader_node_id, leader_host, leader_port}]
FORWARD = b"forward"  # acceptor -> coordinator: [FORWARD, json [[origin, req_no, request], ...]] for the leader
MODE = b"mode"  # coordinator -> worker: [MODE, json [accepting, epoch]] whether to accept queue requests
RESET = b"reset"  # coordinator -> worker: [RESET, json {queue: snapshot}] replace all queues
DRAIN = b"drain"  # acceptor -> worker: [DRAIN] the node is shutting down: answer long polls now, park no more
# The hand-off barrier (ClusterNode.begin_handoff): each sender of requests to a worker (the
# acceptor and the coordinator) puts a FENCE behind the last request it sent under a leading mode;
# a worker that has both serves nothing more in that mode, sends its batch, then FENCED. The pipes
# are FIFO, so once the coordinator has FENCED from every worker, every record they decided in
# that mode is in its log.
FENCE = b"fence"  # acceptor | coordinator -> worker: [FENCE, epoch, sender]
FENCED = b"fenced"  # worker -> coordinator: [FENCED, epoch, worker index]
FROM_ACCEPTOR = b"acceptor"
FROM_COORDINATOR = b"coordinator"
FENCE_SENDERS = frozenset({FROM_ACCEPTOR, FROM_COORDINATOR})

EMPTY_LIST = b"[]"


def batch_frames(records: bytes, header: bytes, blob: bytes, partials: bytes, epoch: int) -> list[bytes]:
    """A worker's BATCH message: what it decided under mode `epoch` (see ClusterNode.epoch)."""
    return [BATCH, records, header, blob, partials, b"%d" % epoch]


def read_batch(frames: list[bytes]) -> tuple[bytes, bytes, bytes, bytes, int]:
    """The (records, header, blob, partials, epoch) of a BATCH message."""
    _, records, header, blob, partials, epoch = frames
    return records, header, blob, partials, int(epoch)


def fence_frames(epoch: int, sender: bytes) -> list[bytes]:
    """A FENCE: `sender` (FROM_ACCEPTOR or FROM_COORDINATOR) sends the worker no more requests of
    mode `epoch`."""
    return [FENCE, b"%d" % epoch, sender]


def read_fence(frames: list[bytes]) -> tuple[int, bytes]:
    """The (epoch, sender) of a FENCE message."""
    _, epoch, sender = frames
    return int(epoch), sender


def fenced_frames(epoch: int, index: int) -> list[bytes]:
    """A FENCED: worker `index` has sent every batch of mode `epoch` and decides nothing more in it."""
    return [FENCED, b"%d" % epoch, b"%d" % index]


def read_fenced(frames: list[bytes]) -> tuple[int, int]:
    """The (epoch, worker index) of a FENCED message."""
    _, epoch, index = frames
    return int(epoch), int(index)
