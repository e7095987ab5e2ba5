"""queue-cli reads message bodies from standard input (`-`, and `--lines` for one message per
line) and tells its version."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from queue_server.client import QueueClient, cli


def run_cli(monkeypatch, stdin: str, *args: str) -> tuple[int, list[dict], str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    status = cli.main(["--json", *args])
    return status, [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


def drain(node, queue: str) -> list[str]:
    with QueueClient(node.hosts) as q:
        return [m.data for m in q.consume_batch(queue, 1000)]


def test_dash_reads_one_message_from_stdin(node, qname, monkeypatch):
    status, [reply], _ = run_cli(monkeypatch, '{"id": 1}\nsecond line\n',
                                 "--hosts", node.hosts, "produce", qname, "-")
    assert status == 0 and reply["code"] == 0
    assert drain(node, qname) == ['{"id": 1}\nsecond line']  # the last newline is not the body's


def test_lines_makes_one_message_per_line_in_batches(node, qname, monkeypatch):
    monkeypatch.setattr(cli.p, "MAX_BATCH", 100)  # the test node's queues are small
    lines = [f"m{i}" for i in range(150)]
    status, replies, err = run_cli(monkeypatch, "\n".join(lines) + "\n\n",
                                 "--hosts", node.hosts, "produce", qname, "-", "--lines")
    assert status == 0 and [r["code"] for r in replies] == [0, 0], err  # 100 + 50
    assert sorted(drain(node, qname)) == sorted(lines)


@pytest.mark.parametrize("args, stdin, message", [
    (["x", "--lines"], "a\n", "queue-cli: --lines reads standard input: give - as DATA"),
    (["-", "x"], "a\n", "queue-cli: - (standard input) must be the only DATA"),
    (["-", "--lines"], "\n\n", "queue-cli: --lines: standard input holds no line"),
])
def test_stdin_misuse_is_one_line(node, qname, monkeypatch, args, stdin, message):
    status, replies, err = run_cli(monkeypatch, stdin, "--hosts", node.hosts, "produce", qname, *args)
    assert (status, replies, err.strip()) == (2, [], message)
    assert drain(node, qname) == []


@pytest.mark.parametrize("command", [["queue_server.client.cli"], ["queue_server.server.main"],
                                     ["queue_server.server.devcluster"]])
def test_version(command):
    from importlib import metadata
    out = subprocess.run([sys.executable, "-P", "-m", *command, "--version"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0
    assert out.stdout.strip().endswith(" " + metadata.version("queue-server"))


def test_a_reader_that_goes_away_is_no_traceback(node, qname):
    with QueueClient(node.hosts) as q:
        for _ in range(2):  # a ~90 kB reply: more than a pipe holds, so the writer meets the closed end
            q.produce_batch(qname, ["x" * 400] * 100)
    cli_cmd = [sys.executable, "-P", "-m", "queue_server.client.cli", "--hosts", node.hosts,
               "peek", qname, "--count", "200"]
    proc = subprocess.Popen(cli_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(10)
    proc.stdout.close()  # like `| head -c 10`
    err = proc.stderr.read().decode()
    assert proc.wait(20) == 0 and "Traceback" not in err, err
