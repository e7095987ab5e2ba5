"""Tests for config/loader.py: the node config."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from queue_server.config import loader
from queue_server.config.loader import (
    DEFAULT_CONFIG_TEXT, ClusterNode, ConfigError, NodeConfig, VirtualQueue, check_queue_name,
    key_docs, load_config, parse_config, strip_comments,
)

EXAMPLES = Path(loader.__file__).parent / "examples"

DEFAULTS = {
    "log_prefix": "", "log_level": 3, "node_type": 10, "node_id": 1, "host": "127.0.0.1",
    "port": 1111, "queue_size": 100000, "queue_log_size": 100000, "queue_log_bytes": 8 << 20, "queue_sync_rate": 1000000,
    "forward_request": True, "cluster_node_list": (), "virtual_queue_list": (),
    "queue_data_dir": "./queue_data", "workers": 2, "max_request_size": 1048576,
    "udp_max_response": 60000, "max_wait": 30.0, "replication": "quorum", "fsync": "everysec",
    "in_memory": False, "snapshot_every": 100000, "wal_segment_bytes": 64 << 20, "repair": False, "metrics_port": 0, "election_timeout_ms": 300, "heartbeat_ms": 50,
    "max_deliveries": 0, "dead_letter_suffix": ".dlq", "queue_metrics_max": 100, "shutdown_grace": 10, "http_port": 8111, "auth_token_file": "",
    "cluster_secret_file": "", "insecure_peers": False, "udp_amplification_limit": 3,
    "overflow_mb": 1024, "overflow_dir": "",
    "max_connections": 1000, "idle_timeout": 600, "max_pending_requests": 4096,
    "max_queues": 10000, "max_memory_mb": 2048,
    "tls_cert_file": "", "tls_key_file": "", "tls_ca_file": "",
    "queue_groups": 1, "group_replicas": 0, "queue_group_list": (),
}

THREE = [
    {"node_id": 1, "host": "127.0.0.1", "port": 1101},
    {"node_id": 2, "host": "127.0.0.1", "port": 1102},
    {"node_id": 3, "host": "127.0.0.1", "port": 1103},
]


def parse(**keys: object) -> NodeConfig:
    config, _ = parse_config(json.dumps(keys))
    return config


def error(**keys: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(json.dumps(keys))
    return info.value


# -- defaults ------------------------------------------------------------------------------


def test_empty_object_gives_defaults() -> None:
    config, warnings = parse_config("{}")
    assert dataclasses.asdict(config) == DEFAULTS
    assert warnings == []
    assert not config.is_cluster and config.self_node is None and config.peers == ()


def test_embedded_default_text_matches_the_key_table() -> None:
    config, warnings = load_config(None)
    assert warnings == []
    assert config == parse_config("{}")[0]
    for name, _, _ in loader.key_docs():  # every key is written out in the default text
        assert f'"{name}"' in DEFAULT_CONFIG_TEXT


def test_key_table_and_dataclass_agree() -> None:
    assert [k for k, _, _ in loader.key_docs()] == [f.name for f in dataclasses.fields(NodeConfig)]


def test_log_levels_mapping() -> None:
    assert parse(log_level=1).python_log_level == 40  # logging.ERROR
    assert parse(log_level=4).python_log_level == 10  # logging.DEBUG
    assert set(loader.LOG_LEVELS) == set(range(6))


# -- comments ------------------------------------------------------------------------------


def test_strip_comments_keeps_strings() -> None:
    text = '{"url": "http://x/y//z", "c": "/* not a comment */", "q": "a\\"//b"} // tail\n'
    assert json.loads(strip_comments(text)) == {
        "url": "http://x/y//z", "c": "/* not a comment */", "q": 'a"//b'}


def test_strip_comments_blanks_but_keeps_lines() -> None:
    text = '{ // one\n  /* two\n three */ "a": 1 /* x */ }'
    out = strip_comments(text)
    assert len(out) == len(text) and out.count("\n") == text.count("\n")
    assert json.loads(out) == {"a": 1}


def test_comments_everywhere_in_config() -> None:
    text = """
    // leading
    {
        "host" : "http://not-a-comment//", // trailing
        /* block
           over lines */ "port" : 1112 , /* inline */ "log_prefix": "a/*b*/c"
    }
    // after
    """
    config, _ = parse_config(text)
    assert (config.host, config.port, config.log_prefix) == ("http://not-a-comment//", 1112, "a/*b*/c")


def test_unterminated_block_comment() -> None:
    with pytest.raises(ConfigError, match="unterminated /\\* comment at line 2"):
        parse_config('{\n /* open\n "port": 1}')


def test_invalid_json_reports_position_in_the_file() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config('{ // c\n "port": 1111,\n "host" "x"\n}')
    assert info.value.key == ""
    assert "invalid JSON" in str(info.value) and "line 3" in str(info.value)


@pytest.mark.parametrize("text", ["[]", "1", '"x"', "null"])
def test_top_level_must_be_an_object(text: str) -> None:
    with pytest.raises(ConfigError, match="JSON object"):
        parse_config(text)


def test_nan_and_duplicate_keys_rejected() -> None:
    with pytest.raises(ConfigError, match="NaN"):
        parse_config('{"max_wait": NaN}')
    with pytest.raises(ConfigError) as info:
        parse_config('{"port": 1, "port": 2}')
    assert info.value.key == "port"


# -- every key's invalid values ----------------------------------------------------------

INVALID: dict[str, list[object]] = {
    "log_prefix": [1, None, ["a"]],
    "log_level": [-1, 6, "3", 3.0, True],
    "node_type": [-1, "10", 1.5, False],
    "node_id": [0, -3, "1", 1.0, True],
    "host": ["", 1, None],
    "port": [0, 65536, "abc", 1111.0, True, None],
    "queue_size": [0, "100", 1.5, True],
    "queue_log_size": [0, -1, "x"],
    "queue_log_bytes": [0, 1023, -1, "8M", 1.5],
    "queue_sync_rate": [0, 2.5, "fast"],
    "forward_request": [2, -1, "1", 1.0, None],
    "cluster_node_list": [{}, "x", [1], None],
    "virtual_queue_list": [{}, "x", [1], None],
    "queue_data_dir": ["", 0, None],
    "workers": [0, 65, "2", 2.0, True],
    "max_request_size": [0, 1023, 2 ** 31, "1M", 1.5],
    "udp_max_response": [0, 65508, 100, "60000"],
    "max_wait": [0, -1, "30", True, None],
    "replication": ["sync", "", 1, None, "QUORUM"],
    "fsync": ["sometimes", 1, True, None],
    "wal_segment_bytes": [0, 4095, "64M", 1.5],
    "in_memory": [0, 1, "true", None],
    "snapshot_every": [0, -5, 1.5, "10"],
    "repair": [0, 1, "yes", None],
    "metrics_port": [-1, 65536, "9100", 9100.0, True],
    "election_timeout_ms": [0, 5, 60001, "300", 300.5],
    "heartbeat_ms": [0, 10001, "50", 50.5],
    "max_deliveries": [-1, 2**31, "3", 1.5, True],
    "dead_letter_suffix": [1, None, "\n", "x" * 65],
    "queue_metrics_max": [-1, 100001, "10", 2.5],
    "shutdown_grace": [0, -1, "10", None],
    "http_port": [-1, 65536, "8080", 8080.0, True],
    "auth_token_file": [1, None, ["f"]],
    "cluster_secret_file": [1, None, ["f"]],
    "insecure_peers": [0, 1, "true", None],
    "udp_amplification_limit": [-1, 1001, 1.5, "3", None],
    "overflow_mb": [-1, 1.5, "1024", None],
    "overflow_dir": [3, None],
    "max_connections": [-1, 1.5, "10", None],
    "idle_timeout": [-1, 1.5, "10", None],
    "max_pending_requests": [0, 15, 2**20 + 1, "10", None],
    "max_queues": [-1, 1.5, "10", None],
    "max_memory_mb": [-1, 1.5, "10", None],
    "tls_cert_file": [1, None, ["f"]],
    "tls_key_file": [1, None, ["f"]],
    "tls_ca_file": [1, None, ["f"]],
    "queue_groups": [0, 1025, "3", 1.5, True, None],
    "group_replicas": [-1, 256, "3", 1.5, None],
    "queue_group_list": [{}, "x", [1], None, [{"pattern": "a*"}], [{"group": 0}], [{"group": -1, "pattern": "a"}],
                         [{"group": 0, "pattern": ""}], [{"group": 0, "nodes": [1, 1, 2]}],
                         [{"group": 0, "nodes": [1, 2]}], [{"group": 0, "nodes": "1"}], [{"group": 0, "node": [1]}]],
}


def test_every_key_has_invalid_cases() -> None:
    assert set(INVALID) == {f.name for f in dataclasses.fields(NodeConfig)}


@pytest.mark.parametrize("key,value", [(k, v) for k, vs in INVALID.items() for v in vs])
def test_invalid_value_names_the_key(key: str, value: object) -> None:
    e = error(**{key: value})
    assert e.key == key
    assert str(e).startswith(f"config key '{key}': ")


def test_infinite_number_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config('{"max_wait": 1e999}')
    assert info.value.key == "max_wait"


def test_error_message_format() -> None:
    assert str(error(port="abc")) == "config key 'port': expected an integer 1..65535, got 'abc'"
    assert str(error(port=True)) == "config key 'port': expected an integer 1..65535, got True"
    assert error(port="abc").message == "expected an integer 1..65535, got 'abc'"


def test_valid_edge_values() -> None:
    c = parse(port=65535, log_level=0, workers=64, udp_max_response=65507, max_wait=0.5,
              forward_request=0, metrics_port=9100, in_memory=True, fsync="no",
              replication="async", node_type=0)
    assert c.port == 65535 and c.workers == 64 and c.max_wait == 0.5
    assert c.forward_request is False and c.in_memory is True
    assert parse(forward_request=True).forward_request is True
    assert parse(max_wait=5).max_wait == 5.0


def test_unknown_keys_warn() -> None:
    config, warnings = parse_config('{"port": 1112, "queue_data_blocks": 10, "colour": "red"}')
    assert config.port == 1112
    assert len(warnings) == 2
    assert "'queue_data_blocks'" in warnings[0] and "'colour'" in warnings[1]


# -- cluster -------------------------------------------------------------------------------


def test_three_node_cluster() -> None:
    c = parse(node_id=2, port=1112, cluster_node_list=THREE)
    assert c.is_cluster
    assert c.cluster_node_list[0] == ClusterNode(1, "127.0.0.1", 1101)
    assert c.self_node == ClusterNode(2, "127.0.0.1", 1102)
    assert [n.node_id for n in c.peers] == [1, 3]


def test_one_node_list_is_not_a_cluster() -> None:
    c = parse(cluster_node_list=[{"node_id": 1, "host": "127.0.0.1", "port": 1101}])
    assert not c.is_cluster and c.self_node is not None and c.peers == ()


def _cluster_error(nodes: list, node_id: int = 1, **more: object) -> ConfigError:
    e = error(node_id=node_id, cluster_node_list=nodes, **more)
    assert e.key == "cluster_node_list", str(e)
    return e


def test_cluster_validation() -> None:
    assert "odd" in str(_cluster_error(THREE[:2]))
    assert "odd" in str(_cluster_error(THREE + [{"node_id": 4, "host": "h", "port": 1}]))
    assert "duplicate node_id 1" in str(_cluster_error(
        [THREE[0], THREE[1], {"node_id": 1, "host": "127.0.0.2", "port": 1101}]))
    assert "duplicate address 127.0.0.1:1101" in str(_cluster_error(
        [THREE[0], THREE[1], {"node_id": 3, "host": "127.0.0.1", "port": 1101}]))
    assert "node_id 4" in str(_cluster_error(THREE, node_id=4))
    assert "missing field 'port'" in str(_cluster_error([{"node_id": 1, "host": "h"}]))
    assert "unknown field 'id'" in str(_cluster_error([{"id": 1, "node_id": 1, "host": "h", "port": 1}]))
    assert "'port'" in str(_cluster_error([{"node_id": 1, "host": "h", "port": 0}]))
    assert "'port'" in str(_cluster_error([{"node_id": 1, "host": "h", "port": "1"}]))
    assert "'node_id'" in str(_cluster_error([{"node_id": True, "host": "h", "port": 1}]))
    assert "'host'" in str(_cluster_error([{"node_id": 1, "host": "", "port": 1}]))
    assert "entry 2" in str(_cluster_error([THREE[0], "x", THREE[2]]))
    # internal address equal to the client address
    assert "client address" in str(_cluster_error(THREE, port=1101))
    assert "client address" in str(_cluster_error(THREE, port=1101, host="0.0.0.0"))
    parse(node_id=1, cluster_node_list=THREE, port=1101, host="127.0.0.2")  # other address: fine


def test_port_and_timing_cross_checks() -> None:
    assert error(metrics_port=1111).key == "metrics_port"
    assert error(metrics_port=1101, cluster_node_list=THREE).key == "metrics_port"
    assert error(http_port=1111).key == "http_port"
    assert error(http_port=9100, metrics_port=9100).key == "http_port"
    assert error(http_port=1101, cluster_node_list=THREE).key == "http_port"
    assert error(heartbeat_ms=300).key == "heartbeat_ms"
    assert error(heartbeat_ms=100, election_timeout_ms=50).key == "heartbeat_ms"


def test_tls_keys_go_together() -> None:
    assert error(tls_cert_file="c.pem").key == "tls_key_file"
    assert error(tls_key_file="k.pem").key == "tls_cert_file"
    assert error(tls_ca_file="ca.pem").key == "tls_ca_file"
    parse(tls_cert_file="c.pem", tls_key_file="k.pem", tls_ca_file="ca.pem")


# -- virtual queues ------------------------------------------------------------------------


def test_virtual_queues() -> None:
    c = parse(virtual_queue_list=[{"name": "v", "queue_list": ["a", "b"]},
                                  {"name": "w", "queue_list": ["a", "c"]}])
    assert c.virtual_queue_list == (VirtualQueue("v", ("a", "b")), VirtualQueue("w", ("a", "c")))


@pytest.mark.parametrize("entries,fragment", [
    ([{"name": "", "queue_list": ["a"]}], "non-empty"),
    ([{"name": 1, "queue_list": ["a"]}], "'name'"),
    ([{"name": "v", "queue_list": []}], "non-empty list"),
    ([{"name": "v", "queue_list": "a"}], "non-empty list"),
    ([{"name": "v"}], "missing field 'queue_list'"),
    ([{"name": "v", "queue_list": ["a"], "x": 1}], "unknown field 'x'"),
    (["v"], "expected an object"),
    ([{"name": "v", "queue_list": ["a"]}, {"name": "v", "queue_list": ["b"]}], "defined twice"),
    ([{"name": "v", "queue_list": ["a"]}, {"name": "w", "queue_list": ["v"]}], "also a member"),
    ([{"name": "v", "queue_list": ["v"]}], "also a member"),
    ([{"name": "v", "queue_list": ["a", "a"]}], "appears twice"),
    ([{"name": "v", "queue_list": [""]}], "non-empty"),
    ([{"name": "v", "queue_list": [3]}], "non-empty string"),
    ([{"name": "v", "queue_list": ["a\nb"]}], "control character"),
    ([{"name": "v\u0085", "queue_list": ["a"]}], "control character"),
    ([{"name": "v", "queue_list": ["x" * 257]}], "256 bytes"),
    ([{"name": "v", "queue_list": ["é" * 129]}], "256 bytes"),
])
def test_virtual_queue_validation(entries: list, fragment: str) -> None:
    e = error(virtual_queue_list=entries)
    assert e.key == "virtual_queue_list"
    assert fragment in e.message


def test_queue_name_rule() -> None:
    assert check_queue_name("x" * 256) is None
    assert check_queue_name("é" * 128) is None
    assert check_queue_name("队列.名字 with spaces/and:colons") is None
    assert check_queue_name("x" * 257) is not None
    assert check_queue_name("a\x00") is not None
    assert check_queue_name("a\x7f") is not None
    assert check_queue_name("\ud800") is not None
    assert check_queue_name(None) is not None


# -- overrides -----------------------------------------------------------------------------


def test_overrides_replace_file_values() -> None:
    config, _ = parse_config('{"port": 1111, "host": "127.0.0.1"}',
                             {"port": 1112, "host": "0.0.0.0", "node_id": 2, "workers": 4,
                              "queue_data_dir": "/tmp/q", "max_wait": None})
    assert (config.port, config.host, config.node_id, config.workers, config.queue_data_dir) == \
        (1112, "0.0.0.0", 2, 4, "/tmp/q")
    assert config.max_wait == 30.0  # None means "flag not given"


def test_overrides_are_validated() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("{}", {"port": "1112"})
    assert info.value.key == "port" and "override" in info.value.message
    with pytest.raises(ConfigError) as info:
        parse_config("{}", {"workers": 0})
    assert info.value.key == "workers"
    with pytest.raises(ConfigError) as info:
        parse_config("{}", {"data_dir": "/x"})
    assert info.value.key == "data_dir"


def test_override_node_id_is_checked_against_the_cluster() -> None:
    text = json.dumps({"cluster_node_list": THREE})
    assert parse_config(text, {"node_id": 3})[0].self_node == ClusterNode(3, "127.0.0.1", 1103)
    with pytest.raises(ConfigError) as info:
        parse_config(text, {"node_id": 5})
    assert info.value.key == "cluster_node_list"


# -- round trip ----------------------------------------------------------------------------


def test_round_trip() -> None:
    config = parse(node_id=3, port=1113, cluster_node_list=THREE, forward_request=0,
                   virtual_queue_list=[{"name": "v", "queue_list": ["a", "b"]}], max_wait=2.5)
    d = config.to_dict()
    assert json.loads(json.dumps(d)) == d  # JSON-able
    assert NodeConfig.from_dict(d) == config
    assert parse_config(json.dumps(d))[0] == config
    assert NodeConfig.from_dict({}) == parse_config("{}")[0]
    with pytest.raises(ConfigError):
        NodeConfig.from_dict({"nope": 1})
    with pytest.raises(ConfigError):
        NodeConfig.from_dict({**d, "port": 0})


def test_config_is_frozen() -> None:
    config = parse()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.port = 1  # type: ignore[misc]


# -- files ---------------------------------------------------------------------------------


def test_examples_load() -> None:
    names = sorted(p.name for p in EXAMPLES.glob("*.json"))
    assert names == ["node1.json", "node2.json", "node3.json", "single.json", "virtual.json"]
    for path in EXAMPLES.glob("*.json"):
        config, warnings = load_config(str(path))
        assert warnings == [], path


def test_single_example() -> None:
    config, _ = load_config(str(EXAMPLES / "single.json"))
    assert not config.is_cluster and config.port == 1111


def test_single_example_shows_every_key_at_its_default() -> None:
    """The README sends readers to single.json for every key with its default and meaning."""
    text = (EXAMPLES / "single.json").read_text()
    config, _ = load_config(str(EXAMPLES / "single.json"))
    default, _ = load_config(None)
    for name, _, _ in key_docs():
        assert f'"{name}"' in text, name
        if name != "log_prefix":  # the example logs to a file
            assert getattr(config, name) == getattr(default, name), name


def test_cluster_examples() -> None:
    configs = [load_config(str(EXAMPLES / f"node{i}.json"))[0] for i in (1, 2, 3)]
    assert [c.node_id for c in configs] == [1, 2, 3]
    assert [c.port for c in configs] == [1111, 1112, 1113]
    assert [c.self_node.port for c in configs] == [1101, 1102, 1103]  # type: ignore[union-attr]
    assert all(c.is_cluster for c in configs)
    assert len({c.queue_data_dir for c in configs}) == 3
    assert len({c.cluster_node_list for c in configs}) == 1
    assert len({c.node_type for c in configs}) == 1


def test_virtual_example() -> None:
    config, _ = load_config(str(EXAMPLES / "virtual.json"))
    assert VirtualQueue("test", ("test1", "test2")) in config.virtual_queue_list


def test_load_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"host": "\xff"}')
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(bad))
    good = tmp_path / "good.json"
    good.write_text('{"port": 2222} // comment\n')
    assert load_config(str(good), {"workers": 3})[0].workers == 3


def test_cluster_node_list_may_name_each_http_port() -> None:
    nodes = [dict(n, http_port=8110 + n["node_id"]) for n in THREE]
    config = parse(node_id=1, cluster_node_list=nodes)
    assert [n.http_port for n in config.cluster_node_list] == [8111, 8112, 8113]
    assert NodeConfig.from_dict(config.to_dict()) == config
    assert parse(node_id=1, cluster_node_list=THREE).cluster_node_list[0].http_port == 0
    assert "http_port" not in parse(node_id=1, cluster_node_list=THREE).to_dict()["cluster_node_list"][0]
    bad = error(node_id=1, cluster_node_list=[dict(THREE[0], http_port="8111"), *THREE[1:]])
    assert bad.key == "cluster_node_list" and "http_port" in str(bad)


# -- queue groups (issue 28; only the default placement is built yet) ---------------------------

SIX = [{"node_id": i, "host": "127.0.0.1", "port": 1100 + i} for i in range(1, 7)]


def test_queue_groups_default_is_one_group_on_every_node() -> None:
    c = parse(node_id=2, cluster_node_list=THREE)
    placement = c.placement()
    assert placement.queue_groups == 1 and placement.replicas(0) == (1, 2, 3)
    assert placement.group_of("anything") == 0 and placement.groups_of(2) == (0,)
    assert parse(group_replicas=3, node_id=2, cluster_node_list=THREE).queue_group_list == ()  # N given as N


def test_group_replicas_must_be_odd_and_at_most_the_nodes() -> None:
    assert error(group_replicas=2, cluster_node_list=THREE).key == "group_replicas"
    assert "at most the 3 node(s)" in str(error(group_replicas=5, cluster_node_list=THREE))
    assert "at most the 1 node(s)" in str(error(group_replicas=3))


def test_group_rules_are_checked_against_the_groups_and_nodes() -> None:
    e = error(cluster_node_list=THREE, queue_groups=2, queue_group_list=[{"group": 2, "pattern": "a*"}])
    assert e.key == "queue_group_list" and "not below queue_groups (2)" in str(e)
    e = error(cluster_node_list=THREE, queue_group_list=[{"group": 0, "nodes": [1, 2, 9]}])
    assert e.key == "queue_group_list" and "node 9 is not in cluster_node_list" in str(e)
    e = error(cluster_node_list=THREE, queue_groups=2,
              queue_group_list=[{"group": 1, "nodes": [1]}, {"group": 1, "nodes": [2]}])
    assert "entry 2: group 1 is given two different replica sets" in str(e)


def test_a_virtual_queue_split_over_groups_is_refused_by_name() -> None:
    e = error(cluster_node_list=THREE, queue_groups=3,
              virtual_queue_list=[{"name": "all", "queue_list": ["orders.eu", "audit"]}],
              queue_group_list=[{"group": 2, "pattern": "orders.*"}])
    assert e.key == "queue_group_list"
    assert "the virtual queue of all, audit, orders.eu would span groups" in str(e)


def test_groups_on_fewer_nodes_than_the_cluster_are_accepted_while_every_node_replicates_one() -> None:
    for keys in [{"queue_groups": 3}, {"queue_groups": 3, "group_replicas": 3},
                 {"queue_groups": 2, "queue_group_list": [{"group": 1, "pattern": "a*", "nodes": [3, 1, 2]}]}]:
        assert parse(cluster_node_list=THREE, **keys).placement().groups_of(2) == tuple(range(keys["queue_groups"]))
    six = parse(cluster_node_list=SIX, group_replicas=3, queue_groups=6).placement()  # an even N, odd replica sets
    assert [len(six.groups_of(n)) for n in range(1, 7)] == [3] * 6
    assert parse(cluster_node_list=THREE, queue_groups=3, group_replicas=1).placement().groups_of(2) == (1,)
    e = error(cluster_node_list=THREE, group_replicas=1)
    assert e.key == "queue_groups" and "node 2 would be a replica of no queue group" in str(e)
    e = error(cluster_node_list=THREE, queue_groups=2, queue_group_list=[{"group": 0, "nodes": [1]}, {"group": 1, "nodes": [1]}])
    assert e.key == "queue_groups" and "node 2 would be a replica of no queue group" in str(e)


def test_queue_group_list_round_trips_through_to_dict() -> None:
    c = parse(cluster_node_list=THREE)
    assert NodeConfig.from_dict(c.to_dict()) == c
    assert c.to_dict()["queue_group_list"] == []
