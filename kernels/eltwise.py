"""Eltwise forward: ``dst = f(src)`` elementwise, generator beside its OpenCL source and reference.

Algorithms follow oneDNN's names and parameters: ``relu`` takes the negative slope ``alpha``;
``clip`` keeps ``alpha < x <= beta``. Dense tensors with matching strides run flat, ``vector_width``
elements per work-item (pointer casts, not vloadN: PoCL keeps vloadN as a call); anything else
runs one element per work-item with index arithmetic.
"""

from __future__ import annotations

import math
import string

import numpy as np

from ._spec import KernelConfig, KernelSpec, c_float, index_code, is_dense, padded_global

# The OpenCL expression of each algorithm in terms of ``x`` of type ``$T``, with ``$alpha`` and
# ``$beta`` standing for literals. Ternaries instead of fmax/fabs/fmin: PoCL does not inline
# built-ins, and the ternary vectorises.
_EXPRESSIONS: dict[str, str] = {
    "relu": "x > ($T)(0.0f) ? x : x * $alpha",
    # erfc and the logistic form avoid 1 + erf / 1 + tanh, which cancel for negative x (and
    # PoCL's tanh(-inf) is -0.99999994, which left 0.5*x*(1+tanh) far off for large -x).
    "gelu_erf": "($T)(0.5f) * x * erfc(x * ($T)(-0.70710678118654752f))",
    "gelu_tanh": (
        "x / (($T)(1.0f) + exp(($T)(-1.5957691216057308f) * (x + ($T)(0.044715f) * x * x * x)))"
    ),
    "tanh": "tanh(x)",
    "sigmoid": "($T)(1.0f) / (($T)(1.0f) + exp(-x))",
    "exp": "exp(x)",
    "log": "log(x)",
    "abs": "x < ($T)(0.0f) ? -x : x",
    "sqrt": "sqrt(x)",
    "square": "x * x",
    "clip": "x > ($T)($beta) ? ($T)($beta) : (x <= ($T)($alpha) ? ($T)($alpha) : x)",
}

ALGORITHMS: tuple[str, ...] = tuple(_EXPRESSIONS)

# Algorithms whose result goes through a transcendental built-in (looser tolerance).
TRANSCENDENTAL: frozenset[str] = frozenset({"gelu_erf", "gelu_tanh", "tanh", "sigmoid", "exp", "log"})

_VECTOR_TYPES = {1: "float", 2: "float2", 4: "float4", 8: "float8", 16: "float16"}


def _function(name: str, type_name: str, alg: str, alpha: float, beta: float) -> str:
    expr = string.Template(_EXPRESSIONS[alg]).substitute(
        T=type_name, alpha=c_float(alpha), beta=c_float(beta)
    )
    return f"static inline {type_name} {name}(const {type_name} x) {{ return {expr}; }}\n"


def generate(
    alg: str,
    *,
    dims: tuple[int, ...],
    src_strides: tuple[int, ...],
    dst_strides: tuple[int, ...],
    alpha: float = 0.0,
    beta: float = 0.0,
    config: KernelConfig,
) -> KernelSpec:
    """OpenCL source computing ``alg`` from ``src`` into ``dst`` (both f32, may be one buffer)."""
    if alg not in _EXPRESSIONS:
        raise ValueError(f"unknown eltwise algorithm {alg!r}; known: {', '.join(ALGORITHMS)}")
    n = math.prod(dims)
    local = config.local_size
    scalar_fn = _function("op_scalar", "float", alg, alpha, beta)
    flat = src_strides == dst_strides and is_dense(dims, src_strides)
    if flat:
        vec = config.vector_width
        full, tail = divmod(n, vec)
        work_items = full + (1 if tail else 0)
        vec_type = _VECTOR_TYPES[vec]
        vector_fn = _function("op_vector", vec_type, alg, alpha, beta) if vec > 1 else ""
        body = f"""
    const ulong i = get_global_id(0);
    if (i < {full}UL) {{
        ((__global {vec_type}*)dst)[i] = {"op_vector" if vec > 1 else "op_scalar"}(((__global const {vec_type}*)src)[i]);
    }} else if (i == {full}UL) {{
        for (ulong j = i * {vec}UL; j < {n}UL; ++j) dst[j] = op_scalar(src[j]);
    }}"""
        impl = f"ocl:flat:{config.name}"
    else:
        vector_fn = ""
        work_items = n
        offsets = index_code(dims, {"src": src_strides, "dst": dst_strides}, "i")
        body = f"""
    const ulong i = get_global_id(0);
    if (i >= {n}UL) return;
    {offsets}
    dst[off_dst] = op_scalar(src[off_src]);"""
        impl = f"ocl:strided:l{local}"
    source = (
        scalar_fn
        + vector_fn
        + "__kernel void eltwise_fwd(__global const float* src, __global float* dst) {"
        + body
        + "\n}\n"
    )
    return KernelSpec(
        source=source,
        name="eltwise_fwd",
        arg_names=("src", "dst"),
        global_size=(padded_global(work_items, local),),
        local_size=(local,),
        impl=impl,
    )


def _erf(x: np.ndarray) -> np.ndarray:
    return np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)


def reference(alg: str, src: np.ndarray, *, alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """``alg`` applied to ``src`` in float64, returned as float32."""
    x = np.asarray(src, dtype=np.float64)
    a, b = float(np.float32(alpha)), float(np.float32(beta))
    with np.errstate(all="ignore"):
        if alg == "relu":
            y = np.where(x > 0, x, x * a)
        elif alg == "gelu_erf":
            y = 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
        elif alg == "gelu_tanh":
            y = 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
        elif alg == "tanh":
            y = np.tanh(x)
        elif alg == "sigmoid":
            y = 1.0 / (1.0 + np.exp(-x))
        elif alg == "exp":
            y = np.exp(x)
        elif alg == "log":
            y = np.log(x)
        elif alg == "abs":
            y = np.abs(x)
        elif alg == "sqrt":
            y = np.sqrt(x)
        elif alg == "square":
            y = x * x
        elif alg == "clip":
            y = np.where(x > b, b, np.where(x <= a, a, x))
        else:
            raise ValueError(f"unknown eltwise algorithm {alg!r}; known: {', '.join(ALGORITHMS)}")
    return y.astype(np.float32)
