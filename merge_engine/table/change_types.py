"""The changelog's change types: what a record did to its key (Flink's RowKind names)."""

import pyarrow as pa

INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE = "+I", "-U", "+U", "-D"

CHANGE_TYPES = pa.array([INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE], type=pa.string())
