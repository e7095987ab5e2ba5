"""Fixtures for the Spark tests: one real node per module, and one local SparkSession shared by
the whole test session (Spark takes 10-20 s to start). Executors import `spark`, `client` and
`tests` from the repository through PYTHONPATH, as an installed package would be imported."""
from __future__ import annotations

import itertools
import os
import sys
import time

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from tests.harness import REPO, NodeProcess

_names = itertools.count()


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """One node shared by a test module, with a virtual queue fan = [fan_a, fan_b]."""
    n = NodeProcess(
        str(tmp_path_factory.mktemp("node")),
        {"queue_size": 200_000, "max_wait": 5,
         "virtual_queue_list": [{"name": "fan", "queue_list": ["fan_a", "fan_b"]}]},
    ).start()
    yield n
    n.stop()


@pytest.fixture
def qname(request) -> str:
    """A queue name prefix no other test uses."""
    return f"{request.node.name[:30]}-{os.getpid()}-{next(_names)}-{time.monotonic_ns() % 10**9}"


@pytest.fixture(scope="session")
def spark_session(tmp_path_factory):
    """A local[2] SparkSession (up to 4 attempts per task, so that a failed task is retried)."""
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    # Executors run the interpreter of the tests, so that they import this checkout's package
    # (another python on PATH may have another install of queue_server).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    import queue_server.spark as queue_spark

    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("queue-server-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.local.dir", str(tmp_path_factory.mktemp("spark-local")))
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    queue_spark.register(session)
    yield session
    session.stop()
    gateway = SparkContext._gateway
    if gateway is not None:  # stop the JVM too: no process outlives the tests
        proc = getattr(gateway, "proc", None)
        gateway.shutdown()
        SparkContext._gateway = None
        SparkContext._jvm = None
        if proc is not None:
            proc.terminate()
            proc.wait(30)
