"""The node config: JSON with // and /* */ comments, as in the original queue_server.

Pure: text in, validated :class:`NodeConfig` out (``load_config`` is the one function that
reads a file). Every key of the original is kept with its meaning; ours are added after them.
Each key is one row of ``_KEYS`` (name, default, validator, doc): a new key is one row there
plus one field of :class:`NodeConfig` and one line of ``DEFAULT_CONFIG_TEXT``.

One file, over 600 lines, because those three must change together for every key, and the
validators and cross-checks are the keys' own types and rules: split apart, a new key would be
four edits in four files that no test ties together.

log_level follows the original's levels: 0 off, 1 error, 2 warning, 3 info, 4 debug,
5 trace (see ``LOG_LEVELS`` for the matching :mod:`logging` levels).
"""

from __future__ import annotations

import json
import logging
import re
from queue_server.protocol.placement import GroupRule, Placement, RoutingKeys
from queue_server.protocol.vocabulary import MAX_QUEUE_NAME_BYTES, queue_name_error
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

__all__ = [
    "ConfigError", "VirtualQueue", "ClusterNode", "NodeConfig", "strip_comments", "parse_config",
    "load_config", "check_queue_name", "key_docs", "DEFAULT_CONFIG_TEXT", "LOG_LEVELS",
    "MAX_QUEUE_NAME_BYTES",
]



# log_level (the original's numbers) -> logging level. 5 (trace) is below DEBUG.
LOG_LEVELS: dict[int, int] = {
    0: logging.CRITICAL + 10,  # off
    1: logging.ERROR,
    2: logging.WARNING,
    3: logging.INFO,
    4: logging.DEBUG,
    5: 5,  # trace
}


class ConfigError(Exception):
    """An invalid config; ``key`` names the offending key ('' for the file as a whole)."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"config key '{key}': {message}" if key else f"config: {message}")


@dataclass(frozen=True)
class VirtualQueue:
    """A name whose produce goes to each real queue of queue_list."""

    name: str
    queue_list: tuple[str, ...]


@dataclass(frozen=True)
class ClusterNode:
    """One member of the cluster, with its INTERNAL (replication) address, and its http_port when
    the list names it (0: not named). The nodes also tell each other their http_port (the peer
    messages carry it), so that any node can name the leader's HTTP address."""

    node_id: int
    host: str
    port: int
    http_port: int = 0


# -- validators: each takes the JSON value and returns the stored one, or raises _Invalid ----


class _Invalid(Exception):
    """A value does not fit its key (message without the key name)."""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _expected(what: str, value: Any) -> _Invalid:
    return _Invalid(f"expected {what}, got {_show(value)}")


def _is_int(value: Any) -> bool:
    return type(value) is int  # bool is not an int here


def _int(lo: int | None = None, hi: int | None = None) -> Callable[[Any], int]:
    if lo is not None and hi is not None:
        what = f"an integer {lo}..{hi}"
    elif lo is not None:
        what = f"an integer >= {lo}"
    else:
        what = "an integer"

    def check(value: Any) -> int:
        if not _is_int(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
            raise _expected(what, value)
        return value

    return check


def _positive_number(value: Any) -> float:
    if type(value) not in (int, float) or not value > 0 or value == float("inf"):
        raise _expected("a number > 0", value)
    return float(value)


def _string(nonempty: bool) -> Callable[[Any], str]:
    what = "a non-empty string" if nonempty else "a string"

    def check(value: Any) -> str:
        if type(value) is not str or (nonempty and not value):
            raise _expected(what, value)
        return value

    return check


def _suffix(value: Any) -> str:
    """A queue-name suffix: a string of at most 64 characters without control characters."""
    if type(value) is not str or len(value) > 64 or any(ord(c) < 32 or 127 <= ord(c) < 160 for c in value):
        raise _expected("a string of at most 64 characters without control characters", value)
    return value


def _bool(value: Any) -> bool:
    if type(value) is not bool:
        raise _expected("true or false", value)
    return value


def _flag(value: Any) -> bool:
    """0/1 (the original's style) or true/false."""
    if type(value) is bool:
        return value
    if _is_int(value) and value in (0, 1):
        return bool(value)
    raise _expected("0, 1, true or false", value)


def _choice(*choices: str) -> Callable[[Any], str]:
    what = " or ".join(repr(c) for c in choices)

    def check(value: Any) -> str:
        if value not in choices or type(value) is not str:
            raise _expected(what, value)
        return value

    return check


def _fields(value: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    if not isinstance(value, dict):
        raise _Invalid(f"{where}: expected an object, got {_show(value)}")
    for name in value:
        if name not in required and name not in optional:
            raise _Invalid(f"{where}: unknown field {name!r} (expected {', '.join(required + optional)})")
    for name in required:
        if name not in value:
            raise _Invalid(f"{where}: missing field {name!r}")
    return value


def _field(check: Callable[[Any], Any], entry: dict, name: str, where: str) -> Any:
    try:
        return check(entry[name])
    except _Invalid as e:
        raise _Invalid(f"{where}: field {name!r}: {e}") from None


def check_queue_name(name: Any) -> str | None:
    """Why name is not a valid queue name (the protocol's rule: 1..256 bytes of UTF-8, no control
    characters), or None."""
    reason = queue_name_error(name)
    if reason is None:
        return None
    if type(name) is not str or not name:
        return f"expected a non-empty string, got {_show(name)}"
    return f"{reason.split(': ', 1)[1]}: {_show(name)}"


def _cluster_nodes(value: Any) -> tuple[ClusterNode, ...]:
    if not isinstance(value, list):
        raise _expected("a list of {node_id, host, port} objects", value)
    nodes: list[ClusterNode] = []
    ids: set[int] = set()
    addresses: set[tuple[str, int]] = set()
    for n, entry in enumerate(value, 1):
        where = f"entry {n}"
        _fields(entry, where, ("node_id", "host", "port"), ("http_port",))
        node = ClusterNode(
            node_id=_field(_int(1), entry, "node_id", where),
            host=_field(_string(True), entry, "host", where),
            port=_field(_int(1, 65535), entry, "port", where),
            http_port=_field(_int(0, 65535), entry, "http_port", where) if "http_port" in entry else 0,
        )
        if node.node_id in ids:
            raise _Invalid(f"{where}: duplicate node_id {node.node_id}")
        if (node.host, node.port) in addresses:
            raise _Invalid(f"{where}: duplicate address {node.host}:{node.port}")
        ids.add(node.node_id)
        addresses.add((node.host, node.port))
        nodes.append(node)
    return tuple(nodes)


def _virtual_queues(value: Any) -> tuple[VirtualQueue, ...]:
    if not isinstance(value, list):
        raise _expected("a list of {name, queue_list} objects", value)
    queues: list[VirtualQueue] = []
    for n, entry in enumerate(value, 1):
        where = f"entry {n}"
        _fields(entry, where, ("name", "queue_list"))
        name = entry["name"]
        problem = check_queue_name(name)
        if problem:
            raise _Invalid(f"{where}: field 'name': {problem}")
        where = f"virtual queue {name!r}"
        members = entry["queue_list"]
        if not isinstance(members, list) or not members:
            raise _Invalid(f"{where}: queue_list: expected a non-empty list of queue names, "
                           f"got {_show(members)}")
        for member in members:
            problem = check_queue_name(member)
            if problem:
                raise _Invalid(f"{where}: queue_list: {problem}")
        if len(set(members)) != len(members):
            dup = next(m for m in members if members.count(m) > 1)
            raise _Invalid(f"{where}: queue_list: {dup!r} appears twice")
        queues.append(VirtualQueue(name, tuple(members)))
    names = [q.name for q in queues]
    for q in queues:
        if names.count(q.name) > 1:
            raise _Invalid(f"virtual queue {q.name!r} is defined twice")
    members_all = {m: q.name for q in queues for m in q.queue_list}
    for q in queues:
        if q.name in members_all:
            raise _Invalid(f"virtual queue {q.name!r} is also a member of virtual queue "
                           f"{members_all[q.name]!r}")
    return tuple(queues)


def _group_rules(value: Any) -> tuple[GroupRule, ...]:
    if not isinstance(value, list):
        raise _expected('a list of {"pattern", "group", "nodes"} objects', value)
    rules: list[GroupRule] = []
    for n, entry in enumerate(value, 1):
        where = f"entry {n}"
        _fields(entry, where, ("group",), ("pattern", "nodes"))
        if "pattern" not in entry and "nodes" not in entry:
            raise _Invalid(f"{where}: give a 'pattern' (the queues of the group), 'nodes' (its replicas) or both")
        pattern = _field(_string(True), entry, "pattern", where) if "pattern" in entry else None
        nodes = entry.get("nodes", [])
        if not isinstance(nodes, list) or not all(_is_int(x) and x >= 1 for x in nodes):
            raise _Invalid(f"{where}: field 'nodes': expected a list of node ids, got {_show(nodes)}")
        if len(set(nodes)) != len(nodes):
            raise _Invalid(f"{where}: field 'nodes': a node is named twice")
        if "nodes" in entry and len(nodes) % 2 == 0:
            raise _Invalid(f"{where}: field 'nodes': a group needs an odd number of replicas, got {len(nodes)}")
        rules.append(GroupRule(_field(_int(0), entry, "group", where), pattern, tuple(nodes)))
    return tuple(rules)


# -- the keys --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Key:
    name: str
    default: Any  # as written in JSON; run through check like any other value
    check: Callable[[Any], Any]  # type and range: JSON value -> stored value, or _Invalid
    doc: str


_KEYS: tuple[_Key, ...] = (
    # the original's keys
    _Key("log_prefix", "", _string(False), "also log to <prefix>.log in the working directory; '' logs to stderr only"),
    _Key("log_level", 3, _int(0, 5), "0 off, 1 error, 2 warning, 3 info, 4 debug, 5 trace"),
    _Key("node_type", 10, _int(0), "cluster id: the same on every node of a cluster"),
    _Key("node_id", 1, _int(1), "this node's id, unique in the cluster"),
    _Key("host", "127.0.0.1", _string(True), "client TCP/UDP address"),
    _Key("port", 1111, _int(1, 65535), "client TCP/UDP port"),
    _Key("queue_size", 100000, _int(1), "max messages per queue"),
    _Key("queue_log_size", 100000, _int(1), "change-log records kept for replication"),
    _Key("queue_log_bytes", 8 << 20, _int(1024), "bytes of change-log records kept for replication (older records fall off past this or queue_log_size)"),
    _Key("queue_sync_rate", 1000000, _int(1), "max records/s sent to a catching-up follower"),
    _Key("forward_request", 1, _flag, "1: a follower forwards requests to the leader; 0: redirect"),
    _Key("cluster_node_list", [], _cluster_nodes, "cluster members' internal addresses (and http_port, optional); [] = single node"),
    _Key("virtual_queue_list", [], _virtual_queues, "virtual queue name -> real queues a produce goes to"),
    _Key("queue_data_dir", "./queue_data", _string(True), "directory for the change log and snapshots"),
    # ours
    _Key("workers", 2, _int(1, 64), "worker processes (queues are spread over them)"),
    _Key("max_request_size", 1 << 20, _int(1024, 1 << 30), "largest request in bytes"),
    _Key("udp_max_response", 60000, _int(512, 65507), "largest UDP reply in bytes"),
    _Key("max_wait", 30, _positive_number, "longest long-poll wait a consume may ask for, seconds"),
    _Key("replication", "quorum", _choice("quorum", "async"), "reply after a quorum has the write, or at once"),
    _Key("fsync", "everysec", _choice("always", "everysec", "no"), "when the change log is synced to disk"),
    _Key("in_memory", False, _bool, "true: no data dir (a snapshot for a follower goes through the run dir)"),
    _Key("snapshot_every", 100000, _int(1), "write a snapshot after this many committed records"),
    _Key("wal_segment_bytes", 64 << 20, _int(4096), "bytes per change-log file on disk (a file goes once a snapshot covers it; a follower further behind than the files gets a snapshot)"),
    _Key("repair", False, _bool, "true: cut a log corrupt in the middle at the damage (losing what follows)"),
    _Key("metrics_port", 0, _int(0, 65535), "HTTP metrics port; 0 = off"),
    _Key("election_timeout_ms", 300, _int(10, 60000), "follower waits this long without a leader before voting"),
    _Key("heartbeat_ms", 50, _int(1, 10000), "leader heartbeat interval (below election_timeout_ms)"),
    _Key("max_deliveries", 0, _int(0, 2**31 - 1), "deliveries without a confirm before a message is a dead letter; 0 = unlimited"),
    _Key("dead_letter_suffix", ".dlq", _suffix, "dead letters of queue q go to q + this; '' = no dead-letter queues"),
    _Key("queue_metrics_max", 100, _int(0, 100000), "queues that get their own series in the per-queue metrics"),
    _Key("shutdown_grace", 10, _positive_number, "on SIGTERM: seconds to finish the requests in flight before stopping"),
    _Key("http_port", 8111, _int(0, 65535), "HTTP API and status page port, on host (docs/http.md); 0 = off"),
    _Key("auth_token_file", "", _string(False), "file holding the token clients must send (TCP: an auth request; UDP: auth_token), one per line, any passes; '' = no authentication"),
    _Key("cluster_secret_file", "", _string(False), "file holding the cluster's shared secret (queue-server keygen): peers use CURVE; a second line while rotating; '' = plain peers"),
    _Key("insecure_peers", False, _bool, "true: allow plain (unauthenticated) peers on a non-loopback peer address"),
    _Key("max_connections", 1000, _int(0), "client TCP connections at once; one past it is told why and closed; 0 = no limit"),
    _Key("idle_timeout", 600, _int(0), "seconds a TCP connection may stay silent with nothing pending (no long poll or subscription); 0 = forever"),
    _Key("max_pending_requests", 4096, _int(16, 1 << 20), "unanswered requests per TCP connection before the node stops reading it"),
    _Key("max_queues", 10000, _int(0), "queues a node holds; a produce that would create one past it is refused (each worker holds ceil(max_queues / workers)); 0 = no limit"),
    _Key("max_memory_mb", 2048, _int(0), "MiB the node may hold for its messages (with overflow: what its workers count, memory_bytes, each max_memory_mb / workers; without: its processes' resident memory) past which produces are refused (consume, confirm, purge go on); 0 = no limit"),
    _Key("tls_cert_file", "", _string(False), "PEM certificate (chain) of the client TCP port: with tls_key_file, clients must speak TLS; '' = plain TCP"),
    _Key("tls_key_file", "", _string(False), "PEM private key of tls_cert_file"),
    _Key("tls_ca_file", "", _string(False), "PEM CA certificates: clients must present a certificate they signed; '' = no client certificates"),
    _Key("queue_groups", 1, _int(1, 1024), "queue groups, each with its own leader and replica set (docs/architecture.md)"),
    _Key("group_replicas", 0, _int(0, 255), "nodes that replicate each queue group (odd); 0 = every node"),
    _Key("queue_group_list", [], _group_rules, 'placement rules: [{"pattern": "orders.*", "group": 2, "nodes": [1, 4, 5]}], first match wins'),
    _Key("udp_amplification_limit", 3, _int(0, 1000), "on a non-loopback UDP address: a reply to an unauthenticated datagram is at most this many times its size; 0 = off"),
    # issue 26: message bodies past a budget overflow to disk
    _Key("overflow_mb", 1024, _int(0), "MiB of message bodies the node holds in memory (each worker overflow_mb / workers); past it the bodies of new messages go to overflow_dir; 0 = off (also with in_memory)"),
    _Key("overflow_dir", "", _string(False), "directory of the overflowed bodies (one folder per worker, emptied at start and locked: each node needs its own); '' = <queue_data_dir>/overflow"),
)

_BY_NAME: dict[str, _Key] = {k.name: k for k in _KEYS}


@dataclass(frozen=True)
class NodeConfig:
    """A validated node config: one field per key (see ``_KEYS`` for the docs)."""

    log_prefix: str
    log_level: int
    node_type: int
    node_id: int
    host: str
    port: int
    queue_size: int
    queue_log_size: int
    queue_log_bytes: int
    queue_sync_rate: int
    forward_request: bool
    cluster_node_list: tuple[ClusterNode, ...]
    virtual_queue_list: tuple[VirtualQueue, ...]
    queue_data_dir: str
    workers: int
    max_request_size: int
    udp_max_response: int
    max_wait: float
    replication: str
    fsync: str
    in_memory: bool
    snapshot_every: int
    wal_segment_bytes: int
    repair: bool
    metrics_port: int
    election_timeout_ms: int
    heartbeat_ms: int
    max_deliveries: int
    dead_letter_suffix: str
    queue_metrics_max: int
    shutdown_grace: float
    http_port: int
    auth_token_file: str
    cluster_secret_file: str
    insecure_peers: bool
    max_connections: int
    idle_timeout: int
    max_pending_requests: int
    max_queues: int
    max_memory_mb: int
    tls_cert_file: str
    tls_key_file: str
    tls_ca_file: str
    queue_groups: int
    group_replicas: int
    queue_group_list: tuple[GroupRule, ...]
    udp_amplification_limit: int
    overflow_mb: int
    overflow_dir: str

    @property
    def overflow_path(self) -> str | None:
        """Where bodies overflow to (overflow_dir, or its default in queue_data_dir); None when
        overflow is off (overflow_mb 0, or in_memory)."""
        if not self.overflow_mb or self.in_memory:
            return None
        return self.overflow_dir or self.queue_data_dir.rstrip("/") + "/overflow"

    @property
    def is_cluster(self) -> bool:
        """More than one node."""
        return len(self.cluster_node_list) > 1

    @property
    def self_node(self) -> ClusterNode | None:
        """This node's entry in cluster_node_list (None on a single node without a list)."""
        return next((n for n in self.cluster_node_list if n.node_id == self.node_id), None)

    @property
    def peers(self) -> tuple[ClusterNode, ...]:
        """The other cluster members."""
        return tuple(n for n in self.cluster_node_list if n.node_id != self.node_id)

    def placement(self) -> Placement:
        """The cluster's queue groups: which group each queue is in, and their replica sets."""
        return Placement([n.node_id for n in self.cluster_node_list] or [self.node_id], self.queue_groups,
                         self.group_replicas, self.queue_group_list,
                         RoutingKeys([(v.name, v.queue_list) for v in self.virtual_queue_list], self.dead_letter_suffix))

    @property
    def python_log_level(self) -> int:
        """log_level as a :mod:`logging` level."""
        return LOG_LEVELS[self.log_level]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict in the config file's format (``from_dict`` reads it back)."""
        out: dict[str, Any] = {}
        for key in _KEYS:
            out[key.name] = getattr(self, key.name)
        out["cluster_node_list"] = [
            {"node_id": n.node_id, "host": n.host, "port": n.port, **({"http_port": n.http_port} if n.http_port else {})}
            for n in self.cluster_node_list
        ]
        out["virtual_queue_list"] = [
            {"name": q.name, "queue_list": list(q.queue_list)} for q in self.virtual_queue_list
        ]
        out["queue_group_list"] = [r.as_dict() for r in self.queue_group_list]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeConfig:
        """Validate a dict of config keys (missing keys take defaults; unknown keys are errors)."""
        for name in data:
            if name not in _BY_NAME:
                raise ConfigError(name, "unknown key")
        config, _ = _build(data, None)
        return config


def _build(data: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> tuple[NodeConfig, list[str]]:
    warnings = [f"unknown config key '{name}' ignored" for name in data if name not in _BY_NAME]
    values: dict[str, Any] = {}
    for key in _KEYS:
        raw = data.get(key.name, key.default)
        try:
            values[key.name] = key.check(raw)
        except _Invalid as e:
            raise ConfigError(key.name, str(e)) from None
    for name, raw in (overrides or {}).items():
        if raw is None:  # a command-line flag that was not given
            continue
        key = _BY_NAME.get(name)
        if key is None:
            raise ConfigError(name, "unknown key (override)")
        try:
            values[name] = key.check(raw)
        except _Invalid as e:
            raise ConfigError(name, f"{e} (override)") from None
    config = NodeConfig(**values)
    _cross_check(config)
    return config, warnings


_WILDCARDS = ("0.0.0.0", "::", "")


def _cross_check(c: NodeConfig) -> None:
    """Rules between keys."""
    me = c.self_node
    if c.cluster_node_list and me is None:
        raise ConfigError("cluster_node_list", f"this node (node_id {c.node_id}) is not in the list")
    if me is not None and me.port == c.port and (
            me.host == c.host or me.host in _WILDCARDS or c.host in _WILDCARDS):
        raise ConfigError("cluster_node_list",
                          f"this node's internal address {me.host}:{me.port} is its client address")
    if c.metrics_port and (c.metrics_port == c.port or (me is not None and c.metrics_port == me.port)):
        raise ConfigError("metrics_port", f"port {c.metrics_port} is already used by this node")
    if c.http_port and (c.http_port in (c.port, c.metrics_port) or (me is not None and c.http_port == me.port)):
        raise ConfigError("http_port", f"port {c.http_port} is already used by this node")
    if bool(c.tls_cert_file) != bool(c.tls_key_file):
        missing = "tls_key_file" if c.tls_cert_file else "tls_cert_file"
        raise ConfigError(missing, "TLS needs both tls_cert_file and tls_key_file")
    if c.tls_ca_file and not c.tls_cert_file:
        raise ConfigError("tls_ca_file", "client certificates need TLS: set tls_cert_file and tls_key_file")
    if c.heartbeat_ms >= c.election_timeout_ms:
        raise ConfigError("heartbeat_ms", f"must be below election_timeout_ms "
                          f"({c.heartbeat_ms} >= {c.election_timeout_ms})")
    _check_groups(c)


def _check_groups(c: NodeConfig) -> None:
    """The queue groups' rules: odd replica sets of known nodes, no virtual queue split, no node
    that replicates nothing (it would only pass requests on)."""
    nodes = len(c.cluster_node_list)
    if nodes % 2 == 0 and nodes and not c.group_replicas:
        raise ConfigError("cluster_node_list", f"a cluster needs an odd number of nodes (1, 3, 5...), got {nodes}")
    if c.group_replicas and (c.group_replicas % 2 == 0 or c.group_replicas > max(nodes, 1)):
        raise ConfigError("group_replicas", f"must be odd and at most the {max(nodes, 1)} node(s) of "
                          f"cluster_node_list, got {c.group_replicas}")
    ids = {n.node_id for n in c.cluster_node_list} or {c.node_id}
    named: dict[int, tuple[int, ...]] = {}
    for n, rule in enumerate(c.queue_group_list, 1):
        if rule.group >= c.queue_groups:
            raise ConfigError("queue_group_list", f"entry {n}: group {rule.group} is not below queue_groups ({c.queue_groups})")
        unknown = [x for x in rule.nodes if x not in ids]
        if unknown:
            raise ConfigError("queue_group_list", f"entry {n}: node {unknown[0]} is not in cluster_node_list")
        if rule.nodes and named.setdefault(rule.group, rule.nodes) != rule.nodes:
            raise ConfigError("queue_group_list", f"entry {n}: group {rule.group} is given two different replica sets")
    placement = c.placement()
    split = placement.split_virtual_queue()
    if split is not None:
        names, (a, b) = split
        raise ConfigError("queue_group_list", f"the virtual queue of {', '.join(names)} would span groups {a} and {b}: "
                          "place all of its queues in one group")
    idle = [node for node in sorted(ids) if not placement.groups_of(node)]
    if idle:
        raise ConfigError("queue_groups", f"node {idle[0]} would be a replica of no queue group ({c.queue_groups} "
                          f"group(s) of {placement.group_replicas} replica(s) on {len(ids)} nodes): raise "
                          "queue_groups or group_replicas")


# -- text ------------------------------------------------------------------------------------

_TOKENS = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/|/\*', re.S)


def strip_comments(text: str) -> str:
    """Blank out // line comments and /* */ block comments that are outside JSON strings.

    Comments become spaces (newlines kept), so JSON error positions still match the file.
    """

    def blank(m: re.Match[str]) -> str:
        token = m.group()
        if token[0] == '"':
            return token
        if token == "/*":
            line = text.count("\n", 0, m.start()) + 1
            raise ConfigError("", f"unterminated /* comment at line {line}")
        return re.sub(r"[^\n]", " ", token)

    return _TOKENS.sub(blank, text)


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name in out:
            raise ConfigError(name, "appears twice")
        out[name] = value
    return out


def _no_constant(name: str) -> Any:
    raise ConfigError("", f"invalid JSON: {name} is not a JSON number")


def parse_config(text: str, overrides: Mapping[str, Any] | None = None) -> tuple[NodeConfig, list[str]]:
    """Validate config text (JSON with comments); returns (config, warnings).

    Missing keys take their defaults; unknown keys give a warning naming them; overrides
    (config key -> value, None = not given) replace file values and are validated the same way.
    """
    try:
        data = json.loads(strip_comments(text), object_pairs_hook=_object_pairs,
                          parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ConfigError("", f"invalid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(data, dict):
        raise ConfigError("", f"expected a JSON object at the top, got {type(data).__name__}")
    return _build(data, overrides)


def load_config(path: str | None, overrides: Mapping[str, Any] | None = None) -> tuple[NodeConfig, list[str]]:
    """Read and validate a config file; None uses the embedded defaults (DEFAULT_CONFIG_TEXT)."""
    if path is None:
        return parse_config(DEFAULT_CONFIG_TEXT, overrides)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError("", f"cannot read config file {path}: {reason}") from None
    try:
        return parse_config(text, overrides)
    except ConfigError as e:
        if e.key:
            raise
        raise ConfigError("", f"{path}: {e.message}") from None  # which file is not JSON


def key_docs() -> Iterable[tuple[str, Any, str]]:
    """(name, default, doc) for every key, in file order (for --help and docs)."""
    return [(k.name, k.default, k.doc) for k in _KEYS]


DEFAULT_CONFIG_TEXT = """\
// queue-server node config: JSON with // and /* */ comments (the original's format).
{
    "log_prefix" : "",              // also log to <prefix>.log in the working directory; "" = stderr only
    "log_level" : 3,                // 0 off, 1 error, 2 warning, 3 info, 4 debug, 5 trace

    "node_type" : 10,               // cluster id: the same on every node of a cluster
    "node_id" : 1,                  // this node's id, unique in the cluster
    "host" : "127.0.0.1",           // client TCP/UDP address
    "port" : 1111,                  // client TCP/UDP port

    "queue_size" : 100000,          // max messages per queue
    "queue_log_size" : 100000,      // change-log records kept for replication
    "queue_log_bytes" : 8388608,    // bytes of change-log records kept for replication
    "queue_sync_rate" : 1000000,    // max records/s sent to a catching-up follower
    "forward_request" : 1,          // 1: a follower forwards requests to the leader; 0: redirect

    "cluster_node_list" : [],       // [{"node_id":1, "host":"127.0.0.1", "port":1101}, ...]: internal addresses
    "virtual_queue_list" : [],      // [{"name":"v", "queue_list":["q1","q2"]}, ...]
    "queue_data_dir" : "./queue_data",

    "workers" : 2,                  // worker processes
    "max_request_size" : 1048576,   // largest request, bytes
    "udp_max_response" : 60000,     // largest UDP reply, bytes (at most 65507)
    "max_wait" : 30,                // longest long-poll wait, seconds
    "replication" : "quorum",       // "quorum": reply once a majority has the write; "async"
    "fsync" : "everysec",           // "always", "everysec" or "no"
    "in_memory" : false,            // true: no data dir (a snapshot for a follower goes through the run dir)
    "snapshot_every" : 100000,      // write a snapshot after this many committed records
    "wal_segment_bytes" : 67108864, // bytes per change-log file (a follower older than the files gets a snapshot)
    "repair" : false,               // true: cut a log corrupt in the middle at the damage (losing what follows)
    "metrics_port" : 0,             // HTTP metrics port; 0 = off
    "election_timeout_ms" : 300,
    "heartbeat_ms" : 50,
    "max_deliveries" : 0,           // deliveries without a confirm before a dead letter; 0 = unlimited
    "dead_letter_suffix" : ".dlq",  // dead letters of queue q go to q + this; "" = none
    "queue_metrics_max" : 100,      // queues that get their own series in per-queue metrics
    "shutdown_grace" : 10,          // on SIGTERM: seconds to finish the requests in flight
    "http_port" : 8111,             // HTTP API and status page: http://127.0.0.1:8111/ (docs/http.md); 0 = off
    "auth_token_file" : "",         // file with the token clients must present; "" = no authentication
    "cluster_secret_file" : "",     // file with the cluster's secret (queue-server keygen); "" = plain peers
    "insecure_peers" : false,       // true: plain peers even on a non-loopback peer address
    "max_connections" : 1000,       // TCP connections at once; 0 = no limit
    "idle_timeout" : 600,           // close a TCP connection silent this long with nothing pending; 0 = never
    "max_pending_requests" : 4096,  // unanswered requests per connection before reading it pauses
    "max_queues" : 10000,           // queues a node holds (each worker ceil(max_queues / workers)); 0 = no limit
    "max_memory_mb" : 2048,         // MiB held for messages (with overflow; else resident) past which produces are refused; 0 = no limit
    "tls_cert_file" : "",           // with tls_key_file: the client TCP port speaks TLS; "" = plain
    "tls_key_file" : "",
    "tls_ca_file" : "",             // CA of the client certificates required; "" = none required
    "queue_groups" : 1,             // queue groups, each with its own leader and log
    "group_replicas" : 0,           // nodes that replicate each group (odd); 0 = every node
    "queue_group_list" : [],        // [{"pattern": "orders.*", "group": 2, "nodes": [1, 4, 5]}], first match wins
    "udp_amplification_limit" : 3,  // non-loopback UDP: a reply is at most 3x an unauthenticated request; 0 = off
    "overflow_mb" : 1024,           // MiB of message bodies held in memory; past it new bodies go to disk; 0 = off
    "overflow_dir" : ""             // where they go; "" = <queue_data_dir>/overflow
}
"""
