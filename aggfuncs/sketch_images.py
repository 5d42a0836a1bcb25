"""The byte layouts of Apache DataSketches images, and their canonical forms.

DataSketches merges sketches (the `datasketches` package does all of it here); what it leaves
to the order of merges is only *layout*: an HLL union's coupon list and set, and the exceptions
of an HLL_4 array, come out in insertion order, and an HLL array built in order keeps its HIP
accumulator where a union result has none; a KLL sketch's level 0 is unsorted. Two cells with
the same content would then hold different bytes, so a write that adds nothing would still show
a change in the changelog, and the same writes in another grouping would store other bytes.
Tally stores every merged image in a canonical form: coupons and exceptions sorted, HLL arrays
marked out of order with no HIP accumulator (exactly what a DataSketches union does to them), an
exact-mode KLL sketch's items sorted. Readers of any DataSketches language read these images as
they read any other: the fields changed are ones the format leaves free.
"""

from __future__ import annotations

import struct

# HLL preamble (the DataSketches HLL serialization format).
_HLL_FLAGS, _HLL_MODE, _HLL_OUT_OF_ORDER = 5, 7, 0x10
_HLL_HIP = slice(8, 16)
_LIST, _SET, _HLL = 0, 1, 2
_HLL_4 = 0

# KLL preamble: full images have 5 preamble ints, empty and single-item ones 2.
_KLL_FULL_PREAMBLE_INTS = 5
_KLL_LEVELS = 18
_KLL_N = slice(8, 16)


def _sorted_words(data: bytearray, start: int) -> None:
    """Sort the little-endian uint32 words of data[start:] in place."""
    body = bytes(data[start:])
    count = len(body) // 4
    words = sorted(struct.unpack(f"<{count}I", body[:count * 4]))
    data[start:start + count * 4] = struct.pack(f"<{count}I", *words)


def canonical_hll(image: bytes) -> bytes:
    """A compact HLL image in its canonical form (same sketch content, same bytes)."""
    data = bytearray(image)
    preamble = data[0] * 4
    mode = data[_HLL_MODE] & 0x3
    if mode in (_LIST, _SET):
        _sorted_words(data, preamble)
    elif mode == _HLL:
        data[_HLL_FLAGS] |= _HLL_OUT_OF_ORDER
        data[_HLL_HIP] = bytes(8)
        if (data[_HLL_MODE] >> 2) & 0x3 == _HLL_4:
            lg_k = data[3]
            _sorted_words(data, preamble + (1 << lg_k) // 2)
    return bytes(data)


def canonical_kll(image: bytes, item_format: str) -> bytes:
    """A KLL image with an exact-mode sketch's items sorted (one level, n items retained).

    `item_format` is the struct code of one item ('d', 'f' or 'q'). Estimation-mode images are
    left as they are: their compactions draw random bits, so no order of merges reproduces them
    anyway (KLL merges are equal in distribution, not in bytes).
    """
    if not image or image[0] != _KLL_FULL_PREAMBLE_INTS:
        return image
    data = bytearray(image)
    n = struct.unpack("<Q", bytes(data[_KLL_N]))[0]
    size = struct.calcsize(item_format)
    if data[_KLL_LEVELS] != 1 or len(data) < n * size:
        return image
    start = len(data) - n * size
    items = sorted(struct.unpack(f"<{n}{item_format}", bytes(data[start:])))
    data[start:] = struct.pack(f"<{n}{item_format}", *items)
    return bytes(data)


# Frequent-items preamble: 1 long when empty, else 4 (lg sizes and flags, active items, total
# weight, offset), then the active items' counts (int64 each), then the items (int32 length,
# UTF-8 bytes each), both in the order of the sketch's hash map slots.
_FREQUENT_PREAMBLE_BYTES = 32


def canonical_frequent_items(image: bytes) -> bytes:
    """A frequent-strings image with its active items (and their counts) sorted by item: the
    slot order of the sketch's hash map follows the order items arrived in."""
    if not image or image[0] & 0x3F == 1:
        return image
    count = struct.unpack_from("<I", image, 8)[0]
    counts = struct.unpack_from(f"<{count}q", image, _FREQUENT_PREAMBLE_BYTES)
    items, at = [], _FREQUENT_PREAMBLE_BYTES + 8 * count
    for _ in range(count):
        length = struct.unpack_from("<I", image, at)[0]
        items.append(image[at:at + 4 + length])
        at += 4 + length
    pairs = sorted(zip(items, counts), key=lambda pair: pair[0][4:])
    body = struct.pack(f"<{count}q", *(c for _, c in pairs)) + b"".join(i for i, _ in pairs)
    return image[:_FREQUENT_PREAMBLE_BYTES] + body + image[at:]
