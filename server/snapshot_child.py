"""The child a worker forks for a snapshot (ipc_frames SNAP): it writes the worker's queues, as
they were at the fork, into one part file, then leaves. It shares the worker's memory copy on
write, so it touches as little as it can: no ZeroMQ socket (their threads did not survive the
fork), no garbage collection, no exit handlers (os._exit), and it runs at SCHED_IDLE so that the
worker and the other processes of the node keep the CPU."""
from __future__ import annotations

import gc
import os
import signal
from collections.abc import Callable, Sequence

from queue_server.replication.snapshot import write_part
from queue_server.server.child import die_with_parent
from queue_server.server.overflow_files import sync_segments
from queue_server.workers.service import PartitionService


def part_name(index: int) -> str:
    """The file name of worker `index`'s part in a cut's directory."""
    return f"part-{index}.qsp"


def fork_writer(service: PartitionService, tmp: str, index: int,
                before_write: Callable[[], None] = lambda: None, close: Sequence[int] = ()) -> int:
    """Fork a child that writes `service`'s queues as part `index` into directory `tmp`; the
    child's pid. The child exits 0 once the part is written and fsync'd; when it could not be,
    with the errno of the failure (ENOSPC, ...: see exit_reason), or 1; a signal (the worker
    died, SIGTERM) ends it unfinished. close: descriptors the child closes first, the locks of
    the worker's folders (a child that outlives its worker for a moment must not make a
    restarted node find them in use). before_write runs in the child next (tests)."""
    pid = os.fork()
    if pid:
        return pid
    status = 1
    try:
        for fd in close:
            os.close(fd)
        gc.disable()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the worker's handler would run its exit code
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        die_with_parent()
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError):
            pass
        before_write()
        write_part_inline(service, tmp, index)
        status = 0
    except OSError as exc:
        status = exc.errno if exc.errno and 1 < exc.errno < 126 else 1
    except BaseException:
        status = 1
    finally:
        os._exit(status)


def write_part_inline(service: PartitionService, tmp: str, index: int) -> None:
    """What the forked child writes, written in the calling process (Worker write_inline: the
    node sim). With overflow on, the bodies on disk are written as references (REFS) to the
    segments the worker linked beside the part (overflow_files.link_segments), fsync'd here.
    Raises OSError."""
    os.makedirs(tmp, exist_ok=True)
    path = os.path.join(tmp, part_name(index))
    overflow = service.overflow
    write_part(path, service.snapshot_frames(refs=overflow is not None))
    if overflow is not None:
        sync_segments(path, overflow.live)


def exit_reason(code: int) -> str:
    """Why a writer ended so, from os.waitstatus_to_exitcode."""
    if code < 0:
        return f"its writer was killed by signal {-code}"
    if code == 1:
        return "its writer failed"
    return os.strerror(code)
