"""The options of the queue data source, parsed and checked once on the driver.

Spark hands a data source its options as a case-insensitive dict of strings; every error names
the option. The parsed objects are small frozen dataclasses, so that they pickle to executors.
"""
from __future__ import annotations

import math
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from queue_server.client.credentials import load_token
from queue_server.client.protocol import MAX_BATCH, parse_hosts
from queue_server.client.tls import TlsFileError, TlsFiles

DEFAULT_LEASE = 60.0
DEFAULT_TIMEOUT = 30.0
DEFAULT_STREAM_MAX_MESSAGES = 50_000
DEFAULT_BATCH_SIZE = 1000
# Below the server's default max_request_size (1 MiB), with room for the request's other fields.
DEFAULT_MAX_REQUEST_BYTES = 900_000

N = TypeVar("N", int, float)


class OptionError(ValueError):
    """An option is missing or invalid; the message names it."""


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    """Option names are case-insensitive (Spark lower-cases them; a plain dict may not)."""
    return {str(k).lower(): v for k, v in options.items()}


def _get(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name.lower())
    return None if value is None else str(value)


def _required(options: Mapping[str, str], name: str) -> str:
    value = _get(options, name)
    if value is None or not value.strip():
        raise OptionError(f"option {name}: missing")
    return value.strip()


def _number(options: Mapping[str, str], name: str, convert: Callable[[str], N], kind: str) -> N | None:
    """The option as `convert` (int or float) reads it; None when it is unset or blank."""
    text = _get(options, name)
    if text is None or text.strip() == "":
        return None
    try:
        return convert(text)
    except ValueError:
        raise OptionError(f"option {name}: must be {kind}, not {text!r}") from None


def _int(options: Mapping[str, str], name: str, default: int | None, low: int = 1,
         high: int | None = None) -> int | None:
    value = _number(options, name, int, "an integer")
    if value is None:
        return default
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise OptionError(f"option {name}: must be {bound}, not {value}")
    return value


def _float(options: Mapping[str, str], name: str, default: float | None,
           positive: bool = True) -> float | None:
    value = _number(options, name, float, "a number")
    if value is None:
        return default
    if math.isnan(value) or value < 0 or (positive and value == 0):
        raise OptionError(f"option {name}: must be {'> 0' if positive else '>= 0'}, not {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = _get(options, name)
    if text is None:
        return default
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name}: must be true or false, not {text!r}")


def _hosts(options: Mapping[str, str]) -> str:
    hosts = _required(options, "hosts")
    try:
        parse_hosts(hosts)
    except ValueError as exc:
        raise OptionError(f"option hosts: {exc}") from None
    return hosts


def _plain_id(options: Mapping[str, str], name: str) -> str | None:
    """An id that goes into lease tokens or producer ids: no '/', at most 100 characters."""
    value = _get(options, name)
    if value is None:
        return None
    if not value or "/" in value or len(value) > 100:
        raise OptionError(f"option {name}: must be 1..100 characters without '/'")
    return value


@dataclass(frozen=True)
class ReadOptions:
    """Options of spark.read / spark.readStream .format("queue")."""

    hosts: str
    queues: tuple[str, ...]
    partitions_per_queue: int = 1
    max_messages: int | None = None  # per partition (batch) / per partition and micro-batch (stream)
    lease: float = DEFAULT_LEASE
    timeout: float = DEFAULT_TIMEOUT
    chunk: int = MAX_BATCH
    confirm: bool = False  # batch only: confirm at the end of each partition (a consuming read)
    read_id: str | None = None  # batch only
    max_messages_per_trigger: int | None = None  # stream only
    look: bool = True  # batch only: peek instead of consuming (the read takes nothing)
    auth_token: str | None = None  # the nodes' client token (auth_token_file)
    tls: TlsFiles = TlsFiles()  # made into an SSLContext where the client is made

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool) -> ReadOptions:
        """Check and convert the options; OptionError names the first bad one."""
        options = _lower(options)
        names = tuple(q.strip() for q in _required(options, "queues").split(",") if q.strip())
        if not names:
            raise OptionError("option queues: no queue named")
        if len(set(names)) != len(names):
            raise OptionError("option queues: a queue is named twice")
        default_max = DEFAULT_STREAM_MAX_MESSAGES if streaming else None
        confirm, look = _after_read(options)
        opts = cls(
            hosts=_hosts(options),
            queues=names,
            partitions_per_queue=_int(options, "partitionsPerQueue", 1, 1, 1000),
            max_messages=_int(options, "maxMessages", default_max),
            lease=_float(options, "leaseSeconds", DEFAULT_LEASE),
            timeout=_float(options, "timeout", DEFAULT_TIMEOUT),
            chunk=_int(options, "chunkSize", MAX_BATCH, 1, MAX_BATCH),
            confirm=confirm,
            read_id=_plain_id(options, "readId"),
            max_messages_per_trigger=_int(options, "maxMessagesPerTrigger", None),
            look=look,
            auth_token=_auth_token(options),
            tls=_tls(options),
        )
        if not streaming and not opts.confirm and not opts.look and opts.read_id is None:
            raise OptionError("option readId: required with confirm=false (confirm_read() needs it)")
        return opts


def _auth_token(options: Mapping[str, str]) -> str | None:
    """The client token: option authToken, else the file named by authTokenFile, else the
    driver's QUEUE_TOKEN; read on the driver, it travels to the executors with the options."""
    token = _get(options, "authToken")
    if token is not None and token.strip():
        return token.strip()
    path = _get(options, "authTokenFile")
    try:
        return load_token(path.strip() if path else None)
    except OSError as exc:
        raise OptionError(f"option authTokenFile: cannot read {path}: {exc.strerror or exc}") from None


def _tls(options: Mapping[str, str]) -> TlsFiles:
    """TLS as queue-cli's --tls, --tls-ca, --tls-cert and --tls-key take it: `tls` true/false,
    `tlsCa`, `tlsCert` (each implies tls) and `tlsKey`. The files are loaded once here, so that
    a bad one fails the job on the driver naming its option; executors load the same paths."""
    ca, cert, key = (_path(options, n) for n in ("tlsCa", "tlsCert", "tlsKey"))
    if key and not cert:
        raise OptionError("option tlsKey: needs tlsCert (the certificate this key belongs to)")
    if _get(options, "tls") is not None and not _bool(options, "tls", False) and (ca or cert):
        raise OptionError(f"option tls: false contradicts {'tlsCa' if ca else 'tlsCert'} (which implies tls)")
    files = TlsFiles(_bool(options, "tls", False), ca, cert, key)
    _load_tls(files, "")
    return files


def tls_context(files: TlsFiles) -> ssl.SSLContext | None:
    """The SSLContext of the TLS options, made where a client is made (the driver or an
    executor); a file missing or bad here is an OptionError of one line naming its option and
    this host."""
    return _load_tls(files, f" on {socket.gethostname()} (every executor needs the TLS files at the paths the "
                            f"driver was given)")


_TLS_OPTIONS = {"ca_file": "tlsCa", "cert_file": "tlsCert", "key_file": "tlsKey"}  # TlsFileError.field


def _load_tls(files: TlsFiles, where: str) -> ssl.SSLContext | None:
    try:
        return files.context()
    except TlsFileError as exc:
        name = _TLS_OPTIONS[exc.field]
        if exc.what is None:
            raise OptionError(f"option {name}: cannot read {exc.path}{where}: {exc.reason}") from None
        raise OptionError(f"option {name}: {exc.path} is not {exc.what}{where} ({exc.reason})") from None


def _path(options: Mapping[str, str], name: str) -> str | None:
    """A file option: None when unset or blank."""
    path = (_get(options, name) or "").strip()
    return path or None


def _after_read(options: Mapping[str, str]) -> tuple[bool, bool]:
    """(confirm, look): how a batch read reads.

    By default it only looks (peek): nothing is leased or taken, every message stays in its
    queue. `consume=true` makes it a consuming read that confirms what it read; `confirm=false`
    (with readId) consumes and keeps the leases for confirm_read()/release_read(). An explicit
    `confirm=true` is a consuming read too, as it always was."""
    consume = _get(options, "consume")
    consuming = _bool(options, "consume", False)
    if _get(options, "confirm") is None:
        return consuming, not consuming
    confirm = _bool(options, "confirm", True)
    if confirm and consume is not None and not consuming:
        raise OptionError("option consume: false contradicts confirm=true (which consumes)")
    return confirm, False


@dataclass(frozen=True)
class WriteOptions:
    """Options of df.write / df.writeStream .format("queue")."""

    hosts: str
    queue: str
    batch_size: int = DEFAULT_BATCH_SIZE
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    timeout: float = DEFAULT_TIMEOUT
    delay: float | None = None
    ttl: float | None = None
    retry: float | None = None
    priority: int | None = None
    producer_id: str | None = None
    auth_token: str | None = None  # the nodes' client token (auth_token_file)
    tls: TlsFiles = TlsFiles()  # made into an SSLContext where the client is made

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        """Check and convert the options; OptionError names the first bad one."""
        options = _lower(options)
        priority = _get(options, "priority")
        try:
            prio = None if priority is None else int(priority)
        except ValueError:
            raise OptionError(f"option priority: must be an integer, not {priority!r}") from None
        return cls(
            hosts=_hosts(options),
            queue=_required(options, "queue"),
            batch_size=_int(options, "batchSize", DEFAULT_BATCH_SIZE, 1, 100_000),
            max_request_bytes=_int(options, "maxRequestBytes", DEFAULT_MAX_REQUEST_BYTES, 1024),
            timeout=_float(options, "timeout", DEFAULT_TIMEOUT),
            delay=_float(options, "delay", None, positive=False),
            ttl=_float(options, "ttl", None),
            retry=_float(options, "retry", None, positive=False),
            priority=prio,
            producer_id=_plain_id(options, "producerId"),
            auth_token=_auth_token(options),
            tls=_tls(options),
        )
