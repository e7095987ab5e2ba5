"""The coordinator's batching (server/batching.py) without sockets: what one Ready sends the
acceptor and the workers, as few messages per destination as their order allows."""
from __future__ import annotations

from queue_server.server import batching
from queue_server.protocol import ipc_frames, replies
from queue_server.protocol.origin import Origin


def _rep(conn: int, seq: int) -> list[bytes]:
    return [ipc_frames.REP, *replies.encode([(Origin(conn), seq, {"code": 0, "seq": seq})])]


def _req(item: str, epoch: int = 3) -> list[bytes]:
    return ipc_frames.req_frames([ipc_frames.req_item(Origin(1), 0, {"queue": item})], epoch)


def _items(frames: list[bytes]) -> list[str]:
    return [request["queue"] for _, _, request, _ in ipc_frames.read_req(frames)]


def test_the_acceptor_gets_status_first_and_one_reply_batch():
    status = ipc_frames.status_frames({"role": "leader"})
    out = batching.for_acceptor([_rep(1, 1), status, _rep(2, 2)])
    assert out[0] == status and len(out) == 2
    assert _delivered(out[1]) == [(1, 1), (2, 2)]
    assert batching.for_acceptor([_rep(1, 1)]) == [_rep(1, 1)]
    assert batching.for_acceptor([status]) == [status]
    assert batching.for_acceptor([]) == []


def _delivered(frames: list[bytes]) -> list[tuple[int, int]]:
    return [(o.conn, n) for header, blob in ipc_frames.read_rep(frames) for o, n, _ in replies.decode(header, blob)]


def test_reply_batches_are_joined_undecoded_within_the_frame_limit():
    """A message holds at most 255 parts: past MAX_JOINED_REPS batches, another REP."""
    many = [_rep(conn, conn) for conn in range(batching.MAX_JOINED_REPS + 3)]
    out = batching.for_acceptor(many)
    assert [len(m) for m in out] == [1 + 2 * batching.MAX_JOINED_REPS, 1 + 2 * 3]
    assert max(len(m) for m in out) <= 255
    assert [x for m in out for x in _delivered(m)] == [(conn, conn) for conn in range(len(many))]
    assert out[0][1:3] == many[0][1:]  # the batches as they came: never decoded


def test_requests_that_follow_one_another_to_a_worker_become_one():
    out = batching.for_workers([(0, _req("a")), (1, _req("x")), (0, _req("b")), (0, _req("c"))])
    assert [(i, _items(f)) for i, f in out] == [(0, ["a", "b", "c"]), (1, ["x"])]
    assert ipc_frames.req_epoch(out[0][1]) == 3


def test_requests_are_not_joined_across_another_message_or_mode():
    """A fence or a mode change between two requests is a barrier the worker relies on."""
    fence = ipc_frames.fence_frames(3, ipc_frames.FROM_COORDINATOR)
    mode = ipc_frames.mode_frames(True, 4)
    out = batching.for_workers([(0, _req("a")), (0, fence), (0, _req("b")), (0, mode), (0, _req("c", 4)),
                                (0, _req("d", 5))])
    assert [f[0] for _, f in out] == [ipc_frames.REQ, ipc_frames.FENCE, ipc_frames.REQ, ipc_frames.MODE,
                                      ipc_frames.REQ, ipc_frames.REQ]
    assert [_items(f) for _, f in out if f[0] == ipc_frames.REQ] == [["a"], ["b"], ["c"], ["d"]]


def test_each_workers_messages_keep_their_order():
    apply = ipc_frames.apply_frames([])
    messages = [(1, _req("x")), (0, apply), (1, _req("y")), (0, _req("a")), (1, apply), (1, _req("z"))]
    out = batching.for_workers(messages)
    for worker in (0, 1):
        mine = [f for i, f in out if i == worker]
        flat = [x for f in mine for x in (_items(f) if f[0] == ipc_frames.REQ else [f[0]])]
        expected = [x for i, f in messages if i == worker
                    for x in (_items(f) if f[0] == ipc_frames.REQ else [f[0]])]
        assert flat == expected
    assert len(out) == 5  # x and y joined
