"""The undo journal (workers/undo.py), differentially: a leader's PartitionService takes random
traffic, rolls back to a random record, and must then equal a fresh PartitionService that
replayed the records up to that one (JSON round trip, as the log carries them), and go on deciding
exactly as it does. ROLLBACK_SEEDS (default 300) sets how many traffic runs."""
from __future__ import annotations

import os
import random

import pytest

from queue_server.protocol import limits
from queue_server.protocol import vocabulary as p
from queue_server.protocol.origin import Origin
from queue_server.protocol.records import decode_many, encode_many
from queue_server.workers import undo
from queue_server.workers.queue import Queue
from queue_server.workers.service import PartitionService
from tests.unit.service_replies import take_replies

T0 = 1_700_000_000.0
SEEDS = int(os.environ.get("ROLLBACK_SEEDS", "300"))
QUEUES = ("a", "b", "c", "v")  # v: a virtual queue over a and b
TOKENS = ("t1", "t2", "t3")


class SmallDedupe(Queue):
    """A queue that remembers 3 idempotent produces: its window forgets (and a rollback brings
    back) the oldest often."""

    __slots__ = ()

    def __init__(self, name: str, max_size: int, next_id: int = 1, dedupe_window: int = 3) -> None:
        super().__init__(name, max_size, next_id, 3)


def service(undo_limit: int | None, restore_cache: int, suffix: str = ".dlq",
            queue_class: type[Queue] = Queue) -> PartitionService:
    return PartitionService(node_id=1, queue_size=12, virtual_queues={"v": ("a", "b")},
                            max_deliveries=3, dead_letter_suffix=suffix, restore_cache=restore_cache,
                            undo_limit=undo_limit, queue_class=queue_class)


class Run:
    """One seed: a leader with an undo journal, the log of its records, and random traffic."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.restore_cache = self.rng.choice((4, 1000))  # small: evictions are undone too
        # Without dead-letter queues, ended messages expire.
        self.suffix = self.rng.choice((".dlq", ".dlq", ""))
        self.queue_class = self.rng.choice((Queue, SmallDedupe))
        self.leader = service(10**6, self.restore_cache, self.suffix, self.queue_class)
        self.log: list = []  # every record the leader applied, decoded from its JSON
        self.now = T0
        self.req_no = 0
        self.delivered: list[tuple[str, int, int]] = []  # at-most-once deliveries (undeliver)

    # ------------------------------------------------------------------ traffic
    def request(self) -> dict:
        rng = self.rng
        q = rng.choice(QUEUES)
        real = rng.choice(QUEUES[:3]) if rng.random() < 0.9 else "a.dlq"
        kind = rng.choices(
            ("produce", "batch", "idempotent", "consume", "confirm", "release", "extend",
             "purge", "delete", "pause", "resume", "dlq_replay", "subscribe"),
            (10, 4, 3, 10, 5, 3, 2, 0.5, 0.5, 0.7, 0.7, 1, 0.7))[0]
        if kind in ("produce", "batch", "idempotent"):
            req: dict = {"action": "produce", "queue": q}
            req["data"] = ("m%d" % rng.randrange(1000) if kind != "batch"
                           else ["b%d" % rng.randrange(1000) for _ in range(rng.randint(1, 4))])
            if rng.random() < 0.3:
                req["delay"] = rng.choice((0.5, 2.0))
            if rng.random() < 0.3:
                req["ttl"] = rng.choice((1.0, 3.0, 30.0))
            if rng.random() < 0.5:
                req["retry"] = rng.choice((0.0, 1.0, 2.0))
            if rng.random() < 0.3:
                req["priority"] = rng.randint(-1, 2)
            if rng.random() < 0.1:
                req["max_deliveries"] = rng.randint(0, 2)
            if kind == "idempotent":
                req["producer"] = rng.choice(("p1", "p2"))
                req["sequence"] = rng.randrange(6)
            return req
        if kind == "consume":
            req = {"action": "consume", "queue": real}
            if rng.random() < 0.5:
                req["count"] = rng.randint(1, 5)
            if rng.random() < 0.4:
                req["lease"] = rng.choice((0.5, 2.0))
            if rng.random() < 0.3:
                req["token"] = rng.choice(TOKENS)
            if rng.random() < 0.15:
                req["wait"] = 1.0
            return req
        if kind in ("confirm", "release", "extend"):
            req = {"action": kind, "queue": real}
            pick = rng.random()
            if pick < 0.5:
                req["msg_id"] = rng.randint(1, 20)
                if rng.random() < 0.2:
                    req["delivery_count"] = rng.randint(1, 3)
            elif pick < 0.8:
                req["msg_ids"] = rng.sample(range(1, 20), rng.randint(1, 5))
            else:
                req["token"] = rng.choice(TOKENS)
            if kind == "extend":
                req["retry"] = rng.choice((1.0, 5.0))
            return req
        if kind == "subscribe":
            return {"action": "subscribe", "queue": real, "credit": rng.randint(0, 3)}
        action = {"delete": "delete_queue"}.get(kind, kind)
        return {"action": action, "queue": real}

    def step(self, services: list[PartitionService]) -> list:
        """One random event on each of `services` (the same event); their replies and records."""
        rng = self.rng
        roll = rng.random()
        outs = []
        self.req_no += 1
        if roll < 0.12:
            self.now += rng.choice((0.1, 0.6, 1.5))
            for s in services:
                s.tick(self.now)
        elif roll < 0.16 and self.delivered:
            queue, msg_id, dc = self.delivered.pop(rng.randrange(len(self.delivered)))
            for s in services:
                s.undeliver(queue, [[msg_id, dc]], self.now)
        elif roll < 0.18:
            conn = rng.randint(1, 3)
            for s in services:
                s.cancel(conn)
        else:
            req = self.request()
            conn = rng.randint(1, 3)
            for s in services:
                s.handle(dict(req), Origin(conn), self.req_no, self.now)
        for s in services:
            assert not s.errors, s.errors  # a bug would cost a request, not the process
            replies = take_replies(s)
            records = decode_many(encode_many(s.records))
            s.records.clear()
            outs.append((replies, records))
        for _, _, reply in outs[0][0]:
            if reply.get("code") == 0 and reply.get("lease_until", 0) is None and "msg_id" in reply:
                self.delivered.append((reply["queue"], reply["msg_id"], reply["delivery_count"]))
            for m in reply.get("messages", ()) if reply.get("code") == 0 else ():
                if isinstance(m, dict) and m.get("lease_until", 0) is None:
                    self.delivered.append((reply["queue"], m["msg_id"], m["delivery_count"]))
        return outs

    def lead(self, steps: int) -> None:
        """`steps` events on the leader alone; its records go to the log."""
        leader = self.leader
        for _ in range(steps):
            (_, records), = self.step([leader])
            self.log.extend(records)
            journal = leader.journal
            assert journal.base + len(journal) == leader.seq == len(self.log)
            if self.rng.random() < 0.05:  # a commit watermark
                leader.trim(self.rng.randint(journal.base, leader.seq))
                assert journal.base + len(journal) == leader.seq

    def replay(self, k: int) -> PartitionService:
        fresh = service(None, self.restore_cache, self.suffix, self.queue_class)
        for record in self.log[:k]:
            fresh.apply(record)
        assert fresh.seq == k
        return fresh


def queue_state(q: Queue, now: float) -> dict:
    """Everything of a queue a later decision can read, beside its snapshot; and a check that
    each message sits in exactly one ordering, as its state says."""
    unleased = {}
    for group, ready, msg_id in list(q._ready) + list(q._delayed):
        assert msg_id not in unleased, f"{q.name}: msg_id {msg_id} in two orderings"
        m = q._index[msg_id]
        assert m.lease is None and m.ready == ready and group in (0, -m.priority)
        unleased[msg_id] = ready
    leased = {lease: set(ids) for lease, ids in q._leased.items()}
    assert all(q._index[i].lease == lease for lease, ids in leased.items() for i in ids)
    assert q._n_leased == sum(map(len, leased.values()))
    assert len(unleased) + q._n_leased == len(q._index)
    tokens = {t: set(ids) for t, ids in q._tokens.items()}
    assert all(q._index[i].token == t for t, ids in tokens.items() for i in ids)
    return {
        "unleased": unleased, "leased": leased, "tokens": tokens, "next_id": q.next_id,
        "counts": dict(q.counts), "paused": q.paused, "dedupe": list(q._dedupe.items()),
        "stats": q.stats(now), "next_event": q.next_event(now), "has_ready": q.has_ready(now),
        "ready": [(c, m.msg_id, m.data, m._state) for c, m in q.look(now, "ready", 100)],
    }


def assert_same(a: PartitionService, b: PartitionService, now: float, where: str) -> None:
    assert a.seq == b.seq, where
    assert set(a.queues) == set(b.queues), where
    assert a.snapshot() == b.snapshot(), where
    for name in a.queues:
        assert queue_state(a.queues[name], now) == queue_state(b.queues[name], now), f"{where}: queue {name}"
    restorable = {k: (m.msg_id, m.data, m._state) for k, m in a._restorable.items()}
    assert restorable == {k: (m.msg_id, m.data, m._state) for k, m in b._restorable.items()}, where


def by_queue(items: list) -> list:
    """Records or (req_no, reply) pairs, stably sorted by their queue."""
    def queue(item: object) -> str:
        return item[1].get("queue", "") if isinstance(item, tuple) else item.queue
    return sorted(items, key=queue)


def run_seed(seed: int) -> int:
    """The differential check of one seed; how many records its rollbacks undid."""
    run = Run(seed)
    rng = run.rng
    leader = run.leader
    undone = 0
    for rollback in range(rng.randint(1, 3)):
        run.lead(rng.randint(5, 150))
        k = rng.randint(leader.journal.base, leader.seq)
        where = f"seed {seed}, rollback {rollback} to {k} of {leader.seq}"
        n = leader.rollback(k)
        assert n == len(run.log) - k, where
        undone += n
        del run.log[k:]
        assert leader.journal.base + len(leader.journal) == leader.seq == k, where
        if n:
            assert not leader.waiters and not leader.subs, where
            take_replies(leader)  # the long polls answered empty, the subscriptions ended
        else:  # kept: the replay has none, so end them for the comparison that follows
            leader._end_waiting()
            leader.subs.end_all()
            take_replies(leader)
        fresh = run.replay(k)
        assert_same(leader, fresh, run.now, where)
        # Both go on deciding: the same requests get the same replies and records.
        fresh.undo_limit = leader.undo_limit
        fresh._next_sweep = leader._next_sweep  # the sweep's schedule is not replicated state
        # A rollback puts forgotten deliveries back at the cache's end, not where they were: the
        # same ones are kept (checked above), but a later eviction could pick another.
        for key in fresh._restorable:
            leader._restorable.move_to_end(key)
        for i in range(rng.randint(0, 40)):
            (r1, rec1), (r2, rec2) = run.step([leader, fresh])
            # A tick goes through the queues in the order they were made, which a rollback
            # may change: compare each queue's own order.
            assert by_queue([(n1, r) for _, n1, r in r1]) == by_queue([(n2, r) for _, n2, r in r2]), \
                f"{where}, step {i}"
            assert by_queue(rec1) == by_queue(rec2), f"{where}, step {i}"
            run.log.extend(rec1)
            assert leader.journal.base + len(leader.journal) == leader.seq == len(run.log)
        assert_same(leader, fresh, run.now, where + ", then deciding on both")
    return undone


@pytest.mark.parametrize("chunk", range(10))
def test_rollback_equals_the_replay_of_the_kept_records(chunk):
    undone = sum(run_seed(seed) for seed in range(chunk, SEEDS, 10))
    assert undone > 0


@pytest.mark.parametrize("broken", ["deleted message", "released state", "pause", "created queue",
                                    "dedupe eviction", "consume count", "forgotten delivery"])
def test_the_differential_check_catches_a_lost_before_image(monkeypatch, broken):
    """A journal that loses one before-image fails some seed (the check is not vacuous)."""
    if broken == "deleted message":  # a list confirm (or expire) forgets its last message
        real_delete = undo.undo_delete

        def delete(entry, service):
            images = entry[4]
            real_delete((*entry[:4], images[:-1] if type(images) is list else images), service)
        monkeypatch.setattr(undo, "undo_delete", delete)
    elif broken == "released state":  # a release's undo skips its first message
        real_restate = undo.undo_restate

        def restate(entry, service):
            _, q, record, ids, states, counter, value = entry
            if counter is None:
                ids, states = ids[1:], states[1:]
            real_restate((_, q, record, ids, states, counter, value), service)
        monkeypatch.setattr(undo, "undo_restate", restate)
    elif broken == "pause":
        monkeypatch.setattr(undo, "_undo_pause", lambda entry, service: None)
    elif broken == "created queue":
        monkeypatch.setattr(undo, "undo_create", lambda *args: None)
    elif broken == "dedupe eviction":
        real_produced = undo.produced

        def produced(q, record):
            real_produced(q, record)
            entry = q.journal.pop()
            q.journal.append((*entry[:-1], None))
        monkeypatch.setattr(undo, "produced", produced)
    elif broken == "consume count":
        real_undo = undo.undo_lease
        monkeypatch.setattr(undo, "undo_lease", lambda entry, service: (
            real_undo(entry, service), entry[1].counts.__setitem__("consumed", entry[1].counts["consumed"] + 1)))
    elif broken == "forgotten delivery":
        monkeypatch.setattr(undo, "undo_forget", lambda *args: None)
    for seed in range(SEEDS):
        try:
            run_seed(seed)
        except (AssertionError, KeyError, ValueError):
            return
    pytest.fail(f"no seed noticed the broken journal ({broken})")


def test_records_past_the_undo_limit_are_refused_until_trimmed():
    s = service(3, 100)
    replies = []
    for i in range(5):
        s.handle({"action": "produce", "queue": "a", "data": str(i)}, Origin(1), i, T0)
        replies += take_replies(s)
    assert [r.get("code") for _, _, r in replies] == [0, 0, 0, -1, -1]
    assert replies[-1][2]["reason"] == limits.too_many_uncommitted(3)
    assert s.limit_refusals == {limits.UNCOMMITTED: 2}
    s.handle({"action": "peek", "queue": "a"}, Origin(1), 9, T0)  # reads go on
    assert take_replies(s)[0][2]["code"] == 0
    s.trim(2)
    s.handle({"action": "produce", "queue": "a", "data": "x"}, Origin(1), 10, T0)
    assert take_replies(s)[0][2]["code"] == 0
    assert s.seq == 4 and len(s.journal) == 2


def test_rollback_outside_the_journal_is_refused():
    s = service(100, 100)
    for i in range(3):
        s.handle({"action": "produce", "queue": "a", "data": str(i)}, Origin(1), i, T0)
    s.trim(2)
    with pytest.raises(ValueError):
        s.rollback(1)
    with pytest.raises(ValueError):
        s.rollback(4)
    assert s.rollback(2) == 1 and s.seq == 2
    s.trim(1)  # an older watermark changes nothing
    assert s.journal.base == 2


def test_a_refused_produce_makes_no_queue():
    s = service(100, 100)
    s.handle({"action": "produce", "queue": "new", "data": ["x"] * 13}, Origin(1), 1, T0)
    assert take_replies(s)[0][2]["reason"] == p.QUEUE_FULL
    assert "new" not in s.queues and s.seq == 0


def test_a_rollback_that_undoes_nothing_keeps_long_polls_and_one_that_does_answers_them():
    s = service(100, 100)
    s.handle({"action": "produce", "queue": "a", "data": "x"}, Origin(1), 1, T0)
    s.handle({"action": "consume", "queue": "b", "wait": 5}, Origin(2), 2, T0)
    take_replies(s)
    assert s.rollback(1) == 0 and s.waiters
    assert s.rollback(0) == 1 and not s.waiters and "a" not in s.queues
    (origin, req_no, reply), = take_replies(s)
    assert req_no == 2 and reply["code"] == 0 and "msg_id" not in reply


def test_past_the_undo_limit_the_tick_decides_nothing():
    s = service(1, 100)
    s.handle({"action": "produce", "queue": "a", "data": "x", "retry": 1}, Origin(1), 1, T0)
    s.handle({"action": "consume", "queue": "a"}, Origin(1), 2, T0)  # refused: the journal is full
    s.tick(T0 + 10)
    assert s.records == [s.records[0]] and s.seq == 1
    s.trim(1)
    s.handle({"action": "consume", "queue": "a"}, Origin(1), 3, T0 + 10)
    assert s.seq == 2


@pytest.mark.parametrize("chunk", range(5))
def test_committed_applies_journal_nothing_and_later_records_still_roll_back(chunk):
    """A follower's worker replays committed records (apply_committed) with no undo entry at
    all; the records applied after them (a new leader's uncommitted APPLY, then its own) are
    journalled, and a rollback to any point from the committed one on equals the replay."""
    for seed in range(chunk, SEEDS, 10):
        run = Run(seed)
        rng = run.rng
        run.lead(rng.randint(20, 150))
        follower = service(10**6, run.restore_cache, run.suffix, run.queue_class)
        committed = rng.randint(0, len(run.log))
        done = 0
        while done < committed:  # in APPLY-sized pieces
            n = min(committed - done, rng.randint(1, 30))
            follower.apply_committed(run.log[done:done + n])
            done += n
            where = f"seed {seed}, committed through {done}"
            assert len(follower.journal) == 0 and not follower.journal.side, where
            assert follower.journal.base == follower.seq == done, where
        assert not follower.errors
        for record in run.log[committed:]:  # applied, not committed yet
            follower.apply(record)
        assert follower.journal.base + len(follower.journal) == follower.seq == len(run.log)
        k = rng.randint(committed, len(run.log))
        where = f"seed {seed}, rollback to {k} of {len(run.log)}, committed {committed}"
        assert follower.rollback(k) == len(run.log) - k, where
        follower._end_waiting()
        follower.subs.end_all()
        take_replies(follower)
        assert_same(follower, run.replay(k), run.now, where)
        if committed:
            with pytest.raises(ValueError):
                follower.rollback(committed - 1)  # committed records are never undone
