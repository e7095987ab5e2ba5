"""The data dir's layout per queue group and its groups.json (replication/datadir.py,
replication/group_marker.py): group 0 where a node always kept its data, group g >= 1 in
group-<g>/; a data dir written with one placement refuses another in one line naming the key."""
from __future__ import annotations

import os

import orjson
import pytest

from queue_server.protocol.placement import GroupRule, Placement
from queue_server.replication import group_marker
from queue_server.replication.datadir import GROUPS_FILE, DataDirLocked
from queue_server.replication.storage import Storage

DEFAULT = Placement([1, 2, 3])


def _with_data(path: str, marker: dict | None) -> None:
    """A data dir that holds a log segment, written with `marker` (None: from before groups.json)."""
    os.makedirs(os.path.join(path, "wal"), exist_ok=True)
    with open(os.path.join(path, "wal", "00000000000000000001.wal"), "wb") as f:
        f.write(b"x")
    if marker is not None:
        with open(os.path.join(path, GROUPS_FILE), "wb") as f:
            f.write(orjson.dumps(marker))


def test_group_0_keeps_the_layout_and_other_groups_live_in_group_dirs(tmp_path):
    path = str(tmp_path)
    zero = Storage(path)
    two = Storage(path, group=2)  # opened by the holder of group 0's lock: takes none itself
    try:
        zero.recover()
        two.recover()
        zero.save_vote(3, 1)
        two.save_vote(5, 2)
        assert sorted(os.listdir(path)) == ["LOCK", "group-2", "snapshots", "vote.json", "wal"]
        assert sorted(os.listdir(tmp_path / "group-2")) == ["snapshots", "vote.json", "wal"]
        assert zero.snapshot_dir == os.path.join(path, "snapshots")
        assert two.snapshot_dir == os.path.join(path, "group-2", "snapshots")
        with pytest.raises(DataDirLocked):
            Storage(path)  # the node's one lock is group 0's
    finally:
        two.close()
        zero.close()
    again = Storage(path, group=2)
    try:
        assert again.recover().vote == (5, 2)
    finally:
        again.close()


def test_first_start_records_the_placement(tmp_path):
    path = str(tmp_path)
    assert group_marker.settle(path, DEFAULT) is None
    assert orjson.loads((tmp_path / GROUPS_FILE).read_bytes()) == group_marker.DEFAULT
    assert group_marker.settle(path, DEFAULT) is None


def test_a_changed_group_count_with_data_is_refused_naming_the_key(tmp_path):
    path = str(tmp_path)
    _with_data(path, group_marker.marker_of(Placement([1, 2, 3], 3)))
    reason = group_marker.settle(path, DEFAULT)
    assert reason is not None and reason.startswith(
        f"config key 'queue_groups': the data in {path} was written with queue_groups 3, this config gives 1:")
    assert "\n" not in reason
    assert orjson.loads((tmp_path / GROUPS_FILE).read_bytes())["queue_groups"] == 3  # not rewritten


def test_a_data_dir_from_before_groups_json_was_written_with_one_group(tmp_path):
    path = str(tmp_path)
    _with_data(path, None)
    assert group_marker.problem(path, DEFAULT) is None
    assert group_marker.problem(path, Placement([1, 2, 3], 3)).startswith("config key 'queue_groups': ")
    rules = Placement([1, 2, 3], 1, 0, [GroupRule(0, "orders.*")])
    assert group_marker.problem(path, rules).startswith("config key 'queue_group_list': ")


@pytest.mark.parametrize("old,new,key", [
    (Placement([1, 2, 3, 4, 5], 5, 3), Placement([1, 2, 3, 4, 5], 5, 5), "group_replicas"),
    (Placement([1, 2, 3], 3), Placement([2, 1, 3], 3), "cluster_node_list"),
    (Placement([1, 2, 3], 3), Placement([1, 2, 3], 3, 0, [GroupRule(1, nodes=(1, 2, 3))]), "queue_group_list"),
])
def test_each_key_that_places_queues_is_named(tmp_path, old, new, key):
    path = str(tmp_path)
    _with_data(path, group_marker.marker_of(old))
    assert group_marker.problem(path, new).startswith(f"config key '{key}': ")
    assert group_marker.problem(path, old) is None


def test_one_group_on_every_node_does_not_depend_on_the_node_list(tmp_path):
    path = str(tmp_path)
    _with_data(path, group_marker.marker_of(Placement([1, 2, 3])))
    assert group_marker.problem(path, Placement([1, 2, 3, 4, 5])) is None
    assert group_marker.problem(path, Placement([7], 1, 1)) is None  # group_replicas = every node


def test_without_data_a_new_placement_replaces_the_old(tmp_path):
    path = str(tmp_path)
    (tmp_path / GROUPS_FILE).write_bytes(orjson.dumps(group_marker.marker_of(Placement([1, 2, 3], 3))))
    os.makedirs(tmp_path / "wal")  # empty: nothing written yet
    assert group_marker.settle(path, DEFAULT) is None
    assert orjson.loads((tmp_path / GROUPS_FILE).read_bytes()) == group_marker.DEFAULT


def test_data_of_a_group_dir_counts(tmp_path):
    path = str(tmp_path)
    (tmp_path / GROUPS_FILE).write_bytes(orjson.dumps(group_marker.marker_of(Placement([1, 2, 3], 3))))
    _with_data(str(tmp_path / "group-2"), None)
    assert group_marker.problem(path, DEFAULT).startswith("config key 'queue_groups': ")


def test_an_unreadable_marker_is_one_line(tmp_path):
    (tmp_path / GROUPS_FILE).write_bytes(b"{not json")
    reason = group_marker.settle(str(tmp_path), DEFAULT)
    assert reason.startswith(f"config key 'queue_data_dir': cannot read {tmp_path / GROUPS_FILE}: ")
    assert "\n" not in reason
