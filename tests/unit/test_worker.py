"""The worker's request handling (server/worker.py) without sockets or processes: inbox
messages in, one BATCH per flush out, each stamped with the mode it was decided in."""
from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

import orjson
import pytest
from prometheus_client import CollectorRegistry

from queue_server.protocol import ipc_frames, replies
from queue_server.server.metrics import WorkerMetrics
from queue_server.server.overflow_files import DiskSegments
from queue_server.protocol.origin import Origin
from queue_server.workers.body_budget import BodyBudget
from queue_server.workers.overflow import Overflow
from queue_server.workers.service import PartitionService
from queue_server.replication import datadir
from queue_server.replication.snapshot import iter_frames, write_part
from queue_server.server.snapshot_child import fork_writer
from queue_server.server.worker import Worker
from tests.harness import wait_for

NOW = 1_000.0


class Pipe:
    """Stands in for the PUSH socket to the coordinator."""

    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []

    def send_multipart(self, frames: list[bytes]) -> None:
        self.sent.append(list(frames))


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple] = []

    def warning(self, *args, **kwargs) -> None:
        self.lines.append(("warning",) + args)

    def error(self, *args, **kwargs) -> None:
        self.lines.append(("error",) + args)

    def info(self, *args, **kwargs) -> None:
        self.lines.append(("info",) + args)


@pytest.fixture
def worker() -> Worker:
    service = PartitionService(1, 1000, {}, max_wait=30)
    service.accepting = False
    return Worker({0: service}, None, Pipe(), Log(), 0, metrics=WorkerMetrics(CollectorRegistry()))


def mode(accepting: bool, epoch: int) -> list[bytes]:
    return ipc_frames.mode_frames(accepting, epoch)


def req(items: list, epoch: int) -> list[bytes]:
    return ipc_frames.req_frames([ipc_frames.req_item(Origin(c), n, r) for c, n, r in items], epoch)


def batches(w: Worker) -> list[tuple[list, list, int]]:
    """Each BATCH sent: its records, its (origin, req_no, reply) triples and its epoch."""
    out = []
    for frames in w.coordinator.sent:
        [(_, records, header, blob, _partials, epoch)] = ipc_frames.read_batch(frames)
        got = [(o, n, orjson.loads(d)) for o, n, d in replies.decode(header, blob)]
        out.append((orjson.loads(records), got, epoch))
    return out


def produce(queue: str, data: str, **extra) -> dict:
    return {"action": 1, "queue": queue, "data": data, **extra}


def test_a_request_batch_becomes_one_message_with_its_records_and_replies(worker):
    worker.dispatch(mode(True, 1), NOW)
    worker.dispatch(req([(5, 1, produce("q", "a")), (5, 2, produce("q", "b", retry=3)),
                         (6, 1, {"action": 2, "queue": "q"})], 1), NOW)
    worker.flush()
    [(records, got, epoch)] = batches(worker)
    assert epoch == 1
    assert [r["op"] for r in records] == ["produce", "produce", "consume"]
    assert [(o.conn, n, r["code"]) for o, n, r in got] == [(5, 1, 0), (5, 2, 0), (6, 1, 0)]
    assert got[2][2]["data"] == "a"
    worker.flush()
    assert len(worker.coordinator.sent) == 1  # nothing new, nothing sent


def test_requests_before_the_worker_leads_are_refused_and_change_nothing(worker):
    worker.dispatch(req([(5, 1, produce("q", "a"))], 0), NOW)
    worker.flush()
    [(records, [(_, _, reply)], _)] = batches(worker)
    assert records == [] and reply["code"] == -1
    assert worker.services[0].snapshot() == {}


def test_a_batch_from_a_later_mode_waits_for_that_mode(worker):
    worker.dispatch(mode(True, 1), NOW)
    worker.dispatch(req([(5, 1, produce("q", "a"))], 2), NOW)  # overtook its MODE
    worker.flush()
    assert worker.coordinator.sent == []
    worker.dispatch(mode(True, 2), NOW)
    worker.flush()
    [(records, _, epoch)] = batches(worker)
    assert epoch == 2 and records[0]["data"] == "a"


def test_what_was_decided_leaves_stamped_with_its_mode_before_a_mode_change(worker):
    worker.dispatch(mode(True, 1), NOW)
    worker.dispatch(req([(5, 1, produce("q", "a"))], 1), NOW)
    worker.dispatch(mode(False, 2), NOW)  # flushes first
    worker.dispatch(req([(5, 2, produce("q", "b"))], 2), NOW)
    worker.flush()
    (r1, _, e1), (r2, got2, e2) = batches(worker)
    assert (e1, [r["data"] for r in r1]) == (1, ["a"])
    assert (e2, r2, got2[0][2]["code"]) == (2, [], -1)


def test_a_closed_connection_loses_its_long_poll_and_nothing_else(worker):
    worker.dispatch(mode(True, 1), NOW)
    worker.dispatch(req([(5, 1, {"action": 2, "queue": "q", "wait": 10}),
                         (6, 1, {"action": 2, "queue": "q", "wait": 10})], 1), NOW)
    worker.dispatch(ipc_frames.close_frames(5), NOW)
    worker.dispatch(req([(7, 1, produce("q", "a"))], 1), NOW + 1)
    worker.flush()
    served = [(o.conn, r.get("data")) for _, got, _ in batches(worker) for o, _, r in got]
    assert (6, "a") in served
    assert all(conn != 5 for conn, _ in served)


def test_replayed_records_and_a_load_replace_the_state(worker, tmp_path):
    record = {"op": "produce", "queue": "q", "msg_id": 1, "ready": NOW, "ttl": NOW + 60, "retry": 0,
              "priority": 0, "data": "x", "delivery_count": 0}
    worker.dispatch(ipc_frames.apply_frames([record]), NOW)
    assert [m[1] for m in worker.services[0].snapshot()["q"]["messages"]] == ["x"]
    write_part(str(tmp_path / "empty.qsp"), [], 5)
    worker.dispatch(ipc_frames.load_frames(5, [str(tmp_path / "empty.qsp")]), NOW)
    assert worker.services[0].snapshot() == {}
    assert worker.coordinator.sent == []  # replay answers nobody


def test_an_unknown_message_kind_is_logged_not_fatal(worker):
    worker.dispatch([b"nonsense"], NOW)
    assert worker.log.lines and worker.log.lines[0][0] == "warning"


def fence(epoch: int, sender: bytes) -> list[bytes]:
    return ipc_frames.fence_frames(epoch, sender)


def test_fenced_by_both_senders_the_worker_sends_its_batch_then_fenced_and_decides_no_more(worker):
    """The hand-off barrier: what was decided before the second fence leaves before FENCED on
    the same pipe, and afterwards no timer decides anything (a parked long poll is not served
    by a message becoming ready, nor answered: the hand-off may fail)."""
    worker.dispatch(mode(True, 1), NOW)
    worker.dispatch(req([(5, 1, produce("q", "later", delay=1)), (6, 1, {"action": 2, "queue": "q", "wait": 10})], 1), NOW)
    worker.dispatch(fence(1, ipc_frames.FROM_ACCEPTOR), NOW)
    worker.dispatch(req([(7, 1, produce("r", "a"))], 1), NOW)  # the coordinator's, sent before its fence
    assert not any(f[0] == ipc_frames.FENCED for f in worker.coordinator.sent)
    worker.dispatch(fence(1, ipc_frames.FROM_COORDINATOR), NOW)
    *_, fenced = worker.coordinator.sent
    assert ipc_frames.read_fenced(fenced) == (1, 0)
    worker.coordinator.sent.pop()
    (records, got, epoch), = batches(worker)
    assert epoch == 1 and [r["data"] for r in records if r["op"] == "produce"] == ["later", "a"]
    worker.services[0].tick(NOW + 2)  # "later" is ready now, but nothing may be decided
    worker.flush()
    assert batches(worker)[1:] == []
    worker.dispatch(req([(8, 1, produce("q", "refused"))], 1), NOW + 2)  # none comes; if one did
    worker.flush()
    [(records, [(_, _, refused)], _)] = batches(worker)[1:]
    assert records == [] and refused["code"] == -1


def _parked_then_fenced(worker: Worker) -> None:
    """A long poll (connection 6) and a subscription (connection 8) parked in mode 1, each on a
    queue whose message becomes ready at NOW + 1; then the hand-off's fence."""
    worker.dispatch(mode(True, 1), NOW)
    worker.dispatch(req([(5, 1, produce("q", "later", delay=1)), (5, 2, produce("s", "pushed", delay=1)),
                         (6, 1, {"action": 2, "queue": "q", "wait": 10}),
                         (8, 1, {"action": "subscribe", "queue": "s", "credit": 5})], 1), NOW)
    worker.dispatch(fence(1, ipc_frames.FROM_ACCEPTOR), NOW)
    worker.dispatch(fence(1, ipc_frames.FROM_COORDINATOR), NOW)
    worker.coordinator.sent.clear()
    worker.services[0].tick(NOW + 2)
    worker.flush()
    assert worker.coordinator.sent == []  # kept: neither served nor ended


def _answers(worker: Worker) -> list[tuple[int, int, bool, int]]:
    """(connection, code, whether it carries a message, epoch) of each reply and push sent."""
    return sorted((o.conn, r["code"], "data" in r, epoch) for _, got, epoch in batches(worker) for o, _, r in got)


def test_a_hand_off_that_fails_serves_the_long_polls_and_subscriptions_the_fence_kept(worker):
    """The node leads on (a new mode that accepts, ClusterNode._resume_leading): what waited
    through the fence is served, in the new mode."""
    _parked_then_fenced(worker)
    worker.dispatch(mode(True, 2), NOW + 2)
    worker.services[0].tick(NOW + 2)
    worker.flush()
    assert _answers(worker) == [(6, 0, True, 2), (8, 0, True, 2)]


def test_a_hand_off_that_succeeds_ends_what_the_fence_kept(worker):
    """The node follows now (a mode that does not accept): the long poll is answered empty and
    the subscription ends with its message, for the client to go to the new leader."""
    _parked_then_fenced(worker)
    worker.dispatch(mode(False, 2), NOW + 2)
    worker.services[0].tick(NOW + 2)
    worker.flush()
    assert _answers(worker) == [(6, 0, False, 2), (8, -1, False, 2)]


def test_a_long_poll_kept_through_a_fence_is_answered_at_its_deadline(worker):
    _parked_then_fenced(worker)
    worker.services[0].tick(NOW + 10)
    worker.flush()
    assert _answers(worker) == [(6, 0, False, 1)]  # empty: nothing decided


def test_a_fence_waits_behind_the_requests_it_fences_and_a_stale_fence_is_ignored(worker):
    worker.dispatch(mode(True, 1), NOW)
    worker.dispatch(req([(5, 1, produce("q", "a"))], 2), NOW)  # overtook its MODE: held
    worker.dispatch(fence(2, ipc_frames.FROM_ACCEPTOR), NOW)  # held behind it
    worker.dispatch(fence(1, ipc_frames.FROM_COORDINATOR), NOW)  # one of two for mode 1: nothing yet
    assert worker.coordinator.sent == []
    worker.dispatch(mode(True, 2), NOW)
    worker.dispatch(fence(2, ipc_frames.FROM_COORDINATOR), NOW)
    batch, fenced = worker.coordinator.sent
    assert orjson.loads(ipc_frames.read_batch(batch)[0][1])[0]["data"] == "a"
    assert ipc_frames.read_fenced(fenced) == (2, 0)
    worker.dispatch(mode(True, 3), NOW)  # a hand-off that did not happen: deciding again
    worker.dispatch(req([(5, 2, produce("q", "b"))], 3), NOW)
    worker.flush()
    *_, last = worker.coordinator.sent
    assert orjson.loads(ipc_frames.read_batch(last)[0][1])[0]["data"] == "b"


def test_an_undelivered_lease_is_given_back_and_served_again(worker):
    worker.dispatch(mode(True, 1), NOW)
    worker.dispatch(req([(5, 1, produce("q", "a", retry=30)), (5, 2, {"action": 2, "queue": "q"})], 1), NOW)
    worker.flush()
    [(_, got, _)] = batches(worker)
    msg_id = got[1][2]["msg_id"]
    worker.dispatch(ipc_frames.undeliver_frames("q", [[msg_id, 1]]), NOW)
    worker.dispatch(req([(6, 1, {"action": 2, "queue": "q"})], 1), NOW)
    worker.flush()
    (records, got, _), = batches(worker)[1:]
    assert [r["op"] for r in records] == ["release", "consume"]
    assert (got[0][0].conn, got[0][2]["msg_id"], got[0][2]["data"]) == (6, msg_id, "a")


def test_a_scattered_request_is_answered_with_a_partial_in_the_batch(worker):
    worker.dispatch(mode(True, 1), NOW)
    worker.dispatch(req([(5, 1, produce("q", "a"))], 1), NOW)
    tag = [4, Origin(5).wire(), 2, 1, {"action": 7}]
    worker.dispatch(ipc_frames.req_frames([ipc_frames.req_item(Origin(5), 2, {"action": 7}, tag)], 1), NOW)
    worker.flush()
    [frames] = worker.coordinator.sent
    [(_, _, header, blob, partials, _)] = ipc_frames.read_batch(frames)
    [(origin, req_no, _)] = replies.decode(header, blob)
    assert (origin, req_no) == (Origin(5), 1)  # the scattered one has no reply of its own
    [part] = orjson.loads(partials)
    assert part[0] == tag


def test_draining_answers_a_parked_long_poll_now_and_parks_no_more(worker):
    worker.dispatch(mode(True, 1), NOW)
    worker.dispatch(req([(5, 1, {"action": 2, "queue": "q", "wait": 10})], 1), NOW)
    worker.flush()
    assert worker.coordinator.sent == []  # parked
    worker.dispatch(ipc_frames.DRAIN_FRAMES, NOW)
    worker.dispatch(req([(6, 1, {"action": 2, "queue": "q", "wait": 10})], 1), NOW)
    worker.services[0].tick(NOW)
    worker.flush()
    [(_, got, _)] = batches(worker)
    assert sorted((o.conn, r["code"], "data" in r) for o, _, r in got) == [(5, 0, False), (6, 0, False)]


def test_a_mode_rolls_back_what_it_does_not_keep_and_commits_trim_the_journal():
    service = PartitionService(1, 1000, {}, max_wait=30, undo_limit=100)
    w = Worker({0: service}, None, Pipe(), Log(), 3, metrics=WorkerMetrics(CollectorRegistry()))
    record = {"op": "produce", "queue": "q", "msg_id": 1, "ready": NOW, "ttl": NOW + 60, "retry": 0,
              "priority": 0, "data": "x", "delivery_count": 0}
    w.dispatch(ipc_frames.apply_frames([record], committed=True), NOW)
    assert service.seq == 1 and len(service.journal) == 0  # committed: no undo kept
    w.dispatch(ipc_frames.mode_frames(True, 1, 1, 1), NOW)
    w.dispatch(req([(5, 1, produce("q", "a")), (5, 2, produce("q", "b"))], 1), NOW)
    w.flush()
    assert ipc_frames.batch_index(w.coordinator.sent[-1]) == 3
    assert service.seq == 3 and len(service.journal) == 2
    w.dispatch(ipc_frames.committed_frames(0, 3), NOW)  # of a mode that is over: ignored
    w.dispatch(ipc_frames.committed_frames(1, 2), NOW)
    assert len(service.journal) == 1
    w.dispatch(ipc_frames.mode_frames(False, 2, 2, 2), NOW)  # record 3 was not committed
    assert w.undone == 1 and w.rollbacks == 1 and service.seq == 2
    assert [m[1] for m in service.snapshot()["q"]["messages"]] == ["x", "a"]
    w.dispatch(ipc_frames.mode_frames(True, 3, 2, 2), NOW)  # keeps everything: undoes nothing
    assert w.undone == 0 and w.rollbacks == 1


# ---------------------------------------------------------------------- snapshots (ipc_frames SNAP)
def _kinds(w: Worker) -> list[bytes]:
    return [frames[0] for frames in w.coordinator.sent]


def test_snap_forks_a_writer_of_the_workers_part_and_holds_later_batches_until_release(worker, tmp_path):
    """SNAPPED follows the batch of what came before the fork on the pipe; what is decided
    after it is held until RELEASE; the part holds the state at the fork; PART_DONE names it."""
    tmp = str(tmp_path / "tmp-cut-1")
    worker.dispatch(mode(True, 1), NOW)
    worker.dispatch(req([(5, 1, produce("q", "a")), (5, 2, produce("q", "b"))], 1), NOW)
    worker.dispatch(ipc_frames.snap_frames(1, 7, tmp, True), NOW)
    worker.dispatch(req([(5, 3, produce("q", "c"))], 1), NOW)
    worker.flush()
    assert _kinds(worker) == [ipc_frames.BATCH, ipc_frames.SNAPPED]  # the third produce is held
    assert ipc_frames.read_snapped(worker.coordinator.sent[1]) == (1, 7, 0)
    worker.end_writer()  # waits for the child
    assert len(worker.coordinator.sent) == 2  # PART_DONE is held behind the batch too
    worker.dispatch(ipc_frames.release_frames(7), NOW)
    assert _kinds(worker) == [ipc_frames.BATCH, ipc_frames.SNAPPED, ipc_frames.BATCH, ipc_frames.PART_DONE]
    cut_id, index, ok, part = ipc_frames.read_part_done(worker.coordinator.sent[3])
    assert (cut_id, index, ok) == (7, 0, True)
    assert (part["file"], part["queues"], part["messages"]) == ("part-0.qsp", 1, 2)
    assert part["bytes"] == os.path.getsize(os.path.join(tmp, "part-0.qsp"))
    # The part loads into the state the worker had at the fork: a and b, not c.
    loaded = PartitionService(1, 1000, {}, max_wait=30)
    loaded.load_frames(iter_frames(os.path.join(tmp, "part-0.qsp"), 0))
    assert [m[1] for m in loaded.snapshot()["q"]["messages"]] == ["a", "b"]


def test_sync_is_answered_once_what_came_before_it_is_handled(worker):
    worker.dispatch(ipc_frames.apply_frames([], committed=False), NOW)
    worker.dispatch(ipc_frames.sync_frames(3, 9), NOW)
    assert worker.coordinator.sent == [ipc_frames.synced_frames(3, 9, 0)]
    assert ipc_frames.read_synced(worker.coordinator.sent[0]) == (3, 9, 0)


def test_a_mode_change_ends_the_hold_and_a_follower_s_snap_holds_nothing(worker, tmp_path):
    worker.dispatch(mode(True, 1), NOW)
    worker.dispatch(ipc_frames.snap_frames(1, 1, str(tmp_path / "a"), True), NOW)
    worker.dispatch(req([(5, 1, produce("q", "a"))], 1), NOW)
    worker.flush()
    assert _kinds(worker) == [ipc_frames.SNAPPED]
    worker.dispatch(mode(False, 2), NOW)  # the batch leaves stamped with mode 1, then the mode changes
    assert _kinds(worker) == [ipc_frames.SNAPPED, ipc_frames.BATCH]
    assert ipc_frames.read_batch(worker.coordinator.sent[1])[0][-1] == 1
    worker.end_writer()
    worker.dispatch(ipc_frames.snap_frames(2, 2, str(tmp_path / "b"), False), NOW)
    worker.end_writer()
    assert _kinds(worker)[-3:] == [ipc_frames.PART_DONE, ipc_frames.SNAPPED, ipc_frames.PART_DONE]


def _stalled_writers(monkeypatch) -> tuple[int, int]:
    """Make the worker's writers say they started (a byte on the pipe returned: its read end,
    its write end), then wait to be killed."""
    import queue_server.server.worker as worker_module
    started_r, started_w = os.pipe()

    def stalled(*args, **kwargs):
        return fork_writer(*args, **kwargs, before_write=lambda: (os.write(started_w, b"!"), time.sleep(60)))

    monkeypatch.setattr(worker_module, "fork_writer", stalled)
    return started_r, started_w


def test_a_killed_writer_gives_part_done_not_ok(worker, tmp_path, monkeypatch):
    started_r, started_w = _stalled_writers(monkeypatch)
    worker.dispatch(mode(True, 1), NOW)
    worker.dispatch(req([(5, 1, produce("q", "a"))], 1), NOW)
    worker.dispatch(ipc_frames.snap_frames(1, 3, str(tmp_path / "tmp-cut-3"), False), NOW)
    os.read(started_r, 1)
    os.close(started_r)
    os.close(started_w)
    os.kill(worker.writer[0], signal.SIGKILL)
    wait_for(lambda: worker.reap() or worker.writer is None, 10, "the writer's end")
    assert ipc_frames.read_part_done(worker.coordinator.sent[-1]) == (
        3, 0, False, {"error": "its writer was killed by signal 9"})


def test_a_writer_does_not_hold_the_overflow_folder_s_lock(tmp_path, monkeypatch):
    """A forked writer can outlive its worker for a moment (it dies of the SIGTERM the worker's
    death sends it, at SCHED_IDLE): it must not keep the folder's flock, or a node restarted at
    once finds its overflow_dir in use."""
    where = str(tmp_path / "worker-0")
    files = DiskSegments(where)
    service = PartitionService(1, 1000, {}, max_wait=30, overflow=Overflow(BodyBudget(0), files))
    w = Worker({0: service}, None, Pipe(), Log(), 0, metrics=WorkerMetrics(CollectorRegistry()))
    started_r, started_w = _stalled_writers(monkeypatch)
    w.dispatch(mode(True, 1), NOW)
    w.dispatch(req([(5, 1, produce("q", "a"))], 1), NOW)
    w.dispatch(ipc_frames.snap_frames(1, 3, str(tmp_path / "tmp-cut-3"), False), NOW)
    os.read(started_r, 1)
    try:
        assert datadir.holder(where) == str(os.getpid())
        files.close()  # the worker is gone; its writer lives on
        assert datadir.holder(where) is None
    finally:
        os.kill(w.writer[0], signal.SIGKILL)
        wait_for(lambda: w.reap() or w.writer is None, 10, "the writer's end")
        os.close(started_r)
        os.close(started_w)


def test_a_graceful_stop_lets_the_writer_finish_unless_the_cut_still_holds(worker, tmp_path, monkeypatch):
    import queue_server.server.worker as worker_module
    go_r, go_w = os.pipe()

    def slow(*args, **kwargs):  # the child writes once told to
        return fork_writer(*args, **kwargs, before_write=lambda: os.read(go_r, 1))

    monkeypatch.setattr(worker_module, "fork_writer", slow)
    assert not worker.finish_writer(5.0)  # no writer: nothing to wait for
    worker.dispatch(mode(True, 1), NOW)
    worker.dispatch(req([(5, 1, produce("q", "a"))], 1), NOW)
    worker.dispatch(ipc_frames.snap_frames(1, 3, str(tmp_path / "tmp-cut-3"), True), NOW)
    assert not worker.finish_writer(5.0)  # still held: T is not set, the cut cannot be published
    worker.dispatch(ipc_frames.release_frames(3), NOW)
    assert not worker.finish_writer(0.1) and worker.writer is not None  # not done within the time
    os.write(go_w, b"!")
    assert worker.finish_writer(10.0) and worker.writer is None
    cut_id, index, ok, part = ipc_frames.read_part_done(worker.coordinator.sent[-1])
    assert (cut_id, index, ok, part["messages"]) == (3, 0, True, 1)
    os.close(go_r)
    os.close(go_w)


def test_a_writer_that_cannot_write_gives_part_done_not_ok(worker, tmp_path):
    (tmp_path / "file").write_text("")
    worker.dispatch(ipc_frames.snap_frames(0, 4, str(tmp_path / "file" / "tmp-cut-4"), False), NOW)
    worker.end_writer()
    assert ipc_frames.read_part_done(worker.coordinator.sent[-1]) == (4, 0, False, {"error": "Not a directory"})


def test_load_keeps_the_queues_the_worker_owns(worker, tmp_path):
    other = PartitionService(1, 1000, {}, max_wait=30)
    other.accepting = True
    for name in ("mine", "theirs"):
        other.handle(produce(name, "x"), Origin(1), 1, NOW)
    path = str(tmp_path / "part-0.qsp")
    write_part(path, other.snapshot_frames(), 9)
    worker.owns = lambda name: name == "mine"
    worker.dispatch(ipc_frames.load_frames(9, [path]), NOW)
    assert list(worker.services[0].queues) == ["mine"]
    (level, line, *args), = worker.log.lines
    assert level == "info" and (line % tuple(args)).startswith(
        "worker 0 loaded 1 queues holding 1 messages from the snapshot at trans_id 9 in ")


def test_a_part_that_cannot_be_loaded_stops_the_worker_in_one_line(worker, tmp_path):
    path = str(tmp_path / "part-0.qsp")
    write_part(path, iter(()), 9)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 1)
    with pytest.raises(SystemExit) as stopped:
        worker.dispatch(ipc_frames.load_frames(9, [path]), NOW)
    assert stopped.value.code == 4
    (level, line, *args), = worker.log.lines
    assert level == "error" and "torn frame at offset 16; stopping" in line % tuple(args)


# ----------------------------------------------------------------- queue groups
def _two_groups() -> Worker:
    """A worker of a node that is a replica of groups 0 and 2 (docs/plans/queue-groups.md)."""
    services = {g: PartitionService(1, 1000, {}, max_wait=30) for g in (0, 2)}
    return Worker(services, None, Pipe(), Log(), 4, metrics=WorkerMetrics(CollectorRegistry()))


def test_each_group_has_its_own_service_mode_and_epoch_and_one_batch_carries_them_all():
    w = _two_groups()
    w.dispatch(ipc_frames.mode_frames(True, 3, group=0), NOW)  # the node leads group 0 ...
    w.dispatch(ipc_frames.mode_frames(False, 7, group=2), NOW)  # ... and follows group 2
    w.dispatch(ipc_frames.req_frames([ipc_frames.req_item(Origin(5), 1, produce("a", "x"))], 3, 0), NOW)
    w.dispatch(ipc_frames.req_frames([ipc_frames.req_item(Origin(5), 2, produce("b", "y"))], 7, 2), NOW)
    w.dispatch(ipc_frames.req_frames([ipc_frames.req_item(Origin(5), 3, produce("c", "z"))], 8, 2), NOW)  # held
    w.flush()
    [frames] = w.coordinator.sent  # one message ...
    assert ipc_frames.batch_index(frames) == 4
    (g0, records0, header0, blob0, _, epoch0), (g2, records2, header2, blob2, _, epoch2) = ipc_frames.read_batch(frames)
    assert (g0, epoch0, [r["queue"] for r in orjson.loads(records0)]) == (0, 3, ["a"])  # ... a part per group
    assert (g2, epoch2, orjson.loads(records2)) == (2, 7, [])  # group 2 follows: refused, nothing changed
    assert [r["code"] for _, _, r in ((o, n, orjson.loads(d)) for o, n, d in replies.decode(header2, blob2))] == [-1]
    assert list(w.services[0].queues) == ["a"] and list(w.services[2].queues) == []
    assert w.epochs == {0: 3, 2: 7} and len(w.held[2]) == 1 and w.held[0] == []
    w.dispatch(ipc_frames.mode_frames(True, 8, group=2), NOW)  # group 2's mode 8 releases its held REQ
    w.flush()
    [(g, records, *_)] = ipc_frames.read_batch(w.coordinator.sent[-1])
    assert (g, [r["queue"] for r in orjson.loads(records)]) == (2, ["c"])
    assert w.epochs == {0: 3, 2: 8} and w.services[0].accepting


def test_a_fence_ends_only_its_groups_mode():
    w = _two_groups()
    for group in (0, 2):
        w.dispatch(ipc_frames.mode_frames(True, 1, group=group), NOW)
    for sender in sorted(ipc_frames.FENCE_SENDERS):
        w.dispatch(ipc_frames.fence_frames(1, sender, 2), NOW)
    [fenced] = w.coordinator.sent
    assert ipc_frames.read_fenced(fenced) == (1, 4) and ipc_frames.group_of(fenced) == 2
    assert w.services[2].fenced and not w.services[0].fenced


def test_a_message_of_a_group_the_node_does_not_hold_is_dropped_and_logged_once():
    w = _two_groups()
    for _ in range(2):
        w.dispatch(ipc_frames.req_frames([ipc_frames.req_item(Origin(5), 1, produce("a", "x"))], 0, 1), NOW)
        w.dispatch(ipc_frames.mode_frames(True, 1, group=1), NOW)
    w.flush()
    assert w.coordinator.sent == [] and w.epochs == {0: 0, 2: 0}
    [(level, text, *args)] = w.log.lines
    assert level == "error" and text % tuple(args) == (
        "dropped a b'req' message of queue group 1, which this node is no replica of (logged once per group)")


def test_a_torn_overflow_segment_is_logged_once_per_group_and_segment():
    services = {g: PartitionService(1, 1000, {}, max_wait=30,
                                    overflow=Overflow(BodyBudget(100), SimpleNamespace(where=f"/ov/g{g}")))
                for g in (0, 2)}
    w = Worker(services, None, Pipe(), Log(), 4, metrics=WorkerMetrics(CollectorRegistry()))
    services[0].overflow.torn[3] = 1
    services[2].overflow.torn[3] = 2  # the same number in another group's folder: its own line
    w.after()
    services[0].overflow.torn[3] += 1  # more of a segment already said: no line
    w.after()
    services[2].overflow.torn[5] = 1
    w.after()
    said = [text % tuple(args) for level, text, *args in w.log.lines if level == "error"]
    assert [line.split(" holds")[0] for line in said] == [
        "overflow segment 3 in /ov/g0", "overflow segment 3 in /ov/g2", "overflow segment 5 in /ov/g2"]
    assert all(line.endswith("reason 'body unreadable'") for line in said)


def test_a_cut_writes_its_own_group_s_part_and_only_that_group_s_mode_ends_its_hold(tmp_path):
    w = _two_groups()
    for group, queue in ((0, "a"), (2, "b")):
        w.dispatch(ipc_frames.mode_frames(True, 1, group=group), NOW)
        w.dispatch(ipc_frames.req_frames([ipc_frames.req_item(Origin(5), 1, produce(queue, "x"))], 1, group), NOW)
    w.flush()
    sent = len(w.coordinator.sent)
    tmp = str(tmp_path / "tmp-cut-1")
    w.dispatch(ipc_frames.snap_frames(1, 1, tmp, True, 2), NOW)  # group 2's cut, holding
    snapped = w.coordinator.sent[sent]
    assert ipc_frames.read_snapped(snapped) == (1, 1, 4) and ipc_frames.group_of(snapped) == 2
    w.end_writer()
    w.dispatch(ipc_frames.mode_frames(False, 2, group=0), NOW)  # group 0's mode changes: the hold stays
    assert len(w.coordinator.sent) == sent + 1 and w.out_held
    w.dispatch(ipc_frames.release_frames(1, 0), NOW)  # group 0's cut 1 is another cut: the hold stays
    assert len(w.coordinator.sent) == sent + 1
    w.dispatch(ipc_frames.release_frames(1, 2), NOW)
    part_done = w.coordinator.sent[-1]
    assert part_done[0] == ipc_frames.PART_DONE and ipc_frames.group_of(part_done) == 2
    _, _, ok, part = ipc_frames.read_part_done(part_done)
    assert ok and part["queues"] == 1  # group 2's queue "b", not group 0's "a"
    loaded = PartitionService(1, 1000, {}, max_wait=30)
    loaded.load_frames(iter_frames(os.path.join(tmp, part["file"]), 0))
    assert list(loaded.queues) == ["b"]


def test_with_overflow_max_memory_mb_counts_what_the_worker_holds_and_a_purge_frees_it_at_once():
    """RSS does not fall when messages go; the count (memory_bytes) does: produces are refused
    past the worker's share of max_memory_mb, and served again as soon as a purge frees it."""
    from queue_server.server.node_memory import HeldMemory
    from queue_server.workers.body_budget import PER_MESSAGE
    from tests.unit.service_replies import take_replies
    from tests.unit.test_overflow import FakeFiles

    service = PartitionService(1, 100_000, {}, max_wait=30, max_memory_mb=1,
                               overflow=Overflow(BodyBudget(1 << 16), FakeFiles()))
    memory = HeldMemory([service], 1, workers=2)  # a share of 512 KiB
    log = Log()
    w = Worker({0: service}, None, Pipe(), log, 0, metrics=WorkerMetrics(CollectorRegistry()), memory=memory)
    body = "x" * 100
    fits = ((1 << 19) - (1 << 16)) // PER_MESSAGE  # the bodies held fill their 64 KiB, the rest is per message
    service.handle({"action": 1, "queue": "q", "data": [body] * fits}, Origin(1), 1, NOW)
    w.check_memory(0.0)
    assert not service.memory_full and memory.used(0.0) <= memory.limit
    service.handle({"action": 1, "queue": "q", "data": [body] * 100}, Origin(1), 2, NOW)
    w.check_memory(1.0)
    assert service.memory_full and memory.used(1.0) > memory.limit
    service.handle({"action": 1, "queue": "q", "data": "more"}, Origin(1), 3, NOW)
    reason = [r for _, n, r in take_replies(service) if n == 3][0]["reason"]
    assert reason.startswith("node memory limit reached: this node holds more for its messages than max_memory_mb (1)")
    service.handle({"action": 21, "queue": "q"}, Origin(1), 4, NOW)  # purge
    w.check_memory(2.0)
    assert not service.memory_full and memory.used(2.0) == 0
    said = [line[1] % line[2:] for line in log.lines if line[0] == "warning"]
    assert said == ["worker 0 holds 0 MiB for its messages, over its share (0 MiB) of max_memory_mb (1): produces are refused",
                    "worker 0 holds 0 MiB for its messages, back under its share (0 MiB) of max_memory_mb (1): "
                    "produces are served again"], said
