"""The Spark source's and sink's TLS options (tls, tlsCa, tlsCert, tlsKey): parsed once on the
driver into a TlsFiles that pickles to executors and becomes the SSLContext the clients take;
every bad value an OptionError of one line naming the option. No node, no sockets."""
from __future__ import annotations

import pickle
import ssl

import pytest

pytest.importorskip("pyspark")

from queue_server.client.tls import TlsFiles
from queue_server.spark.options import OptionError, ReadOptions, WriteOptions
from queue_server.spark.source import QueueBatchReader
from tests.tls_certs import make_tls_files

BASE = {"hosts": "127.0.0.1:1111"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_tls_files(str(tmp_path_factory.mktemp("tls")))


def read(**extra: str) -> ReadOptions:
    return ReadOptions.parse({**BASE, "queues": "q", **extra}, streaming=False)


def write(**extra: str) -> WriteOptions:
    return WriteOptions.parse({**BASE, "queue": "q", **extra})


def test_without_tls_options_the_clients_connect_plain():
    for opts in (read(), write(), read(tls="false")):
        assert opts.tls == TlsFiles() and opts.tls.context() is None


def test_tls_true_verifies_with_the_system_cas():
    ctx = read(tls="true").tls.context()
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


def test_a_ca_file_implies_tls_and_travels_as_its_path(certs):
    for opts in (read(tlsCa=certs.ca), write(tlsCa=certs.ca), read(tls="true", tlsCa=certs.ca)):
        travelled = pickle.loads(pickle.dumps(opts))
        assert travelled.tls.ca_file == certs.ca and travelled == opts
        ctx = travelled.tls.context()
        assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName", "queue-server test CA"),),)]


def test_option_names_are_case_insensitive_as_spark_passes_them(certs):
    assert read(tlsca=certs.ca).tls.ca_file == certs.ca
    assert ReadOptions.parse({**BASE, "queues": "q", "TLS": "TRUE"}, streaming=False).tls.enabled


def test_a_client_certificate_and_its_key(certs):
    opts = write(tlsCa=certs.ca, tlsCert=certs.client_cert, tlsKey=certs.client_key)
    travelled = pickle.loads(pickle.dumps(opts.tls))
    assert (travelled.cert_file, travelled.key_file) == (certs.client_cert, certs.client_key)
    assert isinstance(travelled.context(), ssl.SSLContext)


def test_the_batch_reader_hands_tls_to_every_partition(certs):
    opts = ReadOptions.parse({**BASE, "queues": "a,b", "tlsCa": certs.ca, "consume": "true",
                              "partitionsPerQueue": "2"}, streaming=False)
    parts = QueueBatchReader(opts).partitions()
    assert len(parts) == 4
    assert all(pickle.loads(pickle.dumps(part)).tls == opts.tls for part in parts)


def test_bad_values_name_their_option_in_one_line(certs, tmp_path):
    (tmp_path / "garbage.pem").write_text("not a certificate\n")
    missing = str(tmp_path / "nope.pem")
    cases = (
        ({"tlsCa": missing}, "option tlsCa: cannot read .*nope.pem: No such file or directory"),
        ({"tlsCa": str(tmp_path / "garbage.pem")}, "option tlsCa: .*garbage.pem is not a PEM file of CA certificates"),
        ({"tlsCert": missing}, "option tlsCert: cannot read"),
        ({"tlsCert": certs.client_cert, "tlsKey": missing}, "option tlsKey: cannot read"),
        ({"tlsCert": certs.client_cert}, "option tlsCert: .*client.pem is not a PEM certificate whose key"),
        ({"tlsCert": certs.client_cert, "tlsKey": certs.server_key}, "option tlsCert: "),
        ({"tlsKey": certs.client_key}, "option tlsKey: needs tlsCert"),
        ({"tls": "false", "tlsCa": certs.ca}, "option tls: false contradicts tlsCa"),
        ({"tls": "maybe"}, "option tls: must be true or false"),
    )
    for extra, message in cases:
        for parse in (read, write):
            with pytest.raises(OptionError, match=message) as err:
                parse(**extra)
            assert "\n" not in str(err.value)


def test_a_tls_file_missing_on_an_executor_fails_its_task_in_one_line_naming_the_option(certs, tmp_path):
    import shutil
    import socket

    from queue_server.spark.sink import produce_batches
    from queue_server.spark.source import read_partition

    ca = str(tmp_path / "ca.pem")
    shutil.copy(certs.ca, ca)
    reading, writing = read(tlsCa=ca, consume="true"), write(tlsCa=ca)  # on the driver, the file is there
    [part] = QueueBatchReader(reading).partitions()
    (tmp_path / "ca.pem").unlink()  # the executor's host has no such file
    expected = f"option tlsCa: cannot read {ca} on {socket.gethostname()} (every executor needs the TLS files"
    for run in (lambda: next(read_partition(part)), lambda: produce_batches(writing, "p", iter(()))):
        with pytest.raises(OptionError) as err:
            run()
        assert str(err.value).startswith(expected) and "\n" not in str(err.value)
