"""The sinks' first contact with a cluster address that refuses connections fails within
seconds, naming the address, instead of retrying in silence for the whole retry timeout.

Elapsed times are printed (`pytest -s`); the bound asserted is generous for a busy machine.
"""

from __future__ import annotations

import socket
import time

import pytest

import sink
from tally.errors import UnavailableError

BOUND = 10.0  # seconds; the client's own budget for a refused first contact is 1 s


def refused_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"grpc://127.0.0.1:{port}"


@pytest.fixture
def df(spark):
    return spark.createDataFrame([(1, 10)], "k long, v long")


def test_tally_sink_write_to_a_refused_address_fails_fast(df):
    url = refused_url()
    started = time.monotonic()
    with pytest.raises(UnavailableError, match=f"cannot reach the coordinator at {url}"):
        sink.TallySink(url, "db.t").write(df)
    elapsed = time.monotonic() - started
    print(f"TallySink.write to {url} failed after {elapsed:.2f} s")
    assert elapsed < BOUND


def test_format_tally_to_a_refused_address_fails_fast(spark, df, cluster, table_name):
    """Spark plans a Python data source's writer in a new Python process (its imports take
    seconds on a busy machine), so the baseline is the same write to a live cluster that
    fails right after the first contact (the table is missing); a refused address must fail
    about as fast, not after the client's 60 s retry timeout."""
    sink.register(spark)

    def failed_write(url: str) -> tuple[float, str]:
        started = time.monotonic()
        with pytest.raises(Exception) as error:  # Spark wraps the source's error in its own
            df.write.format("tally").option("url", url).option("table", table_name) \
                .mode("append").save()
        return time.monotonic() - started, str(error.value)

    failed_write(cluster.url)  # the first use of the data source starts Spark's machinery
    baseline, message = failed_write(cluster.url)
    assert "does not exist" in message
    url = refused_url()
    elapsed, message = failed_write(url)
    print(f'format("tally") to {url} failed after {elapsed:.2f} s; to a live cluster, after '
          f"the first contact, in {baseline:.2f} s")
    assert f"cannot reach the coordinator at {url}" in message
    assert elapsed < baseline + BOUND
