"""sum_map: map<K, V> columns with numeric V; per map key the values written are summed.

A write's map adds each entry `k -> v` to the cell's sum for k (duplicate keys in one map add
up too); an entry whose value is null adds nothing. Keys are kept sorted as merge_map keeps
them (Arrow's order), so a cell does not depend on the order its keys arrived in.

A key whose sum comes to zero leaves the map (as ClickHouse's sumMap does), and a map left
without entries is the empty state, null. Why not keep a per-key count: the cell then is a
function of the contributions alone (the sum per key, zeros dropped), so a retraction is exact
without hidden state, `{a: 5}` retracted leaves the cell as if never written, and a reader
never sees `a -> 0` entries that mean nothing. The price: `{a: 0}` leaves no trace.

Sums follow sum's rules per key: integers and decimals are exact, every running sum of a key
must fit V (else the write is refused as an overflow), floats fold left to right in V's
precision. Retraction (-U/-D) subtracts each entry of the retracted map. Cells are bounded by
`max-elements` (entries) and `max-cell-bytes` (their keys' and values' bytes), as merge_map's.
"""

from __future__ import annotations

import decimal

import numpy as np
import pyarrow as pa

from aggfuncs.base import Aggregator, valid_mask
from aggfuncs.cell_limits import (DEFAULT_MAX_CELL_BYTES, MAX_CELL_BYTES, MAX_ELEMENTS,
                                  map_cell_sizes, parse_cell_bytes, parse_elements, refuse_over)
from aggfuncs.merge_map import _entries, _sortable_key
from aggfuncs.numeric import check_result, each_contribution_breaks, is_numeric
from aggfuncs.segments import Segments
from aggfuncs.functions import AggFunction

_EXACT = decimal.Context(prec=80)


def _accepts(arrow_type: pa.DataType) -> bool:
    return pa.types.is_map(arrow_type) and _sortable_key(arrow_type.key_type) and \
        is_numeric(arrow_type.item_type)


class SumMapAggregator(Aggregator):
    function = AggFunction.SUM_MAP
    type_names = ("map<K, V> with K an integer, string, binary, date, timestamp, decimal or "
                  "bool and V an integer, float or decimal")
    parameters = {MAX_CELL_BYTES: parse_cell_bytes, MAX_ELEMENTS: parse_elements}
    defaults = {MAX_CELL_BYTES: DEFAULT_MAX_CELL_BYTES, MAX_ELEMENTS: 0}
    accepts = staticmethod(_accepts)
    retractable = True

    # --- folding ----------------------------------------------------------------------------

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        """Per group, each key's values summed in order; zero sums dropped, keys sorted."""
        keep = written & valid_mask(states)
        maps = states.to_pylist()
        out: list = [None] * segments.count
        for g in np.nonzero(segments.any(keep))[0]:
            rows = segments.order[segments.starts[g]:segments.starts[g] + segments.lengths[g]]
            acc: dict = {}
            for i in rows:
                if keep[i]:
                    acc = self.step(acc, maps[i], 1)
            out[g] = self.finish(acc)
        return pa.array(out, type=self.type)

    def overwrite(self, values: pa.Array) -> pa.Array:
        """Each map alone: duplicate keys summed, zero sums dropped, keys sorted."""
        n = len(values)
        return self.fold(values, np.ones(n, dtype=bool), Segments(np.arange(n), n))

    def run_breaks(self, states: pa.Array, runs: Segments) -> np.ndarray | None:
        # Each key's running sums must be judged step by step (and floats fold left to
        # right), so no two contributions are pre-folded together.
        return each_contribution_breaks(states)

    # --- retraction -------------------------------------------------------------------------

    def step(self, acc, value, sign):
        """A dict of key -> sum after one map is added (sign 1) or taken back (sign -1)."""
        held = dict(acc or {})
        kind = self.type.item_type
        for key, item in value or ():
            if item is None:
                continue
            if pa.types.is_floating(kind):
                total = held.get(key, 0.0) + sign * item
                if kind.bit_width == 32:
                    with np.errstate(over="ignore"):  # IEEE: beyond float32 is infinity
                        total = float(np.float32(total))
            elif pa.types.is_decimal(kind):
                with decimal.localcontext(_EXACT):  # the range check must not round either
                    total = _EXACT.add(held.get(key, decimal.Decimal(0)), sign * item)
                    check_result(total, kind, f"sum_map column '{self.column}' (key {key!r})")
            else:
                total = held.get(key, 0) + sign * item
                check_result(total, kind, f"sum_map column '{self.column}' (key {key!r})")
            held[key] = total
        return {k: v for k, v in held.items() if v != 0}

    def finish(self, acc):
        return sorted(acc.items(), key=lambda entry: entry[0]) if acc else None

    # --- bounds -----------------------------------------------------------------------------

    def check_cells(self, states: pa.Array) -> None:
        """Each cell within max-cell-bytes (its keys' and values' bytes) and max-elements."""
        byte_limit, count_limit = self.params[MAX_CELL_BYTES], self.params[MAX_ELEMENTS]
        if not len(states) or (not byte_limit or states.nbytes <= byte_limit) and not count_limit:
            return
        counts, sizes = map_cell_sizes(*_entries(states))
        refuse_over(self.column, self.name, counts, count_limit, "entries", MAX_ELEMENTS)
        refuse_over(self.column, self.name, sizes, byte_limit, "bytes", MAX_CELL_BYTES)
