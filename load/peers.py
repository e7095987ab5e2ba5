"""The peers the benchmarks compare queue-server with (beanstalkd, redis): which are installed,
and the command line that starts each on a loopback port."""
from __future__ import annotations

import shutil

BINARIES = {"beanstalkd": "beanstalkd", "redis": "redis-server"}


def installed(notes: list[str], *names: str) -> list[str]:
    """The peers (`names`, default all) installed here; a note in `notes` for each one that is not."""
    found = []
    for name, binary in BINARIES.items():
        if names and name not in names:
            continue
        if shutil.which(binary):
            found.append(name)
        else:
            notes.append(f"{binary} not installed (.ci/install-tools installs it): peer skipped")
    return found


def argv(name: str, port: int, *extra: str) -> list[str]:
    """The command that starts peer `name` on 127.0.0.1:`port`, in memory only, with `extra` appended."""
    if name == "beanstalkd":
        return ["beanstalkd", "-l", "127.0.0.1", "-p", str(port), *extra]
    return ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *extra]
