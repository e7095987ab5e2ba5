"""An app producing into a virtual queue: every event is stored in each member queue, so that
each pipeline reading one member gets all of them.

    queue-server --config examples/virtual_queue.json &
    python examples/fanout_app.py --events 10000
    python examples/fanout_job.py --queue events_billing --out /tmp/billing   # job 1
    python examples/fanout_job.py --queue events_search --out /tmp/search     # job 2

The app's produces are idempotent (producer id + sequence): if a request times out and is sent
again, the events are not stored twice. Run it again with the same --producer to see every
batch answered as a duplicate.
"""
from __future__ import annotations

import argparse
import json
import random

from queue_server.client import QueueClient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="127.0.0.1:1111")
    parser.add_argument("--queue", default="events", help="the virtual queue")
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--producer", default="fanout-app-1", help="idempotent producer id")
    args = parser.parse_args()

    rng = random.Random(7)
    stored = duplicates = 0
    with QueueClient(args.hosts, timeout=10) as client:
        for sequence, start in enumerate(range(0, args.events, args.batch)):
            batch = [
                json.dumps({"event": i, "user": rng.randrange(100), "amount": rng.randrange(1, 500)})
                for i in range(start, min(args.events, start + args.batch))
            ]
            reply = client.request({"action": "produce", "queue": args.queue, "data": batch,
                                    "retry": 30, "producer": args.producer, "sequence": sequence})
            if reply.get("duplicate"):
                duplicates += len(batch)
            else:
                stored += len(batch)
            if sequence == 0:
                print("first batch stored in:", ", ".join(sorted(reply["msg_ids"])))
    print(f"{stored} events stored, {duplicates} already there (duplicates)")


if __name__ == "__main__":
    main()
