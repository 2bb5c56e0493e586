"""OpenCL C for quantized operands (``_values._quantization.Quantization``), shared by the kernels
that dequantize as they load and quantize as they store (fused attention, convolution).

* Rounding an f32 to bf16's 8 or f16's 11 significant bits, kept as f32: a graph's TypeCast or a
  bf16 op's output emulated in registers, so that a fused kernel's integers match the op-by-op
  graph's.
* A static dequantization of a byte type as a ``__constant`` table of its 256 values.
* The float a quantized store takes (the dtype's store rounds half to even and saturates).
"""

from __future__ import annotations

import math

import numpy as np

from .._values._float8 import decode as decode_float8
from .._values._quantization import Quantization
from . import _dtype_io
from ._spec import c_float

# Rounding to nearest even in bits, no built-in call (PoCL would not inline one). f16's
# subnormal and overflow ranges are not emulated: scores and
# dequantized operands live far from both.
_ROUND_DROP = {"bf16": 16, "f16": 13}
_BYTE_CODES = ("s8", "u8", "f8_e4m3", "f8_e5m2")


def rounding_functions(kinds: set[str]) -> str:
    """Definitions of ``rounded``'s helpers for the float types in ``kinds`` (bf16, f16)."""
    out = []
    for kind in sorted(kinds):
        drop = _ROUND_DROP[kind]
        half, mask = (1 << (drop - 1)) - 1, (0xFFFFFFFF >> drop) << drop
        for t, u in (("float", "uint"), ("float16", "uint16")):
            suffix = "" if t == "float" else "_v"
            out.append(f"static inline {t} sd_r{kind}{suffix}(const {t} x) {{ const {u} b = as_{u}(x);"
                       f" return as_{t}((b + ({u})({half}u) + ((b >> {drop}u) & ({u})(1u))) & ({u})({mask}u)); }}\n")
    return "".join(out)


def rounded(kind: str, expr: str, vector: bool = False) -> str:
    """``expr`` rounded to ``kind`` (f32: unchanged); ``rounding_functions`` defines the helpers."""
    return expr if kind == "f32" else f"sd_r{kind}{'_v' if vector else ''}({expr})"


def tabled(quant: Quantization) -> bool:
    """Whether ``table`` serves ``quant``: a static dequantization of a byte type."""
    return not quant.grouped and quant.dtype in _BYTE_CODES


def table(name: str, quant: Quantization) -> str:
    """A static dequantization of a byte type as a table of its 256 values, dequantized and
    rounded once in numpy: one load per element where the arithmetic (convert, subtract,
    multiply, round to bf16) cost more than the products it feeds. PoCL, 1x12x128x64 u8
    attention with bf16 casts: 5.4 ms with the arithmetic in the loops."""
    codes = np.arange(256, dtype=np.uint8)
    if quant.dtype in ("f8_e4m3", "f8_e5m2"):
        stored = decode_float8(codes, quant.dtype).astype(np.float64)
    else:
        stored = codes.view(np.int8 if quant.dtype == "s8" else np.uint8).astype(np.float64)
    values = ((stored - quant.zp) * np.float64(np.float32(quant.static_scale))).astype(np.float32)
    values = _dtype_io.store_reference(values, quant.round_out).astype(np.float32)
    entries = ", ".join(_constant(float(v)) for v in values)
    return f"__constant float sd_table_{name}[256] = {{{entries}}};\n"


def _constant(value: float) -> str:
    """A float literal a program-scope initializer takes: PoCL's NAN and INFINITY are not
    compile-time constants there, divisions by zero are."""
    if math.isnan(value):
        return "(0.0f / 0.0f)"
    if math.isinf(value):
        return "(1.0f / 0.0f)" if value > 0 else "(-1.0f / 0.0f)"
    return c_float(value)


def table_load(name: str, index: str) -> str:
    """Element ``index`` of buffer ``name`` dequantized through its ``table``."""
    return f"sd_table_{name}[(uchar){name}[{index}]]"


def centered(quant: Quantization | None, expr: str) -> str:
    """A loaded value less its static zero point: integer products stay exact in f32, the scales
    multiply the sum once."""
    return f"({expr} - {c_float(quant.zp)})" if quant is not None and quant.zp else expr


def quantized_value(quant: Quantization, expr: str) -> str:
    """The float a quantized store of ``expr`` takes: ``round_in(expr) / scale + zp`` (Quantize
    divides, as oneDNN's src / scale); the dtype's store rounds half to even and saturates."""
    zp = f" + {c_float(quant.zp)}" if quant.zp else ""
    return f"({rounded(quant.round_in, f'({expr})')} / {c_float(quant.static_scale)}{zp})"
