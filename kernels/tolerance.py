"""Comparison thresholds against the numpy references, after oneDNN's benchdnn.

One place for every kind, so tests, the CLI's correctness mode and benchmarks agree. A result
passes when, elementwise, ``|got - ref| <= threshold * max(1, |ref|)``: relative error above 1 in
magnitude, absolute below it, as benchdnn's "relative or absolute, whichever is larger" rule.
"""

from __future__ import annotations

import numpy as np

_F32_EPS = float(np.finfo(np.float32).eps)  # 1.19e-7

BINARY = _F32_EPS
ELTWISE = 4e-6
ELTWISE_TRANSCENDENTAL = 4e-5


def eltwise(alg: str) -> float:
    from .eltwise import TRANSCENDENTAL

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
