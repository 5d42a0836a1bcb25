"""rbm32 / rbm64 bitmap columns: union merges, pyroaring interop, clear errors."""

import pyarrow as pa
import pytest
from pyroaring import BitMap, BitMap64

from aggfuncs import bitmap_ids, build_bitmap
from tally.errors import InvalidAggFunctionError, InvalidInputError, RetractionError
from tests.tablet_helpers import one_column_tablet


def test_pyroaring_bitmaps_round_trip_and_merge_by_union(tmp_path):
    with one_column_tablet(tmp_path, "rbm32", pa.binary()) as t:
        raw = BitMap(range(0, 1000, 3)).serialize()  # not run-optimised: still read exactly
        t.put([{"k": 1, "v": raw}])
        assert BitMap.deserialize(t.lookup({"k": 1})["v"]) == BitMap(range(0, 1000, 3))
        t.put([{"k": 1, "v": build_bitmap([1, 2**32 - 1])}, {"k": 1, "v": None}, {"k": 1, "v": 5}])
        assert set(bitmap_ids(t.lookup({"k": 1})["v"])) == set(range(0, 1000, 3)) | {1, 5, 2**32 - 1}


def test_rbm64_takes_64_bit_ids_and_integer_inputs(tmp_path):
    with one_column_tablet(tmp_path, "rbm64", pa.large_binary()) as t:
        t.put(pa.table({"k": [1, 1, 2], "v": [2**40, 7, None]}))
        t.put([{"k": 1, "v": BitMap64([2**63]).serialize()}])
        assert bitmap_ids(t.lookup({"k": 1})["v"], 64) == [7, 2**40, 2**63]
        assert t.lookup({"k": 2})["v"] is None  # null rule: nothing yet


def test_invalid_bytes_name_the_column_and_leave_no_trace(tmp_path):
    with one_column_tablet(tmp_path, "rbm32", pa.binary()) as t:
        t.put([{"k": 1, "v": build_bitmap([1])}])
        before = t.to_arrow()
        with pytest.raises(InvalidInputError, match="Column 'v' \\(rbm32\\).*not a portable 32-bit"):
            t.put([{"k": 2, "v": build_bitmap([2])}, {"k": 1, "v": b"\x00garbage"}])
        with pytest.raises(InvalidInputError, match="ids in \\[0, 4294967295\\]"):
            t.put([{"k": 1, "v": -1}])
        with pytest.raises(RetractionError, match="ignore-retract"):
            t.put([{"k": 1, "v": build_bitmap([1]), "_change_type": "-D"}])
        assert t.to_arrow().equals(before)


def test_bitmaps_need_a_binary_column(tmp_path):
    with pytest.raises(InvalidAggFunctionError, match="rbm32 column 'v' must be one of \\[binary"):
        one_column_tablet(tmp_path, "rbm32", pa.int64())
