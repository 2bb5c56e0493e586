"""Sum forward: ``dst = sum_i scale_i * src_i`` over N same-shaped inputs, generator beside its source.

As oneDNN's sum primitive: every source has dst's dims, each in any layout. Two code paths: all
tensors dense with one layout (flat, vectorised, like binary's flat path), and the general case
(one element per work-item, offsets by index arithmetic). Accumulation is in float, in input
order; a scale of exactly 1.0 multiplies nothing (the product would be exact anyway).

Each source and dst has its own storage type of ``_dtype_io.DTYPES``: values are loaded as float,
summed in f32 and stored with dst's conversion. Non-f32 storage loads and stores element by element
but keeps the vectorised accumulation of the flat path.

Tolerance after benchdnn's sum ``setup_cmp`` (tests/benchdnn/sum/sum.cpp):
``epsilon_dt(ddt) * n_inputs``, i.e. f32 eps times N (see ``threshold``).
"""

from __future__ import annotations

import math

import numpy as np

from .._values._sum_desc import SumDesc
from . import _dtype_io, tolerance
from ._registry import register
from ._spec import (
    VECTOR_TYPES,
    KernelConfig,
    KernelSpec,
    c_float,
    index_code,
    is_dense,
    padded_global,
)

# benchdnn's sum threshold for f32: eps times the number of inputs (kept in kernels/tolerance.py).
threshold = tolerance.sum_


def _term(value: str, scale: float, type_name: str) -> str:
    if scale == 1.0 and math.copysign(1.0, scale) > 0:
        return value
    literal = c_float(scale)
    return f"({type_name})({literal}) * {value}" if type_name != "float" else f"{literal} * {value}"


def _accumulate(values: list[str], scales: tuple[float, ...], type_name: str) -> list[str]:
    """Statements leaving ``acc`` = the scaled sum of ``values``, in order."""
    lines = [f"{type_name} acc = {_term(values[0], scales[0], type_name)};"]
    lines += [f"acc += {_term(v, s, type_name)};" for v, s in zip(values[1:], scales[1:])]
    return lines


def generate(desc: SumDesc, config: KernelConfig) -> KernelSpec:
    """OpenCL source for ``dst = sum(scales[i] * src_i)``, every tensor of dst's dims in its own
    layout and storage type (``_dtype_io.DTYPES``); the sum is f32 either way."""
    desc.check_supported()
    dims, dst_strides, dst_dtype = desc.dst.dims, desc.dst.strides, desc.dst.dtype
    src_strides = tuple(md.strides for md in desc.srcs)
    src_dtypes = tuple(md.dtype for md in desc.srcs)
    scales = desc.scales
    n_inputs = len(desc.srcs)
    names = [f"src{i}" for i in range(n_inputs)]
    n = math.prod(dims)
    local = config.local_size
    flat = is_dense(dims, dst_strides) and all(s == dst_strides for s in src_strides)
    if flat:
        vec = config.vector_width
        vec_type = VECTOR_TYPES[vec]
        full, tail = divmod(n, vec)
        work_items = full + (1 if tail else 0)
        vec_values = [
            _dtype_io.load_vector(dtype, name, "i", vec_type, vec) for name, dtype in zip(names, src_dtypes)
        ]
        tail_values = [_dtype_io.load(dtype, name, "j") for name, dtype in zip(names, src_dtypes)]
        vec_body = "\n        ".join(_accumulate(vec_values, scales, vec_type))
        tail_body = "\n            ".join(_accumulate(tail_values, scales, "float"))
        body = f"""
    const ulong i = get_global_id(0);
    if (i < {full}UL) {{
        {vec_body}
        {_dtype_io.store_vector(dst_dtype, "dst", "i", vec_type, vec, "acc")}
    }} else if (i == {full}UL) {{
        for (ulong j = i * {vec}UL; j < {n}UL; ++j) {{
            {tail_body}
            {_dtype_io.store(dst_dtype, "dst", "j", "acc")}
        }}
    }}"""
        impl = f"ocl:flat:{config.name}"
    else:
        work_items = n
        offsets = index_code(dims, {**dict(zip(names, src_strides)), "dst": dst_strides}, "i")
        values = [_dtype_io.load(dtype, name, f"off_{name}") for name, dtype in zip(names, src_dtypes)]
        acc = "\n    ".join(_accumulate(values, scales, "float"))
        body = f"""
    const ulong i = get_global_id(0);
    if (i >= {n}UL) return;
    {offsets}
    {acc}
    {_dtype_io.store(dst_dtype, "dst", "off_dst", "acc")}"""
        impl = f"ocl:strided:l{local}"
    params = ", ".join(_dtype_io.param(dtype, name, const=True) for name, dtype in zip(names, src_dtypes))
    source = (
        _dtype_io.functions(loads=src_dtypes, stores=(dst_dtype,))
        + f"__kernel void sum_fwd({params}, {_dtype_io.param(dst_dtype, 'dst', const=False)}) {{"
        + body
        + "\n}\n"
    )
    return KernelSpec(
        source=source,
        name="sum_fwd",
        arg_names=(*names, "dst"),
        global_size=(padded_global(work_items, local),),
        local_size=(local,),
        impl=impl,
    )


def reference(srcs, scales=None, *, dst_dtype: str = "f32") -> np.ndarray:
    """``sum(scales[i] * srcs[i])`` of user-facing values of any data type, in float64 and input
    order, rounded to float32 and stored as ``dst_dtype`` (user-facing values: bf16 as float32)."""
    srcs = [_dtype_io.widen(s) for s in srcs]
    if not srcs:
        raise ValueError("sum needs at least one input")
    if scales is None:
        scales = (1.0,) * len(srcs)
    if len(scales) != len(srcs):
        raise ValueError(f"{len(scales)} scales for {len(srcs)} inputs")
    acc = float(scales[0]) * srcs[0]
    for s, x in zip(scales[1:], srcs[1:]):
        acc = acc + float(s) * x
    return _dtype_io.store_reference(acc.astype(np.float32), dst_dtype)


def _reference(desc: SumDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    srcs = [inputs[f"src{i}"] for i in range(len(desc.srcs))]
    return reference(srcs, desc.scales, dst_dtype=desc.dst.dtype)


def _tolerance(desc: SumDesc) -> float:
    # benchdnn's eps * N on the f32 sum, or one rounding of dst's storage where that is coarser
    # (the reference rounds to dst's type too, but from the float64 sum).
    return max(tolerance.sum_(len(desc.srcs)), _dtype_io.EPSILON[desc.dst.dtype])


register(SumDesc, generate=generate, reference=_reference, tolerance=_tolerance)
