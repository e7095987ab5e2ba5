"""The queue source and sink against a node that requires TLS and a client certificate
(tls_cert_file, tls_key_file, tls_ca_file): a small Spark batch write and read through TLS, a
stream round driven by hand (its driver-side clients too), and the one-line error of options
without TLS."""
from __future__ import annotations

import pickle

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from queue_server.client import NoServerAvailable, QueueClient
from queue_server.client.tls import TlsFiles
from queue_server.spark.options import ReadOptions
from queue_server.spark.stream import QueueStreamReader
# The TLS test material and node of the client's TLS tests, as fixtures of this module too.
from tests.integration.test_tls import certs, mtls_node  # noqa: F401

PLAIN_ON_TLS = ("connection closed by the server before any reply "
                "(a node with TLS closes plain connections: connect with tls)")


def tls_options(node, certs) -> dict[str, str]:
    return {"hosts": node.hosts, "tlsCa": certs.ca, "tlsCert": certs.client_cert,
            "tlsKey": certs.client_key}


def client(node, certs) -> QueueClient:
    return QueueClient(node.hosts, tls=TlsFiles(True, certs.ca, certs.client_cert, certs.client_key).context())


def test_a_batch_write_and_read_through_tls(spark_session, mtls_node, certs, qname):
    sent = [f"secret-{i}" for i in range(20)]
    opts = tls_options(mtls_node, certs)
    spark_session.createDataFrame([(d,) for d in sent], "data string").repartition(2) \
        .write.format("queue").options(**opts).option("queue", qname).mode("append").save()
    with client(mtls_node, certs) as c:
        assert c.monitor(qname)["size"] == 20
    rows = spark_session.read.format("queue").options(**opts).option("queues", qname) \
        .option("consume", "true").load().collect()
    assert sorted(r.data for r in rows) == sorted(sent)
    with client(mtls_node, certs) as c:
        assert c.monitor(qname)["size"] == 0


def test_options_without_tls_fail_in_one_line_against_a_tls_node(spark_session, mtls_node, qname):
    df = spark_session.createDataFrame([("x",)], "data string")
    with pytest.raises(Exception) as err:
        df.write.format("queue").option("hosts", mtls_node.hosts).option("queue", qname) \
            .option("timeout", "5").mode("append").save()
    lines = [line.strip() for line in str(err.value).splitlines() if PLAIN_ON_TLS in line]
    assert lines and all(line.endswith(PLAIN_ON_TLS) for line in lines), str(err.value)[-2000:]


def test_a_stream_round_through_tls(mtls_node, certs, qname):
    with client(mtls_node, certs) as c:
        c.produce_batch(qname, [f"s-{i}" for i in range(30)])
    opts = ReadOptions.parse({**tls_options(mtls_node, certs), "queues": qname}, streaming=True)
    r = QueueStreamReader(opts)
    try:
        start = r.initialOffset()
        end = r.latestOffset(start, ReadAllAvailable())  # the driver's client: monitor over TLS
        [part] = r.partitions(start, end)
        fresh = pickle.loads(pickle.dumps(r))  # executors get a pickled reader and partition
        got = [d for b in fresh.read(pickle.loads(pickle.dumps(part))) for d in b.to_pydict()["data"]]
        assert sorted(got) == sorted(f"s-{i}" for i in range(30))
        r.commit(end)  # confirms over TLS
        with client(mtls_node, certs) as c:
            assert c.monitor(qname)["size"] == 0
    finally:
        r.stop()

    plain = QueueStreamReader(ReadOptions.parse({"hosts": mtls_node.hosts, "queues": qname,
                                                 "timeout": "5"}, streaming=True))
    try:
        with pytest.raises(NoServerAvailable, match="connect with tls"):
            plain.latestOffset(plain.initialOffset(), ReadAllAvailable())
    finally:
        plain.stop()
