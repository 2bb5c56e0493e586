"""Concat forward: ``dst = concatenate(srcs, axis)``, generator beside its source.

Every source has dst's dims except along ``axis``; each source and dst in any layout. One element
of dst per work-item: the work-item peels its coordinates from the linear index, finds its source
by comparing the axis coordinate with the baked cumulative offsets (a binary search, unrolled),
and reads that source with its own strides.

Each source and dst has its own storage type of ``_dtype_io.DTYPES``. A source of dst's type is
copied bit for bit (exact: s32 beyond 2**24 and NaN payloads survive); any other is loaded as float
and stored with dst's conversion.
"""

from __future__ import annotations

import math

import numpy as np

from .._values._concat_desc import ConcatDesc
from . import _dtype_io
from ._registry import register
from ._spec import KernelConfig, KernelSpec, padded_global


def _select(lo: int, hi: int, starts: list[int], loads: list[str], indent: str) -> list[str]:
    """Nested ifs choosing among sources ``lo`` .. ``hi - 1`` by the axis coordinate ``ca``."""
    if hi - lo == 1:
        return [indent + loads[lo]]
    mid = (lo + hi) // 2
    return (
        [f"{indent}if (ca < {starts[mid]}UL) {{"]
        + _select(lo, mid, starts, loads, indent + "    ")
        + [f"{indent}}} else {{"]
        + _select(mid, hi, starts, loads, indent + "    ")
        + [f"{indent}}}"]
    )


def generate(desc: ConcatDesc, config: KernelConfig) -> KernelSpec:
    """OpenCL source concatenating ``desc.srcs`` along ``desc.axis`` (normalised) into dst, each
    in its own layout and storage type (``_dtype_io.DTYPES``)."""
    desc.check_supported()
    src_dims = tuple(md.dims for md in desc.srcs)
    src_strides = tuple(md.strides for md in desc.srcs)
    src_dtypes = tuple(md.dtype for md in desc.srcs)
    axis, dims, dst_strides, dst_dtype = desc.axis, desc.dst.dims, desc.dst.strides, desc.dst.dtype
    n_inputs = len(desc.srcs)
    ndims = len(dims)
    n = math.prod(dims)
    starts = [0]
    for extents in src_dims:
        starts.append(starts[-1] + extents[axis])
    local = config.local_size

    # Coordinates, innermost first; off_dst accumulates as they are peeled.
    lines = ["ulong r = i;", "ulong off_dst = 0;"]
    for k in reversed(range(ndims)):
        d = dims[k]
        if d == 1:
            lines.append(f"const ulong c{k} = 0;")
            continue
        lines.append(f"const ulong c{k} = r % {d}UL; r /= {d}UL;")
        if dst_strides[k]:
            lines.append(f"off_dst += c{k} * {dst_strides[k]}UL;")
    lines.append(f"const ulong ca = c{axis};")

    # A same-type copy goes through the type's bit pointer: f16 has no plain half access.
    dst_bits = _dtype_io.BITS[dst_dtype]
    dst_as_bits = "dst" if dst_bits == _dtype_io.STORAGE[dst_dtype] else f"((__global {dst_bits}*)dst)"
    moves = []
    for s, (sdims, strides, dtype) in enumerate(zip(src_dims, src_strides, src_dtypes)):
        terms = []
        for k in range(ndims):
            if sdims[k] == 1 or strides[k] == 0:
                continue
            coord = f"(c{k} - {starts[s]}UL)" if k == axis and starts[s] else f"c{k}"
            terms.append(f"{coord} * {strides[k]}UL")
        offset = " + ".join(terms) or "0"
        if dtype == dst_dtype:
            src = f"src{s}" if dst_as_bits == "dst" else f"((__global const {dst_bits}*)src{s})"
            moves.append(f"{dst_as_bits}[off_dst] = {src}[{offset}];")
        else:
            moves.append(_dtype_io.store(dst_dtype, "dst", "off_dst", _dtype_io.load(dtype, f"src{s}", offset)))
    lines += _select(0, n_inputs, starts, moves, "")

    names = [f"src{i}" for i in range(n_inputs)]
    params = ", ".join(_dtype_io.param(dtype, name, const=True) for name, dtype in zip(names, src_dtypes))
    converted = [dtype for dtype in src_dtypes if dtype != dst_dtype]
    body = "\n    ".join(lines)
    source = (
        _dtype_io.functions(loads=converted, stores=(dst_dtype,) if converted else ())
        + f"__kernel void concat_fwd({params}, {_dtype_io.param(dst_dtype, 'dst', const=False)}) {{\n"
        f"    const ulong i = get_global_id(0);\n"
        f"    if (i >= {n}UL) return;\n"
        f"    {body}\n}}\n"
    )
    return KernelSpec(
        source=source,
        name="concat_fwd",
        arg_names=(*names, "dst"),
        global_size=(padded_global(n, local),),
        local_size=(local,),
        impl=f"ocl:strided:l{local}",
    )


def reference(srcs, axis: int, *, src_dtypes=None, dst_dtype: str = "f32") -> np.ndarray:
    """``numpy.concatenate(srcs, axis)`` of user-facing values, returned as user-facing values of
    ``dst_dtype``. A source of dst's type (every source when ``src_dtypes`` is None) is taken as
    is, the kernel's bit copy; any other is converted as the kernel converts it."""
    if src_dtypes is None:
        src_dtypes = (dst_dtype,) * len(srcs)
    user_type = _dtype_io.USER_NUMPY[dst_dtype]
    parts = [
        np.asarray(s, dtype=user_type) if dtype == dst_dtype
        else _dtype_io.store_reference(_dtype_io.widen(s).astype(np.float32), dst_dtype)
        for s, dtype in zip(srcs, src_dtypes, strict=True)
    ]
    return np.concatenate(parts, axis=axis)


def _reference(desc: ConcatDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    srcs = [inputs[f"src{i}"] for i in range(len(desc.srcs))]
    return reference(srcs, desc.axis, src_dtypes=tuple(md.dtype for md in desc.srcs), dst_dtype=desc.dst.dtype)


def _tolerance(desc: ConcatDesc) -> float:
    # Exact: bit copies, or the conversion the reference reproduces bit for bit.
    return 0.0


register(ConcatDesc, generate=generate, reference=_reference, tolerance=_tolerance)
