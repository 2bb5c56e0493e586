"""Reorder: ``dst = convert(src)`` elementwise between any two layouts and data types.

Every value goes through f32: the source is widened to float (exact for f16, bf16, s8 and u8;
s32 magnitudes above 2**24 round to nearest even there, as in oneDNN's reorders), then narrowed
to the destination type:

* f16: ``vstore_half_rte`` (a core built-in, no cl_khr_fp16 needed): round to nearest even,
  overflow to inf, NaN kept NaN.
* bf16: round to nearest even on the 16 dropped bits, NaN kept NaN with the quiet bit set:
  bit for bit what ``triodnn._dtypes.to_storage`` does.
* s32, s8, u8: round to nearest even, saturate to the type's range, NaN -> 0. This is
  OpenCL C's ``convert_<type>_sat_rte`` (the spec maps NaN to 0), which oneDNN's OpenCL kernels
  use for integer destinations; it is written out by hand because PoCL keeps the built-in as a
  call.

A source and destination of one data type copy the stored bits without any conversion (s32 stays
exact, NaN payloads survive). Dense tensors of one data type and one layout take the ``copy``
path: a flat copy, ``vector_width`` elements per work-item. Everything else runs one element per
work-item, the offsets found by index arithmetic.
"""

from __future__ import annotations

import math

import numpy as np

from ._spec import KernelConfig, KernelSpec, c_float, index_code, is_dense, padded_global

DTYPES: tuple[str, ...] = ("f32", "f16", "bf16", "s32", "s8", "u8")

# OpenCL storage type of each data type. f16 is addressed as half only through vload_half /
# vstore_half (legal without cl_khr_fp16); a plain copy moves it as ushort bits.
_STORAGE = {"f32": "float", "f16": "half", "bf16": "ushort", "s32": "int", "s8": "char", "u8": "uchar"}
_BITS = {"f32": "uint", "f16": "ushort", "bf16": "ushort", "s32": "int", "s8": "char", "u8": "uchar"}

# Saturation bounds of the integer types: (lowest as float, highest as float, C lowest, C highest).
# 2**31 - 1 is not a float; every float >= 2**31 saturates, every float below it fits an int.
_INT_RANGE = {
    "s32": (-(2.0**31), 2.0**31, "(-2147483647 - 1)", "2147483647"),
    "s8": (-128.0, 127.0, "(-128)", "127"),
    "u8": (0.0, 255.0, "0", "255"),
}
_NUMPY_INT = {"s32": np.int32, "s8": np.int8, "u8": np.uint8}

_IS_NAN = "((as_uint(x) & 0x7fffffffu) > 0x7f800000u)"  # bit test: no built-in call, no fast-math doubt


def _check_dtype(name: str, dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"{name} dtype {dtype!r} is not reorderable; known: {', '.join(DTYPES)}")


def _load_function(dtype: str) -> str:
    t = _STORAGE[dtype]
    if dtype == "f32":
        expr = "p[off]"
    elif dtype == "f16":
        expr = "vload_half(off, p)"
    elif dtype == "bf16":
        expr = "as_float((uint)p[off] << 16)"
    else:
        expr = "(float)p[off]"  # int -> float rounds to nearest even
    return f"static inline float load(__global const {t}* p, const ulong off) {{ return {expr}; }}\n"


def _store_function(dtype: str) -> str:
    t = _STORAGE[dtype]
    if dtype == "f32":
        body = "p[off] = x;"
    elif dtype == "f16":
        body = "vstore_half_rte(x, off, p);"
    elif dtype == "bf16":
        body = (
            "const uint b = as_uint(x);"
            f" p[off] = (ushort)({_IS_NAN} ? ((b >> 16) | 0x40u) : ((b + 0x7fffu + ((b >> 16) & 1u)) >> 16));"
        )
    else:
        lo, hi, c_lo, c_hi = _INT_RANGE[dtype]
        body = (
            f"p[off] = {_IS_NAN} ? ({t})0"
            f" : (x <= {c_float(lo)} ? ({t}){c_lo}"
            f" : (x >= {c_float(hi)} ? ({t}){c_hi} : ({t})rint(x)));"
        )
    return f"static inline void store(__global {t}* p, const ulong off, const float x) {{ {body} }}\n"


def generate(
    *,
    dims: tuple[int, ...],
    src_dtype: str,
    src_strides: tuple[int, ...],
    dst_dtype: str,
    dst_strides: tuple[int, ...],
    config: KernelConfig,
) -> KernelSpec:
    """OpenCL source converting ``src`` (``src_dtype``, ``src_strides``) into ``dst``."""
    _check_dtype("src", src_dtype)
    _check_dtype("dst", dst_dtype)
    if len(src_strides) != len(dims) or len(dst_strides) != len(dims):
        raise ValueError(f"strides {src_strides} / {dst_strides} do not match dims {dims}")
    n = math.prod(dims)
    local = config.local_size
    same_type = src_dtype == dst_dtype
    helpers = ""
    if same_type and src_strides == dst_strides and is_dense(dims, src_strides):
        bits = _BITS[src_dtype]
        vec = config.vector_width
        full, tail = divmod(n, vec)
        work_items = full + (1 if tail else 0)
        vec_type = bits if vec == 1 else f"{bits}{vec}"
        src_type = dst_type = bits
        body = f"""
    const ulong i = get_global_id(0);
    if (i < {full}UL) {{
        ((__global {vec_type}*)dst)[i] = ((__global const {vec_type}*)src)[i];
    }} else if (i == {full}UL) {{
        for (ulong j = i * {vec}UL; j < {n}UL; ++j) dst[j] = src[j];
    }}"""
        impl = f"ocl:copy:{config.name}"
    else:
        work_items = n
        offsets = index_code(dims, {"src": src_strides, "dst": dst_strides}, "i")
        if same_type:
            src_type = dst_type = _BITS[src_dtype]
            move = "dst[off_dst] = src[off_src];"
            impl = f"ocl:strided:l{local}"
        else:
            src_type, dst_type = _STORAGE[src_dtype], _STORAGE[dst_dtype]
            helpers = _load_function(src_dtype) + _store_function(dst_dtype)
            move = "store(dst, off_dst, load(src, off_src));"
            impl = f"ocl:convert:l{local}"
        body = f"""
    const ulong i = get_global_id(0);
    if (i >= {n}UL) return;
    {offsets}
    {move}"""
    source = (
        helpers
        + f"__kernel void reorder(__global const {src_type}* src, __global {dst_type}* dst) {{"
        + body
        + "\n}\n"
    )
    return KernelSpec(
        source=source,
        name="reorder",
        arg_names=("src", "dst"),
        global_size=(padded_global(work_items, local),),
        local_size=(local,),
        impl=impl,
    )


def _to_bf16_values(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded to bf16 (nearest even, NaN kept), returned as float32 values."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    with np.errstate(over="ignore"):
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    rounded = np.where(np.isnan(x), (bits >> 16) | np.uint32(0x40), rounded)
    return (rounded.astype(np.uint32) << 16).view(np.float32).reshape(np.shape(x))


def reference(src: np.ndarray, src_dtype: str, dst_dtype: str) -> np.ndarray:
    """``src`` (user-facing values: bf16 as float32) converted as the kernel does, computed in
    float64; returns user-facing values of ``dst_dtype`` (bf16 as float32)."""
    _check_dtype("src", src_dtype)
    _check_dtype("dst", dst_dtype)
    src = np.asarray(src)
    if src_dtype == dst_dtype:
        return src.copy()
    x = src.astype(np.float64)
    if src_dtype == "s32":
        x = x.astype(np.float32).astype(np.float64)  # the kernel widens s32 through f32
    with np.errstate(all="ignore"):
        if dst_dtype == "f32":
            return x.astype(np.float32)
        if dst_dtype == "f16":
            return x.astype(np.float16)
        if dst_dtype == "bf16":
            return _to_bf16_values(x.astype(np.float32))
        lo, hi, _, _ = _INT_RANGE[dst_dtype]
        info = np.iinfo(_NUMPY_INT[dst_dtype])
        y = np.clip(np.rint(x), lo, hi)
        y = np.where(np.isnan(x), 0.0, np.clip(y, info.min, info.max))
        return y.astype(_NUMPY_INT[dst_dtype])
