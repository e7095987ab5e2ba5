"""Where a client's request goes and when it gives up: the redirect and fail-over rules that
QueueClient, AsyncQueueClient and the subscriptions share.

Pure: the outcome of each attempt (a reply, or the exception the transport raised) and the clock
go in; decisions come out (send to this host, send again, give up with this error, wait this
long). The clients only connect, send, receive and sleep.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import protocol as p
from . import tls
from .errors import NoServerAvailable, QueueError, QueueTimeout
from .group_leaders import GroupLeaders
from .protocol import Address


class Lost(Exception):
    """The connection closed before the reply arrived; `reused`: it had been open before this
    request (a server may close an idle connection, so one more try on a new one is free)."""

    def __init__(self, detail: str, reused: bool = False) -> None:
        super().__init__(detail)
        self.reused = reused


def describe(exc: BaseException) -> str:
    """A failed attempt on one host, in one line: a Lost by its text, a TLS failure as
    client/tls.py says it, others with their type."""
    tls_text = tls.describe(exc)
    if tls_text is not None:
        return tls_text
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, Lost) else f"{type(exc).__name__}: {text}"


class Drop(enum.IntEnum):
    """What becomes of the connections made before a move to another host."""

    KEEP = 0  # nothing moved
    FINISH = 1  # the host is fine (a redirect, or skipped): let replies already asked for come, then close
    CLOSE = 2  # the host failed: close them now (calls waiting on them fail over at once)


class Verdict(enum.Enum):
    """What to do after one attempt (a QueueError returned instead means: raise it)."""

    DONE = "done"  # the reply is the answer
    AGAIN = "again"  # send again to the host next() names (a closed idle connection, a redirect, a resend)
    NEXT = "next"  # this host failed: send to the host next() names, unless next() gives up


DONE, AGAIN, NEXT = Verdict.DONE, Verdict.AGAIN, Verdict.NEXT


class Route:
    """A client's current host: the leader a redirect named, else hosts[index].

    `epoch` counts the moves; an attempt remembers the epoch it was sent in, so that of several
    concurrent calls failing on one host only the first moves the route on.
    """

    def __init__(self, hosts: Sequence[Address]) -> None:
        self.hosts = list(hosts)
        self.host_set = frozenset(self.hosts)
        self.index = 0
        self.leader: Address | None = None
        self.epoch = 0
        # With queue groups: each group's leader (client/group_leaders.py); None until known.
        # groups_asked: whether the cluster was asked (a cluster of one group has none).
        self.groups: GroupLeaders | None = None
        self.groups_asked = False

    @property
    def address(self) -> Address:
        """The host the next request goes to."""
        return self.leader or self.hosts[self.index]

    def advance(self, epoch: int) -> bool:
        """Go on from the host tried in `epoch` to the next one; False if the route had already
        moved since."""
        if epoch != self.epoch:
            return False
        if self.leader is not None:
            self.leader = None
        else:
            self.index = (self.index + 1) % len(self.hosts)
        self.epoch += 1
        return True

    def move(self, epoch: int, target: Address) -> bool:
        """Send what follows to `target` (a redirect named it); False if another call already did."""
        if epoch != self.epoch and self.leader == target:
            return False
        self.leader = target
        self.epoch += 1
        return True

    def renew(self) -> None:
        """Start a new epoch on the same host: connections made before are not used again."""
        self.epoch += 1


@dataclass(frozen=True, slots=True)
class Attempt:
    """Send the request to `addr` now (on a connection of `epoch`); first `drop` the connections
    of the hosts the route left."""

    addr: Address
    epoch: int
    drop: Drop


# How many times one call sends its request again to a host that refused it unapplied because
# its mode changed (a hand-off, a new leader): it knows by then where the request goes.
MAX_RESENDS = 3
# When every host failed and one of them refused the request unapplied (no leader, leadership
# changed: an election is under way), the call pauses and tries the hosts again, the pause
# doubling from ROUND_PAUSE up to ROUND_PAUSE_MAX, for as long as its patience lasts.
ROUND_PAUSE = 0.05
ROUND_PAUSE_MAX = 0.4


class Failover:
    """One request's way through the hosts: each host at most once per call, redirects (code -2)
    followed up to `max_redirects` times, one free retry when a kept-open connection turns out
    closed. A reply saying nothing was applied (p.NOT_APPLIED: no leader, not leading, the
    node's mode changed) is sent again, and so is one of unknown outcome (p.UNKNOWN_OUTCOME: the
    leader changed or did not answer) for a produce with producer and sequence (sending it again
    stores it once): to the same host, up to MAX_RESENDS times, when that host has learnt who
    leads since (p.resend_here), else to the next host. When every host failed and one of them
    refused it so (the cluster is between two leaders), the call pauses and goes round the
    hosts again, until `patience` seconds have passed since `now` at its start (0: never; a
    single host's refusal is then the call's error at once). When every host failed: the
    refusal itself if there is one host, QueueTimeout if the last one timed out, else
    NoServerAvailable, naming each host's failure in the last round.

    With queue groups (the route's `groups`), a request about a queue goes first to its group's
    leader when that is known; a redirect moves that group's leader, not the route; a leader
    that fails the request is forgotten, and the request goes on as any other does.
    """

    def __init__(
        self,
        route: Route,
        req: dict[str, Any],
        timeout: float,
        follow_redirects: bool = True,
        max_redirects: int = 3,
        *,
        patience: float = 0.0,
        now: float = 0.0,
    ) -> None:
        self.route = route
        self.req = req
        # With queue groups, a request about a queue goes first to its group's leader when the
        # route knows it; if that fails, the way any request goes.
        groups = route.groups
        self._direct = groups.leader_of(req) if groups is not None else None
        self._now = now
        self.wait = p.reply_wait(req)
        self.timeout = timeout + self.wait  # one attempt's limit: the server may hold a long poll
        self.follow_redirects = follow_redirects
        self.max_redirects = max_redirects
        self.redirects = 0
        self.resends = 0
        self._may_reuse = True
        self._failed: set[Address] = set()
        self._errors: list[str] = []
        self._timed_out = False
        self._drop = Drop.KEEP
        self._give_up_at = now + patience
        self._patient = patience > 0
        self._pause = ROUND_PAUSE
        # A host of this round refused the request unapplied (the cluster is between two
        # leaders): its refusal, the last one (with one host, the error to give up with).
        self._refusal: QueueError | None = None

    def next(self, now: float = 0.0) -> Attempt | QueueError | float:
        """The host to send to now; or the seconds to pause before calling again (every host
        failed this round, one because the cluster is between two leaders, and the patience
        lasts); or the error to give up with (every host failed)."""
        route = self.route
        if self._failed and route.host_set <= self._failed:
            if self._refusal is None or now + self._pause > self._give_up_at:
                if len(route.host_set) < 2 and self._refusal is not None:
                    return self._refusal
                return self._unavailable()
            pause, self._pause = self._pause, min(self._pause * 2, ROUND_PAUSE_MAX)
            self._failed.clear()
            self._errors.clear()
            self._timed_out = False
            self._refusal = None
            return pause
        if self._direct is not None and self._direct not in self._failed:
            drop, self._drop = self._drop, Drop.KEEP
            return Attempt(self._direct, route.epoch, drop)
        while route.address in self._failed:  # it failed this call already: skip it
            route.advance(route.epoch)
            self._drop = max(self._drop, Drop.FINISH)  # others may still use it: let their replies come
        drop, self._drop = self._drop, Drop.KEEP
        return Attempt(route.address, route.epoch, drop)

    def _direct_failed(self, attempt: Attempt) -> bool:
        """Whether `attempt` went to its group's leader straight: then that leader is forgotten,
        and the request goes the way any request goes."""
        if self._direct is None or attempt.addr != self._direct:
            return False
        assert self.route.groups is not None
        self.route.groups.failed(self.req, attempt.addr, self._now)
        self._direct = None
        return True

    def replied(self, attempt: Attempt, reply: dict[str, Any]) -> Verdict | QueueError:
        """The verdict on a reply: DONE (code 0), AGAIN (a redirect, or a refusal to send again to
        the same host), NEXT, or the reply's error."""
        code = reply.get("code")
        if code == p.CODE_OK:
            return DONE
        if code == p.CODE_REDIRECT and self.follow_redirects and self.redirects < self.max_redirects:
            target = p.redirect_target(reply, attempt.addr[0])
            if target is not None:
                self.redirects += 1
                groups = self.route.groups
                if groups is not None and type(self.req.get("queue")) is str:  # its group's leader, not every request's
                    groups.moved(self.req, target)
                    self._direct = target
                elif self.route.move(attempt.epoch, target):
                    self._drop = max(self._drop, Drop.FINISH)
                return AGAIN
        error = p.error_from_reply(reply)
        if not p.retry_elsewhere(self.req, reply):
            return error
        if self._direct_failed(attempt):  # its leader no longer leads: through any node
            return AGAIN
        if p.resend_here(reply) and self.resends < MAX_RESENDS:
            self.resends += 1
            return AGAIN
        if len(self.route.host_set) < 2 and not self._patient:
            return error
        self._refusal = error
        return self._host_failed(attempt, error, timed_out=False)

    def failed(self, attempt: Attempt, exc: BaseException) -> Verdict:
        """The verdict when the transport raised `exc` (Lost, TimeoutError or another OSError):
        AGAIN once for a kept-open connection found closed, else NEXT."""
        if isinstance(exc, Lost) and exc.reused and self._may_reuse:
            self._may_reuse = False
            return AGAIN
        if self._direct_failed(attempt):
            self._failed.add(attempt.addr)
            self._errors.append(f"{p.format_address(attempt.addr)}: {describe(exc)}")
            return NEXT
        return self._host_failed(attempt, exc, timed_out=isinstance(exc, TimeoutError))

    def _host_failed(self, attempt: Attempt, exc: BaseException, timed_out: bool) -> Verdict:
        self._failed.add(attempt.addr)
        self._errors.append(f"{p.format_address(attempt.addr)}: {describe(exc)}")
        self._timed_out = timed_out
        if not self.route.host_set <= self._failed and self.route.advance(attempt.epoch):
            self._drop = Drop.CLOSE
        return NEXT

    def _unavailable(self) -> QueueError:
        if self._timed_out:
            return QueueTimeout(p.CODE_ERROR, "timed out: " + "; ".join(self._errors))
        return NoServerAvailable(p.CODE_ERROR, "no server available: " + "; ".join(self._errors))


class Reconnect:
    """When a subscription that lost its connection tries again: every `pause` seconds until
    `patience` seconds have passed since it started trying, then NoServerAvailable."""

    def __init__(self, now: float, what: str, patience: float = 30.0, pause: float = 0.2) -> None:
        self.deadline = now + patience
        self.what = what
        self.pause = pause

    def failed(self, now: float, exc: BaseException) -> float | QueueError:
        """Seconds to wait before the next try, or the error to give up with."""
        if now > self.deadline:
            last = str(exc) or type(exc).__name__
            return NoServerAvailable(p.CODE_ERROR, f"{self.what}: no leader reachable: {last}")
        return self.pause
