"""HTTP closed-loop load for load/bench.py: wrk (Debian's `wrk`, compiled, epoll) runs
produce -> consume -> confirm cycles against a node's HTTP API (docs/http.md), one connection per
wrk thread so that each connection keeps its own cycle, with the figures cbench reports."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

# One cycle per connection: POST a message, GET it (leased for 30 s), DELETE it. Each thread has
# one connection and its own queue; a consume that finds nothing produces again.
SCRIPT = r"""
local counter = 0
function setup(thread)
  counter = counter + 1
  thread:set("id", counter)
end
function init(args)
  queue = "/v1/queues/http-bench-" .. id .. "/messages"
  body = '{"data":"' .. string.rep("x", tonumber(args[1])) .. '","retry":30}'
  step, msg_id, cycles = 1, nil, 0
end
function request()
  if step == 1 then return wrk.format("POST", queue, nil, body) end
  if step == 2 then return wrk.format("GET", queue) end
  return wrk.format("DELETE", queue .. "/" .. msg_id)
end
function response(status, headers, text)
  if status >= 300 then error("status " .. status .. ": " .. text) end
  if step == 1 then step = 2
  elseif step == 2 then
    msg_id = string.match(text, '"msg_id":(%d+)')
    step = msg_id and 3 or 1
  else
    step, cycles = 1, cycles + 1
  end
end
"""


def available() -> str | None:
    """Why the HTTP workload cannot run here, or None."""
    return None if shutil.which("wrk") else "wrk not installed (.ci/install-tools installs it): HTTP rows skipped"


def _ms(text: str) -> float:
    """A latency as wrk prints it (its units: us, ms, s, m, h), in milliseconds."""
    found = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text)
    if found is None:
        raise ValueError(f"wrk printed a latency of {text!r}")
    value, unit = found.groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}[unit]


def percentile(text: str, q: int) -> float:
    """The q% latency of wrk's --latency distribution, in ms: its own line, not a "+/- Stdev"
    column that ends in the same digits (92.50% is no 50% line)."""
    return _ms(re.search(rf"^\s*{q}%\s+(\S+)", text, re.M).group(1))


def run(port: int, conns: int, seconds: float, payload: int, workdir: str) -> dict:
    """One closed-loop run against 127.0.0.1:port; ops (requests), messages (completed cycles),
    their rates and request latency p50/p99, as cbench reports them."""
    script = os.path.join(workdir, "http-cycle.lua")
    with open(script, "w") as f:
        f.write(SCRIPT)
    argv = ["wrk", "-t", str(conns), "-c", str(conns), "-d", f"{max(1, round(seconds))}s", "--latency",
            "-s", script, f"http://127.0.0.1:{port}", "--", str(payload)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    text = out.stdout
    done = re.search(r"(\d+) requests in ([\d.]+)(s|ms|m)", text)
    if out.returncode != 0 or done is None or "error" in out.stderr.lower():
        raise RuntimeError(f"wrk failed: {(out.stderr or text).strip()[-300:]}")
    if re.search(r"Non-2xx or 3xx responses: \d+", text):
        raise RuntimeError(f"wrk: error responses: {text.strip()[-300:]}")
    ops = int(done.group(1))
    elapsed = float(done.group(2)) * {"s": 1, "ms": 1e-3, "m": 60}[done.group(3)]
    try:
        p50, p99 = (percentile(text, q) for q in (50, 99))
    except (AttributeError, ValueError) as exc:  # shown whole: which line wrk printed is the question
        raise RuntimeError(f"wrk's latency distribution was not read ({exc}): {text.strip()[-600:]}") from None
    messages = ops // 3
    return {"ops": ops, "messages": messages, "seconds": elapsed, "ops_per_s": ops / elapsed,
            "messages_per_s": messages / elapsed, "p50_ms": p50, "p99_ms": p99}
