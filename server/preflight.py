"""What the supervisor checks before it starts a node's processes, so that the usual mistakes end
in one line a person can act on (and exit status 1) instead of a child's traceback: a host name
that does not resolve, a port already in use, a data (or overflow) directory that cannot be written."""
from __future__ import annotations

import errno
import ipaddress
import os
import socket
from typing import Any, Callable

from queue_server.config.loader import NodeConfig
from queue_server.replication import datadir, group_marker
from queue_server.server.auth import read_token_file
from queue_server.server import overflow_files, tls
from queue_server.server.secret_file import read_secrets


class StartError(Exception):
    """Why the node cannot start, as one line."""


class PortUnavailable(StartError):
    """One of the node's ports cannot be bound (in use, privileged, ...): a port to change."""


def check(config: NodeConfig) -> list[str]:
    """Raise StartError naming the config key if the node cannot start as configured; return
    warnings about what may heal by itself (a peer's name that does not resolve yet, as in a
    docker-compose cluster whose other containers are still starting)."""
    warnings = []
    _resolve("host", config.host)
    me = config.self_node if config.is_cluster else None
    for i, node in enumerate(config.cluster_node_list):
        try:
            _resolve(f"cluster_node_list[{i}].host", node.host)
        except StartError as exc:
            if node is me:
                raise
            warnings.append(f"{exc}; node {node.node_id} is unreachable until it does")
    _bindable("port", config.host, config.port, socket.SOCK_STREAM)
    _bindable("port", config.host, config.port, socket.SOCK_DGRAM)
    if me is not None:
        i = config.cluster_node_list.index(me)
        _bindable(f"cluster_node_list[{i}].port", me.host, me.port, socket.SOCK_STREAM,
                  host_key=f"cluster_node_list[{i}].host")
    if config.metrics_port:
        _bindable("metrics_port", config.host, config.metrics_port, socket.SOCK_STREAM)
    if config.http_port:
        _bindable("http_port", config.host, config.http_port, socket.SOCK_STREAM)
    if not config.in_memory:
        _writable_dir("queue_data_dir", config.queue_data_dir)
        try:
            datadir.check_free(config.queue_data_dir)
        except datadir.DataDirLocked as exc:
            raise StartError(f"config key 'queue_data_dir': {exc}; give each node its own (--data-dir)") from None
        _loads(_placement_kept, config)
    if config.overflow_path is not None:
        _writable_dir("overflow_dir", config.overflow_path)
        busy = overflow_files.in_use(config.overflow_path, config.workers)
        if busy:
            raise StartError(f"config key 'overflow_dir': {busy}; give each node its own")
    if config.auth_token_file:
        _loads(read_token_file, config.auth_token_file)
    _loads(tls.server_context, config)
    if config.cluster_secret_file:  # read by the coordinator whenever it is set, cluster or not
        _loads(read_secrets, config.cluster_secret_file)
    if me is not None:
        warnings += _peer_security(config, me.host)
    return warnings


def _peer_security(config: NodeConfig, host: str) -> list[str]:
    """A peer port others can reach needs the cluster secret, unless insecure_peers says plainly
    that it may go without."""
    if config.cluster_secret_file:
        return []
    if is_loopback(host):
        return []
    if not config.insecure_peers:
        raise StartError(f"config key 'cluster_secret_file': the peer address {host} is not loopback, so "
                         f"peers must be authenticated: make a secret with `queue-server keygen --out FILE` "
                         f"and set cluster_secret_file on every node (or set insecure_peers to true)")
    return [f"insecure_peers: the peer port on {host} takes unauthenticated, unencrypted peers: anyone who "
            f"reaches it can take over the cluster; set cluster_secret_file"]


def _placement_kept(config: NodeConfig) -> None:
    """Raise ValueError (one line naming the key) if the data dir holds data written with
    another placement of queue groups (replication/group_marker.py)."""
    reason = group_marker.problem(config.queue_data_dir, config.placement())
    if reason is not None:
        raise ValueError(reason)


def _loads(load: Callable[[Any], object], arg: Any) -> None:
    """Load a file the config names as the node will; its ValueError (a one-line reason naming
    the key: TlsConfigError is one) becomes the StartError."""
    try:
        load(arg)
    except ValueError as exc:
        raise StartError(str(exc)) from None


def is_loopback(host: str) -> bool:
    """Whether `host` resolves to a loopback address only (a wildcard address is not)."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (socket.gaierror, UnicodeError):
        return False
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def _resolve(key: str, host: str) -> None:
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise StartError(f"config key '{key}': cannot resolve host '{host}' ({reason})") from None


def _bindable(key: str, host: str, port: int, kind: socket.SocketKind, host_key: str = "host") -> None:
    """Bind and release the address as the node will (SO_REUSEADDR, as the acceptor does); the
    error names `host_key` when the host is what is wrong."""
    proto = "TCP" if kind == socket.SOCK_STREAM else "UDP"
    family = socket.getaddrinfo(host, port, type=kind)[0][0]
    with socket.socket(family, kind) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            if kind == socket.SOCK_STREAM:
                s.listen(1)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                why = "is already in use (another queue-server, or another program?)"
            elif exc.errno == errno.EADDRNOTAVAIL:
                raise StartError(f"config key '{host_key}': {host} is not an address of this machine") from None
            elif exc.errno == errno.EACCES:
                why = "needs privileges (ports below 1024)"
            else:
                why = f"cannot be bound: {exc.strerror or exc}"
            raise PortUnavailable(f"config key '{key}': {proto} {host}:{port} {why}") from None


def _writable_dir(key: str, path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise StartError(f"config key '{key}': cannot create '{path}': {exc.strerror or exc}") from None
    if not os.path.isdir(path):
        raise StartError(f"config key '{key}': '{path}' is not a directory")
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        raise StartError(f"config key '{key}': '{path}' is not readable and writable by this user")
