"""Comparison thresholds against the numpy references, after oneDNN's benchdnn.

One place for every kind, so tests, the CLI's correctness mode and benchmarks agree. A result
passes when, elementwise, ``|got - ref| <= threshold * max(1, |ref|)``: relative error above 1 in
magnitude, absolute below it, as benchdnn's "relative or absolute, whichever is larger" rule.
"""

from __future__ import annotations

import numpy as np

from . import normalization as _normalization
from . import pooling as _pooling
from ._elementwise import EXACT, TRANSCENDENTAL

_F32_EPS = float(np.finfo(np.float32).eps)  # 1.19e-7

BINARY = _F32_EPS
ELTWISE = 4e-6
ELTWISE_TRANSCENDENTAL = 4e-5


def eltwise(alg: str) -> float:
    return ELTWISE_TRANSCENDENTAL if alg in TRANSCENDENTAL else ELTWISE


def max_error(got: np.ndarray, ref: np.ndarray) -> float:
    """Largest benchdnn-style error; NaN/inf must match exactly (inf error otherwise)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        raise ValueError(f"shape {got.shape} differs from reference shape {ref.shape}")
    special = ~np.isfinite(ref) | ~np.isfinite(got)
    if np.any(special):
        same = (np.isnan(got) & np.isnan(ref)) | (got == ref)
        if not np.all(same[special]):
            return float("inf")
    if not np.any(~special):
        return 0.0
    g, r = got[~special], ref[~special]
    return float(np.max(np.abs(g - r) / np.maximum(1.0, np.abs(r))))


def check(got: np.ndarray, ref: np.ndarray, threshold: float) -> None:
    """AssertionError naming the worst element when ``got`` is off ``ref`` beyond ``threshold``."""
    err = max_error(got, ref)
    if not err <= threshold:
        g = np.asarray(got, dtype=np.float64).ravel()
        r = np.asarray(ref, dtype=np.float64).ravel()
        with np.errstate(all="ignore"):
            worst = int(np.nanargmax(np.abs(g - r) / np.maximum(1.0, np.abs(r))))
        raise AssertionError(
            f"error {err:.3g} above threshold {threshold:.3g}; worst at flat index {worst}: "
            f"got {g[worst]!r}, expected {r[worst]!r}"
        )


# Softmax, after benchdnn's softmax setup_cmp (tests/benchdnn/softmax/softmax.cpp): f32 threshold
# 10 * eps, times 5 for logsoftmax. Softmax values lie in [0, 1], so the rule above checks them
# absolutely; logsoftmax values are often above 1 in magnitude and get the relative check.
SOFTMAX = 10 * _F32_EPS
LOGSOFTMAX = 5 * SOFTMAX


def softmax(alg: str) -> float:
    return LOGSOFTMAX if alg == "logsoftmax" else SOFTMAX


# Reduction, after benchdnn's reduction setup_cmp (tests/benchdnn/reduction/reduction.cpp): eps,
# times 5 for the norm algorithms. benchdnn fills reductions with small integers (sums exact in
# f32, products of powers of two); tests here use random floats, where even a correctly rounded
# f32 result is up to half an ulp off the float64 reference, and mean's division rounds once
# more, so 2 * eps (the compensated sums measured within it on 1e5 elements). A product rounds at
# each of its n - 1 multiplications: its bound grows with the count.
REDUCTION = 2 * _F32_EPS
REDUCTION_NORM = 5 * _F32_EPS


def reduction(alg: str, count: int = 1) -> float:
    """Threshold for ``alg`` over ``count`` reduced elements."""
    if alg in ("l1", "l2"):
        return REDUCTION_NORM
    if alg == "mul":
        return max(REDUCTION, (count + 1) * _F32_EPS / 2)
    return REDUCTION


# Comparisons write exactly 0 or 1 and select copies an operand: nothing to round, no slack.
BINARY_EXACT = 0.0


def binary(alg: str) -> float:
    return BINARY_EXACT if alg in EXACT else BINARY


# Pooling and the normalizations keep their thresholds beside their generators, where the
# reasoning about their rounding lives; these entries make this module the one place to look
# them all up. (Those modules never import this one, so it may import them.)


def pooling(alg: str, window: int) -> float:
    """Max pooling is exact; averages round once per summed element (see kernels/pooling.py)."""
    return _pooling.tolerance(alg, window)


def normalization(kind: str) -> float:
    """Layer, RMS, group (8 eps) and batch normalization (6e-7), after benchdnn's thresholds."""
    return {
        "layer_normalization": _normalization.LNORM,
        "rms_normalization": _normalization.RMSNORM,
        "group_normalization": _normalization.GNORM,
        "batch_normalization": _normalization.BNORM,
    }[kind]


def sum_(n_inputs: int) -> float:
    """eps * N, benchdnn's sum threshold for f32 (each input adds one rounding; see kernels/sum.py)."""
    return _F32_EPS * n_inputs


# Matmul and convolution sum products in f32: the primitive tests hold random data to 1e-6 per
# product summed into an element (K for matmul, C/groups times the kernel taps for convolution);
# small integers are exact.
ACCUMULATION = 1e-6


# A product of two operands rounded to TF32 (10 explicit mantissa bits, each off by up to 2^-11
# of itself): about 2^-10 of the product, per product summed.
TF32_PRODUCT = 2.0 ** -10


def matmul(k: int, *, tf32: bool = False) -> float:
    """Threshold of a matmul over ``k`` products per element (``tf32``: operands that may be
    rounded to TF32, as fpmath "tf32" and "any" allow)."""
    return (TF32_PRODUCT if tf32 else ACCUMULATION) * k


def convolution(taps: int) -> float:
    """Threshold of a convolution summing ``taps`` products (C/groups x kernel size) per element."""
    return ACCUMULATION * taps
