"""Dropout with oneDNN's Philox 4x32-10 numbers: the generator of ``DropoutDesc`` and its
reference, bit for bit the same mask.

oneDNN (src/cpu/primitive_attr_postops.cpp ``ref_dropout``, src/gpu/intel/include/philox.h
``philox_4x32_s64``) draws one 32-bit word per element: element ``i`` takes word ``i & 3`` of
Philox4x32-10 on the counter ``(offset_lo, offset_hi, x_lo, x_hi)``, ``x = i & ~3``, with the key
``(seed_lo, seed_hi)``. An offset of 0 keeps oneDNN's legacy form, a 32-bit seed and index: the
counter ``(x, x+1, x+2, x+3)`` and the key ``(seed, seed)``. The element is kept when the word is
above ``p * (2**32 - 1)`` computed in double (the kernel rounds the integer product to
double's 53 bits itself: devices need no fp64), and scaled by the f32 ``1 / (1 - p)`` (0 when p is 1).

One work-item per element with index arithmetic, as the other elementwise kinds. The 32x32->64
products go through ``mul_hi`` and a plain product (OpenCL C 1.2, no 64-bit multiply needed).
"""

from __future__ import annotations

import math

import numpy as np

from .._values._dropout_desc import DropoutDesc
from . import _dtype_io, tolerance
from ._registry import register
from ._spec import KernelConfig, KernelSpec, index_code, padded_global

PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
_ROUNDS = 10
_U32 = 0xFFFFFFFF

_PHILOX_C = f"""
uint philox4x32_10(uint4 c, uint k0, uint k1, uint word) {{
    for (int r = 0; r < {_ROUNDS}; ++r) {{
        const uint hi0 = mul_hi({PHILOX_M[0]}u, c.x), lo0 = {PHILOX_M[0]}u * c.x;
        const uint hi1 = mul_hi({PHILOX_M[1]}u, c.z), lo1 = {PHILOX_M[1]}u * c.z;
        c = (uint4)(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
        k0 += {PHILOX_W[0]}u;
        k1 += {PHILOX_W[1]}u;
    }}
    return word == 0 ? c.x : (word == 1 ? c.y : (word == 2 ? c.z : c.w));
}}

"""

_THRESHOLD_C = """
/* floor of oneDNN's double p * (2**32 - 1) for p in (0, 1): p = m * 2**-shift with a 24-bit m,
   so the product m * (2**32 - 1) (up to 56 bits) is rounded to double's 53 bits (to nearest,
   ties to even) in integers, then shifted down. */
uint dropout_threshold(float p) {
    const uint bits = as_uint(p);
    const int biased = (int)((bits >> 23) & 0xffu);
    const ulong m = biased ? (ulong)((bits & 0x7fffffu) | 0x800000u) : (ulong)(bits & 0x7fffffu);
    const int shift = biased ? 150 - biased : 149;
    if (shift >= 64) return 0u;
    ulong prod = m * 4294967295UL;
    const int width = 64 - (int)clz(prod);
    if (width > 53) {
        const int d = width - 53;
        const ulong rem = prod & ((1UL << d) - 1UL), mid = 1UL << (d - 1);
        prod >>= d;
        if (rem > mid || (rem == mid && (prod & 1UL))) prod += 1UL;
        prod <<= d;
    }
    return (uint)(prod >> shift);
}
"""


def generate(desc: DropoutDesc, config: KernelConfig) -> KernelSpec:
    """OpenCL source computing ``dst`` (and ``mask`` when the descriptor has one)."""
    desc.check_supported()
    src_md, dst_md = desc.src, desc.dst
    dims = src_md.dims
    n = math.prod(dims)
    local = config.local_size
    strides = {"s": src_md.strides, "d": dst_md.strides}
    if desc.mask is not None:
        strides["m"] = desc.mask.strides
    offsets = index_code(dims, strides, "i")
    mask_param = ", __global uchar *mask" if desc.mask is not None else ""
    mask_store = "    mask[off_m] = keep;\n" if desc.mask is not None else ""
    source = (
        _dtype_io.functions(loads=(src_md.dtype,), stores=(dst_md.dtype,))
        + _PHILOX_C
        + _THRESHOLD_C
        + "__kernel void dropout("
        + f"{_dtype_io.param(src_md.dtype, 'src', const=True)}, __global const long *seed_in, "
        + "__global const long *offset_in, __global const float *p_in, "
        + f"{_dtype_io.param(dst_md.dtype, 'dst', const=False)}{mask_param}) {{\n"
        + f"    const ulong i = get_global_id(0);\n    if (i >= {n}UL) return;\n    {offsets}\n"
        + "    const ulong s = (ulong)seed_in[0], o = (ulong)offset_in[0];\n"
        + "    const float p = p_in[0];\n"
        + "    uint word;\n"
        + "    if (o != 0UL) {\n"
        + "        const ulong x = i & ~3UL;\n"
        + "        word = philox4x32_10((uint4)((uint)o, (uint)(o >> 32), (uint)x, (uint)(x >> 32)),\n"
        + "                             (uint)s, (uint)(s >> 32), (uint)(i & 3UL));\n"
        + "    } else {\n"
        + "        const uint x = (uint)i & ~3u;\n"
        + "        word = philox4x32_10((uint4)(x, x + 1u, x + 2u, x + 3u), (uint)s, (uint)s, (uint)(i & 3UL));\n"
        + "    }\n"
        # NaN fails every comparison in oneDNN's double test: nothing is kept.
        + "    uchar keep;\n"
        + "    if (isnan(p) || p >= 1.0f) keep = 0;\n"
        + "    else if (p <= 0.0f) keep = word > 0u;\n"
        + "    else keep = word > dropout_threshold(p);\n"
        + "    const float inv_q = p != 1.0f ? 1.0f / (1.0f - p) : 0.0f;\n"
        + f"    const float x = {_dtype_io.load(src_md.dtype, 'src', 'off_s')};\n"
        + "    const float y = keep ? x * inv_q : 0.0f;\n"
        + f"    {_dtype_io.store(dst_md.dtype, 'dst', 'off_d', 'y')}\n"
        + mask_store
        + "}\n"
    )
    arg_names = ("src", "seed", "offset", "probability", "dst") + (("mask",) if desc.mask is not None else ())
    return KernelSpec(
        source=source,
        name="dropout",
        arg_names=arg_names,
        global_size=(padded_global(n, local),),
        local_size=(local,),
        impl=f"ocl:philox:l{local}",
    )


# -- numpy ----------------------------------------------------------------------------------


def philox4x32_10(counter: tuple, key: tuple) -> tuple[np.ndarray, ...]:
    """Philox4x32-10 (Salmon et al. 2011, as oneDNN and Random123 compute it) on arrays of
    uint32 counter words ``(c0, c1, c2, c3)`` and key words ``(k0, k1)``: the four output words."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & _U32 for c in counter)
    k0, k1 = (np.asarray(k, dtype=np.uint64) & _U32 for k in key)
    m0, m1 = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1])
    w0, w1 = np.uint64(PHILOX_W[0]), np.uint64(PHILOX_W[1])
    mask, shift = np.uint64(_U32), np.uint64(32)
    for _ in range(_ROUNDS):
        p0, p1 = c0 * m0, c2 * m1  # < 2**64: exact in uint64
        c0, c1, c2, c3 = ((p1 >> shift) ^ c1 ^ k0, p1 & mask, (p0 >> shift) ^ c3 ^ k1, p0 & mask)
        k0, k1 = (k0 + w0) & mask, (k1 + w1) & mask
    return tuple(c.astype(np.uint32) for c in (c0, c1, c2, c3))


def philox_words(indices: np.ndarray, seed: int, offset: int) -> np.ndarray:
    """oneDNN's dropout word (uint32) for each element index, from the s64 ``seed``/``offset``
    (legacy 32-bit form when ``offset`` is 0, as in the module docstring)."""
    i = np.asarray(indices, dtype=np.uint64)
    s, o = int(seed) & (2**64 - 1), int(offset) & (2**64 - 1)
    if o:
        x = i & ~np.uint64(3)
        counter = (np.full_like(i, o & _U32), np.full_like(i, o >> 32), x & np.uint64(_U32), x >> np.uint64(32))
        key = (s & _U32, s >> 32)
    else:
        x = (i & np.uint64(_U32)) & ~np.uint64(3)
        c0, c1, c2, c3 = ((x + np.uint64(k)) & np.uint64(_U32) for k in range(4))
        counter = (c0, c1, c2, c3)
        key = (s & _U32, s & _U32)
    words = np.stack(philox4x32_10(counter, key))
    return np.take_along_axis(words, (i & np.uint64(3)).astype(np.intp)[None], axis=0)[0]


def keep_mask(shape, seed: int, offset: int, probability: float) -> np.ndarray:
    """The u8 mask (1 kept) oneDNN draws for a tensor of ``shape``, elements in row-major order."""
    n = math.prod(shape)
    words = philox_words(np.arange(n, dtype=np.uint64), seed, offset)
    p = float(np.float32(probability))
    if math.isnan(p) or p >= 1.0:
        return np.zeros(shape, np.uint8)  # NaN fails oneDNN's comparison; p = 1 drops all
    # oneDNN compares with the double p * (2**32 - 1) (rounded: up to 56 bits); the words are
    # integers, so its floor decides the same.
    threshold = math.floor(max(p, 0.0) * float(2**32 - 1))
    return (words.astype(np.uint64) > np.uint64(threshold)).astype(np.uint8).reshape(shape)


def inverse_keep(probability: float) -> float:
    """oneDNN's f32 ``1 / (1 - p)`` (0 when p is 1), as float64."""
    p = np.float32(probability)
    if p == np.float32(1.0):
        return 0.0
    with np.errstate(all="ignore"):
        return float(np.float32(1.0) / (np.float32(1.0) - p))


def reference(src: np.ndarray, seed: int, offset: int, probability: float, *,
              dst_dtype: str = "f32") -> tuple[np.ndarray, np.ndarray]:
    """``(dst, mask)``: dst in float64 from user-facing ``src``, stored as ``dst_dtype``, and
    the u8 mask."""
    x = _dtype_io.widen(src)
    mask = keep_mask(x.shape, seed, offset, probability)
    dst = np.where(mask.astype(bool), x * inverse_keep(probability), 0.0)
    return _dtype_io.store_reference(dst, dst_dtype), mask


def _scalar(value) -> np.ndarray:
    return np.asarray(value).reshape(-1)[0]


def desc_reference(desc: DropoutDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    dst, _ = reference(inputs["src"], int(_scalar(inputs["seed"])), int(_scalar(inputs["offset"])),
                       float(_scalar(inputs["probability"])), dst_dtype=desc.dst.dtype)
    return dst


register(DropoutDesc, generate=generate, reference=desc_reference, tolerance=lambda desc: tolerance.ELTWISE)
