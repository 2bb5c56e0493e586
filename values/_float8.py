"""oneDNN's 8-bit floats, f8_e4m3 and f8_e5m2, as numpy bit patterns (one ``uint8`` a value).

The encoding is oneDNN's ``convert_fp32_to_fp8e{4m3,5m2}_RNE`` (src/common/float8.cpp), its
non-saturating form, the one ``operator=(float)`` uses:

* one rounding, to nearest even, straight from f32 (no detour through f16);
* f32 subnormal inputs read as zero (DAZ), keeping their sign; f8 subnormals are produced (no FTZ);
* f8_e4m3 (bias 7, no infinity, S.1111.111 is NaN, largest 448): a magnitude rounding above 448
  (above 464, the tie at 464 goes to 448), an infinity or a NaN becomes NaN, sign kept;
* f8_e5m2 (bias 15, IEEE-like: the top byte of an f16): a magnitude rounding above 57344 (from
  61440, the tie going to the odd code's neighbour, infinity) becomes infinity; a NaN stays NaN
  with the quiet bit set and the sign kept.

Decoding is exact (every f8 value is an f32). The kernels' OpenCL C (``kernels._dtype_io``)
runs the same bit arithmetic, so host copies and device stores agree bit for bit.
"""

from __future__ import annotations

import attrs
import numpy as np


@attrs.frozen
class Float8Format:
    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max_code: int  # largest finite magnitude's code
    overflow_code: int  # what a too-large magnitude becomes (NaN for e4m3, infinity for e5m2)


FORMATS: dict[str, Float8Format] = {
    "f8_e4m3": Float8Format("f8_e4m3", 4, 3, 7, 0x7E, 0x7F),
    "f8_e5m2": Float8Format("f8_e5m2", 5, 2, 15, 0x7B, 0x7C),
}


def encode(values, dtype: str) -> np.ndarray:
    """f32 ``values`` (anything numpy converts to float32 first) as ``dtype`` codes."""
    fmt = FORMATS[dtype]
    x = np.ascontiguousarray(values, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)  # room for the rounding carry
    sign = ((bits >> 31) << 7).astype(np.uint64)
    a = bits & 0x7FFFFFFF
    exp32 = a >> 23
    m = fmt.mantissa_bits
    shift = 23 - m
    rebias = 127 - fmt.bias
    # Normal f8 range: round the f32 bits to nearest even on the dropped mantissa bits; the carry
    # may step into the exponent, which is what rounding up a binade's last value means.
    rounded = (a + ((1 << (shift - 1)) - 1) + ((a >> shift) & 1)) >> shift
    normal = rounded.astype(np.int64) - (rebias << m)
    # Subnormal f8 range: |x| * 2**(bias + m - 1) is exact (a power-of-two scaling of a normal f32
    # into [0, 2**m]); np.rint rounds half to even, and 2**m lands on the smallest normal's code.
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = np.abs(x.astype(np.float64)) * 2.0 ** (fmt.bias + m - 1)
        sub = np.rint(np.where(exp32 <= rebias, scaled, 0.0)).astype(np.int64)
    code = np.where(exp32 <= rebias, sub, normal)
    code = np.where(code > fmt.max_code, fmt.overflow_code, code)
    code = np.where(exp32 == 0, 0, code)  # DAZ: f32 zeros and subnormals give a signed zero
    nan = (exp32 == 0xFF) & ((a & 0x7FFFFF) != 0)
    if dtype == "f8_e4m3":
        nan_code = np.full(a.shape, 0x7F, np.int64)
    else:  # e5m2 keeps the top mantissa bits, quiet bit set
        nan_code = (0x7C | ((((a & 0x7FFFFF) | 0x400000) >> 21) & 3)).astype(np.int64)
    code = np.where(nan, nan_code, code)
    return (code.astype(np.uint64) | sign).astype(np.uint8).reshape(x.shape)


def _decode_table(dtype: str) -> np.ndarray:
    fmt = FORMATS[dtype]
    m = fmt.mantissa_bits
    table = np.empty(256, np.float32)
    for code in range(256):
        magnitude = code & 0x7F
        e, f = magnitude >> m, magnitude & ((1 << m) - 1)
        if dtype == "f8_e4m3" and magnitude == 0x7F:
            value = np.nan
        elif dtype == "f8_e5m2" and e == 0x1F:
            value = np.inf if f == 0 else np.nan
        elif e == 0:
            value = f * 2.0 ** (1 - fmt.bias - m)
        else:
            value = (1 + f / (1 << m)) * 2.0 ** (e - fmt.bias)
        table[code] = -value if code & 0x80 else value
    return table


_TABLES = {name: _decode_table(name) for name in FORMATS}


def decode(codes, dtype: str) -> np.ndarray:
    """``dtype`` codes (uint8) as float32 values (exact)."""
    return _TABLES[dtype][np.asarray(codes, dtype=np.uint8)]
