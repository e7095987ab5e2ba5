"""How the coordinator batches what one Ready sends a node's own processes: as few ZeroMQ messages
per destination as the order the receiver relies on allows (each send wakes two I/O threads).
Pure: frames in, frames out."""
from __future__ import annotations

from queue_server.protocol import ipc_frames

# Most REPs joined into one message: a message has at most 255 parts (server/ipc.py pack),
# and each reply batch is two.
MAX_JOINED_REPS = 127


def for_acceptor(messages: tuple[list[bytes], ...] | list[list[bytes]]) -> list[list[bytes]]:
    """The messages for the acceptor: status first, then the reply batches side by side in one
    REP (MAX_JOINED_REPS at most: more take more), as they are: the acceptor reads a REP's
    batches one after another, so nothing is decoded to join them. Status first, so that the
    acceptor knows of a change of role before a client can read a reply caused by it (and send
    its next request to a role that is over)."""
    if len(messages) == 1:
        return list(messages)  # the common case: one reply batch, or one status
    others = [m for m in messages if m[0] != ipc_frames.REP]
    reps = [m for m in messages if m[0] == ipc_frames.REP]
    if len(reps) < 2:
        return others + reps
    return others + [ipc_frames.join_reps(reps[i:i + MAX_JOINED_REPS])
                     for i in range(0, len(reps), MAX_JOINED_REPS)]


def for_workers(messages: tuple[tuple[int, list[bytes]], ...] | list[tuple[int, list[bytes]]]
                ) -> list[tuple[int, list[bytes]]]:
    """The (worker index, frames) messages with each run of requests that follow one another to
    one worker, under one mode, joined into one request: a worker serves the items of a request
    in order, as it would serve them one request at a time. Every other message keeps its place
    in its worker's order."""
    out: list[tuple[int, list[bytes]]] = []
    last_of: dict[int, int] = {}  # worker -> index in out of its latest message
    runs: dict[int, list[list[bytes]]] = {}  # index in out -> the requests to join there
    for index, frames in messages:
        at = last_of.get(index)
        if at is not None and ipc_frames.same_mode_reqs(out[at][1], frames):
            run = runs.get(at)
            if run is None:
                runs[at] = [out[at][1], frames]
            else:
                run.append(frames)
            continue
        last_of[index] = len(out)
        out.append((index, frames))
    for at, reqs in runs.items():
        out[at] = (out[at][0], ipc_frames.join_reqs(reqs))
    return out
