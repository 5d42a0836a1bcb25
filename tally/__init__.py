"""Tally: a table store for real-time aggregates.

`import tally` is the public face:

    tally.connect(url)                 a client connection to a cluster
    tally.Schema, tally.AggFunction    tables and their aggregate columns
    tally.TableDescriptor, tally.MergeMode, tally.KvTablet
    tally.TallySink                    the exactly-once Spark sink
    tally.LocalCluster                 a real cluster of local processes
    tally.TlsFiles                     the PEM files of a grpc+tls:// connection or server
    tally.errors                       every error Tally raises (TallyError and its subclasses)
    tally.sketches                     build sketch images, read estimates, quantiles, ranks
    tally.testing                      the reference model; tally.testing.strategies for hypothesis

Each name is loaded on first use (PEP 562), so building a schema loads neither RocksDB, Arrow
Flight nor Spark, and `tally version` stays instant. The names come from packages layered
below this face (docs/architecture.md); this module imports none of them until asked.
"""

from __future__ import annotations

import importlib
import os
import sys

__version__ = "0.1.0"


def _default_spark_python() -> None:
    """Spark runs its Python workers with $PYSPARK_PYTHON, else `python3` from the PATH, often
    an interpreter without Tally (its tasks fail with `No module named 'sink'`, its lookup of
    installed data sources misses `format("tally")`). The JVM reads the variable when it
    starts, so this sets it, to this interpreter, while no JVM runs yet (under spark-submit
    one does, launched with its own settings) and only when unset: a variable you set wins."""
    if "PYSPARK_PYTHON" not in os.environ and "PYSPARK_GATEWAY_PORT" not in os.environ:
        os.environ["PYSPARK_PYTHON"] = sys.executable


_default_spark_python()

# name -> (module, attribute); no attribute: the module itself.
_FACE: dict[str, tuple[str, str | None]] = {
    "connect": ("tally.client.connection", "connect"),
    "Schema": ("merge_engine.table.schema", "Schema"),
    "AggFunction": ("aggfuncs.functions", "AggFunction"),
    "TableDescriptor": ("merge_engine.table.descriptor", "TableDescriptor"),
    "MergeMode": ("merge_engine.table.modes", "MergeMode"),
    "KvTablet": ("merge_engine.kv.tablet", "KvTablet"),
    "TallySink": ("sink.tally_sink", "TallySink"),
    "LocalCluster": ("tally.server.local_cluster", "LocalCluster"),
    "TlsFiles": ("tally.wire.tls", "TlsFiles"),
    "errors": ("tally.errors", None),
    "sketches": ("aggfuncs.sketch_values", None),
    "testing": ("merge_engine.testing", None),
}

__all__ = list(_FACE)


def __getattr__(name: str):
    try:
        module_name, attribute = _FACE[name]
    except KeyError:
        raise AttributeError(f"module 'tally' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*_FACE, "__version__"])
