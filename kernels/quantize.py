"""Static Quantize / Dequantize: the generator of ``QuantizeDesc`` and its float64 reference.

One work-item per element. Scales and zero points are the descriptor's, baked into the source as
``__constant`` tables (they are part of the primitive's key anyway); the channel of an element
is one more offset of ``index_code`` (stride 1 on the axis, 0 elsewhere). The math is f32:
quantize divides by the scale (as oneDNN's ``src / scale``, not a product by a rounded
reciprocal), adds the zero point and stores through ``_dtype_io`` (nearest even and saturation
for integers, oneDNN's f8 rounding for f8, packed nibbles for s4/u4, each stored once);
dequantize subtracts the zero point (exact: both are small integers) and multiplies.
"""

from __future__ import annotations

import math

import numpy as np

from .._values._quantize_desc import QuantizeDesc
from . import _dtype_io
from . import tolerance as thresholds
from ._registry import register
from ._spec import KernelConfig, KernelSpec, c_float, index_code, padded_global


def _table(name: str, values) -> str:
    return f"__constant float {name}[{len(values)}] = {{{', '.join(c_float(float(v)) for v in values)}}};\n"


def generate(desc: QuantizeDesc, config: KernelConfig) -> KernelSpec:
    desc.check_supported()
    dims = desc.src.dims
    total = math.prod(dims)
    strides = {"src": desc.src.strides, "dst": desc.dst.strides}
    if desc.axis is not None:
        strides["ch"] = tuple(1 if i == desc.axis else 0 for i in range(len(dims)))
    channel = "off_ch" if desc.axis is not None else "0"
    tables = _table("SCALES", desc.scales)
    zp = "0.0f"
    if any(desc.zps):
        tables += _table("ZPS", desc.zps)
        zp = f"ZPS[{channel}]"
    x = _dtype_io.load(desc.src.dtype, "src", "off_src")
    if desc.alg == "quantize":
        y = f"x / SCALES[{channel}] + {zp}"
    else:
        y = f"(x - {zp}) * SCALES[{channel}]"
    local = config.local_size
    source = (
        _dtype_io.functions(loads=(desc.src.dtype,), stores=(desc.dst.dtype,))
        + tables
        + f"__kernel void {desc.alg}(__global const {_dtype_io.STORAGE[desc.src.dtype]}* src,"
        f" __global {_dtype_io.STORAGE[desc.dst.dtype]}* dst) {{\n"
        "    const ulong gid = get_global_id(0);\n"
        f"    if (gid >= {total}UL) return;\n"
        f"    {index_code(dims, strides, 'gid')}\n"
        f"    const float x = {x};\n"
        f"    const float y = {y};\n"
        f"    {_dtype_io.store(desc.dst.dtype, 'dst', 'off_dst', 'y')}\n"
        "}\n"
    )
    return KernelSpec(
        source=source,
        name=desc.alg,
        arg_names=("src", "dst"),
        global_size=(padded_global(total, local),),
        local_size=(local,),
        impl=f"ocl:{desc.alg}:l{local}",
    )


def _per_element(values, axis: int | None, ndims: int) -> np.ndarray:
    """Scales or zero points shaped to broadcast against src (one value, or one per channel)."""
    values = np.asarray(values, dtype=np.float64)
    if axis is None:
        return values.reshape(())
    shape = [1] * ndims
    shape[axis] = values.size
    return values.reshape(shape)


def reference(src: np.ndarray, alg: str, scales, zps, axis: int | None, dst_dtype: str) -> np.ndarray:
    """float64 quantize (``src / scale + zp``) or dequantize (``(src - zp) * scale``) of
    user-facing ``src``, stored as ``dst_dtype`` (nearest even, saturated; f8 rounding)."""
    x = _dtype_io.widen(src)
    scale = _per_element(scales, axis, x.ndim)
    zp = _per_element(zps if len(zps) else [0], axis if len(zps) else None, x.ndim)
    with np.errstate(all="ignore"):
        y = x / scale + zp if alg == "quantize" else (x - zp) * scale
    return _dtype_io.store_reference(y.astype(np.float32), dst_dtype)


def desc_reference(desc: QuantizeDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return reference(inputs["src"], desc.alg, desc.scales, desc.zps, desc.axis, desc.dst.dtype)


def _tolerance(desc: QuantizeDesc) -> float:
    # Quantize: f32 division may differ from float64's by an ulp (OpenCL allows division a few
    # ulps off), which can move a value across a rounding tie: one quantization step (an
    # integer, or one f8 ulp). Dequantize: one product rounded once.
    if desc.alg == "dequantize":
        return thresholds.BINARY
    return _dtype_io.EPSILON[desc.dst.dtype] if desc.dst.dtype in ("f8_e4m3", "f8_e5m2") else 1.0


register(QuantizeDesc, generate=generate, reference=desc_reference, tolerance=_tolerance)
