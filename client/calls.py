"""The clients' actions, written once for both: each builds its request and says how its reply
becomes the result (a Call). BlockingActions and AsyncActions make every action a method that
sends the Call; QueueClient and AsyncQueueClient add only how a request is sent (`request`)."""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from . import admin
from . import protocol as p
from .admin import DELETE_QUEUE, DLQ_REPLAY, PAUSE, PURGE, RESUME
from .protocol import Call, Message

P = ParamSpec("P")
T = TypeVar("T")


class action(Generic[P, T]):
    """An action, from the function that makes its Call. Read on a client, it is the method that
    sends the Call and returns the result (BlockingActions), or a coroutine method (AsyncActions);
    the overloads tell type checkers so."""

    def __init__(self, build: Callable[Concatenate[Any, P], Call[T]]) -> None:
        self.build = build

    @overload
    def __get__(self, client: None, owner: type) -> action[P, T]: ...

    @overload
    def __get__(self, client: BlockingActions, owner: type) -> Callable[P, T]: ...

    @overload
    def __get__(self, client: AsyncActions, owner: type) -> Callable[P, Coroutine[Any, Any, T]]: ...

    def __get__(self, client: Any, owner: type) -> Any:
        if client is None:
            return self
        # BlockingActions and AsyncActions put the methods in front of this descriptor.
        raise TypeError(f"{owner.__name__} sends no requests: make it a BlockingActions or AsyncActions")


def _on_queue(kind: int, field: str, read: Callable[[Any], T], doc: str) -> action[[str], T]:
    """An administration action that names one queue and returns one field of its reply."""
    def build(self: Any, queue: str) -> Call[T]:
        return Call(admin.queue_request(kind, queue), admin.reads(field, read))
    build.__doc__ = doc
    build.__annotations__ = {"queue": "str", "return": f"Call[{read.__name__}]"}
    return action(build)


class Actions:
    """Every action of the clients. A client's `_producer` (a ProducerSequence, or None with
    idempotent=False) numbers the produces that bring no (producer, sequence) of their own."""

    _producer: p.ProducerSequence | None

    @action
    def produce(self, queue: str, data: str, *, delay: float | None = None, ttl: float | None = None,
                retry: float | None = 0, priority: int | None = None, producer: str | None = None,
                sequence: int | None = None, max_deliveries: int | None = None) -> Call[int | dict[str, int]]:
        """Store one message; its msg_id (a virtual queue: {real queue: msg_id}).

        With `producer` and `sequence` the produce is idempotent: a retry the queue still
        remembers stores nothing and returns the original id(s). Without them the client gives
        every produce its own (producer, sequence) unless it was made with idempotent=False.
        """
        if not isinstance(data, str):
            raise TypeError("data must be a str (use produce_batch for several)")
        return _produce(self._producer, queue, data, delay, ttl, retry, priority, producer, sequence, max_deliveries)

    @action
    def produce_batch(self, queue: str, data: Sequence[str], *, delay: float | None = None,
                      ttl: float | None = None, retry: float | None = 0, priority: int | None = None,
                      producer: str | None = None, sequence: int | None = None,
                      max_deliveries: int | None = None) -> Call[list[int] | dict[str, list[int]]]:
        """Store several messages, all or none; their msg_ids in order (virtual: per real queue).

        `producer` and `sequence` make it idempotent, as for produce().
        """
        if isinstance(data, str):
            raise TypeError("data must be a sequence of str")
        return _produce(self._producer, queue, data, delay, ttl, retry, priority, producer, sequence, max_deliveries)

    @action
    def consume(self, queue: str, *, wait: float | None = None, lease: float | None = None,
                token: str | None = None, times: bool = False) -> Call[Message | None]:
        """The next ready message, or None (after up to `wait` seconds of long poll over TCP).

        `lease` leases it for that many seconds whatever its retry; `token` binds the lease to
        a name, so that a retry with the same token returns the same message; `times` fills in
        the message's ready, ttl and lease_until.
        """
        req = p.consume_request(queue, None, wait, lease, token, times)
        return Call(req, functools.partial(p.message_from_reply, queue))

    @action
    def consume_batch(self, queue: str, count: int, *, wait: float | None = None, lease: float | None = None,
                      token: str | None = None, times: bool = False) -> Call[list[Message]]:
        """Up to `count` (1..1000) ready messages, possibly none (`lease`, `token`, `times` as
        for consume())."""
        req = p.consume_request(queue, count, wait, lease, token, times)
        return Call(req, functools.partial(p.messages_from_reply, queue))

    @action
    def confirm(self, queue: str, msg_id: int, *, token: str | None = None,
                delivery_count: int | None = None) -> Call[bool]:
        """Delete a consumed message; False if it was no longer there (or, with `token` or
        `delivery_count`, no longer leased under that token / delivered again since)."""
        req = p.ids_request(p.CONFIRM, queue, msg_id, token=token, delivery_count=delivery_count)
        return Call(req, p.confirmed_one)

    @action
    def confirm_many(self, queue: str, msg_ids: Iterable[int] | None = None, *, token: str | None = None,
                     tokens: Iterable[str] | None = None, token_prefix: str | None = None,
                     delivery_counts: Iterable[int] | None = None) -> Call[int]:
        """Delete consumed messages, by id and/or by lease token; how many were deleted."""
        ids = None if msg_ids is None else list(msg_ids)
        return _by_ids(p.CONFIRM, queue, ids, token=token, tokens=tokens, token_prefix=token_prefix,
                       delivery_counts=delivery_counts)

    @action
    def release(self, queue: str, msg_ids: int | Iterable[int] | None = None, *, token: str | None = None,
                tokens: Iterable[str] | None = None, token_prefix: str | None = None,
                delivery_counts: Iterable[int] | None = None) -> Call[int]:
        """Give leases back (the messages are ready again at once), by id and/or token; how
        many were leased."""
        return _by_ids(p.RELEASE, queue, msg_ids, token=token, tokens=tokens, token_prefix=token_prefix,
                       delivery_counts=delivery_counts)

    @action
    def extend(self, queue: str, msg_ids: int | Iterable[int] | None, retry: float, *, token: str | None = None,
               tokens: Iterable[str] | None = None, token_prefix: str | None = None,
               delivery_counts: Iterable[int] | None = None) -> Call[int]:
        """Make leases end `retry` seconds from now, by id and/or token; how many were leased."""
        return _by_ids(p.EXTEND, queue, msg_ids, retry=retry, token=token, tokens=tokens,
                       token_prefix=token_prefix, delivery_counts=delivery_counts)

    @action
    def monitor(self, queue: str | None = None, *, local: bool = False) -> Call[dict[str, Any]]:
        """Statistics of one queue, or of the node; `local` asks the answering node itself."""
        return Call(p.monitor_request(queue, local), _itself)

    @action
    def list_queues(self, pattern: str = "", *, local: bool = False) -> Call[list[str]]:
        """Names of the queues containing `pattern`."""
        return Call(p.list_request(pattern, local), p.queue_names)

    @action
    def leader(self, queue: str | None = None) -> Call[dict[str, Any]]:
        """The leader's node id and client address (leader_node_id, leader_host, leader_port);
        with `queue`, of the queue group that queue is in (a cluster with queue groups)."""
        return Call(p.leader_request(queue), _itself)

    @action
    def peek(self, queue: str, count: int | None = None, *, state: str | None = None,
             local: bool = False) -> Call[list[dict[str, Any]]]:
        """Up to `count` (default 10, at most 1000) messages in `state` ("ready" by default,
        "delayed", "leased" or "dead") as dicts, changing nothing; `local` asks the node itself."""
        return Call(admin.peek_request(queue, count, state, local), admin.reads("messages", list))

    purge = _on_queue(PURGE, "purged", int, "Delete every message of the queue; how many there were.")
    delete_queue = _on_queue(DELETE_QUEUE, "deleted", bool,
                             "Remove the queue and its messages; False if there was no such queue.")
    pause = _on_queue(PAUSE, "changed", bool,
                      "Pause consumers of the queue (produces are still stored); False if it already was.")
    resume = _on_queue(RESUME, "changed", bool,
                       "Let consumers take from the queue again; False if it was not paused.")
    dlq_replay = _on_queue(DLQ_REPLAY, "moved", int, "Move the queue's dead letters back to it; how many were moved.")


def _produce(numbering: p.ProducerSequence | None, queue: str, data: str | Sequence[str],
             delay: float | None, ttl: float | None, retry: float | None, priority: int | None,
             producer: str | None, sequence: int | None, max_deliveries: int | None) -> Call[Any]:
    if producer is None and sequence is None and numbering is not None:
        producer, sequence = numbering.next()
    req = p.produce_request(queue, data, delay, ttl, retry, priority, producer, sequence, max_deliveries)
    return Call(req, p.produced_ids)


_COUNTS = {p.CONFIRM: "confirmed", p.RELEASE: "released", p.EXTEND: "extended"}


def _by_ids(kind: int, queue: str, msg_ids: int | Iterable[int] | None, **extra: Any) -> Call[int]:
    field = _COUNTS[kind]
    return Call(p.ids_request(kind, queue, msg_ids, **extra), lambda reply: p.count_from_reply(reply, field))


def _itself(reply: dict[str, Any]) -> dict[str, Any]:
    return reply


class BlockingActions(Actions):
    """Every action as a method that sends its request with `request` and returns the result."""

    def request(self, req: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - the client's
        raise NotImplementedError


class AsyncActions(Actions):
    """Every action as a coroutine method that sends its request with `await request`."""

    async def request(self, req: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - the client's
        raise NotImplementedError


def _blocking(build: Callable[..., Call[Any]]) -> Callable[..., Any]:
    def method(self: BlockingActions, *args: Any, **kwargs: Any) -> Any:
        call = build(self, *args, **kwargs)
        return call.read(self.request(call.request))
    return method


def _awaiting(build: Callable[..., Call[Any]]) -> Callable[..., Any]:
    async def method(self: AsyncActions, *args: Any, **kwargs: Any) -> Any:
        call = build(self, *args, **kwargs)
        return call.read(await self.request(call.request))
    return method


def _add_actions(cls: type, make: Callable[[Callable[..., Call[Any]]], Callable[..., Any]]) -> None:
    for name, act in vars(Actions).items():
        if not isinstance(act, action):
            continue
        build = act.build
        method = functools.update_wrapper(make(build), build)
        method.__name__ = name
        # Seen from the client, an action returns what its Call reads, not the Call.
        result = _read_type(inspect.signature(build).return_annotation)
        method.__annotations__ = {**build.__annotations__, "return": result}
        method.__signature__ = inspect.signature(build).replace(  # type: ignore[attr-defined]
            return_annotation=result)
        method.__module__, method.__qualname__ = cls.__module__, f"{cls.__qualname__}.{name}"
        setattr(cls, name, method)


def _read_type(annotation: Any) -> Any:
    if isinstance(annotation, str) and annotation.startswith("Call[") and annotation.endswith("]"):
        return annotation[len("Call["):-1]
    return annotation


_add_actions(BlockingActions, _blocking)
_add_actions(AsyncActions, _awaiting)
