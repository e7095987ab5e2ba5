"""Who leads: a Raft-style election in which vote_id is the term.

Pure logic: the time and messages are arguments, the result is a list of actions
(election/messages.py). Rules:

* A node grants at most one vote per vote_id (durable: vote_id, voted_for) and only to a candidate
  whose log is at least as up to date as its own: compare (last vote_id, last trans_id).
* A candidate needs votes from a majority of the whole cluster, itself included.
* Election timeouts are randomized in [election_timeout, 2 * election_timeout).
* Any message with a higher vote_id makes a node a follower of that term -- except a vote request
  that arrives while the node hears from a live leader (see below).
* Pre-vote: before raising its vote_id a node asks whether it could win; peers say yes only if
  they have not heard from a leader for an election timeout and the node's log is up to date.
  A node cut off from the cluster therefore never inflates its vote_id and never deposes a
  healthy leader when it comes back.
* Check quorum: a leader that has not heard from a majority (itself included) within an election
  timeout steps down and stops accepting writes. Followers that heard from a leader within an
  election timeout ignore vote requests (the leader's lease).
* Leadership transfer (Raft thesis 3.10): a leader asked to hand over (transfer_leadership)
  picks a live follower, waits until that follower's log equals its own and all of it is
  committed (on_progress; the caller has stopped taking new writes), then sends it TimeoutNow.
  The follower starts an election at once, without pre-vote, and marks its vote requests as a
  transfer, which voters grant even within the leader's lease. A transfer not finished by its
  deadline is aborted (TransferAborted): the node goes on leading.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from operator import attrgetter
from typing import Protocol

from queue_server.protocol.roles import Role
from queue_server.election.membership import membership
from queue_server.election.messages import (
    BecomeCandidate,
    BecomeFollower,
    BecomeLeader,
    Heartbeat,
    HeartbeatAck,
    PersistVote,
    Send,
    TimeoutNow,
    TransferAborted,
    VoteReply,
    VoteRequest,
)

Action = Send | PersistVote | BecomeLeader | BecomeFollower | BecomeCandidate | TransferAborted


class LogView(Protocol):
    """What the election reads of the local change log (replication.log.ChangeLog fits)."""

    @property
    def last_trans_id(self) -> int: ...

    @property
    def last_vote_id(self) -> int: ...

    @property
    def commit_trans_id(self) -> int: ...

    def term_at(self, trans_id: int) -> int | None: ...


class Election:
    """The election state machine of one node."""

    def __init__(
        self,
        node_id: int,
        members: Iterable[int],
        log: LogView,
        rng: random.Random,
        now: float,
        *,
        election_timeout: float = 1.0,
        heartbeat_interval: float = 0.1,
        vote_id: int = 0,
        voted_for: int | None = None,
        pre_vote: bool = True,
        check_quorum: bool = True,
    ) -> None:
        """members: every node_id of the cluster (this node's included). vote_id and voted_for:
        the durable state saved by an earlier run (PersistVote)."""
        self.node_id = node_id
        self.members, self.peers, self.quorum = membership(node_id, members)
        self.log = log
        self.rng = rng
        self.election_timeout = election_timeout
        self.heartbeat_interval = heartbeat_interval
        self.pre_vote = pre_vote
        self.check_quorum = check_quorum

        self._vote_id = vote_id
        self._voted_for = voted_for
        self._role = Role.FOLLOWER
        self._leader_id: int | None = None
        self._votes: set[int] = set()
        self._leader_contact = float("-inf")  # last time we heard from the current leader
        self._acks: dict[int, float] = {}  # leader: last time each peer answered
        self._next_heartbeat = now
        # A leadership transfer under way: to whom, until when, and whether TimeoutNow went out.
        self._transfer_target: int | None = None
        self._transfer_deadline = float("inf")
        self._transfer_sent = False
        # A cluster of one elects itself on the first tick.
        self._deadline = now if not self.peers else now + self._random_timeout()

    # ----------------------------------------------------------------- state

    role = property(attrgetter("_role"), doc="Role: follower, candidate or leader")
    vote_id = property(attrgetter("_vote_id"), doc="int: the current term")
    voted_for = property(attrgetter("_voted_for"), doc="int | None: who this node voted for in the current term")
    leader_id = property(attrgetter("_leader_id"),
                         doc="int | None: the leader of the current term, if known (this node's id when it leads)")

    @property
    def is_leader(self) -> bool:
        return self._role is Role.LEADER

    transfer_target = property(attrgetter("_transfer_target"),
                               doc="int | None: the follower this leader is handing leadership to, while a transfer is under way")

    @property
    def wake_at(self) -> float:
        """The latest time at which tick() should next be called."""
        if self._role is Role.LEADER:
            wake = min(self._next_heartbeat, self._quorum_expiry()) if self.check_quorum else self._next_heartbeat
            return min(wake, self._transfer_deadline)
        return self._deadline

    @property
    def durable(self) -> tuple[int, int | None]:
        """(vote_id, voted_for): what must survive a restart."""
        return self._vote_id, self._voted_for

    # ----------------------------------------------------------------- inputs

    def tick(self, now: float) -> list[Action]:
        """Advance time: heartbeats and check quorum for a leader, elections for the others."""
        actions: list[Action] = []
        if self._role is Role.LEADER:
            if self.check_quorum and not self._has_quorum(now):
                self._become_follower(self._vote_id, None, now, actions)
                return actions
            if now >= self._transfer_deadline:
                actions.append(TransferAborted(self._transfer_target))
                self._end_transfer()
            if now >= self._next_heartbeat:
                self._broadcast_heartbeat(now, actions)
            return actions
        if now >= self._deadline:
            self._campaign(now, actions, pre=self.pre_vote)
        return actions

    def on_message(self, msg: object, now: float) -> list[Action]:
        """Handle a message from a peer: election messages, and the term and sender of any other
        (replication) message whose class has SENDER "leader" or "follower". Messages from
        nodes outside the cluster are ignored."""
        actions: list[Action] = []
        if getattr(msg, "src", None) not in self.peers:
            return actions
        if isinstance(msg, VoteRequest):
            self._on_vote_request(msg, now, actions)
        elif isinstance(msg, VoteReply):
            self._on_vote_reply(msg, now, actions)
        elif isinstance(msg, TimeoutNow):
            # Only from the leader of our term (the only node that sends it in that term).
            if msg.vote_id == self._vote_id and self._role is Role.FOLLOWER:
                self._campaign(now, actions, pre=False, transfer=True)
        else:
            sender = getattr(type(msg), "SENDER", None)
            if sender == "leader":
                self._on_from_leader(msg, now, actions)
            elif sender == "follower":
                self._on_from_follower(msg, now, actions)
        return actions

    def transfer_leadership(self, now: float, timeout: float, matches: Mapping[int, int],
                            target: int | None = None, settled: bool = True) -> list[Action]:
        """Start handing leadership over (the caller stops taking new writes): to `target`, or
        to the live follower whose log reaches furthest. matches: each follower's match
        trans_id (how far its log is known to equal ours). settled=False: writes this leader
        decided may still be on their way into its log, so no TimeoutNow goes out now; the
        caller calls on_progress once they are all in. Nothing happens unless this node leads
        and some follower answered within an election timeout; transfer_target says whether a
        transfer started."""
        actions: list[Action] = []
        if self._role is not Role.LEADER or self._transfer_target is not None:
            return actions
        if target is None:
            target = self._furthest_live(now, matches)
            if target is None:
                return actions
        elif target not in self.peers:
            raise ValueError(f"{target} is not a peer of node {self.node_id}")
        self._transfer_target = target
        self._transfer_deadline = now + timeout
        self._transfer_sent = False
        if settled:
            actions.extend(self.on_progress(now, matches))
        return actions

    def retarget_transfer(self, now: float, matches: Mapping[int, int]) -> None:
        """During a transfer whose target has not answered for an election timeout (it stopped
        too, or is cut off; told to campaign, it would have deposed this leader by now): make
        the live follower whose log reaches furthest the target instead, if there is one
        (on_progress then tells it). Should the first still campaign, the votes elect one."""
        target = self._transfer_target
        if target is None or self._role is not Role.LEADER or self.live(now, target):
            return
        other = self._furthest_live(now, matches)
        if other is not None:
            self._transfer_target = other
            self._transfer_sent = False

    def on_progress(self, now: float, matches: Mapping[int, int]) -> list[Action]:
        """The followers' logs or the commit point moved (or, after transfer_leadership(...,
        settled=False), every write is in the log now): during a transfer, send TimeoutNow once
        the target's log equals ours and all of it is committed."""
        target = self._transfer_target
        if target is None or self._transfer_sent or self._role is not Role.LEADER:
            return []
        last = self.log.last_trans_id
        if matches.get(target, 0) < last or self.log.commit_trans_id < last:
            return []
        self._transfer_sent = True
        return [Send(target, TimeoutNow(self._vote_id, self.node_id))]

    # ----------------------------------------------------------------- handlers

    def _on_vote_request(self, m: VoteRequest, now: float, actions: list[Action]) -> None:
        in_lease = self.check_quorum and self._in_lease(now) and not m.transfer
        up_to_date = (m.last_vote_id, m.last_trans_id) >= (self.log.last_vote_id, self.log.last_trans_id)
        if m.pre_vote:
            granted = m.vote_id > self._vote_id and up_to_date and not in_lease
            self._reply_vote(m, granted, pre=True, actions=actions)
            return
        if m.vote_id > self._vote_id:
            if in_lease:
                self._reply_vote(m, False, pre=False, actions=actions)
                return
            self._become_follower(m.vote_id, None, now, actions)
        if m.vote_id < self._vote_id:
            self._reply_vote(m, False, pre=False, actions=actions)
            return
        granted = self._voted_for in (None, m.src) and up_to_date
        if granted:
            if self._voted_for != m.src:
                self._voted_for = m.src
                actions.append(PersistVote(self._vote_id, self._voted_for))
            self._deadline = now + self._random_timeout()
        self._reply_vote(m, granted, pre=False, actions=actions)

    def _reply_vote(self, m: VoteRequest, granted: bool, pre: bool, actions: list[Action]) -> None:
        vote_id = m.vote_id if granted else self._vote_id
        actions.append(Send(m.src, VoteReply(vote_id, self.node_id, granted, pre)))

    def _on_vote_reply(self, m: VoteReply, now: float, actions: list[Action]) -> None:
        if m.pre_vote:
            if m.granted:
                if self._role is Role.PRE_CANDIDATE and m.vote_id == self._vote_id + 1:
                    self._votes.add(m.src)
                    if len(self._votes) >= self.quorum:
                        self._campaign(now, actions, pre=False)
            elif m.vote_id > self._vote_id:
                self._become_follower(m.vote_id, None, now, actions)
            return
        if m.vote_id > self._vote_id:
            self._become_follower(m.vote_id, None, now, actions)
            return
        if self._role is Role.CANDIDATE and m.vote_id == self._vote_id and m.granted:
            self._votes.add(m.src)
            if len(self._votes) >= self.quorum:
                self._become_leader(now, actions)

    def _on_from_leader(self, m: object, now: float, actions: list[Action]) -> None:
        vote_id, src = m.vote_id, m.src
        if vote_id < self._vote_id:
            # A stale leader: tell it the current term so that it steps down.
            actions.append(Send(src, self._ack()))
            return
        if vote_id > self._vote_id:
            self._become_follower(vote_id, src, now, actions)
        elif self._role is Role.LEADER:
            raise AssertionError(f"two leaders in vote_id {vote_id}: {self.node_id} and {src}")
        elif self._role is not Role.FOLLOWER or self._leader_id != src:
            self._become_follower(vote_id, src, now, actions)
        self._leader_contact = now
        self._deadline = now + self._random_timeout()
        if isinstance(m, Heartbeat):
            actions.append(Send(src, self._ack()))

    def _on_from_follower(self, m: object, now: float, actions: list[Action]) -> None:
        if m.vote_id > self._vote_id:
            self._become_follower(m.vote_id, None, now, actions)
        elif m.vote_id == self._vote_id and self._role is Role.LEADER:
            self._acks[m.src] = now

    # ----------------------------------------------------------------- transitions

    def _campaign(self, now: float, actions: list[Action], pre: bool, transfer: bool = False) -> None:
        self._deadline = now + self._random_timeout()
        self._votes = {self.node_id}
        self._leader_id = None
        if pre:
            self._role = Role.PRE_CANDIDATE
            term = self._vote_id + 1
        else:
            self._role = Role.CANDIDATE
            self._vote_id += 1
            self._voted_for = self.node_id
            term = self._vote_id
            actions.append(PersistVote(self._vote_id, self._voted_for))
        actions.append(BecomeCandidate(term, pre))
        if len(self._votes) >= self.quorum:
            if pre:
                self._campaign(now, actions, pre=False)
            else:
                self._become_leader(now, actions)
            return
        req = VoteRequest(term, self.node_id, self.log.last_trans_id, self.log.last_vote_id, pre, transfer)
        actions.extend(Send(p, req) for p in self.peers)

    def _become_leader(self, now: float, actions: list[Action]) -> None:
        self._role = Role.LEADER
        self._leader_id = self.node_id
        self._votes = set()
        self._end_transfer()
        self._acks = {p: now for p in self.peers}  # a full timeout of grace before check quorum
        actions.append(BecomeLeader(self._vote_id))
        self._broadcast_heartbeat(now, actions)

    def _become_follower(self, vote_id: int, leader_id: int | None, now: float,
                         actions: list[Action]) -> None:
        was = (self._role, self._leader_id, self._vote_id)
        if vote_id > self._vote_id:
            self._vote_id = vote_id
            self._voted_for = None
            actions.append(PersistVote(vote_id, None))
        self._role = Role.FOLLOWER
        self._leader_id = leader_id
        self._votes = set()
        self._end_transfer()
        self._deadline = now + self._random_timeout()
        if was != (Role.FOLLOWER, leader_id, self._vote_id):
            actions.append(BecomeFollower(self._vote_id, leader_id))

    # ----------------------------------------------------------------- helpers

    def _end_transfer(self) -> None:
        self._transfer_target = None
        self._transfer_deadline = float("inf")
        self._transfer_sent = False

    def _broadcast_heartbeat(self, now: float, actions: list[Action]) -> None:
        self._next_heartbeat = now + self.heartbeat_interval
        hb = self.heartbeat()
        actions.extend(Send(p, hb) for p in self.peers)

    def heartbeat(self) -> Heartbeat:
        """This node's heartbeat in its current term: where its log ends and is committed."""
        commit = self.log.commit_trans_id
        commit_vote = self.log.term_at(commit) or 0  # always known: the log keeps its commit point
        return Heartbeat(self._vote_id, self.node_id, commit, commit_vote, self.log.last_trans_id, self.log.last_vote_id)

    def _ack(self) -> HeartbeatAck:
        return HeartbeatAck(self._vote_id, self.node_id, self.log.last_trans_id, self.log.last_vote_id)

    def live(self, now: float, peer: int) -> bool:
        """Whether `peer` answered this leader within an election timeout."""
        return now - self._acks.get(peer, float("-inf")) < self.election_timeout

    def _furthest_live(self, now: float, matches: Mapping[int, int]) -> int | None:
        """The live follower whose log reaches furthest (the lower id on a tie), or None."""
        live = [p for p in self.peers if self.live(now, p)]
        return max(live, key=lambda p: (matches.get(p, 0), -p)) if live else None

    def _quorum_expiry(self) -> float:
        """When this leader stops hearing from a majority if no follower answers again: an
        election timeout after the answer of the follower that makes the majority (the
        (quorum-1)-th most recent). Not the oldest answer: a follower that is down must not
        keep this time in the past, which would wake the leader's loop at once, over and over."""
        needed = self.quorum - 1  # followers, with this node
        if needed <= 0:
            return float("inf")
        acks = sorted(self._acks.values(), reverse=True)
        return (acks[needed - 1] if len(acks) >= needed else float("-inf")) + self.election_timeout

    def _has_quorum(self, now: float) -> bool:
        return now < self._quorum_expiry()

    def _in_lease(self, now: float) -> bool:
        if self._role is Role.LEADER:
            return True
        return self._leader_id is not None and now - self._leader_contact < self.election_timeout

    def _random_timeout(self) -> float:
        return self.election_timeout * (1.0 + self.rng.random())
