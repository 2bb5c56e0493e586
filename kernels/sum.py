"""Sum forward: ``dst = sum_i scale_i * src_i`` over N same-shaped inputs, generator beside its source.

As oneDNN's sum primitive: every source has dst's dims, each in any layout. Two code paths: all
tensors dense with one layout (flat, vectorised, like binary's flat path), and the general case
(one element per work-item, offsets by index arithmetic). Accumulation is in float, in input
order; a scale of exactly 1.0 multiplies nothing (the product would be exact anyway).

Tolerance after benchdnn's sum ``setup_cmp`` (tests/benchdnn/sum/sum.cpp):
``epsilon_dt(ddt) * n_inputs``, i.e. f32 eps times N (see ``threshold``).
"""

from __future__ import annotations

import math

import numpy as np

from ._spec import (
    VECTOR_TYPES,
    KernelConfig,
    KernelSpec,
    c_float,
    index_code,
    is_dense,
    padded_global,
)

MAX_INPUTS = 64

_F32_EPS = float(np.finfo(np.float32).eps)


def threshold(n_inputs: int) -> float:
    """benchdnn's sum threshold for f32: eps times the number of inputs."""
    return _F32_EPS * n_inputs


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


def generate(
    *,
    dims: tuple[int, ...],
    src_strides: tuple[tuple[int, ...], ...],
    scales: tuple[float, ...],
    dst_strides: tuple[int, ...],
    config: KernelConfig,
) -> KernelSpec:
    """OpenCL source for ``dst = sum(scales[i] * src_i)``; all of shape ``dims``."""
    n_inputs = len(src_strides)
    if not 1 <= n_inputs <= MAX_INPUTS:
        raise ValueError(f"sum takes 1 to {MAX_INPUTS} inputs, got {n_inputs}")
    if len(scales) != n_inputs:
        raise ValueError(f"{len(scales)} scales for {n_inputs} inputs")
    for strides in (*src_strides, dst_strides):
        if len(strides) != len(dims):
            raise ValueError(f"strides {strides} do not match dims {dims}")
    names = [f"src{i}" for i in range(n_inputs)]
    n = math.prod(dims)
    local = config.local_size
    flat = is_dense(dims, dst_strides) and all(s == dst_strides for s in src_strides)
    if flat:
        vec = config.vector_width
        vec_type = VECTOR_TYPES[vec]
        full, tail = divmod(n, vec)
        work_items = full + (1 if tail else 0)
        vec_values = [f"((__global const {vec_type}*){name})[i]" for name in names]
        tail_values = [f"{name}[j]" for name in names]
        vec_body = "\n        ".join(_accumulate(vec_values, scales, vec_type))
        tail_body = "\n            ".join(_accumulate(tail_values, scales, "float"))
        body = f"""
    const ulong i = get_global_id(0);
    if (i < {full}UL) {{
        {vec_body}
        ((__global {vec_type}*)dst)[i] = acc;
    }} else if (i == {full}UL) {{
        for (ulong j = i * {vec}UL; j < {n}UL; ++j) {{
            {tail_body}
            dst[j] = acc;
        }}
    }}"""
        impl = f"ocl:flat:{config.name}"
    else:
        work_items = n
        offsets = index_code(dims, {**dict(zip(names, src_strides)), "dst": dst_strides}, "i")
        values = [f"{name}[off_{name}]" for name in names]
        acc = "\n    ".join(_accumulate(values, scales, "float"))
        body = f"""
    const ulong i = get_global_id(0);
    if (i >= {n}UL) return;
    {offsets}
    {acc}
    dst[off_dst] = acc;"""
        impl = f"ocl:strided:l{local}"
    params = ", ".join(f"__global const float* {name}" for name in names)
    source = f"__kernel void sum_fwd({params}, __global float* dst) {{" + body + "\n}\n"
    return KernelSpec(
        source=source,
        name="sum_fwd",
        arg_names=(*names, "dst"),
        global_size=(padded_global(work_items, local),),
        local_size=(local,),
        impl=impl,
    )


def reference(srcs, scales=None) -> np.ndarray:
    """``sum(scales[i] * srcs[i])`` in float64, in input order, returned as float32."""
    srcs = [np.asarray(s, dtype=np.float64) for s in srcs]
    if not srcs:
        raise ValueError("sum needs at least one input")
    if scales is None:
        scales = (1.0,) * len(srcs)
    if len(scales) != len(srcs):
        raise ValueError(f"{len(scales)} scales for {len(srcs)} inputs")
    acc = float(scales[0]) * srcs[0]
    for s, x in zip(scales[1:], srcs[1:]):
        acc = acc + float(s) * x
    return acc.astype(np.float32)
