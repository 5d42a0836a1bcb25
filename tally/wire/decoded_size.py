"""The size a client-sent Arrow table takes once its compact encodings are decoded.

Counting the bytes of an IPC stream (tally.wire.ipc_guard) bounds what reading it allocates,
but several encodings describe far more data than they carry, and a server pays for that data
the first time it casts, hashes or merges the column: a run-end encoded key of one run of
2**31 rows is a few hundred bytes on the wire. So before any of that:

- the encodings a Tally client never sends, whose size cannot be read off their buffers (run-end
  encoded, list views, string and binary views), are refused from the stream's schema, before
  any record batch is read;
- what remains is counted by its decoded size on the arrays as read, which are slices of the
  bytes already received (nothing is cast, decoded or combined to count them): a dictionary
  column as its rows times its dictionary's widest value, a list by its child, a struct by its
  fields, a column of the null type as 8 bytes a row (what casting it to any column type
  allocates at most).

Only requests from clients are bounded this way; a client reading a server's answers trusts it.
A client casts string and binary views in user input to their offset-based types before
sending (without_views).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from tally.errors import InvalidInputError

_REFUSED = (
    (pa.types.is_run_end_encoded, "run-end"),
    (pa.types.is_list_view, "list view"),
    (pa.types.is_large_list_view, "list view"),
    (pa.types.is_string_view, "string view"),
    (pa.types.is_binary_view, "binary view"),
)
_NULL_ROW_BYTES = 8  # the widest fixed-width value a null column may be cast to


def stream_schema(source: pa.Buffer) -> pa.Schema | None:
    """The schema of an IPC stream, read without reading any batch; None when the bytes do not
    start with one (the stream's reader reports that, typed)."""
    try:
        return pa.ipc.open_stream(source).schema
    except (pa.ArrowException, OSError):
        return None


def refuse_unbounded_encodings(schema: pa.Schema | None, what: str) -> None:
    """InvalidInputError naming the first column of `schema` that is, or holds, an encoding
    whose decoded size its buffers do not show."""
    for field in schema or ():
        encoding = _refused_encoding(field.type)
        if encoding:
            raise InvalidInputError(
                f"{what}: column '{field.name}' ({field.type}) uses the {encoding} encoding, "
                "which Tally does not accept from clients (its buffers do not bound its decoded "
                "size); send the column decoded")


def _refused_encoding(t: pa.DataType) -> str | None:
    for test, name in _REFUSED:
        if test(t):
            return name
    if pa.types.is_dictionary(t):
        return _refused_encoding(t.value_type)
    for i in range(t.num_fields):
        found = _refused_encoding(t.field(i).type)
        if found:
            return found
    return None


def without_views(table: pa.Table) -> pa.Table:
    """`table` with every string and binary view cast to its offset-based type, which servers
    accept: what a client does to user input before sending it. (List views are left to the
    server's refusal: pyarrow's cast of one to a list builds an invalid array.)"""
    schema = pa.schema([f.with_type(_offset_based(f.type)) for f in table.schema],
                       metadata=table.schema.metadata)
    return table if schema.equals(table.schema) else table.cast(schema)


def _offset_based(t: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_offset_based(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_offset_based(t.key_type)),
                       t.item_field.with_type(_offset_based(t.item_type)), t.keys_sorted)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        make = pa.list_ if pa.types.is_list(t) else pa.large_list
        return make(t.value_field.with_type(_offset_based(t.value_type)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_offset_based(t.value_type)), t.list_size)
    if pa.types.is_dictionary(t):
        return pa.dictionary(t.index_type, _offset_based(t.value_type), t.ordered)
    return t


def check_decoded_size(table: pa.Table, max_bytes: int, what: str) -> None:
    """InvalidInputError naming the column, its encoding and decoded size as soon as the
    table's decoded size passes `max_bytes`."""
    total = 0
    for field, column in zip(table.schema, table.columns):
        size = sum(decoded_bytes(chunk) for chunk in column.chunks)
        total += size
        if total > max_bytes:
            raise InvalidInputError(
                f"{what}: column '{field.name}' ({_encoding(field.type)}) decodes to "
                f"{size:,} bytes, bringing the request to {total:,} bytes decoded, past the "
                f"server's limit of {max_bytes:,} bytes; send smaller batches")


def _encoding(t: pa.DataType) -> str:
    if pa.types.is_dictionary(t):
        return f"dictionary-encoded {t.value_type}"
    return str(t)


def decoded_bytes(arr: pa.Array) -> int:
    """An upper bound of the bytes `arr` takes once every dictionary in it is decoded."""
    t = arr.type
    n = len(arr)
    if pa.types.is_dictionary(arr.type):
        return n * (4 + _widest(arr.dictionary)) + n // 8 + 1
    if pa.types.is_null(t):
        return n * _NULL_ROW_BYTES
    if t.num_fields == 0:
        return arr.nbytes
    own = n * 8 + n // 8 + 1  # offsets and validity, at most
    if pa.types.is_struct(t):
        return own + sum(decoded_bytes(arr.field(i)) for i in range(t.num_fields))
    if isinstance(arr, (pa.ListArray, pa.LargeListArray, pa.FixedSizeListArray, pa.MapArray)):
        return own + decoded_bytes(arr.values)
    if isinstance(arr, pa.UnionArray):
        return own + sum(decoded_bytes(arr.field(i)) for i in range(t.num_fields))
    return arr.get_total_buffer_size()


def _widest(dictionary: pa.Array) -> int:
    """The most bytes one of the dictionary's values takes decoded."""
    t = dictionary.type
    if len(dictionary) == 0:
        return 0
    if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) \
            or pa.types.is_large_string(t):
        widest = pc.max(pc.binary_length(dictionary)).as_py()
        return 4 + (widest or 0)
    if pa.types.is_boolean(t):
        return 1
    try:
        return t.byte_width
    except ValueError:  # nested values: the whole dictionary bounds any one of them
        return decoded_bytes(dictionary)
