"""`queue-server` with no config file (`pip install . && queue-server`): the node serves its status
page and HTTP API on loopback, says where when it starts, and writes its data in the directory
it was started in. tests/integration/test_status_page.py opens that page in a browser."""
from __future__ import annotations

import socket
import urllib.request

import pytest

from load.procs import stop_tree
from tests.harness import free_port, printed_page, start_without_config


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read().decode()


def test_a_node_started_with_no_config_prints_where_its_page_is_and_serves_it(tmp_path):
    """The embedded defaults but for the two ports, taken at run time through the documented flags
    (1111 and 8111 may be another node's while the tests run: the next test runs it as it is)."""
    port, http_port = free_port(), free_port()
    proc = start_without_config(tmp_path, "--port", str(port), "--http-port", str(http_port))
    try:
        page = printed_page(proc, tmp_path)
        assert page == f"http://127.0.0.1:{http_port}/"
        status, html = get(page)
        assert status == 200 and "<title>" in html
        assert get(page + "readyz") == (200, '{"ready":true,"role":"leader"}\n')
        assert (tmp_path / "queue_data").is_dir()  # queue_data_dir "./queue_data": where it started
    finally:
        status = stop_tree(proc, 15)
    assert status == 0  # SIGTERM stops it cleanly


def _busy(port: int, kind: socket.SocketKind) -> bool:
    with socket.socket(socket.AF_INET, kind) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _listening_on(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) with a TCP socket listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.add(address)
    return found


def test_with_no_arguments_the_page_is_on_127_0_0_1_port_8111_only(tmp_path):
    """`queue-server` exactly as a newcomer runs it. Skipped, saying why, while something else on
    this machine holds 1111 or 8111 (a node a person runs, say)."""
    defaults = ((1111, socket.SOCK_STREAM, "TCP"), (1111, socket.SOCK_DGRAM, "UDP"), (8111, socket.SOCK_STREAM, "TCP"))
    busy = [f"{proto} {port}" for port, kind, proto in defaults if _busy(port, kind)]
    if busy:
        pytest.skip(f"the default ports are in use on this machine ({', '.join(busy)})")
    proc = start_without_config(tmp_path)
    try:
        try:
            page = printed_page(proc, tmp_path)
        except AssertionError:
            if proc.returncode == 1 and "is already in use" in (tmp_path / "node.log").read_text():
                pytest.skip("a default port was taken while the node started")
            raise
        assert page == "http://127.0.0.1:8111/"
        assert get(page)[0] == 200
        assert _listening_on(8111) == {"0100007F"}  # 127.0.0.1, nothing else
    finally:
        status = stop_tree(proc, 15)
    assert status == 0  # SIGTERM stops it cleanly
