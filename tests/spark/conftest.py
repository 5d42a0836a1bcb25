"""Fixtures of the Spark sink tests: one SparkSession for the whole run, one Tally cluster.

The SparkSession is `local[2,4]` (2 cores; a task may fail 3 times and be retried, so injected
task failures are retried as on a real cluster), with the UI off. Spark's Python workers run
the venv's Python (PYSPARK_PYTHON) and can import this repository (PYTHONPATH), so test hooks
in tests/spark/hooks.py run inside tasks. Streaming jobs that get killed run in subprocesses
(tests/spark/stream_job.py) with their own JVM, since a SIGKILL must not take the session down.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if shutil.which("java") is None:
    pytest.skip("the Spark sink tests need Java (make test installs openjdk-17-jre-headless)",
                allow_module_level=True)

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")


# The tests' jobs are small and many of them start a JVM of their own (the kill cycles): the
# client compiler alone and the serial collector halve such a JVM's time on 2 busy cores, where
# the optimising compiler's and the parallel collector's threads compete with the other worker.
JAVA_OPTIONS = "-Xss4m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def build_jvm_reader() -> None:
    """Build the JVM reader's jar if its sources changed (a no-op otherwise); without javac
    the tests of that reader skip."""
    import subprocess

    subprocess.run(["bash", os.path.join(ROOT, "scripts", "build_jvm_reader.sh"),
                    sys.executable], check=False)


def spark_builder(master: str = "local[2,4]"):
    from pyspark.sql import SparkSession

    from sink.jvm_reader import spark_jars

    builder = SparkSession.builder
    if spark_jars():
        builder = builder.config("spark.jars", spark_jars())
    return (builder.master(master)
            .appName("tally-sink-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.default.parallelism", "2")
            .config("spark.sql.streaming.stopTimeout", "10s")
            .config("spark.driver.extraJavaOptions", JAVA_OPTIONS)
            .config("spark.python.worker.faulthandler.enabled", "true"))


@pytest.fixture(scope="session")
def spark():
    build_jvm_reader()
    session = spark_builder().getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    from tally.server import LocalCluster

    with LocalCluster(str(tmp_path_factory.mktemp("spark-cluster")), tablet_servers=2) as c:
        yield c


@pytest.fixture
def conn(cluster):
    from tally import client

    connection = client.connect(cluster.url)
    yield connection
    connection.close()


@pytest.fixture
def table_name():
    return f"sparktest.t_{uuid.uuid4().hex[:10]}"
