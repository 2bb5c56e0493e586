"""Dynamic Quantize / Dequantize: the generator of ``DynamicQuantizeDesc`` and its float64
reference.

One work-item per element. Its coordinates are peeled from the linear index as ``index_code``
does; on each dim the scale (and zero point) coordinate is the element's divided by the group
size, so per-tensor, per-channel and per-group quantization are one kernel. Loads and stores go
through ``_dtype_io`` (s4/u4 sources and zero points read their nibble; packed destinations are
stored once per element, safely); the math is ``QuantizeDesc``'s, f32.
"""

from __future__ import annotations

import math

import numpy as np

from .._values._dynamic_quantize_desc import DynamicQuantizeDesc
from . import _dtype_io
from . import tolerance as thresholds
from ._registry import register
from ._spec import KernelConfig, KernelSpec, padded_global


def _offsets(desc: DynamicQuantizeDesc) -> str:
    names = {"src": desc.src.strides, "dst": desc.dst.strides, "sc": desc.scales.strides}
    if desc.zps is not None:
        names["zp"] = desc.zps.strides
    lines = ["ulong r = gid;"] + [f"ulong off_{n} = 0;" for n in names]
    for axis in reversed(range(desc.src.ndims)):
        d, g = desc.src.dims[axis], desc.group_shape[axis]
        if d == 1:
            continue
        lines.append(f"{{ const ulong c = r % {d}UL; r /= {d}UL;")
        for n, strides in names.items():
            if n in ("sc", "zp"):
                if g < d and strides[axis]:  # the whole dim in one group: coordinate 0
                    lines.append(f"  off_{n} += (c / {g}UL) * {strides[axis]}UL;")
            elif strides[axis]:
                lines.append(f"  off_{n} += c * {strides[axis]}UL;")
        lines.append("}")
    return "\n    ".join(lines)


def generate(desc: DynamicQuantizeDesc, config: KernelConfig) -> KernelSpec:
    desc.check_supported()
    total = math.prod(desc.src.dims)
    args = desc.arg_descs
    params = ", ".join(_dtype_io.param(md.dtype, name, const=name != "dst") for name, md in args.items())
    scale = _dtype_io.load(desc.scales.dtype, "scales", "off_sc")
    zp = _dtype_io.load(desc.zps.dtype, "zps", "off_zp") if desc.zps is not None else "0.0f"
    y = f"x / {scale} + {zp}" if desc.alg == "quantize" else f"(x - {zp}) * {scale}"
    loads = [md.dtype for name, md in args.items() if name != "dst"]
    local = config.local_size
    name = f"dynamic_{desc.alg}"
    source = (
        _dtype_io.functions(loads=loads, stores=(desc.dst.dtype,))
        + f"__kernel void {name}({params}) {{\n"
        "    const ulong gid = get_global_id(0);\n"
        f"    if (gid >= {total}UL) return;\n"
        f"    {_offsets(desc)}\n"
        f"    const float x = {_dtype_io.load(desc.src.dtype, 'src', 'off_src')};\n"
        f"    const float y = {y};\n"
        f"    {_dtype_io.store(desc.dst.dtype, 'dst', 'off_dst', 'y')}\n"
        "}\n"
    )
    return KernelSpec(
        source=source,
        name=name,
        arg_names=tuple(args),
        global_size=(padded_global(total, local),),
        local_size=(local,),
        impl=f"ocl:{name}:l{local}",
    )


def reference(src, scales, zps, group_shape, alg: str, dst_dtype: str) -> np.ndarray:
    """float64 dynamic (de)quantization of user-facing ``src`` with ``scales`` (and ``zps`` or
    None) of src's rank, each repeated ``group_shape`` times along its dims."""
    x = _dtype_io.widen(src)

    def expand(t):
        t = _dtype_io.widen(t)
        for axis, g in enumerate(group_shape):
            t = np.repeat(t, g, axis=axis)
        return t

    scale = expand(scales)
    zp = expand(zps) if zps is not None else 0.0
    with np.errstate(all="ignore"):
        y = x / scale + zp if alg == "quantize" else (x - zp) * scale
    return _dtype_io.store_reference(y.astype(np.float32), dst_dtype)


def desc_reference(desc: DynamicQuantizeDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return reference(inputs["src"], inputs["scales"], inputs.get("zps"), desc.group_shape, desc.alg, desc.dst.dtype)


def _tolerance(desc: DynamicQuantizeDesc) -> float:
    # As QuantizeDesc's: one quantization step for quantize (a tie the f32 division may cross),
    # one rounded product for dequantize, plus the dst's own rounding.
    if desc.alg == "dequantize":
        return max(thresholds.BINARY, _dtype_io.EPSILON[desc.dst.dtype])
    return _dtype_io.EPSILON[desc.dst.dtype] if desc.dst.dtype in ("f8_e4m3", "f8_e5m2") else 1.0


register(DynamicQuantizeDesc, generate=generate, reference=desc_reference, tolerance=_tolerance)
