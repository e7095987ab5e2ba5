"""groups.json in the data dir: the placement of queue groups the node's data was written with
(replication/datadir.py shows the layout). A queue's group decides which log holds it, so a data
dir written under one placement cannot be read under another: a node whose config places queues
otherwise, with data present, is refused at start in one line naming the config key, never
reshuffled in silence. Written at first start; a data dir from before queue groups has none and
was written with the default placement (one group on every node)."""
from __future__ import annotations

import os
from typing import Any

import orjson

from queue_server.protocol.placement import Placement
from queue_server.replication.datadir import GROUPS_FILE, group_path
from queue_server.replication.disk import read_file, replace_file

# The marker of the default placement: what a data dir without groups.json was written with.
DEFAULT: dict[str, Any] = {"queue_groups": 1, "group_replicas": 0, "queue_group_list": []}
# The marker's fields, in the order they are compared, and the config key that sets each.
_KEYS = (("queue_groups", "queue_groups"), ("group_replicas", "group_replicas"),
         ("queue_group_list", "queue_group_list"), ("replicas", "cluster_node_list"))


def marker_of(placement: Placement) -> dict[str, Any]:
    """What groups.json says of `placement`. group_replicas is 0 when it is every node, and the
    replica sets are given only when some group is not on every node or there are several
    groups: then the node list decides where queues live; with one group on every node it does
    not (nodes may be added or renamed as before queue groups)."""
    every = placement.group_replicas >= len(placement.members)
    marker: dict[str, Any] = {"queue_groups": placement.queue_groups,
                              "group_replicas": 0 if every else placement.group_replicas,
                              "queue_group_list": [rule.as_dict() for rule in placement.rules]}
    if placement.queue_groups > 1 or not every or any(rule.nodes for rule in placement.rules):
        marker["replicas"] = [list(placement.replicas(g)) for g in range(placement.queue_groups)]
    return marker


def has_data(path: str, queue_groups: int) -> bool:
    """Whether the data dir at `path` holds a log segment or a snapshot of any group (of the
    first queue_groups, and any other group-<g> directory found)."""
    dirs = [group_path(path, g) for g in range(queue_groups)]
    if os.path.isdir(path):
        dirs += [os.path.join(path, name) for name in os.listdir(path) if name.startswith("group-")]
    return any(os.path.isdir(os.path.join(d, sub)) and os.listdir(os.path.join(d, sub))
               for d in dirs for sub in ("wal", "snapshots"))


def written_with(path: str) -> dict[str, Any] | None:
    """The placement the data at `path` was written with (None: no data, and no marker)."""
    try:
        return orjson.loads(read_file(os.path.join(path, GROUPS_FILE)))
    except FileNotFoundError:
        return dict(DEFAULT) if has_data(path, 1) else None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ValueError(f"config key 'queue_data_dir': cannot read {os.path.join(path, GROUPS_FILE)}: {exc}") from None


def problem(path: str, placement: Placement) -> str | None:
    """Why the node cannot start on the data dir at `path` with `placement` (one line naming
    the config key), or None: no data, or written with the same placement."""
    old = written_with(path)
    if old is None:
        return None
    new = marker_of(placement)
    for field, key in _KEYS:
        if old.get(field) != new.get(field) and has_data(path, max(old.get("queue_groups", 1), 1)):
            return (f"config key '{key}': the data in {path} was written with {field} "
                    f"{_show(old.get(field))}, this config gives {_show(new.get(field))}: queues would move "
                    f"between groups; set it back, or start on an empty queue_data_dir "
                    f"(there is no migration of a data dir between placements yet: docs/plans/queue-groups.md 2.4)")
    return None


def record(path: str, placement: Placement) -> None:
    """Write groups.json for `placement` unless it says that already (check problem() first)."""
    marker = marker_of(placement)
    target = os.path.join(path, GROUPS_FILE)
    try:
        if orjson.loads(read_file(target)) == marker:
            return
    except (OSError, orjson.JSONDecodeError):
        pass
    replace_file(target, (orjson.dumps(marker, option=orjson.OPT_INDENT_2),))


def settle(path: str, placement: Placement) -> str | None:
    """At start, holding the data dir's lock: record `placement` in groups.json, unless the data
    was written with another (problem); the one-line reason it cannot start, or None."""
    try:
        reason = problem(path, placement)
        if reason is None:
            record(path, placement)
        return reason
    except ValueError as exc:
        return str(exc)
    except OSError as exc:
        return f"config key 'queue_data_dir': cannot write {os.path.join(path, GROUPS_FILE)}: {exc.strerror or exc}"


def _show(value: Any) -> str:
    return "(every node)" if value is None else orjson.dumps(value).decode()
