"""Eltwise backward: ``diff_src = diff_dst * alg'(x)``, the generator of ``EltwiseBackwardDesc``
and its reference.

The derivatives are oneDNN's (src/common/eltwise_pd.hpp's algorithms, the formulas of
ref_eltwise's ``*_bwd``), including the value each takes at its non-differentiable points: relu
and elu take the negative branch at 0, abs gives 0 there, hardsigmoid and hardswish take the
flat side at their kinks, clip (oneDNN's clip_v2) passes nothing at either bound. ``x`` is the
forward's src, or its dst when the descriptor says ``use_dst`` (relu, elu, sigmoid, sqrt, tanh,
clip: derivatives expressible in dst).

One work-item per element with index arithmetic: the three tensors may have different layouts,
and the backward pass is memory bound either way. Storage any of ``_dtype_io.DTYPES``, f32 math.
"""

from __future__ import annotations

import math

import numpy as np

from .._values._eltwise_bwd_desc import ELTWISE_BACKWARD_ALGORITHMS, EltwiseBackwardDesc
from . import _dtype_io, tolerance
from ._registry import register
from ._spec import KernelConfig, KernelSpec, c_float, index_code, padded_global

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_TANH_C = 0.044715
_erf = np.vectorize(math.erf, otypes=[np.float64])  # numpy has no erf; triodnn needs no scipy


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for either sign


def _derivative_c(alg: str, use_dst: bool, alpha: float, beta: float) -> str:
    """OpenCL C statements setting ``float g`` to ``dd * alg'`` from ``float x`` and ``float dd``."""
    a, b = c_float(alpha), c_float(beta)
    if alg == "relu":
        return f"float g = x > 0.0f ? dd : dd * {a};"
    if alg == "abs":
        return "float g = x > 0.0f ? dd : (x < 0.0f ? -dd : 0.0f);"
    if alg == "clip":
        return f"float g = ({a} < x && x < {b}) ? dd : 0.0f;"
    if alg == "elu":
        if use_dst:
            return f"float g = x > 0.0f ? dd : dd * (x + {a});"
        return f"float g = x > 0.0f ? dd : dd * {a} * exp(x);"
    if alg == "sigmoid":
        s = "x" if use_dst else "(1.0f / (1.0f + exp(-x)))"
        return f"const float s = {s}; float g = dd * s * (1.0f - s);"
    if alg == "tanh":
        t = "x" if use_dst else "tanh(x)"
        return f"const float t = {t}; float g = dd * (1.0f - t * t);"
    if alg == "sqrt":
        return "float g = dd / (2.0f * x);" if use_dst else "float g = dd / (2.0f * sqrt(x));"
    if alg == "gelu_erf":
        return (f"float g = dd * (0.5f * (1.0f + erf(x * {c_float(1 / math.sqrt(2.0))}))"
                f" + x * exp(-0.5f * x * x) * {c_float(1 / math.sqrt(2 * math.pi))});")
    if alg == "gelu_tanh":
        k, c = c_float(_SQRT_2_OVER_PI), c_float(_GELU_TANH_C)
        return (f"const float t = tanh({k} * x * (1.0f + {c} * x * x));"
                f" const float dg = {k} * (1.0f + 3.0f * {c} * x * x);"
                " float g = dd * 0.5f * (1.0f + t) * (1.0f + x * (1.0f - t) * dg);")
    if alg == "hardsigmoid":
        return f"const float v = {a} * x + {b}; float g = (v > 0.0f && v < 1.0f) ? dd * {a} : 0.0f;"
    if alg == "hardswish":
        return (f"const float v = {a} * x + {b};"
                f" float g = v <= 0.0f ? 0.0f : (v >= 1.0f ? dd : dd * (2.0f * {a} * x + {b}));")
    if alg == "soft_relu":
        return f"float g = dd / (1.0f + exp(-{a} * x));"
    if alg == "mish":
        # softplus without overflow: max(x, 0) + log1p(exp(-|x|)).
        return ("const float sp = fmax(x, 0.0f) + log1p(exp(-fabs(x))); const float t = tanh(sp);"
                " float g = dd * (t + x * (1.0f - t * t) / (1.0f + exp(-x)));")
    raise AssertionError(alg)  # the descriptor admits only ELTWISE_BACKWARD_ALGORITHMS


def generate(desc: EltwiseBackwardDesc, config: KernelConfig) -> KernelSpec:
    """OpenCL source computing ``diff_src`` from ``src_or_dst`` and ``diff_dst``."""
    desc.check_supported()
    x_md, dd_md, ds_md = desc.src_or_dst, desc.diff_dst, desc.diff_src
    dims = x_md.dims
    n = math.prod(dims)
    local = config.local_size
    offsets = index_code(dims, {"x": x_md.strides, "dd": dd_md.strides, "ds": ds_md.strides}, "i")
    source = (
        _dtype_io.functions(loads=(x_md.dtype, dd_md.dtype), stores=(ds_md.dtype,))
        + "__kernel void eltwise_bwd("
        + f"{_dtype_io.param(x_md.dtype, 'src_or_dst', const=True)}, "
        + f"{_dtype_io.param(dd_md.dtype, 'diff_dst', const=True)}, "
        + f"{_dtype_io.param(ds_md.dtype, 'diff_src', const=False)}) {{\n"
        + f"    const ulong i = get_global_id(0);\n    if (i >= {n}UL) return;\n    {offsets}\n"
        + f"    const float x = {_dtype_io.load(x_md.dtype, 'src_or_dst', 'off_x')};\n"
        + f"    const float dd = {_dtype_io.load(dd_md.dtype, 'diff_dst', 'off_dd')};\n"
        + f"    {_derivative_c(desc.alg, desc.use_dst, desc.alpha, desc.beta)}\n"
        + f"    {_dtype_io.store(ds_md.dtype, 'diff_src', 'off_ds', 'g')}\n}}\n"
    )
    return KernelSpec(
        source=source,
        name="eltwise_bwd",
        arg_names=("src_or_dst", "diff_dst", "diff_src"),
        global_size=(padded_global(n, local),),
        local_size=(local,),
        impl=f"ocl:strided:l{local}",
    )


def derivative(alg: str, x: np.ndarray, *, alpha: float = 0.0, beta: float = 0.0,
               use_dst: bool = False) -> np.ndarray:
    """``alg'`` at ``x`` (src, or dst when ``use_dst``) in float64, as ``_derivative_c``."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        if alg == "relu":
            return np.where(x > 0, 1.0, alpha)
        if alg == "abs":
            return np.sign(x)
        if alg == "clip":
            return ((alpha < x) & (x < beta)).astype(np.float64)
        if alg == "elu":
            return np.where(x > 0, 1.0, x + alpha if use_dst else alpha * np.exp(x))
        if alg == "sigmoid":
            s = x if use_dst else _sigmoid(x)
            return s * (1.0 - s)
        if alg == "tanh":
            t = x if use_dst else np.tanh(x)
            return 1.0 - t * t
        if alg == "sqrt":
            return 1.0 / (2.0 * (x if use_dst else np.sqrt(x)))
        if alg == "gelu_erf":
            return 0.5 * (1.0 + _erf(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        if alg == "gelu_tanh":
            t = np.tanh(_SQRT_2_OVER_PI * x * (1.0 + _GELU_TANH_C * x * x))
            dg = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_TANH_C * x * x)
            return 0.5 * (1.0 + t) * (1.0 + x * (1.0 - t) * dg)
        if alg == "hardsigmoid":
            v = alpha * x + beta
            return np.where((v > 0) & (v < 1), alpha, 0.0)
        if alg == "hardswish":
            v = alpha * x + beta
            return np.where(v <= 0, 0.0, np.where(v >= 1, 1.0, 2.0 * alpha * x + beta))
        if alg == "soft_relu":
            return _sigmoid(alpha * x)
        if alg == "mish":
            t = np.tanh(np.logaddexp(0.0, x))
            return t + x * (1.0 - t * t) * _sigmoid(x)
    raise ValueError(f"no eltwise backward algorithm {alg!r}; known: {tuple(ELTWISE_BACKWARD_ALGORITHMS)}")


def reference(alg: str, x: np.ndarray, diff_dst: np.ndarray, *, alpha: float = 0.0, beta: float = 0.0,
              use_dst: bool = False, diff_src_dtype: str = "f32") -> np.ndarray:
    """``diff_dst * alg'(x)`` in float64 from user-facing values, stored as ``diff_src_dtype``."""
    g = _dtype_io.widen(diff_dst) * derivative(alg, _dtype_io.widen(x), alpha=alpha, beta=beta, use_dst=use_dst)
    return _dtype_io.store_reference(g, diff_src_dtype)


def desc_reference(desc: EltwiseBackwardDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return reference(desc.alg, inputs["src_or_dst"], inputs["diff_dst"], alpha=desc.alpha, beta=desc.beta,
                     use_dst=desc.use_dst, diff_src_dtype=desc.diff_src.dtype)


# benchdnn's eltwise backward check (eltwise.cpp setup_cmp): the forward's thresholds, 4e-6 where
# the derivative is arithmetic and 4e-5 where it goes through exp/tanh/erf (their ulp errors,
# times the chain rule's product).
TRANSCENDENTAL = frozenset({"elu", "sigmoid", "tanh", "gelu_erf", "gelu_tanh", "soft_relu", "mish"})


def threshold(alg: str, use_dst: bool = False) -> float:
    if alg in TRANSCENDENTAL and not (use_dst and alg in ("elu", "sigmoid", "tanh")):
        return tolerance.ELTWISE_TRANSCENDENTAL
    return tolerance.ELTWISE


register(
    EltwiseBackwardDesc, generate=generate, reference=desc_reference,
    tolerance=lambda desc: threshold(desc.alg, desc.use_dst),
)
