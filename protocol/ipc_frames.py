"""The messages between a node's processes: their kinds (the first frame of every ZeroMQ
multipart message), their frame layouts, and one encoder (`<kind>_frames`) and one decoder
(`read_<kind>`) per kind, used by both its sender and its receiver (see docs/architecture.md).
Pure: no sockets here (server/ipc.py has them).

A request's origin is protocol/origin.py's Origin, in its wire() form inside JSON; the replies in
BATCH and REP are protocol/replies.py batches (a header and a blob), never decoded on the way.

The messages about one queue group's queues and mode (REQ, MODE, FENCE, FENCED, APPLY, COMMITTED,
LOAD, UNDELIVER) carry the group as their last frame (`group_of`); a BATCH carries one part per
group (docs/plans/queue-groups.md). CLOSE and DRAIN are about the node's connections, every
group's. The snapshot cut's messages (SYNC ... PART_DONE) are group 0's until each group has a
snapshot of its own (the plan's step 4)."""
from __future__ import annotations

from typing import Any, Iterable

import orjson

from queue_server.protocol import records
from queue_server.protocol.origin import Origin

_DUMPS = orjson.dumps
_LOADS = orjson.loads
_ORIGIN = Origin._make

# Message kinds (first frame of every multipart message).
REQ = b"req"  # acceptor | coordinator -> worker: [REQ, json [item, ...], epoch, group]; item: see req_item
CLOSE = b"close"  # acceptor -> worker: [CLOSE, json conn] (a TCP connection id)
UNDELIVER = b"undeliver"  # acceptor -> coordinator -> leader's worker: [UNDELIVER, json [queue, [[msg_id, delivery_count], ...]], group]
APPLY = b"apply"  # coordinator -> worker: [APPLY, json [record, ...], committed, group] (replay of the log)
# worker -> coordinator: [BATCH, worker index, (group, records json, reply header json, reply blob,
# partials json, epoch) for each group with something to say]
BATCH = b"batch"
REP = b"rep"  # coordinator, worker -> acceptor: [REP, reply header, reply blob, ...] (protocol/replies.py batches)
STATUS = b"status"  # coordinator -> acceptor: [STATUS, json {role, leader_node_id, leader_host, leader_port, epoch, http_ports}]
FORWARD = b"forward"  # acceptor -> coordinator: [FORWARD, json [[origin, req_no, request], ...]] for the leader
MODE = b"mode"  # coordinator -> worker: [MODE, json [accepting, epoch, keep_through, trans_id], group] whether to accept queue requests
COMMITTED = b"committed"  # coordinator -> leading worker: [COMMITTED, epoch, seq, group] its records through seq are committed
DRAIN = b"drain"  # acceptor -> worker: [DRAIN] the node is shutting down: answer long polls now, park no more
# The hand-off barrier (ClusterNode.begin_handoff): each sender of requests to a worker (the
# acceptor and the coordinator) puts a FENCE behind the last request it sent under a leading mode;
# a worker that has both serves nothing more in that mode, sends its batch, then FENCED. The pipes
# are FIFO, so once the coordinator has FENCED from every worker, every record they decided in
# that mode is in its log.
FENCE = b"fence"  # acceptor | coordinator -> worker: [FENCE, epoch, sender, group]
FENCED = b"fenced"  # worker -> coordinator: [FENCED, epoch, worker index, group]
# Worker-made snapshots (server/snapshots.py SnapshotCut): each worker forks a child that writes
# its part; a leading worker sends nothing more to the coordinator between SNAPPED and the end of
# the cut (RELEASE, or the group's next MODE), so that the log up to T holds exactly its pre-fork records.
# A leader's cut first makes a round trip (SYNC, SYNCED), so that its hold starts only once every
# worker has handled what it was sent before (a long replay would make the hold time out).
# Each is about one queue group's cut (its last frame); a node runs one cut at a time.
SYNC = b"sync"  # coordinator -> worker: [SYNC, json [epoch, cut id], group] answer SYNCED
SYNCED = b"synced"  # worker -> coordinator: [SYNCED, json [epoch, cut id, worker index], group]
SNAP = b"snap"  # coordinator -> worker: [SNAP, json [epoch, cut id, tmp dir, hold], group]
SNAPPED = b"snapped"  # worker -> coordinator: [SNAPPED, json [epoch, cut id, worker index], group] right after the fork
RELEASE = b"release"  # coordinator -> worker: [RELEASE, cut id, group] the cut needs no more holding
PART_DONE = b"part_done"  # worker -> coordinator: [PART_DONE, json [cut id, worker index, ok, part entry], group]
LOAD = b"load"  # coordinator -> worker: [LOAD, json [trans_id, [part path, ...]], group] replace all the group's queues
WAKE = b"wake"  # coordinator -> itself: [WAKE] a signal's handler ends the wait for the next message
FROM_ACCEPTOR = b"acceptor"
FROM_COORDINATOR = b"coordinator"
FENCE_SENDERS = frozenset({FROM_ACCEPTOR, FROM_COORDINATOR})

EMPTY_LIST = b"[]"


# One item of a REQ as its receiver reads it: (origin, req_no, request, gather tag or None). A
# tag marks a scattered request (see Router.plan): the worker answers it with a partial, not a
# reply. (A plain tuple: this is the request path, and a NamedTuple costs a third more to read.)
Request = tuple[Origin, int, Any, "list | None"]


def group_of(frames: list[bytes]) -> int:
    """The queue group of a REQ, MODE, FENCE, FENCED, APPLY, COMMITTED, LOAD, UNDELIVER or a
    snapshot cut's message (SYNC ... PART_DONE): its last frame."""
    return int(frames[-1])


# ----------------------------------------------------------------- REQ, FORWARD
def req_item(origin: Origin, req_no: int, request: Any, gather: list | None = None) -> tuple:
    """One request as it is queued for a REQ (or, without `gather`, a FORWARD):
    [origin, req_no, request] or [origin, req_no, request, gather tag]."""
    if gather is None:
        return (origin.wire(), req_no, request)
    return (origin.wire(), req_no, request, gather)


def req_frames(items: list, epoch: int, group: int = 0) -> list[bytes]:
    """A REQ: req_item()s for one worker's queues of `group`, sent under that group's mode
    `epoch` (the worker holds it until it has reached that mode)."""
    return [REQ, _DUMPS(items), b"%d" % epoch, b"%d" % group]


def join_reqs(reqs: list[list[bytes]]) -> list[bytes]:
    """REQs of one mode of one group as one REQ: their items in order, as the worker would have
    served them one REQ at a time (the items are joined as they are, never decoded)."""
    parts = [frames[1][1:-1] for frames in reqs]
    return [REQ, b"[" + b",".join(part for part in parts if part) + b"]", reqs[0][2], reqs[0][3]]


def same_mode_reqs(first: list[bytes], second: list[bytes]) -> bool:
    """Whether both messages are REQs sent under the same mode of the same group (so join_reqs
    may join them)."""
    return first[0] == REQ and second[0] == REQ and first[2] == second[2] and first[3] == second[3]


def req_epoch(frames: list[bytes]) -> int:
    """The mode a REQ was sent under (read before its items: a REQ may wait for its mode)."""
    return int(frames[2])


def read_req(frames: list[bytes]) -> list[Request]:
    """The items of a REQ."""
    return [(_ORIGIN(item[0]), item[1], item[2], item[3] if len(item) == 4 else None)
            for item in _LOADS(frames[1])]


def forward_frames(items: list) -> list[bytes]:
    """A FORWARD: req_item()s (no gather tag) this follower's acceptor passes to the leader; or,
    with a gather tag and a queue group (req_item(...) + (group,)), the part of a scattered
    request the coordinator must ask of that group's leader."""
    return [FORWARD, _DUMPS(items)]


def read_forward(frames: list[bytes]) -> list[tuple]:
    """The (origin, req_no, request[, gather tag, group]) items of a FORWARD."""
    return [(_ORIGIN(item[0]), item[1], item[2]) if len(item) == 3 else (_ORIGIN(item[0]), *item[1:])
            for item in _LOADS(frames[1])]


# ----------------------------------------------------------------- the worker's other inputs
def close_frames(conn: int) -> list[bytes]:
    """A CLOSE: TCP connection `conn` is gone (its long polls end)."""
    return [CLOSE, b"%d" % conn]


def read_close(frames: list[bytes]) -> int:
    """The connection id of a CLOSE."""
    return int(frames[1])


def undeliver_frames(queue: str, given: Iterable[Iterable[int]], group: int = 0) -> list[bytes]:
    """An UNDELIVER: messages of `queue` (of `group`; [msg_id, delivery_count] each) handed out
    in a consume reply that could not be delivered, to be given back."""
    return [UNDELIVER, _DUMPS([queue, given]), b"%d" % group]


def read_undeliver(frames: list[bytes]) -> tuple[str, list[list[int]]]:
    """The (queue, [[msg_id, delivery_count], ...]) of an UNDELIVER."""
    queue, given = _LOADS(frames[1])
    return queue, given


def apply_frames(changes: list[records.Record], committed: bool = True, group: int = 0) -> list[bytes]:
    """An APPLY: change records of `group`'s log for a worker to replay; `committed`: they are (a
    follower's), so the worker keeps no undo for them (a new leader's, of earlier terms, are not)."""
    return [APPLY, records.encode_many(changes), b"1" if committed else b"0", b"%d" % group]


def read_apply(frames: list[bytes]) -> list[records.Record]:
    """The records of an APPLY."""
    return records.decode_many(frames[1])


def apply_committed(frames: list[bytes]) -> bool:
    """Whether the records of an APPLY are committed."""
    return frames[2] == b"1"


def mode_frames(accepting: bool, epoch: int, keep_through: int | None = None,
                trans_id: int | None = None, group: int = 0) -> list[bytes]:
    """A MODE: the workers' mode `epoch` of `group` begins; whether they accept its queues'
    requests in it. keep_through: the worker first undoes every record of the group it applied
    after its record number keep_through (None: none); trans_id: the log position its queues
    then reflect (a check)."""
    return [MODE, _DUMPS([accepting, epoch, keep_through, trans_id]), b"%d" % group]


def read_mode(frames: list[bytes]) -> tuple[bool, int, int | None, int | None]:
    """The (accepting, epoch, keep_through, trans_id) of a MODE."""
    accepting, epoch, keep_through, trans_id = _LOADS(frames[1])
    return accepting, epoch, keep_through, trans_id


def committed_frames(epoch: int, seq: int, group: int = 0) -> list[bytes]:
    """A COMMITTED: in `group`'s mode `epoch`, the worker's records of the group through number
    `seq` are committed (its undo journal forgets them)."""
    return [COMMITTED, b"%d" % epoch, b"%d" % seq, b"%d" % group]


def read_committed(frames: list[bytes]) -> tuple[int, int]:
    """The (epoch, seq) of a COMMITTED."""
    return int(frames[1]), int(frames[2])


def sync_frames(epoch: int, cut_id: int, group: int = 0) -> list[bytes]:
    """A SYNC of `group`'s cut: answer SYNCED once this (and so everything sent before it) is
    handled."""
    return [SYNC, _DUMPS([epoch, cut_id]), b"%d" % group]


def read_sync(frames: list[bytes]) -> tuple[int, int]:
    """The (epoch, cut id) of a SYNC."""
    epoch, cut_id = _LOADS(frames[1])
    return epoch, cut_id


def synced_frames(epoch: int, cut_id: int, index: int, group: int = 0) -> list[bytes]:
    """A SYNCED: worker `index` has handled the SYNC of `group`'s cut `cut_id`."""
    return [SYNCED, _DUMPS([epoch, cut_id, index]), b"%d" % group]


def read_synced(frames: list[bytes]) -> tuple[int, int, int]:
    """The (epoch, cut id, worker index) of a SYNCED."""
    return read_snapped(frames)


def snap_frames(epoch: int, cut_id: int, tmp: str, hold: bool, group: int = 0) -> list[bytes]:
    """A SNAP: flush, fork a child that writes this worker's part of `group` into directory
    `tmp`, answer SNAPPED; with `hold`, send nothing more to the coordinator until RELEASE (or
    the group's MODE)."""
    return [SNAP, _DUMPS([epoch, cut_id, tmp, hold]), b"%d" % group]


def read_snap(frames: list[bytes]) -> tuple[int, int, str, bool]:
    """The (epoch, cut id, tmp dir, hold) of a SNAP."""
    epoch, cut_id, tmp, hold = _LOADS(frames[1])
    return epoch, cut_id, tmp, hold


def release_frames(cut_id: int, group: int = 0) -> list[bytes]:
    """A RELEASE: `group`'s cut `cut_id` holds this worker's output no longer."""
    return [RELEASE, b"%d" % cut_id, b"%d" % group]


def read_release(frames: list[bytes]) -> int:
    """The cut id of a RELEASE."""
    return int(frames[1])


def load_frames(trans_id: int, parts: list[str], group: int = 0) -> list[bytes]:
    """A LOAD: the worker's queues of `group` are replaced by those of the group's snapshot parts
    at trans_id that its Router gives it."""
    return [LOAD, _DUMPS([trans_id, parts]), b"%d" % group]


def read_load(frames: list[bytes]) -> tuple[int, list[str]]:
    """The (trans_id, part paths) of a LOAD."""
    trans_id, parts = _LOADS(frames[1])
    return trans_id, parts


DRAIN_FRAMES = [DRAIN]  # the whole DRAIN message: it carries nothing
WAKE_FRAMES = [WAKE]  # the whole WAKE message: it carries nothing


# ----------------------------------------------------------------- to the acceptor
def rep_frames(header: bytes, blob: bytes) -> list[bytes]:
    """A REP: a reply batch (protocol/replies.py) for the acceptor to deliver: from the
    coordinator, or from a worker for the replies that rest on no record."""
    return [REP, header, blob]


def join_reps(reps: list[list[bytes]]) -> list[bytes]:
    """REPs as one, their reply batches side by side in order (never decoded): [REP, header,
    blob, header, blob, ...]."""
    return [REP, *[part for frames in reps for part in frames[1:]]]


def read_rep(frames: list[bytes]) -> list[tuple[bytes, bytes]]:
    """The (header, blob) reply batches of a REP, in order."""
    return list(zip(frames[1::2], frames[2::2]))


def status_frames(status: dict[str, Any]) -> list[bytes]:
    """A STATUS: {role, leader_node_id, leader_host, leader_port, epoch, http_ports} as the
    coordinator sees them (ClusterNode.status_fields); http_ports: {node_id: http_port}."""
    return [STATUS, _DUMPS(status, option=orjson.OPT_NON_STR_KEYS)]


def read_status(frames: list[bytes]) -> dict[str, Any]:
    """The fields of a STATUS (http_ports keyed by node_id again)."""
    status = _LOADS(frames[1])
    status["http_ports"] = {int(node_id): port for node_id, port in status["http_ports"].items()}
    return status


# ----------------------------------------------------------------- worker -> coordinator
# One group's part of a BATCH: (group, records, reply header, reply blob, partials, epoch).
BatchPart = tuple[int, bytes, bytes, bytes, bytes, int]


def batch_frames(records: bytes, header: bytes, blob: bytes, partials: bytes, epoch: int,
                 index: int = 0, group: int = 0) -> list[bytes]:
    """Worker `index`'s BATCH message of one group: what it decided for `group` under the
    group's mode `epoch` (see GroupNode.epoch). records and partials are json lists
    (EMPTY_LIST for none, see json_list); header and blob a reply batch."""
    return [BATCH, b"%d" % index, b"%d" % group, records, header, blob, partials, b"%d" % epoch]


def batches_frames(index: int, parts: list[BatchPart]) -> list[bytes]:
    """Worker `index`'s BATCH message of several groups: a part per group, in one message."""
    group, *first = parts[0]
    frames = batch_frames(*first, index, group)  # type: ignore[call-arg]
    for part in parts[1:]:
        add_batch_part(frames, *part)
    return frames


def add_batch_part(frames: list[bytes], group: int, records: bytes, header: bytes, blob: bytes, partials: bytes,
                   epoch: int) -> None:
    """Add `group`'s part to a BATCH of other groups' (batch_frames): one message for them all."""
    frames += (b"%d" % group, records, header, blob, partials, b"%d" % epoch)


def read_batch(frames: list[bytes]) -> list[BatchPart]:
    """The (group, records, header, blob, partials, epoch) parts of a BATCH message, in order
    (batch_index: whose)."""
    return [(int(frames[i]), frames[i + 1], frames[i + 2], frames[i + 3], frames[i + 4], int(frames[i + 5]))
            for i in range(2, len(frames), 6)]


def batch_index(frames: list[bytes]) -> int:
    """The index of the worker that sent a BATCH."""
    return int(frames[1])


def json_list(values: list) -> bytes:
    """A list as the json of a BATCH's partials: EMPTY_LIST when empty, so that the coordinator
    tells an empty one without decoding it."""
    return _DUMPS(values) if values else EMPTY_LIST


def records_list(changes: list[records.Record]) -> bytes:
    """A BATCH's change records: EMPTY_LIST when there are none (see json_list)."""
    return records.encode_many(changes) if changes else EMPTY_LIST


def fence_frames(epoch: int, sender: bytes, group: int = 0) -> list[bytes]:
    """A FENCE: `sender` (FROM_ACCEPTOR or FROM_COORDINATOR) sends the worker no more requests of
    `group`'s mode `epoch`."""
    return [FENCE, b"%d" % epoch, sender, b"%d" % group]


def read_fence(frames: list[bytes]) -> tuple[int, bytes]:
    """The (epoch, sender) of a FENCE message."""
    return int(frames[1]), frames[2]


def fenced_frames(epoch: int, index: int, group: int = 0) -> list[bytes]:
    """A FENCED: worker `index` has sent every batch of `group`'s mode `epoch` and decides
    nothing more in it."""
    return [FENCED, b"%d" % epoch, b"%d" % index, b"%d" % group]


def read_fenced(frames: list[bytes]) -> tuple[int, int]:
    """The (epoch, worker index) of a FENCED message."""
    return int(frames[1]), int(frames[2])


def snapped_frames(epoch: int, cut_id: int, index: int, group: int = 0) -> list[bytes]:
    """A SNAPPED: worker `index` has forked the writer of its part of `group`'s cut `cut_id`;
    every batch it decided before is ahead of this on the pipe."""
    return [SNAPPED, _DUMPS([epoch, cut_id, index]), b"%d" % group]


def read_snapped(frames: list[bytes]) -> tuple[int, int, int]:
    """The (epoch, cut id, worker index) of a SNAPPED."""
    epoch, cut_id, index = _LOADS(frames[1])
    return epoch, cut_id, index


def part_done_frames(cut_id: int, index: int, ok: bool, part: dict | None, group: int = 0) -> list[bytes]:
    """A PART_DONE: worker `index`'s writer of `group`'s cut `cut_id` has ended; ok with its
    part's entry for the manifest ({file, bytes, queues, messages}), or not ({error: why})."""
    return [PART_DONE, _DUMPS([cut_id, index, ok, part]), b"%d" % group]


def read_part_done(frames: list[bytes]) -> tuple[int, int, bool, dict | None]:
    """The (cut id, worker index, ok, part entry) of a PART_DONE."""
    cut_id, index, ok, part = _LOADS(frames[1])
    return cut_id, index, ok, part
