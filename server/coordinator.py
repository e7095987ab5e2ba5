"""The coordinator process: the node's serialization point. It gives every change record from the
workers the next trans_id, appends it to the change log, and releases each batch's replies to the
acceptor once the batch is committed. It also finishes scattered monitor/list requests."""
from __future__ import annotations

import sys

import orjson
import zmq

from config.loader import NodeConfig
from replication.log import ChangeLog
from server import gather, ipc
from server.child import start



class Coordinator:
    """Assigns trans_ids, keeps the change log, and forwards committed replies."""

    def __init__(self, config: NodeConfig, inbox: zmq.Socket, acceptor: zmq.Socket, log) -> None:
        self.config = config
        self.inbox = inbox
        self.acceptor = acceptor
        self.log = log
        self.changes = ChangeLog(config.queue_log_size)
        self.vote_id = 1
        self.gatherer = gather.Gatherer()

    def run(self) -> None:
        """Serve until terminated."""
        ipc.serve(self.inbox, self.dispatch, lambda: None, lambda: None)

    def dispatch(self, frames: list[bytes]) -> None:
        """Handle one inbox message."""
        if frames[0] == ipc.BATCH:
            _, records, header, blob, partials = frames
            if records != ipc.EMPTY_LIST:
                changes = self.changes
                _, last = changes.append(self.vote_id, orjson.loads(records))
                changes.commit_to(last)  # single node: a logged record is committed
            if header != ipc.EMPTY_LIST:
                self.acceptor.send_multipart([ipc.REP, header, blob])
            if partials != ipc.EMPTY_LIST:
                self.gather(orjson.loads(partials))
        else:
            self.log.warning("unknown message kind %r", frames[0])

    def node_fields(self) -> dict:
        """The node's own fields in a monitor reply."""
        return {
            "node_id": self.config.node_id,
            "leader_node_id": self.config.node_id,
            "trans_id": self.changes.last_trans_id,
            "log_size": len(self.changes),
            "max_log_size": self.config.queue_log_size,
        }

    def gather(self, partials: list) -> None:
        """Add workers' parts of scattered requests; reply to those now complete."""
        finished = []
        for tag, part in partials:
            done = self.gatherer.add(tag, part)
            if done is not None:
                conn, req_no, request, parts = done
                finished.append((conn, req_no, gather.merge(request, parts, self.node_fields())))
        if finished:
            header, blob = ipc.encode_replies(finished)
            self.acceptor.send_multipart([ipc.REP, header, blob])


def main(argv: list[str] | None = None) -> None:
    """Entry point of the coordinator process."""
    info = start("coordinator", argv)
    ctx = zmq.Context()
    inbox = ipc.inbox(ctx, info.run_dir, "coordinator")
    acceptor = ipc.outbox(ctx, info.run_dir, "acceptor")
    info.log.info("coordinator ready")
    try:
        Coordinator(info.config, inbox, acceptor, info.log).run()
    except KeyboardInterrupt:
        pass
    finally:
        ctx.destroy(linger=0)


if __name__ == "__main__":
    main(sys.argv[1:])
