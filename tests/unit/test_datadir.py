import os
import subprocess
import sys

import pytest

from queue_server.replication.datadir import DataDir, DataDirLocked, check_free

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# a second node: takes the data dir, says so, and holds it until its stdin closes
SECOND_NODE = """
import sys
from queue_server.replication.datadir import DataDir, DataDirLocked
try:
    d = DataDir(sys.argv[1])
except DataDirLocked as e:
    print("locked:", e, flush=True)
    sys.exit(3)
print("owner", flush=True)
sys.stdin.read()
d.close()
"""


def second_node(path, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.Popen(
        [sys.executable, "-c", SECOND_NODE, str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, **kw,
    )


def test_layout(tmp_path):
    path = tmp_path / "data"
    with DataDir(str(path)) as d:
        assert os.path.isdir(d.wal_dir) and d.wal_dir == str(path / "wal")
        assert os.path.isdir(d.snapshot_dir) and d.snapshot_dir == str(path / "snapshots")
        assert (path / "LOCK").read_text() == f"{os.getpid()}\n"


def test_vote_state(tmp_path):
    with DataDir(str(tmp_path)) as d:
        assert d.load_vote_state() == (0, None)
        d.save_vote_state(3, 2)
        assert d.load_vote_state() == (3, 2)
        d.save_vote_state(4, None)
        assert d.load_vote_state() == (4, None)
    with DataDir(str(tmp_path)) as d:
        assert d.load_vote_state() == (4, None)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


@pytest.mark.parametrize("content", [b"", b"{", b'{"vote_id": 3}', b'{"vote_id": -1, "voted_for": null}', b"[1, 2]",
                                     b'{"vote_id": 3, "voted_for": "b"}'])
def test_a_damaged_vote_file_is_an_error_not_a_fresh_start(tmp_path, content):
    (tmp_path / "vote.json").write_bytes(content)
    with DataDir(str(tmp_path)) as d:
        with pytest.raises(ValueError, match="vote.json"):
            d.load_vote_state()


def test_a_second_open_in_the_same_process_is_refused(tmp_path):
    # flock belongs to the open file description, so even this process's second open conflicts
    d = DataDir(str(tmp_path))
    with pytest.raises(DataDirLocked) as e:
        DataDir(str(tmp_path))
    assert str(e.value) == f"queue data dir {tmp_path} is in use by another node (pid {os.getpid()})"
    d.close()
    DataDir(str(tmp_path)).close()


def test_a_second_node_is_refused_while_the_first_runs(tmp_path):
    d = DataDir(str(tmp_path))
    other = second_node(tmp_path)
    out, _ = other.communicate(timeout=30)
    assert other.returncode == 3
    assert f"queue data dir {tmp_path} is in use by another node (pid {os.getpid()})" in out
    d.close()
    other = second_node(tmp_path)
    out, _ = other.communicate("", timeout=30)
    assert other.returncode == 0 and out == "owner\n"


def test_the_lock_goes_with_the_process_that_held_it(tmp_path):
    other = second_node(tmp_path)
    assert other.stdout.readline() == "owner\n"
    with pytest.raises(DataDirLocked, match=f"pid {other.pid}"):
        DataDir(str(tmp_path))
    other.kill()  # no clean close: the kernel drops the lock with the process
    other.wait(timeout=30)
    other.stdin.close()
    other.stdout.close()
    with DataDir(str(tmp_path)) as d:
        assert (tmp_path / "LOCK").read_text() == f"{os.getpid()}\n"
        d.save_vote_state(1, None)


def test_check_free_says_who_holds_the_directory_and_takes_nothing(tmp_path):
    check_free(str(tmp_path / "new"))  # no directory yet: free
    check_free(str(tmp_path))  # no LOCK file yet: free
    d = DataDir(str(tmp_path))
    with pytest.raises(DataDirLocked, match=f"in use by another node \\(pid {os.getpid()}\\)"):
        check_free(str(tmp_path))
    d.close()
    check_free(str(tmp_path))
    DataDir(str(tmp_path)).close()  # the check kept no lock behind
