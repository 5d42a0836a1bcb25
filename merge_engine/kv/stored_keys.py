"""StoredKeys: which keys a bucket's RocksDB may hold under its row prefix, answered in memory.

Why: a put starts a key from an empty row only once it has proven the key absent. Asked of
RocksDB (a multi-get), that proof costs 0.35-0.4 us per key in the binding alone (a bytes object
per key, a list of answers), against an empty database too: a sixth of a put of new keys. A bloom
filter over the stored keys, computed with numpy from the keys' numpy form, answers "not stored"
for nearly every new key at ~25 ns per key; the keys it may hold are asked of RocksDB as before.

Correctness rests on one invariant: the filter holds a SUPERSET of the row keys stored in
RocksDB. A key is added before the write batch that stores it is committed (BucketRows writes
every row through one method); deleted keys stay in, which a superset allows; a filter made
for a bucket that already holds rows starts from a scan of them (`scan`). A key wrongly
answered "not stored" would restart its row (a sum from zero), so nothing else may write rows.

The filter is a blocked bloom filter: each key sets BITS bits in one 64-bit word, so a query
reads one word per key. A layer of 2**j words holds up to CAPACITY_BITS bits per key, where
its false positives stay near 0.5% (measured: 0.4-0.5% for random keys, five bits a key, 16
bits of words per key). A full layer is never rebuilt (its keys are not at hand): the next one
holds at least twice the keys of all before it, so a bucket of n keys has about log2(n/65536)
layers and a query's false positives stay below 0.5% per layer. Memory: 2 bytes per key in a
full layer; a new layer (twice the keys before it, rounded up to a power of two of words) makes
that up to about 10 bytes per key held until it fills.
"""

from __future__ import annotations

import itertools
from typing import Iterable

import numpy as np

from merge_engine.write.keys import KeyArray

BITS = 5  # bits a key sets in its word
CAPACITY_BITS = 16  # bits of a layer per key it holds
MIN_CAPACITY = 65536  # keys of the first layer
SCAN_CHUNK = 65536  # stored keys hashed at a time by a scan

_GOLDEN = 0x9E3779B97F4A7C15  # a chunk's salt is its position (from 1) times this, mod 2**64
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_ONE = np.uint64(1)
_SIX_BITS = np.uint64(63)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every bit of the result depends on every bit of `z`."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def key_hashes(keys: KeyArray) -> np.ndarray:
    """A uint64 hash per key, the same for a key in any of KeyArray's forms: its bytes, zero
    padded, taken as big-endian 8-byte chunks; all-zero chunks count for nothing, so the padding
    of variable-width keys (to the longest key of their array) leaves the hash as it is."""
    search = keys.search
    if search.dtype == np.uint64:  # fixed width up to 8 bytes: the one chunk itself
        chunks = search.reshape(-1, 1)
    else:
        n, width = len(search), search.dtype.itemsize
        padded = -(-width // 8) * 8
        raw = np.zeros((n, padded), dtype=np.uint8)
        raw[:, :width] = np.ascontiguousarray(search).view(np.uint8).reshape(n, width)
        chunks = raw.view(">u8").astype(np.uint64)
    total = np.zeros(len(chunks), dtype=np.uint64)
    for i in range(chunks.shape[1]):
        chunk = chunks[:, i]
        part = _mix(chunk + np.uint64(_GOLDEN * (i + 1) % (1 << 64)))
        part[chunk == 0] = 0
        total += part
    return _mix(total)


def _masks(hashes: np.ndarray) -> np.ndarray:
    """The BITS bits each key sets in its word, from the hash's low bits (its high bits pick
    the word)."""
    mask = np.zeros(len(hashes), dtype=np.uint64)
    for i in range(BITS):
        mask |= _ONE << ((hashes >> np.uint64(6 * i)) & _SIX_BITS)
    return mask


class _Layer:
    __slots__ = ("words", "shift", "capacity", "count")

    def __init__(self, capacity: int):
        words = 1 << max(int(np.ceil(np.log2(capacity * CAPACITY_BITS / 64))), 0)
        self.words = np.zeros(words, dtype=np.uint64)
        self.shift = np.uint64(64 - int(np.log2(words)))  # the hash's top bits pick the word
        self.capacity = words * 64 // CAPACITY_BITS
        self.count = 0

    def holds(self, hashes: np.ndarray, masks: np.ndarray) -> np.ndarray:
        found = self.words[(hashes >> self.shift).astype(np.intp)]
        return (found & masks) == masks

    def add(self, hashes: np.ndarray, masks: np.ndarray) -> None:
        np.bitwise_or.at(self.words, (hashes >> self.shift).astype(np.intp), masks)
        self.count += len(hashes)


class StoredKeys:
    """A superset of the keys a bucket stores: `may_hold` False means the key is not stored."""

    min_capacity = MIN_CAPACITY  # keys of the first layer (tests make it small)

    def __init__(self) -> None:
        self._layers: list[_Layer] = []
        self.removed = 0  # keys deleted from RocksDB since the filter was made (stale entries)

    def __len__(self) -> int:
        """Keys added (each once, less the few a false positive kept out)."""
        return sum(layer.count for layer in self._layers)

    @property
    def nbytes(self) -> int:
        return sum(layer.words.nbytes for layer in self._layers)

    def may_hold(self, keys: KeyArray) -> np.ndarray:
        """Per key, False where it is certainly not stored."""
        if not self._layers or not len(keys):
            return np.zeros(len(keys), dtype=bool)
        hashes = key_hashes(keys)
        return self._holds(hashes, _masks(hashes))

    def _holds(self, hashes: np.ndarray, masks: np.ndarray) -> np.ndarray:
        held = self._layers[0].holds(hashes, masks)
        for layer in self._layers[1:]:
            held |= layer.holds(hashes, masks)
        return held

    def add(self, keys: KeyArray) -> None:
        """Hold `keys` from now on (call before they are written). Keys it holds already are
        not counted again: a hot key set flushed over and over does not grow the filter."""
        if len(keys):
            self._add_hashes(key_hashes(keys))

    def _add_hashes(self, hashes: np.ndarray) -> None:
        masks = _masks(hashes)
        if self._layers:
            new = ~self._holds(hashes, masks)
            hashes, masks = hashes[new], masks[new]
        if not len(hashes):
            return
        last = self._layers[-1] if self._layers else None
        if last is None or last.count + len(hashes) > last.capacity:
            held = sum(layer.capacity for layer in self._layers)
            last = _Layer(max(2 * held, len(hashes), self.min_capacity))
            self._layers.append(last)
        last.add(hashes, masks)

    @classmethod
    def of_stored(cls, row_keys: Iterable[bytes], prefix: bytes,
                  expected: int = 0) -> "StoredKeys":
        """A filter of the stored row keys `row_keys` (each `prefix` and an encoded key),
        hashed a chunk at a time, never a Python step per key. `expected` (about how many
        there are) sizes its first layer: one layer instead of a doubling series (2 bytes per
        key instead of ~6 for 1M keys, a third of the false positives)."""
        stored = cls()
        if expected:
            stored._layers.append(_Layer(max(expected, cls.min_capacity)))
        keys = iter(row_keys)
        while chunk := list(itertools.islice(keys, SCAN_CHUNK)):
            # One 'S' array of the row keys, the prefix's columns cut off: the encoded keys
            # zero padded to the longest, which key_hashes hashes as it hashes any KeyArray.
            padded = np.array(chunk, dtype=bytes)
            width = padded.dtype.itemsize - len(prefix)
            raw = padded.view(np.uint8).reshape(len(chunk), -1)[:, len(prefix):]
            encoded = np.ascontiguousarray(raw).view(f"S{max(width, 1)}").ravel() if width \
                else np.zeros(len(chunk), dtype="S1")
            stored._add_hashes(key_hashes(KeyArray(encoded, None)))
        return stored

    def __repr__(self) -> str:
        return (f"StoredKeys({len(self)} keys, {len(self._layers)} layers, "
                f"{self.nbytes} bytes, {self.removed} removed since)")
