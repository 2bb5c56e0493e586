"""Eltwise forward: ``dst = f(src)`` elementwise, generator beside its OpenCL source and reference.

Algorithms follow oneDNN's names and parameters: ``relu`` takes the negative slope ``alpha``;
``clip`` keeps ``alpha < x <= beta``; ``linear`` is ``alpha*x + beta``, ``pow`` is ``alpha*x**beta``,
``hardsigmoid`` is ``max(0, min(1, alpha*x + beta))`` and ``hardswish`` is ``x`` times it; ``elu``,
``swish`` and ``soft_relu`` take ``alpha`` as oneDNN does. ``leaky_relu`` is ``relu`` under the
graph API's name. Where oneDNN gives a parameter a value of its own (``DEFAULTS``), an omitted
``alpha``/``beta`` takes it; every other omitted parameter is 0.

Dense tensors with matching strides run flat, ``vector_width`` elements per work-item (pointer
casts, not vloadN: PoCL keeps vloadN as a call); anything else runs one element per work-item with
index arithmetic.

``src`` and ``dst`` each have any storage type of ``_dtype_io.DTYPES``; the math is f32, and the
result is stored with dst's conversion (see ``_dtype_io``). Non-f32 storage loads and stores
element by element but keeps the vectorised math of the flat path.
"""

from __future__ import annotations

import math
import string

import numpy as np

from . import _dtype_io
from ._spec import (
    VECTOR_TYPES,
    KernelConfig,
    KernelSpec,
    c_float,
    index_code,
    is_dense,
    padded_global,
)

# The OpenCL expression of each algorithm in terms of ``x`` of type ``$T``, with ``$alpha`` and
# ``$beta`` standing for literals. Ternaries instead of fmax/fabs/fmin: PoCL does not inline
# built-ins, and the ternary vectorises.
_EXPRESSIONS: dict[str, str] = {
    "relu": "x > ($T)(0.0f) ? x : x * $alpha",
    # The logistic form avoids 1 + tanh, which cancels for negative x (and PoCL's tanh(-inf) is
    # -0.99999994, which left 0.5*x*(1+tanh) far off for large -x); gelu_erf is in _BODIES.
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
    "leaky_relu": "x > ($T)(0.0f) ? x : x * $alpha",
    # expm1, not exp - 1: exp(x) - 1 loses every digit for small |x|.
    "elu": "x > ($T)(0.0f) ? x : $alpha * expm1(x)",
    # x / (1 + exp(-alpha*x)) rather than x * sigmoid(alpha*x): one rounding less; where exp
    # overflows the result is x / inf = -0, the limit.
    "swish": "x / (($T)(1.0f) + exp(($T)(-$alpha) * x))",
    # rint rounds half to even in the default rounding mode, as numpy.round does, and keeps -0.
    "round": "rint(x)",
    "linear": "($alpha) * x + ($beta)",
    "pow": "($alpha) * pow(x, ($T)($beta))",
    "reciprocal": "($T)(1.0f) / x",
}

# gelu_erf = 0.5 x erfc(-x / sqrt2), erfc inlined (PoCL keeps erfc and exp as calls: 4.7 GB/s on
# 16M elements with the call, torch 5.9). With z = |x| / sqrt2 and t = 1 / (1 + z/2),
# erfc(z) = t exp(-z^2 + P(t)) (the form of Numerical Recipes' erfcc), P of degree 9 fitted
# (Chebyshev least squares against mpmath) on t in [1/(1 + 9.3/2), 1]: |error| 4.4e-8 in the
# exponent, so relative in erfc(z); for x > 0 erfc(-z) = 2 - erfc(z). No 1 + erf cancels: for
# x << 0 the result keeps its relative accuracy down to the f32 range. z^2 = x^2 / 2 is not
# rounded: x splits into xh (12 significant bits, xh^2 exact) and x - xh. exp is Cephes' expf (as
# sdpa's: Cody-Waite reduction against the exact -xh^2 / 2, degree-5 polynomial, 2^(n + 24) put
# in the exponent bits, scaled by 2^-24 at the end so that it stays normal down to n = -149; the
# round to integer by adding 1.5 * 2^23). Beyond z = 10 erfc is taken as 0 (also z = inf: gelu(+inf)
# = inf, gelu(-inf) = -inf * 0 = NaN, as the reference's). Measured on 4M points of [-20, 20]
# against float64 erfc: max relative error 4.1e-7 wherever the result is a normal f32.
_GELU_ERF_P = (
    -1.2654266523849653, 0.9982058761617488, 0.3902571638442186, 0.017526168364312176,
    0.050936560342377334, -0.1728714879595718, -0.5852668810141055, 1.0739912893514847,
    -0.6459113302175471, 0.13855933599040032,
)
_GELU_ERF_EXP = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
                 5.0000001201e-1)
_GELU_ERF = (
    "const $T z = x < ($T)(0.0f) ? x * ($T)(-0.70710678118654752f) : x * ($T)(0.70710678118654752f);"
    " const $T t = ($T)(1.0f) / (($T)(1.0f) + ($T)(0.5f) * z);"
    f" $T p = ($T)({c_float(_GELU_ERF_P[-1])});"
    + "".join(f" p = p * t + ($T)({c_float(c)});" for c in reversed(_GELU_ERF_P[:-1]))
    + " const $T xh = as_$T(as_$I(x) & ($I)(-4096));"
    " const $T rest = p - ($T)(0.5f) * ((x - xh) * (x + xh)); const $T hh = ($T)(0.5f) * (xh * xh);"
    f" const $T tn = (rest - hh) * ($T)({c_float(1.44269504088896341)}) + ($T)({c_float(12582912.0)});"
    f" const $T n = tn - ($T)({c_float(12582912.0)});"
    f" const $T r = ((-hh - n * ($T)({c_float(0.693359375)})) + rest) - n * ($T)({c_float(-2.12194440e-4)});"
    f" $T y = ($T)({c_float(_GELU_ERF_EXP[0])});"
    + "".join(f" y = y * r + ($T)({c_float(c)});" for c in _GELU_ERF_EXP[1:])
    + " y = y * (r * r) + r + ($T)(1.0f);"
    # erfc(z) * 2^24: 2^(n + 24) stays a normal number down to n = -149.
    " const $T e = t * as_$T(as_$I(y) + ((as_$I(tn) - ($I)(0x4b400000 - 24)) << 23));"
    " const $T ec = z > ($T)(10.0f) ? ($T)(0.0f) : e;"
    f" return x < ($T)(0.0f) ? (($T)(0.5f) * x * ec) * ($T)({c_float(2.0 ** -24)})"
    f" : ($T)(0.5f) * x * (($T)(2.0f) - ec * ($T)({c_float(2.0 ** -24)}));"
)

# Algorithms that need local values: a function body rather than one expression. mish is
# x * tanh(softplus(x)) = x * n / (n + 2) with u = e^x, n = u * (u + 2): no cancellation for large
# negative x (n ~ 2u, the result ~ x*u) and one exp instead of exp, log and tanh. n/(n+2) rounds to
# 1 in f32 from x ~ 9 on, and u*u overflows (inf/inf is NaN) from x ~ 44: x is returned above 20.
# soft_relu is softplus(alpha*x) / alpha with softplus(z) = max(z, 0) + log1p(exp(-|z|)), and
# max(z, 0) / alpha written as x where z > 0: log(1 + exp(z)) overflows for z > 88 and loses the
# small tail for large negative z, and (alpha*x)/alpha is inf where alpha*x overflows.
# hardswish returns 0 and x exactly on its saturated ranges rather than x * 0 and x * 1:
# hardswish(-inf) is 0, not the NaN of -inf * 0. A NaN t fails both tests and stays NaN.
_BODIES: dict[str, str] = {
    "gelu_erf": _GELU_ERF,
    "hardswish": (
        "const $T t = ($alpha) * x + ($beta);"
        " return t <= ($T)(0.0f) ? ($T)(0.0f) : (t >= ($T)(1.0f) ? x : x * t);"
    ),
    "hardsigmoid": (
        "const $T t = ($alpha) * x + ($beta);"
        " return t <= ($T)(0.0f) ? ($T)(0.0f) : (t >= ($T)(1.0f) ? ($T)(1.0f) : t);"
    ),
    "mish": (
        "const $T u = exp(x); const $T n = u * (u + ($T)(2.0f));"
        " return x > ($T)(20.0f) ? x : x * n / (n + ($T)(2.0f));"
    ),
    "soft_relu": (
        "const $T z = ($alpha) * x; const $T m = z < ($T)(0.0f) ? z : -z;"
        " return (z > ($T)(0.0f) ? x : ($T)(0.0f)) + log1p(exp(m)) / ($alpha);"
    ),
}

ALGORITHMS: tuple[str, ...] = tuple(_EXPRESSIONS) + tuple(_BODIES)

# Algorithms whose result goes through a transcendental built-in (looser tolerance). rint is
# exact, so round is not one.
TRANSCENDENTAL: frozenset[str] = frozenset(
    {"gelu_erf", "gelu_tanh", "tanh", "sigmoid", "exp", "log", "elu", "swish", "mish", "soft_relu", "pow"}
)

# (alpha, beta) of an algorithm whose parameters oneDNN fixes or defaults: the graph API's
# HardSwish is x * max(0, min(1, x/6 + 1/2)), and soft_relu without alpha is log(1 + e^x) (oneDNN
# v2's soft_relu, v3's soft_relu with alpha = 1). Everything else defaults to (0, 0).
DEFAULTS: dict[str, tuple[float, float]] = {
    "hardswish": (1.0 / 6.0, 0.5),
    "soft_relu": (1.0, 0.0),
}

# Algorithms dividing by alpha: alpha = 0 has no meaning there.
NONZERO_ALPHA: frozenset[str] = frozenset({"soft_relu"})


def parameters(alg: str, alpha: float | None, beta: float | None) -> tuple[float, float]:
    """``alpha`` and ``beta`` with None replaced by the algorithm's default."""
    default_alpha, default_beta = DEFAULTS.get(alg, (0.0, 0.0))
    return (
        default_alpha if alpha is None else float(alpha),
        default_beta if beta is None else float(beta),
    )


def _function(name: str, type_name: str, alg: str, alpha: float, beta: float) -> str:
    body = _BODIES.get(alg) or f"return {_EXPRESSIONS[alg]};"
    code = string.Template(body).substitute(
        T=type_name, I=type_name.replace("float", "int"), alpha=c_float(alpha), beta=c_float(beta)
    )
    return f"static inline {type_name} {name}(const {type_name} x) {{ {code} }}\n"


def generate(
    alg: str,
    *,
    dims: tuple[int, ...],
    src_strides: tuple[int, ...],
    dst_strides: tuple[int, ...],
    alpha: float | None = None,
    beta: float | None = None,
    config: KernelConfig,
    post_ops: tuple = (),
    src_dtype: str = "f32",
    dst_dtype: str = "f32",
) -> KernelSpec:
    """OpenCL source computing ``alg`` from ``src`` into ``dst`` (may be one buffer when they
    share a layout and data type).

    ``src_dtype``/``dst_dtype``: storage types (``_dtype_io.DTYPES``), the math f32 either way.
    ``alpha``/``beta`` of None take the algorithm's default (``DEFAULTS``, else 0). ``post_ops``: a
    validated chain (see ``_post_ops``; binary operands f32), applied before the store; a binary
    operand that needs broadcasting sends the kernel down the strided path (impl
    ``ocl:strided:...:po_bcast``)."""
    from . import _post_ops  # here: _post_ops imports this module

    if alg not in ALGORITHMS:
        raise ValueError(f"unknown eltwise algorithm {alg!r}; known: {', '.join(ALGORITHMS)}")
    _dtype_io.check_dtype("src", src_dtype)
    _dtype_io.check_dtype("dst", dst_dtype)
    alpha, beta = parameters(alg, alpha, beta)
    if alg in NONZERO_ALPHA and alpha == 0.0:
        raise ValueError(f"{alg} needs a nonzero alpha")
    n = math.prod(dims)
    local = config.local_size
    scalar_fn = _function("op_scalar", "float", alg, alpha, beta)
    flat = src_strides == dst_strides and is_dense(dims, src_strides)
    access = _post_ops.operand_access(post_ops, dims, dst_strides) if flat else None
    po_bcast = flat and access is None
    flat = flat and access is not None
    po_names = _post_ops.arg_names(post_ops)
    types = ("float",)
    if flat:
        vec = config.vector_width
        full, tail = divmod(n, vec)
        work_items = full + (1 if tail else 0)
        vec_type = VECTOR_TYPES[vec]
        vector_fn = _function("op_vector", vec_type, alg, alpha, beta) if vec > 1 else ""
        if vec > 1:
            types = ("float", vec_type)
        apply_vec, apply_tail = _dtype_io.apply_post_ops_flat(post_ops, "v", vec_type, vec, access, dst_dtype)
        load_vec = _dtype_io.load_vector(src_dtype, "src", "i", vec_type, vec)
        store_vec = _dtype_io.store_vector(dst_dtype, "dst", "i", vec_type, vec, "v")
        load_tail = _dtype_io.load(src_dtype, "src", "j")
        store_tail = _dtype_io.store(dst_dtype, "dst", "j", "v")
        body = f"""
    const ulong i = get_global_id(0);
    if (i < {full}UL) {{
        {vec_type} v = {"op_vector" if vec > 1 else "op_scalar"}({load_vec});
        {apply_vec}
        {store_vec}
    }} else if (i == {full}UL) {{
        for (ulong j = i * {vec}UL; j < {n}UL; ++j) {{ float v = op_scalar({load_tail}); {apply_tail} {store_tail} }}
    }}"""
        impl = f"ocl:flat:{config.name}"
    else:
        vector_fn = ""
        work_items = n
        offsets = index_code(
            dims,
            {"src": src_strides, "dst": dst_strides, **_post_ops.operand_strides(post_ops, len(dims))},
            "i",
        )
        apply = _dtype_io.apply_post_ops_scalar(
            post_ops, "v", "off_dst", {name: f"off_{name}" for name in po_names}, dst_dtype
        )
        body = f"""
    const ulong i = get_global_id(0);
    if (i >= {n}UL) return;
    {offsets}
    float v = op_scalar({_dtype_io.load(src_dtype, "src", "off_src")});
    {apply}
    {_dtype_io.store(dst_dtype, "dst", "off_dst", "v")}"""
        impl = f"ocl:strided:l{local}" + (":po_bcast" if po_bcast else "")
    source = (
        _dtype_io.functions(loads=(src_dtype, dst_dtype), stores=(dst_dtype,))
        + scalar_fn
        + vector_fn
        + _post_ops.functions(post_ops, types)
        + f"__kernel void eltwise_fwd({_dtype_io.param(src_dtype, 'src', const=True)},"
        + _post_ops.params(post_ops)
        + f" {_dtype_io.param(dst_dtype, 'dst', const=False)}) {{"
        + body
        + "\n}\n"
    )
    return KernelSpec(
        source=source,
        name="eltwise_fwd",
        arg_names=("src", *po_names, "dst"),
        global_size=(padded_global(work_items, local),),
        local_size=(local,),
        impl=impl,
    )


def _erf(x: np.ndarray) -> np.ndarray:
    return np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)


def reference(
    alg: str,
    src: np.ndarray,
    *,
    alpha: float | None = None,
    beta: float | None = None,
    dst_dtype: str = "f32",
) -> np.ndarray:
    """``alg`` applied to ``src`` (user-facing values of any data type) in float64, rounded to
    float32 and stored as ``dst_dtype`` (user-facing values: bf16 as float32): the textbook
    formulas, as float64's range and precision cover float32's; only softplus needs logaddexp,
    which stays finite where exp overflows."""
    x = _dtype_io.widen(src)
    alpha, beta = parameters(alg, alpha, beta) if alg in ALGORITHMS else (0.0, 0.0)
    a, b = float(np.float32(alpha)), float(np.float32(beta))
    with np.errstate(all="ignore"):
        if alg in ("relu", "leaky_relu"):
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
        elif alg == "elu":
            y = np.where(x > 0, x, a * np.expm1(x))
        elif alg == "swish":
            y = x / (1.0 + np.exp(-a * x))
        elif alg in ("hardswish", "hardsigmoid"):
            t = a * x + b
            hs = np.where(t <= 0, 0.0, np.where(t >= 1, 1.0, t))  # NaN stays NaN
            y = hs if alg == "hardsigmoid" else np.where(t <= 0, 0.0, np.where(t >= 1, x, x * t))
        elif alg == "round":
            y = np.rint(x)
        elif alg == "linear":
            y = a * x + b
        elif alg == "pow":
            y = a * np.power(x, b)
        elif alg == "reciprocal":
            y = 1.0 / x
        elif alg == "mish":
            y = x * np.tanh(np.logaddexp(0.0, x))
        elif alg == "soft_relu":
            y = np.logaddexp(0.0, a * x) / a
        else:
            raise ValueError(f"unknown eltwise algorithm {alg!r}; known: {', '.join(ALGORITHMS)}")
    return _dtype_io.store_reference(y.astype(np.float32), dst_dtype)
