"""merge_map: map<K, V> columns; per map key the last written value wins, a null value deletes.

A write's map is applied entry by entry in order: `k -> v` sets k to v, `k -> null` removes k.
A cell's keys are kept sorted by key (Arrow's sort order: numbers by value, strings by code
point, binaries by bytes), so the cell does not depend on the order its keys arrived in.

Deletions must survive pre-aggregation: the fold of `{a: 1}` then `{a: null}` is not "no
entry for a", which would leave a stored `a` alone, but a *tombstone* `a -> null` that removes
it. Folded states therefore keep tombstones; only what a cell stores is settled (`settle`):
tombstones dropped, and a map left without entries is the empty state, null.

Retraction (a -U/-D row) takes back each entry `k -> v` of the retracted map whose key still
holds that same v: a key overwritten since keeps its newer value; a null value (a deletion)
cannot be taken back and does nothing.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs.base import Aggregator, valid_mask
from aggfuncs.cell_limits import (DEFAULT_MAX_CELL_BYTES, MAX_CELL_BYTES, MAX_ELEMENTS,
                                  map_cell_sizes, parse_cell_bytes, parse_elements, refuse_over)
from aggfuncs.functions import AggFunction
from aggfuncs.segments import Segments


def _sortable_key(arrow_type: pa.DataType) -> bool:
    """Key types with an exact total order (no floats: NaN and -0.0 have no agreed place)."""
    t = pa.types
    return (t.is_integer(arrow_type) or t.is_string(arrow_type) or t.is_large_string(arrow_type)
            or t.is_binary(arrow_type) or t.is_large_binary(arrow_type) or t.is_date(arrow_type)
            or t.is_timestamp(arrow_type) or t.is_decimal(arrow_type) or t.is_boolean(arrow_type))


def _accepts(arrow_type: pa.DataType) -> bool:
    return pa.types.is_map(arrow_type) and _sortable_key(arrow_type.key_type)


def entries_view(maps: pa.Array) -> pa.Array:
    """The maps as list<struct<key, value>>: the form Arrow's list kernels take."""
    kind = maps.type
    return maps.cast(pa.list_(pa.struct([kind.key_field, kind.item_field])))


def _entries(maps: pa.Array) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """(entries per map, keys, values) of the maps' entries in order (a null map has none)."""
    view = entries_view(maps)
    sizes = pc.fill_null(pc.list_value_length(view), 0).to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(view)
    return sizes.astype(np.int64), flat.field(0), flat.field(1)


def build_maps(map_type: pa.DataType, sizes: np.ndarray, keys: pa.Array,
               values: pa.Array) -> pa.Array:
    """Maps of `map_type` holding the entries in order, `sizes[i]` each; no entries is a null."""
    offsets = pa.array(np.concatenate([[0], np.cumsum(sizes)]), type=pa.int32())
    return pa.MapArray.from_arrays(offsets, keys.cast(map_type.key_type),
                                   values.cast(map_type.item_type), type=map_type,
                                   mask=pa.array(sizes == 0))


class MergeMapAggregator(Aggregator):
    function = AggFunction.MERGE_MAP
    type_names = "map<K, V> with K an integer, string, binary, date, timestamp, decimal or bool"
    parameters = {MAX_CELL_BYTES: parse_cell_bytes, MAX_ELEMENTS: parse_elements}
    defaults = {MAX_CELL_BYTES: DEFAULT_MAX_CELL_BYTES, MAX_ELEMENTS: 0}
    accepts = staticmethod(_accepts)
    retractable = True

    # --- folding ----------------------------------------------------------------------------

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        """Per group, each key's last entry (tombstones included), keys sorted."""
        keep = written & valid_mask(states)
        sub = segments.filtered(keep)
        ordered = states.filter(pa.array(keep)).take(pa.array(sub.order, type=pa.int64()))
        sizes, keys, values = _entries(ordered)
        owner = np.repeat(sub.sorted_ids, sizes)
        if len(keys):
            codes = keys.dictionary_encode().indices.to_numpy(zero_copy_only=False)
            combined = owner * (int(codes.max()) + 1) + codes.astype(np.int64)
            # The last occurrence of each (group, key): the first one in reverse.
            _, first_reversed = np.unique(combined[::-1], return_index=True)
            last = len(combined) - 1 - first_reversed
            picked = pa.table({"g": owner[last], "k": keys.take(pa.array(last))})
            order = pc.sort_indices(picked, sort_keys=[("g", "ascending"), ("k", "ascending")])
            chosen = pa.array(last).take(order)
            keys, values = keys.take(chosen), values.take(chosen)
            owner = owner[chosen.to_numpy()]
        counts = np.bincount(owner, minlength=sub.count).astype(np.int64)
        return build_maps(self.type, counts, keys, values)

    def settle(self, states: pa.Array) -> pa.Array:
        """What a cell stores: tombstones dropped; a map without entries is null."""
        sizes, keys, values = _entries(states)
        live = valid_mask(values)
        if live.all() and (sizes > 0).all():
            return states
        owner = np.repeat(np.arange(len(states)), sizes)
        mask = pa.array(live)
        counts = np.bincount(owner[live], minlength=len(states)).astype(np.int64)
        return build_maps(self.type, counts, keys.filter(mask), values.filter(mask))

    def overwrite(self, values: pa.Array) -> pa.Array:
        """Each map alone, duplicate keys resolved (last wins) and sorted, tombstones dropped."""
        n = len(values)
        return self.settle(self.fold(values, np.ones(n, dtype=bool), Segments(np.arange(n), n)))

    # --- retraction -------------------------------------------------------------------------

    def step(self, acc, value, sign):
        """A dict of key -> value (None: a tombstone) after one contribution or retraction."""
        held = dict(acc or {})
        for key, item in value or ():
            if sign > 0:
                held[key] = item
            elif item is not None and key in held and held[key] == item:
                del held[key]
        return held

    def finish(self, acc):
        return sorted(acc.items(), key=lambda entry: entry[0]) if acc else None

    # --- bounds -----------------------------------------------------------------------------

    def check_cells(self, states: pa.Array) -> None:
        """Each cell within max-cell-bytes (its keys' and values' bytes) and max-elements
        (its entries)."""
        byte_limit, count_limit = self.params[MAX_CELL_BYTES], self.params[MAX_ELEMENTS]
        if not len(states) or (not byte_limit or states.nbytes <= byte_limit) and not count_limit:
            return
        counts, sizes = map_cell_sizes(*_entries(states))
        refuse_over(self.column, self.name, counts, count_limit, "entries", MAX_ELEMENTS)
        refuse_over(self.column, self.name, sizes, byte_limit, "bytes", MAX_CELL_BYTES)
