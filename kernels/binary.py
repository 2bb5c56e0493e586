"""Binary forward: ``dst = op(src0, src1)`` with numpy broadcasting, generator beside its source.

Shapes are aligned from the right, as numpy does; a dimension of 1 broadcasts. Three code paths:
all three tensors dense with one layout (flat, vectorised), ``src1`` a single value broadcast over
a dense ``src0`` (flat, vectorised), and the general case (one element per work-item, offsets by
index arithmetic with stride 0 on broadcast dimensions).
"""

from __future__ import annotations

import math

import numpy as np

from ._spec import KernelConfig, KernelSpec, index_code, is_dense, padded_global

# min/max as ternaries: fmin/fmax stay calls on PoCL. NaN handling differs from numpy's.
_EXPRESSIONS: dict[str, str] = {
    "add": "a + b",
    "sub": "a - b",
    "mul": "a * b",
    "div": "a / b",
    "min": "b < a ? b : a",
    "max": "b > a ? b : a",
}

ALGORITHMS: tuple[str, ...] = tuple(_EXPRESSIONS)

_VECTOR_TYPES = {1: "float", 2: "float2", 4: "float4", 8: "float8", 16: "float16"}


def broadcast_dims(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The numpy broadcast of ``shapes``; ValueError when they do not broadcast."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"shapes {', '.join(map(str, shapes))} do not broadcast") from None


def _aligned_strides(dims: tuple[int, ...], strides: tuple[int, ...], ndims: int) -> tuple[int, ...]:
    """Strides of a tensor right-aligned to ``ndims`` dimensions, 0 where it broadcasts."""
    pad = ndims - len(dims)
    return (0,) * pad + tuple(0 if d == 1 else s for d, s in zip(dims, strides))


def generate(
    alg: str,
    *,
    src0_dims: tuple[int, ...],
    src0_strides: tuple[int, ...],
    src1_dims: tuple[int, ...],
    src1_strides: tuple[int, ...],
    dst_strides: tuple[int, ...],
    config: KernelConfig,
) -> KernelSpec:
    """OpenCL source for ``dst = alg(src0, src1)``; dst has the broadcast shape of the sources."""
    if alg not in _EXPRESSIONS:
        raise ValueError(f"unknown binary algorithm {alg!r}; known: {', '.join(ALGORITHMS)}")
    dims = broadcast_dims(src0_dims, src1_dims)
    if len(dst_strides) != len(dims):
        raise ValueError(f"dst_strides {dst_strides} do not match broadcast dims {dims}")
    n = math.prod(dims)
    local = config.local_size
    expr = _EXPRESSIONS[alg]
    s0 = _aligned_strides(src0_dims, src0_strides, len(dims))
    s1 = _aligned_strides(src1_dims, src1_strides, len(dims))
    dense_dst = is_dense(dims, dst_strides)
    same_layout = dense_dst and s0 == dst_strides and tuple(src0_dims) == dims
    if same_layout and (s1 == dst_strides or math.prod(src1_dims) == 1):
        vec = config.vector_width
        vec_type = _VECTOR_TYPES[vec]
        full, tail = divmod(n, vec)
        work_items = full + (1 if tail else 0)
        scalar_b = math.prod(src1_dims) == 1 and s1 != dst_strides
        b_vec = f"(({vec_type})(src1[0]))" if scalar_b else f"((__global const {vec_type}*)src1)[i]"
        b_tail = "src1[0]" if scalar_b else "src1[j]"
        body = f"""
    const ulong i = get_global_id(0);
    if (i < {full}UL) {{
        const {vec_type} a = ((__global const {vec_type}*)src0)[i];
        const {vec_type} b = {b_vec};
        ((__global {vec_type}*)dst)[i] = {expr};
    }} else if (i == {full}UL) {{
        for (ulong j = i * {vec}UL; j < {n}UL; ++j) {{
            const float a = src0[j];
            const float b = {b_tail};
            dst[j] = {expr};
        }}
    }}"""
        impl = f"ocl:{'scalar_b' if scalar_b else 'flat'}:{config.name}"
    else:
        work_items = n
        offsets = index_code(dims, {"src0": s0, "src1": s1, "dst": dst_strides}, "i")
        body = f"""
    const ulong i = get_global_id(0);
    if (i >= {n}UL) return;
    {offsets}
    const float a = src0[off_src0];
    const float b = src1[off_src1];
    dst[off_dst] = {expr};"""
        impl = f"ocl:broadcast:l{local}"
    source = (
        "__kernel void binary_fwd(__global const float* src0, __global const float* src1,"
        " __global float* dst) {" + body + "\n}\n"
    )
    return KernelSpec(
        source=source,
        name="binary_fwd",
        arg_names=("src0", "src1", "dst"),
        global_size=(padded_global(work_items, local),),
        local_size=(local,),
        impl=impl,
    )


def reference(alg: str, src0: np.ndarray, src1: np.ndarray) -> np.ndarray:
    """``alg`` of the broadcast sources in float64, returned as float32."""
    a = np.asarray(src0, dtype=np.float64)
    b = np.asarray(src1, dtype=np.float64)
    with np.errstate(all="ignore"):
        if alg == "add":
            y = a + b
        elif alg == "sub":
            y = a - b
        elif alg == "mul":
            y = a * b
        elif alg == "div":
            y = a / b
        elif alg == "min":
            y = np.minimum(a, b)
        elif alg == "max":
            y = np.maximum(a, b)
        else:
            raise ValueError(f"unknown binary algorithm {alg!r}; known: {', '.join(ALGORITHMS)}")
    return y.astype(np.float32)
