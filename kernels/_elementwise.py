"""The math of the eltwise and binary algorithms, once: their OpenCL C (expression tables and the
helper function of an eltwise algorithm) and the numpy formulas the kernels are checked against.

The eltwise and binary generators and the post-op chains of every kind (``_post_ops``) build
from these; this module imports no generator, so all of them can import it. The references here
take float64 arrays (the inputs as the kernels' f32 loads see them, ``widen``) and return the f32
result; ``eltwise.reference`` and ``binary.reference`` add the storage conversions of
``_dtype_io``.
"""

from __future__ import annotations

import math
import string

import numpy as np

from .._values._algorithms import COMPARISONS, TERNARY, eltwise_parameters
from ._spec import c_float

# The OpenCL expression of each algorithm in terms of ``x`` of type ``$T``, with ``$alpha`` and
# ``$beta`` standing for literals. Ternaries instead of fmax/fabs/fmin: PoCL does not inline
# built-ins, and the ternary vectorises.
ELTWISE_EXPRESSIONS: dict[str, str] = {
    "relu": "x > ($T)(0.0f) ? x : x * $alpha",
    # The logistic form avoids 1 + tanh, which cancels for negative x (and PoCL's tanh(-inf) is
    # -0.99999994, which left 0.5*x*(1+tanh) far off for large -x); gelu_erf is in ELTWISE_BODIES.
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
ELTWISE_BODIES: dict[str, str] = {
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

ELTWISE_ALGORITHMS: tuple[str, ...] = tuple(ELTWISE_EXPRESSIONS) + tuple(ELTWISE_BODIES)

# Algorithms whose result goes through a transcendental built-in (looser tolerance). rint is
# exact, so round is not one.
TRANSCENDENTAL: frozenset[str] = frozenset(
    {"gelu_erf", "gelu_tanh", "tanh", "sigmoid", "exp", "log", "elu", "swish", "mish", "soft_relu", "pow"}
)


def eltwise_function(name: str, type_name: str, alg: str, alpha: float, beta: float) -> str:
    """C function ``name`` computing ``alg`` on one value of ``type_name`` (float or a vector)."""
    body = ELTWISE_BODIES.get(alg) or f"return {ELTWISE_EXPRESSIONS[alg]};"
    code = string.Template(body).substitute(
        T=type_name, I=type_name.replace("float", "int"), alpha=c_float(alpha), beta=c_float(beta)
    )
    return f"static inline {type_name} {name}(const {type_name} x) {{ {code} }}\n"


# In terms of ``a``, ``b`` (and ``cond``, select's condition) of type ``$T``. min/max as ternaries:
# fmin/fmax stay calls on PoCL. NaN handling differs from numpy's. Comparisons select between
# typed constants: a vector comparison yields -1/0 integers, and a ternary on vectors wants both
# results of the vector type.
BINARY_EXPRESSIONS: dict[str, str] = {
    "add": "a + b",
    "sub": "a - b",
    "mul": "a * b",
    "div": "a / b",
    "min": "b < a ? b : a",
    "max": "b > a ? b : a",
    "ge": "a >= b ? ($T)(1.0f) : ($T)(0.0f)",
    "gt": "a > b ? ($T)(1.0f) : ($T)(0.0f)",
    "le": "a <= b ? ($T)(1.0f) : ($T)(0.0f)",
    "lt": "a < b ? ($T)(1.0f) : ($T)(0.0f)",
    "eq": "a == b ? ($T)(1.0f) : ($T)(0.0f)",
    "ne": "a != b ? ($T)(1.0f) : ($T)(0.0f)",
    "select": "cond != ($T)(0.0f) ? a : b",
}

BINARY_ALGORITHMS: tuple[str, ...] = tuple(BINARY_EXPRESSIONS)

# Algorithms whose result is 0, 1 or an operand bit for bit: compared exactly.
EXACT: frozenset[str] = COMPARISONS | TERNARY


def binary_expression(alg: str, type_name: str) -> str:
    """C expression of ``alg`` on ``a``, ``b`` (and select's ``cond``) of type ``type_name``."""
    return string.Template(BINARY_EXPRESSIONS[alg]).substitute(T=type_name)


# -- numpy references ------------------------------------------------------------------------------


def widen(values) -> np.ndarray:
    """User-facing ``values`` as float64, as a kernel's load sees them: integers and booleans pass
    through float32 (so s32 beyond 2**24 rounds as the kernel's conversion does); floating values
    are exact in f32 already, or are the caller's higher-precision data."""
    array = np.asarray(values)
    if array.dtype.kind in "biu":
        array = array.astype(np.float32)
    return array.astype(np.float64)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)


def eltwise_values(
    alg: str, x: np.ndarray, alpha: float | None = None, beta: float | None = None
) -> np.ndarray:
    """``alg`` applied to float64 ``x`` in float64, rounded to float32: the textbook formulas, as
    float64's range and precision cover float32's; only softplus needs logaddexp, which stays
    finite where exp overflows. ``alpha``/``beta`` of None take the algorithm's default."""
    alpha, beta = eltwise_parameters(alg, alpha, beta) if alg in ELTWISE_ALGORITHMS else (0.0, 0.0)
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
            raise ValueError(f"unknown eltwise algorithm {alg!r}; known: {', '.join(ELTWISE_ALGORITHMS)}")
    return y.astype(np.float32)


def binary_values(alg: str, a: np.ndarray, b: np.ndarray, cond: np.ndarray | None = None) -> np.ndarray:
    """``alg`` of the broadcast float64 operands in float64, rounded to float32. ``cond``:
    select's condition (ValueError when given to another algorithm, or missing for select)."""
    if (alg in TERNARY) != (cond is not None):
        raise ValueError(f"{alg} {'needs' if alg in TERNARY else 'takes no'} src2")
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
        elif alg in COMPARISONS:
            compare = {"ge": np.greater_equal, "gt": np.greater, "le": np.less_equal,
                       "lt": np.less, "eq": np.equal, "ne": np.not_equal}[alg]
            y = compare(a, b).astype(np.float64)
        elif alg == "select":
            y = np.where(cond != 0, a, b)
        else:
            raise ValueError(f"unknown binary algorithm {alg!r}; known: {', '.join(BINARY_ALGORITHMS)}")
    return y.astype(np.float32)
