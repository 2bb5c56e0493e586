"""oneDNN's 4-bit integers, s4 and u4, packed two to a byte, the even element in the low nibble
(oneDNN's src/common/int4.hpp: element ``i`` is byte ``i // 2``, bits ``4 * (i % 2)`` up).

On the host their values are int8 (s4, [-8, 7]) and uint8 (u4, [0, 15]) arrays, one a value; only
the device buffer and the staging copy next to it hold nibbles. A buffer of packed elements is
rounded up to whole 32-bit words: kernels store a nibble with ``atomic_and``/``atomic_or`` on
its word (two work-items writing the two nibbles of one byte must not lose either), and those
touch all four bytes of the word.
"""

from __future__ import annotations

import numpy as np

PACKED: dict[str, tuple[int, int]] = {"s4": (-8, 7), "u4": (0, 15)}  # the types, their ranges


def packed_nbytes(span: int) -> int:
    """Bytes a buffer of ``span`` packed elements needs: whole 32-bit words (module docstring)."""
    return (span + 7) // 8 * 4


def pack(values: np.ndarray, nbytes: int) -> np.ndarray:
    """Flat int8/uint8 ``values`` (each in its type's range) as ``nbytes`` packed bytes."""
    nibbles = np.zeros(nbytes * 2, np.uint8)
    nibbles[: values.size] = np.asarray(values).reshape(-1).view(np.uint8) & 0x0F
    return (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)


def unpack(packed: np.ndarray, count: int, dtype: str) -> np.ndarray:
    """The first ``count`` elements of packed bytes as int8 (s4, sign-extended) or uint8 (u4)."""
    packed = np.asarray(packed, np.uint8).reshape(-1)
    nibbles = np.empty(packed.size * 2, np.uint8)
    nibbles[0::2], nibbles[1::2] = packed & 0x0F, packed >> 4
    nibbles = nibbles[:count]
    if dtype == "s4":
        return ((nibbles.astype(np.int16) ^ 8) - 8).astype(np.int8)
    return nibbles
