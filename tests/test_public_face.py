"""`import tally` is the public face: every name resolves, and each loads only what it needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tally

FACE = ["AggFunction", "KvTablet", "LocalCluster", "MergeMode", "Schema", "TableDescriptor",
        "TallySink", "TlsFiles", "connect", "errors", "sketches", "testing"]
HEAVY = ("rocksdict", "pyarrow.flight", "pyspark")


def loaded_after(code: str) -> list[str]:
    """Which of the heavy modules a fresh interpreter has loaded after running `code`."""
    probe = f"{code}\nimport sys\nprint([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent.parent)
    return eval(out.stdout.splitlines()[-1])


def test_building_a_schema_loads_neither_rocksdb_flight_nor_spark():
    assert loaded_after(
        "import pyarrow as pa\n"
        "import tally\n"
        "schema = (tally.Schema.builder().column('product', pa.string())\n"
        "          .agg_column('revenue', pa.decimal128(18, 2), tally.AggFunction.SUM)\n"
        "          .primary_key('product').build())\n"
        "tally.TableDescriptor(schema, bucket_count=4,\n"
        "                      properties={'table.merge-engine': 'aggregation'})\n"
        "tally.MergeMode.parse('AGGREGATE')\n"
        "tally.errors.TallyError\n") == []


def test_import_tally_alone_loads_nothing_heavy():
    assert loaded_after("import tally") == []


def test_dir_lists_the_face():
    assert sorted(FACE) == [name for name in dir(tally) if not name.startswith("_")]


def test_every_name_of_the_face_resolves():
    from merge_engine import testing
    from merge_engine.testing import strategies
    from sink import TallySink
    from tally.client import connect
    from tally.server import LocalCluster

    assert tally.connect is connect
    assert tally.TallySink is TallySink
    assert tally.LocalCluster is LocalCluster
    assert tally.testing is testing
    from aggfuncs import sketch_values

    assert tally.sketches is sketch_values
    assert tally.testing.strategies is strategies
    assert issubclass(tally.errors.InvalidInputError, tally.errors.TallyError)
    for name in FACE:
        assert getattr(tally, name) is not None


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="Nothing"):
        tally.Nothing
