"""docs/http.md's curl examples, run in order against a fresh node: each ```sh block's output
must be the ```output block that follows it (JSON lines compared as JSON, the change-log
positions and times left out; other lines as text)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import orjson
import pytest

from tests.harness import REPO, NodeProcess, free_port

DOC = os.path.join(REPO, "docs", "http.md")
DOC_HTTP, DOC_PORT = "127.0.0.1:8111", "127.0.0.1:1111"  # the addresses the examples use
VOLATILE = {"trans_id", "commit_trans_id", "log_size", "cursor"}  # and every float: a time
# queue-cli of this interpreter's environment first on PATH
ENV = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
BLOCK = re.compile(r"```sh\n(.*?)```\n(?:\n?```output\n(.*?)```\n)?", re.S)


def examples(text: str) -> list[tuple[str, str | None]]:
    """(commands, documented output or None) of every ```sh block, in order."""
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


def comparable(output: str) -> list:
    rows: list = []
    for line in output.strip().splitlines():
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            rows.append(line.strip())
            continue
        rows.append(_strip(value))
    return rows


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE and type(v) is not float}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def test_the_doc_has_examples_with_outputs():
    found = examples(open(DOC).read())
    assert len(found) >= 10 and sum(out is not None for _, out in found) >= 10


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_curl_examples_give_the_documented_output(tmp_path):
    node = NodeProcess(str(tmp_path), {"http_port": free_port(), "in_memory": True}).start()
    try:
        http_addr, addr = f"127.0.0.1:{node.config['http_port']}", node.hosts
        for commands, documented in examples(open(DOC).read()):
            script = commands.replace(DOC_HTTP, http_addr).replace(DOC_PORT, addr)
            run = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True,
                                 timeout=30, cwd=tmp_path, env=ENV)
            assert run.returncode == 0, f"{commands}\n{run.stderr}"
            if documented is not None:
                assert comparable(run.stdout) == comparable(documented), commands
    finally:
        node.stop()
