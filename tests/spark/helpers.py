"""Test-only pieces that executors import (through PYTHONPATH): a sink whose first task attempt
dies after it has produced part of its rows."""
from __future__ import annotations

from collections.abc import Iterator

from queue_server.client import QueueClient
from queue_server.spark.options import WriteOptions
from queue_server.spark.sink import QueueWriter
from queue_server.spark.source import QueueDataSource


class FailFirstAttemptWriter(QueueWriter):
    """A QueueWriter whose first attempt of every task dies after its first record batch was
    sent; before dying it notes, in queue <queue>-attempts, how many messages were stored."""

    def write(self, iterator: Iterator):
        from pyspark import TaskContext

        if TaskContext.get().attemptNumber() == 0:
            iterator = self._die_after_first(iterator)
        return super().write(iterator)

    def _die_after_first(self, iterator: Iterator) -> Iterator:
        yield next(iterator)
        with QueueClient(self.opts.hosts) as c:
            c.produce(self.opts.queue + "-attempts", str(c.monitor(self.opts.queue)["size"]))
        raise RuntimeError("injected: the task dies after producing its first batch")


class FailFirstAttemptSink(QueueDataSource):
    """Format "queue_fail_first": the queue source whose batch writer is FailFirstAttemptWriter."""

    @classmethod
    def name(cls) -> str:
        return "queue_fail_first"

    def writer(self, schema, overwrite):
        return FailFirstAttemptWriter(WriteOptions.parse(self.options), schema)


def fail_first_attempt(value: str) -> str:
    """A UDF body that fails every task's first attempt (after the task has read its rows)."""
    from pyspark import TaskContext

    if TaskContext.get().attemptNumber() == 0:
        raise RuntimeError("injected: the task dies after reading")
    return value
