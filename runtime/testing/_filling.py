"""Input filling and comparison tolerances for checking graph partitions, after benchdnn graph.

benchdnn fills each input so the reference and the library compute the same numbers wherever
they can: small integers for matmul and convolution (every product and partial sum is an exact
float32 integer, so any summation order gives the exact result), powers of two for scales (a
product or quotient by one only moves the exponent), positive values where the math needs them.
``fill_input`` applies these rules by the fillings the kinds of a tensor's consumers declare in
their family modules (``GraphOp.filling``, named in brackets below) and, where the caller knows
it, the tensor's role.

Rules, in order (the first that applies wins):

1. ``boolean``: a mix of True and False (both present when the tensor has two or more elements),
   so Select conditions take both branches.
2. role ``"scale"``: a power of two from 1/8 to 4 (attention's 1/sqrt(d) or d scales, applied by
   Multiply or Divide, stay exact). Role ``"probability"`` (Dropout's): 1/2 or 3/4, whose
   1 / (1 - p) scales are powers of two.
3. role ``"mask"``: an additive attention mask, 0 or -inf, with the first element of every row
   (along the last axis) 0, so no row is masked entirely (``inf_as_zero`` tests set such rows
   on purpose).
4. role ``"divisor"``, or a consumer among Log, Sqrt(Backward), Pow, Reciprocal [positive]: positive values. Divisors
   are powers of two from 1/2 to 4 (quotients exact); Log/Sqrt/Pow inputs are multiples of 1/8 in
   [1/8, 4] (exact in bf16 and f16, away from log's and sqrt's singular point).
5. roles ``"variance"`` and ``"gamma"`` (BatchNormInference, LayerNorm, RMSNorm and the
   training ops BatchNormForwardTraining, BatchNormTrainingBackward, LayerNormBackward): positive
   multiples of 1/4 in [1/4, 2]; ``"beta"`` and ``"mean"``: multiples of 1/4 in [-2, 2].
6. consumed by MatMul, Convolution [integer_sum], or a Divide [divisor] with no role (it could be either operand):
   integers in [-4, 4], without 0 when a Divide consumes it. Sums of products of these stay
   exact in float32 for reductions of up to 2^20 terms.
7. consumed by LayerNorm, RMSNorm, BatchNormInference or a training one [norm]: multiples of 1/16 in [-4, 4], so every
   normalised row has a spread (nonzero variance).
8. consumed only by transcendental eltwise ops (GELU, Tanh, Sigmoid, Exp, Elu, Mish, SoftPlus,
   and their Backward ops) [transcendental]:
   multiples of 1/4 in [-4, 4], which cover the curved part of each function.
8b. consumed only by SoftMaxBackward [softmax_gradient]: multiples of 1/8 in [0, 1] (softmax's
   range); only by LogSoftmaxBackward [log_softmax_gradient]: multiples of 1/8 in [-2, 0]
   (logsoftmax's sign), see ``_float_values``.
9. anything else (binary ops, softmax, reductions, data movement): integers in [-4, 4].
   Softmax sees differences of at most 8, far from exp's overflow.

Every float value above is exact in bf16 and f16 (at most 8 significant bits, exponents in
range), so one filling serves all three types; f8_e4m3 and f8_e5m2 tensors get the same values
rounded to the type (4 and 3 significant bits), so they too are exact in it. s32 and s64 tensors get integers in [-4, 4]
(positive for divisors), s8 and s4 in [-4, 4], u8 and u4 in [0, 8].

``tolerance`` gives the (rtol, atol) to compare a partition's output with the op-by-op
reference: an element passes when ``|got - ref| <= atol + rtol * |ref|``.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .._values._dtypes import from_storage, to_storage
from .._values._errors import InvalidArgumentError
from ..graph._op_registry import graph_op, graph_ops
from ..graph._op_schema import normalize_attrs
from ..graph.ops.normalization import norm_axes

ROLES = ("scale", "mask", "divisor", "gamma", "beta", "mean", "variance",
         "probability")  # Dropout's p


def _choice(rng: np.random.Generator, values, shape) -> np.ndarray:
    return rng.choice(np.asarray(values, dtype=np.float64), size=shape)


def _fillings(consumer_kinds: frozenset[str]) -> list[str | None]:
    """The filling each consumer kind's family declares (``GraphOp.filling``); None for the
    default, and for names that are not op kinds."""
    ops = graph_ops()
    return [ops[kind].filling if kind in ops else None for kind in consumer_kinds]


def _float_values(shape: tuple[int, ...], fillings: list[str | None], rng: np.random.Generator,
                  role: str | None) -> np.ndarray:
    if role == "scale":
        return _choice(rng, [0.125, 0.25, 0.5, 1.0, 2.0, 4.0], shape)
    if role == "probability":  # Dropout's p: 1 / (1 - p) is 2 or 4, kept values exact
        return _choice(rng, [0.5, 0.75], shape)
    if role == "mask":
        mask = np.where(rng.random(shape) < 0.5, 0.0, -np.inf)
        if mask.ndim:
            mask[..., 0] = 0.0
        return mask
    if role == "divisor":
        return _choice(rng, [0.5, 1.0, 2.0, 4.0], shape)
    if "positive" in fillings:
        return rng.integers(1, 33, size=shape) / 8.0
    if role in ("gamma", "variance"):
        return rng.integers(1, 9, size=shape) / 4.0
    if role in ("beta", "mean"):
        return rng.integers(-8, 9, size=shape) / 4.0
    if "integer_sum" in fillings or "divisor" in fillings:
        values = rng.integers(-4, 5, size=shape).astype(np.float64)
        if "divisor" in fillings:
            values = np.where(values == 0, 1.0, values)
        return values
    if "norm" in fillings:
        return rng.integers(-64, 65, size=shape) / 16.0
    if fillings and all(filling == "transcendental" for filling in fillings):
        return rng.integers(-16, 17, size=shape) / 4.0
    # Softmax backward: values a forward would give, softmax's in [0, 1] and
    # logsoftmax's <= 0, multiples of 1/8. Both inputs follow the rule: logsoftmax's diff_dst of
    # one sign keeps diff_dst - exp(dst) * sum(diff_dst) from cancelling, so exp's ulp errors
    # stay relative to the result; softmax's products and sums stay exact.
    if fillings == ["softmax_gradient"]:
        return rng.integers(0, 9, size=shape) / 8.0
    if fillings == ["log_softmax_gradient"]:
        return rng.integers(-16, 1, size=shape) / 8.0
    return rng.integers(-4, 5, size=shape).astype(np.float64)


def fill_input(dtype: str, shape, consumer_kinds: Iterable[str], rng: np.random.Generator, *,
               role: str | None = None) -> np.ndarray:
    """Values for a graph input of ``dtype`` and ``shape`` consumed by ops of
    ``consumer_kinds``, after the rules of this module's docstring; ``role`` (one of ``ROLES``,
    or None) says what the tensor is where the kinds alone cannot.

    Returns user-facing values: float32 for f32, f16 and bf16 (values exact in the type), int32
    for s32, int64 for s64, int8/uint8 for s8/u8, ``np.bool_`` for boolean.
    """
    if role is not None and role not in ROLES:
        raise InvalidArgumentError(f"fill role {role!r} is not one of {', '.join(ROLES)} (or None)")
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise InvalidArgumentError(f"cannot fill shape {list(shape)}: unknown or negative dims")
    fillings = _fillings(frozenset(consumer_kinds))
    positive = role == "divisor" or "positive" in fillings
    if dtype == "boolean":
        values = rng.random(shape) < 0.5
        if values.size >= 2:
            flat = values.reshape(-1)
            flat[0], flat[-1] = True, False
        return np.asarray(values, dtype=np.bool_)
    if dtype in ("s32", "s8", "s64"):
        low = 1 if positive else -4
        values = rng.integers(low, 5, size=shape)
        return values.astype({"s32": np.int32, "s8": np.int8, "s64": np.int64}[dtype])
    if dtype in ("u8", "u4"):
        return rng.integers(0, 9, size=shape).astype(np.uint8)
    if dtype == "s4":
        low = 1 if positive else -4
        return rng.integers(low, 5, size=shape).astype(np.int8)
    if dtype in ("f8_e4m3", "f8_e5m2"):
        values = _float_values(shape, fillings, rng, role).astype(np.float32)
        return from_storage(to_storage(values, dtype), dtype).reshape(shape)
    if dtype not in ("f32", "f16", "bf16"):
        raise InvalidArgumentError(f"cannot fill data type {dtype!r}")
    return _float_values(shape, fillings, rng, role).astype(np.float32)


def batch_statistics(kind: str, attrs, src: np.ndarray, dtypes: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """The mean and biased variance of ``src`` that BatchNormTrainingBackward or LayerNormBackward
    (``kind``, with ``attrs``) normalises by, as values of ``dtypes`` (mean's, variance's).

    Filled independently, statistics that are not ``src``'s make ``(x - mean) * inv`` large and
    diff_src a difference of terms hundreds of times its size, whose f32 rounding then exceeds any
    threshold; benchdnn too feeds the backward passes the forward's statistics. They are rounded
    to multiples of 1/16, as src's values are, so that ``x - mean`` and its products with diff_dst
    stay exact: diff_gamma sums thousands of them, and rounded terms would leave it off by far more
    than an ulp of its result (as a dot product's)."""
    a = normalize_attrs(kind, attrs)
    x = np.asarray(src, dtype=np.float64)
    if kind == "LayerNormBackward":
        axes = norm_axes(kind, a["begin_norm_axis"], x.ndim)
    else:
        channel = 1 if a["data_format"] == "NCX" else x.ndim - 1
        axes = tuple(i for i in range(x.ndim) if i != channel)
    stats = (np.round(x.mean(axis=axes) * 16) / 16, np.maximum(np.round(x.var(axis=axes) * 16), 1) / 16)
    mean, variance = (from_storage(to_storage(v.astype(np.float32), dt), dt).reshape(v.shape)
                      for v, dt in zip(stats, dtypes))
    return mean, variance


# -- tolerances -----------------------------------------------------------------------------

# benchdnn's relaxed check for outputs with an eltwise in the chain (compare.cpp: absolute
# difference within 2e-5 or relative within 8e-6). It applies here where an op that turns the
# dyadic filling into arbitrary reals (``GraphOp.inexact``) meets another op that sums many
# elements (``GraphOp.accumulates``) in one partition: the two sides then sum differently rounded
# terms, perhaps in different orders. Integer-preserving ops (Add, Multiply by a power of two, ReLU ...) do not
# count: MatMul followed by Add stays exact.
_CHAIN_RTOL = 8e-6
_CHAIN_ATOL = 2e-5
# Rounding bounds of the narrow output types: one ulp relative to the value, 2^-7 for bf16
# (8 significant bits) and 2^-10 for f16 (11 bits). Half an ulp is the rounding error of the
# reference itself; a full ulp lets the partition's rounding land on the neighbouring value
# when its f32 result differs from the float64 reference by a hair across a rounding boundary.
_NARROW_ULP = {"bf16": 2.0**-7, "f16": 2.0**-10, "f8_e4m3": 2.0**-3, "f8_e5m2": 2.0**-2}


def tolerance(kinds: Iterable[str], dtype: str) -> tuple[float, float]:
    """``(rtol, atol)`` to compare a partition made of ops of ``kinds`` with the op-by-op
    reference, for outputs of ``dtype``: pass when ``|got - ref| <= atol + rtol * |ref|``.

    Pass as ``dtype`` the narrowest float type among the partition's tensors (see
    ``narrowest_dtype``): a bf16 intermediate the reference rounds but a fused kernel keeps in
    f32 costs as much as a bf16 output. Rules:

    * f32: the largest per-kind threshold ``t`` (``GraphOp.tolerance``, declared with each kind
      from ``triodnn.kernels.tolerance``, after benchdnn's per-driver thresholds) as ``(t, t)``,
      the ``t * max(1, |ref|)`` rule of the primitives; exact kinds give (0, 0).
    * A chain, where an op making non-dyadic values (transcendental or dividing eltwise, Divide,
      softmax, normalisation, averages) and another op summing many elements (MatMul,
      Convolution, reductions, normalisation, softmax, average pooling) meet in one partition,
      takes at least benchdnn's relaxed eltwise-chain check: rtol 8e-6, atol 2e-5.
    * bf16/f16: at least one ulp of the type, relative (2^-7, 2^-10) and absolute; twice that
      for a chain, since the reference rounds the intermediate and the partition may not.
    * s64, s32, s8, u8, boolean: exact (integer results of integer data, comparisons and copies).
    """
    kinds = frozenset(kinds)
    if dtype in ("s64", "s32", "s8", "u8", "s4", "u4", "boolean"):
        return 0.0, 0.0
    if dtype not in ("f32", *_NARROW_ULP):
        raise InvalidArgumentError(f"no tolerance for data type {dtype!r}")
    ops = [graph_op(kind) for kind in kinds]  # InvalidGraphError for an unknown kind
    t = max((op.tolerance for op in ops), default=0.0)
    rtol, atol = t, t
    chain = any(p.kind != c.kind for p in ops if p.inexact for c in ops if c.accumulates)
    if chain:
        rtol, atol = max(rtol, _CHAIN_RTOL), max(atol, _CHAIN_ATOL)
    if dtype in _NARROW_ULP:
        ulp = _NARROW_ULP[dtype] * (2 if chain else 1)
        rtol, atol = max(rtol, ulp), max(atol, ulp)
    return rtol, atol


_WIDTH = {"f32": 3, "f16": 1, "bf16": 0, "f8_e4m3": -1, "f8_e5m2": -2}  # by significant bits


def narrowest_dtype(dtypes: Iterable[str]) -> str:
    """The float type with the fewest significant bits among ``dtypes`` (f32 when none is a
    float type): what ``tolerance`` wants for a partition whose tensors have ``dtypes``."""
    floats = [d for d in dtypes if d in _WIDTH]
    return min(floats, key=_WIDTH.__getitem__) if floats else "f32"


__all__ = ["ROLES", "fill_input", "narrowest_dtype", "tolerance"]
