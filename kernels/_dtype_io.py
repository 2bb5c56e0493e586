"""Storage data types in generated OpenCL C: loads widening to float, stores narrowing from it.

Generators compute in f32 whatever the storage ("f32 math, any storage", as oneDNN's eltwise,
binary, sum and concat do): every value is loaded as float, and the result is stored with the
destination type's conversion:

* f32: as is.
* f16: ``vload_half`` / ``vstore_half_rte``, core OpenCL built-ins that need no cl_khr_fp16, so
  f16 storage works on every device (the kernel never declares a ``half`` value, only pointers).
  Stores round to nearest even, overflow to inf, keep NaN.
* bf16: bit shifts; stores round to nearest even on the 16 dropped bits, NaN kept NaN with the
  quiet bit set: bit for bit what ``triodnn._dtypes.to_storage`` does.
* s64, s32, s8, u8: loads convert (beyond 2**24 rounds to nearest even); stores round to nearest
  even, saturate to the type's range and write 0 for NaN, as OpenCL's ``convert_<type>_sat_rte``
  (written out: PoCL keeps the built-in as a call).
* boolean (oneDNN Graph's, one byte): loads give 1.0 for any nonzero byte, 0.0 otherwise; stores
  write ``value != 0`` as 1 or 0 (NaN is nonzero: 1).
* f8_e4m3, f8_e5m2 (one ``uchar`` bit pattern): loads are exact; stores are oneDNN's
  non-saturating f32 conversion (``triodnn._values._float8``, whose numpy code runs the same bit
  arithmetic): round to nearest even once, f32 subnormals read as zero, e4m3 overflow and
  infinities become NaN, e5m2 overflow infinity.
* s4, u4 (``PACKED``: two a byte, the even element in the low nibble, ``triodnn._values._int4``):
  loads pick the nibble (s4 sign-extended); stores round to nearest even and saturate like the
  other integers, then clear and set their nibble with ``atomic_and``/``atomic_or`` on its
  32-bit word, so two work-items storing the two halves of one byte lose nothing (the buffer is
  whole words). They are not in ``DTYPES``: kernels that address elements by pointer arithmetic
  would get them wrong, so only kinds written for them (reorder) take them.

Every generator converts through these helpers: eltwise, binary, sum, concat, matmul, softmax,
reduction, pooling, the normalizations, convolution and reorder (whose conversions they once
copied). Pure: strings and numpy arrays only.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .._values import _float8
from .._values._float8 import FORMATS as _F8
from . import _post_ops
from ._elementwise import widen as widen
from ._spec import c_float

DTYPES: tuple[str, ...] = ("f32", "f16", "bf16", "s32", "s8", "u8", "boolean", "s64", "f8_e4m3", "f8_e5m2")
PACKED: tuple[str, ...] = ("s4", "u4")

# OpenCL type a kernel parameter of each data type points to. A ``half`` pointer is legal without
# cl_khr_fp16 as long as only vload_half/vstore_half dereference it.
STORAGE: dict[str, str] = {
    "f32": "float", "f16": "half", "bf16": "ushort", "s32": "int", "s8": "char", "u8": "uchar",
    "boolean": "uchar", "s64": "long", "f8_e4m3": "uchar", "f8_e5m2": "uchar", "s4": "uchar",
    "u4": "uchar",
}

# OpenCL type that moves a stored value's bits unchanged (a copy between tensors of one type).
BITS: dict[str, str] = {
    "f32": "float", "f16": "ushort", "bf16": "ushort", "s32": "int", "s8": "char", "u8": "uchar",
    "boolean": "uchar", "s64": "long", "f8_e4m3": "uchar", "f8_e5m2": "uchar",
}

# Relative rounding a store into the type may add on top of an f32 result (its machine epsilon,
# one ulp at the bottom of a binade): two f32 results a hair apart can land on neighbouring
# values. The integer types and boolean are 0: their stores are compared exactly, on data kept
# away from rounding ties.
EPSILON: dict[str, float] = {
    "f32": 0.0, "f16": 2.0**-10, "bf16": 2.0**-7, "s32": 0.0, "s8": 0.0, "u8": 0.0, "boolean": 0.0,
    "s64": 0.0, "f8_e4m3": 2.0**-3, "f8_e5m2": 2.0**-2, "s4": 0.0, "u4": 0.0,
}

# The numpy type of each data type's user-facing values (bf16 reads back as float32).
USER_NUMPY: dict[str, type] = {
    "f32": np.float32, "f16": np.float16, "bf16": np.float32, "s32": np.int32, "s8": np.int8,
    "u8": np.uint8, "boolean": np.bool_, "s64": np.int64, "f8_e4m3": np.float32, "f8_e5m2": np.float32,
    "s4": np.int8, "u4": np.uint8,
}

# Saturation bounds of the integer types: (lowest as float, highest as float, C lowest, C highest).
# 2**31 - 1 is not a float; every float >= 2**31 saturates, every float below it fits an int.
_INT_RANGE = {
    # 2**63 - 1 is not a float either: every float >= 2**63 saturates.
    "s64": (-(2.0**63), 2.0**63, "(-9223372036854775807L - 1)", "9223372036854775807L"),
    "s32": (-(2.0**31), 2.0**31, "(-2147483647 - 1)", "2147483647"),
    "s8": (-128.0, 127.0, "(-128)", "127"),
    "u8": (0.0, 255.0, "0", "255"),
    "s4": (-8.0, 7.0, "(-8)", "7"),
    "u4": (0.0, 15.0, "0", "15"),
}

_IS_NAN = "((as_uint(x) & 0x7fffffffu) > 0x7f800000u)"  # bit test: no built-in call, no fast-math doubt


def check_dtype(name: str, dtype: str, *, packed: bool = False) -> None:
    """ValueError unless ``dtype`` is one these helpers load and store (s4/u4 only where the
    caller says it takes ``packed`` types)."""
    if dtype not in DTYPES and not (packed and dtype in PACKED):
        raise ValueError(f"{name} dtype {dtype!r} is not a storage type; known: {', '.join(DTYPES)}")


def param(dtype: str, name: str, *, const: bool) -> str:
    """The kernel parameter declaring buffer ``name`` of ``dtype``."""
    return f"__global {'const ' if const else ''}{STORAGE[dtype]}* {name}"


def _load_function(dtype: str) -> str:
    t = STORAGE[dtype]
    if dtype == "f16":
        expr = "vload_half(off, p)"
    elif dtype == "bf16":
        expr = "as_float((uint)p[off] << 16)"
    elif dtype == "boolean":
        expr = "p[off] ? 1.0f : 0.0f"  # any nonzero byte is true, whoever wrote it
    elif dtype in _F8:
        return _f8_load_function(dtype)
    elif dtype in PACKED:
        nibble = "(int)((p[off >> 1] >> ((uint)(off & 1UL) * 4u)) & 0xfu)"
        expr = f"(float)(({nibble} ^ 8) - 8)" if dtype == "s4" else f"(float){nibble}"
    else:
        expr = "(float)p[off]"  # int -> float rounds to nearest even
    return f"static inline float load_{dtype}(__global const {t}* p, const ulong off) {{ return {expr}; }}\n"


def _store_function(dtype: str, linkage: str) -> str:
    t = STORAGE[dtype]
    if dtype == "f16":
        body = "vstore_half_rte(x, off, p);"
    elif dtype == "bf16":
        body = (
            "const uint b = as_uint(x);"
            f" p[off] = (ushort)({_IS_NAN} ? ((b >> 16) | 0x40u) : ((b + 0x7fffu + ((b >> 16) & 1u)) >> 16));"
        )
    elif dtype == "boolean":
        body = "p[off] = x != 0.0f ? (uchar)1 : (uchar)0;"
    elif dtype in _F8:
        return _f8_store_function(dtype, linkage)
    elif dtype in PACKED:
        lo, hi, c_lo, c_hi = _INT_RANGE[dtype]
        body = (
            f"const int v = {_IS_NAN} ? 0 : (x <= {c_float(lo)} ? {c_lo} : (x >= {c_float(hi)} ? {c_hi} : (int)rint(x)));"
            " const uint shift = (uint)(off & 7UL) * 4u;"
            " volatile __global uint* w = (volatile __global uint*)p + (off >> 3);"
            " atomic_and(w, ~(0xfu << shift)); atomic_or(w, ((uint)v & 0xfu) << shift);"
        )
    else:
        lo, hi, c_lo, c_hi = _INT_RANGE[dtype]
        body = (
            f"p[off] = {_IS_NAN} ? ({t})0"
            f" : (x <= {c_float(lo)} ? ({t}){c_lo}"
            f" : (x >= {c_float(hi)} ? ({t}){c_hi} : ({t})rint(x)));"
        )
    return f"{linkage} void store_{dtype}(__global {t}* p, const ulong off, const float x) {{ {body} }}\n"


def _f8_decode(dtype: str, code: str) -> str:
    """Statements declaring float ``v``, the value of f8 code ``code`` (a uint expression)."""
    fmt = _F8[dtype]
    m, bias = fmt.mantissa_bits, fmt.bias
    # Bit patterns, not NAN/INFINITY: no fast-math build option can fold them away.
    nan, inf = "as_float(0x7fc00000u)", "as_float(0x7f800000u)"
    special = f"(c & 0x7fu) == 0x7fu ? {nan}" if dtype == "f8_e4m3" else f"e == 0x1fu ? (f ? {nan} : {inf})"
    # Normal codes rebias into f32 bits; subnormals are f * 2**(1 - bias - m), exact in float.
    return (
        f" const uint c = {code}; const uint e = (c >> {m}) & {(1 << fmt.exponent_bits) - 1}u;"
        f" const uint f = c & {(1 << m) - 1}u;"
        f" const float a = {special}"
        f" : (e ? as_float(((e + {127 - bias}u) << 23) | (f << {23 - m})) : (float)f * {c_float(2.0 ** (1 - bias - m))});"
        " const float v = (c & 0x80u) ? -a : a;"
    )


def _f8_encode(dtype: str) -> str:
    """Statements declaring uint ``code``, the f8 code of float ``x``."""
    fmt = _F8[dtype]
    m, bias = fmt.mantissa_bits, fmt.bias
    shift, rebias = 23 - m, 127 - bias
    nan = "0x7fu" if dtype == "f8_e4m3" else "(0x7cu | ((((a & 0x7fffffu) | 0x400000u) >> 21) & 3u))"
    # The same steps as ``_float8.encode``: NaN, f32 subnormal (DAZ), f8 subnormal (scaled into
    # [0, 2**m] exactly, rint rounds half to even), normal (round the bits to nearest even).
    return (
        " const uint b = as_uint(x); const uint a = b & 0x7fffffffu; const uint e = a >> 23; uint c;"
        f" if (a > 0x7f800000u) c = {nan};"
        " else if (e == 0u) c = 0u;"
        f" else if (e <= {rebias}u) c = (uint)rint(as_float(a) * {c_float(2.0 ** (bias + m - 1))});"
        f" else {{ const uint r = (a + {(1 << (shift - 1)) - 1}u + ((a >> {shift}) & 1u)) >> {shift};"
        f" c = r > {(rebias << m) + fmt.max_code}u ? {fmt.overflow_code}u : r - {rebias << m}u; }}"
        " const uint code = c | ((b >> 24) & 0x80u);"
    )


def _f8_load_function(dtype: str) -> str:
    return (f"static inline float load_{dtype}(__global const uchar* p, const ulong off) {{"
            f"{_f8_decode(dtype, 'p[off]')} return v; }}\n")


def _f8_store_function(dtype: str, linkage: str) -> str:
    return (f"{linkage} void store_{dtype}(__global uchar* p, const ulong off, const float x) {{"
            f"{_f8_encode(dtype)} p[off] = (uchar)code; }}\n")


def f8_round_function(dtype: str) -> str:
    """``static float round_{dtype}(float x)``: x through an f8 store and load (the value a
    Quantize -> Dequantize round trip of that type keeps), for fused kernels that never store it."""
    return (f"static inline float round_{dtype}(const float x) {{ uint stored; {{{_f8_encode(dtype)} stored = code; }}"
            f"{_f8_decode(dtype, 'stored')} return v; }}\n")


def functions(loads: Iterable[str] = (), stores: Iterable[str] = (), *, called_stores: bool = False) -> str:
    """Definitions of the helpers that ``load`` and ``store`` call for these data types, each once
    and in a fixed order (the source, and so the program binary, depends only on the set). f32
    needs none: its loads and stores are plain accesses.

    ``called_stores``: the store helpers are real calls, not inlined. For CPU kernels that unroll
    hundreds of stores: PoCL inlines ``vstore_half_rte`` at each, and the f16 6 x 64 register-block
    matmul (384 stores) took 12.9 s to compile at its first launch, 0.84 s with one called copy
    (its stores are one per output element, after a K loop of hundreds of products)."""
    loads, stores = set(loads), set(stores)
    linkage = "static __attribute__((noinline))" if called_stores else "static inline"
    return "".join(
        [_load_function(t) for t in (*DTYPES, *PACKED) if t in loads and t != "f32"]
        + [_store_function(t, linkage) for t in (*DTYPES, *PACKED) if t in stores and t != "f32"]
    )


def load(dtype: str, pointer: str, offset: str) -> str:
    """Float expression of element ``offset`` of buffer ``pointer``."""
    return f"{pointer}[{offset}]" if dtype == "f32" else f"load_{dtype}({pointer}, {offset})"


def store(dtype: str, pointer: str, offset: str, value: str) -> str:
    """Statement storing float ``value`` into element ``offset`` of buffer ``pointer``."""
    if dtype == "f32":
        return f"{pointer}[{offset}] = {value};"
    return f"store_{dtype}({pointer}, {offset}, {value});"


def _components(vec: int) -> list[str]:
    return [f"s{k:x}" for k in range(vec)]


def load_vector(dtype: str, pointer: str, index: str, vec_type: str, vec: int) -> str:
    """``vec_type`` expression of elements ``index * vec`` .. ``index * vec + vec - 1`` of a dense
    buffer. f32 is one access through a vector pointer cast (PoCL keeps vloadN as a call); other
    types load each element and build the vector, so the math that follows stays vectorised."""
    if dtype == "f32":
        return f"((__global const {vec_type}*){pointer})[{index}]"
    if vec == 1:
        return load(dtype, pointer, index)
    elements = ", ".join(load(dtype, pointer, f"{index} * {vec}UL + {k}UL") for k in range(vec))
    return f"(({vec_type})({elements}))"


def store_vector(dtype: str, pointer: str, index: str, vec_type: str, vec: int, value: str) -> str:
    """Statements storing ``vec_type`` variable ``value`` at elements ``index * vec`` onwards."""
    if dtype == "f32":
        return f"((__global {vec_type}*){pointer})[{index}] = {value};"
    if vec == 1:
        return store(dtype, pointer, index, value)
    return " ".join(
        store(dtype, pointer, f"{index} * {vec}UL + {k}UL", f"{value}.{c}")
        for k, c in enumerate(_components(vec))
    )


def apply_post_ops_flat(
    chain: tuple, var: str, vec_type: str, vec: int, access: dict[str, str], dst_dtype: str
) -> tuple[str, str]:
    """``_post_ops.apply_flat`` for a dst of any data type: a sum post-op reads dst's old value
    through ``dst_dtype``'s load. Binary operands are f32 (descriptors refuse others). For an f32
    dst this is ``apply_flat`` itself, so f32 kernels keep their source."""
    if dst_dtype == "f32":
        return _post_ops.apply_flat(chain, var, vec_type, access)
    vector = _post_ops.apply(
        chain, var, vec_type, load_vector(dst_dtype, "dst", "i", vec_type, vec),
        lambda name: f"(({vec_type})({name}[0]))" if access[name] == "scalar"
        else f"((__global const {vec_type}*){name})[i]",
    )
    tail = apply_post_ops_scalar(
        chain, var, "j", {name: "0" if access[name] == "scalar" else "j" for name in access}, dst_dtype
    )
    return vector, tail


def apply_post_ops_scalar(
    chain: tuple, var: str, dst_offset: str, operand_offsets: dict[str, str], dst_dtype: str
) -> str:
    """``_post_ops.apply_scalar`` for a dst of any data type (see ``apply_post_ops_flat``)."""
    if dst_dtype == "f32":
        return _post_ops.apply_scalar(chain, var, dst_offset, operand_offsets)
    return _post_ops.apply(
        chain, var, "float", load(dst_dtype, "dst", dst_offset),
        lambda name: f"{name}[{operand_offsets[name]}]",
    )


# -- numpy references ------------------------------------------------------------------------------
# ``widen`` (user-facing values as float64, as a kernel's load sees them) lives in ``_elementwise``,
# beneath ``_post_ops``, whose references need it too; it is re-exported above.


def _to_bf16_values(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded to bf16 (nearest even, NaN kept), returned as float32 values."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    with np.errstate(over="ignore"):
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    rounded = np.where(np.isnan(x), (bits >> 16) | np.uint32(0x40), rounded)
    return (rounded.astype(np.uint32) << 16).view(np.float32).reshape(np.shape(x))


def store_reference(values, dtype: str) -> np.ndarray:
    """float32 results ``values`` narrowed as the kernels' stores narrow them; returns user-facing
    values of ``dtype`` (bf16 as float32, boolean as bool)."""
    check_dtype("dst", dtype, packed=True)
    x = np.asarray(values, dtype=np.float32)
    with np.errstate(all="ignore"):
        if dtype == "f32":
            return x
        if dtype == "f16":
            return x.astype(np.float16)
        if dtype == "bf16":
            return _to_bf16_values(x)
        if dtype == "boolean":
            return x != 0  # NaN != 0: true, as the kernel's store
        if dtype in _F8:
            return _float8.decode(_float8.encode(x, dtype), dtype)
        lo, hi, _, _ = _INT_RANGE[dtype]
        numpy_type = USER_NUMPY[dtype]
        info = np.iinfo(numpy_type)
        wide = x.astype(np.float64)
        y = np.clip(np.rint(wide), lo, hi)
        y = np.where(np.isnan(wide), 0.0, np.clip(y, info.min, info.max))
        if dtype == "s64":  # 2**63 is past int64: the kernel's store saturates it to the top
            return np.where(y >= hi, info.max, y.astype(numpy_type)).astype(numpy_type)
        return y.astype(numpy_type)
