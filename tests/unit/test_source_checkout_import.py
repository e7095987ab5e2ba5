"""`pip install .` then Python started in the repository: the checkout's queue_server/ folder
shadows the installed package, and must still import (its subpackages are the checkout's
top-level folders, as the installed mapping makes them)."""
from __future__ import annotations

import subprocess
import sys

from tests.harness import REPO

# Drop setuptools' editable finder (the test environment's `pip install -e .`), so that the
# import goes as it does after a plain `pip install .`: through sys.path, the checkout first.
_WITHOUT_EDITABLE = (
    "import sys\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in repr(f)]\n"
    "from queue_server import QueueClient\n"
    "import queue_server.server.main, queue_server.workers.queue\n"
    "print(queue_server.server.main.__file__)\n"
)


def test_the_package_imports_from_the_repository_root_without_the_editable_finder() -> None:
    out = subprocess.run([sys.executable, "-c", _WITHOUT_EDITABLE], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("server/main.py")


def test_the_clients_are_the_package_face_but_a_node_process_does_not_import_them() -> None:
    code = ("import sys, queue_server, queue_server.server.worker, queue_server.server.coordinator\n"
            "assert 'queue_server.client' not in sys.modules, 'imported'\n"
            "from queue_server import *\n"
            "import queue_server.client as c\n"
            "assert sorted(queue_server.__all__) == sorted(c.__all__) and QueueClient is c.QueueClient\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
