"""The algorithm vocabulary of eltwise and binary operations, shared by their descriptors, post-op
chains and graph ops: names, oneDNN's default parameters, and broadcasting.

Kernels implement exactly these names (``kernels.eltwise`` and ``kernels.binary`` check their
tables against them at import); descriptors validate against them without importing any kernel.
"""

from __future__ import annotations

import numpy as np

# oneDNN's eltwise algorithms (``leaky_relu`` is ``relu`` under the graph API's name), in the
# order the kernels list them.
ELTWISE_ALGORITHMS: tuple[str, ...] = (
    "relu", "gelu_tanh", "tanh", "sigmoid", "exp", "log", "abs", "sqrt", "square", "clip",
    "leaky_relu", "elu", "swish", "round", "linear", "pow", "reciprocal",
    "gelu_erf", "hardswish", "hardsigmoid", "mish", "soft_relu",
)

# (alpha, beta) of an algorithm whose parameters oneDNN fixes or defaults: the graph API's
# HardSwish is x * max(0, min(1, x/6 + 1/2)), and soft_relu without alpha is log(1 + e^x) (oneDNN
# v2's soft_relu, v3's soft_relu with alpha = 1). Everything else defaults to (0, 0).
ELTWISE_DEFAULTS: dict[str, tuple[float, float]] = {
    "hardswish": (1.0 / 6.0, 0.5),
    "soft_relu": (1.0, 0.0),
}

# Algorithms dividing by alpha: alpha = 0 has no meaning there.
NONZERO_ALPHA: frozenset[str] = frozenset({"soft_relu"})


def eltwise_parameters(alg: str, alpha: float | None, beta: float | None) -> tuple[float, float]:
    """``alpha`` and ``beta`` with None replaced by the algorithm's default."""
    default_alpha, default_beta = ELTWISE_DEFAULTS.get(alg, (0.0, 0.0))
    return (
        default_alpha if alpha is None else float(alpha),
        default_beta if beta is None else float(beta),
    )


BINARY_ALGORITHMS: tuple[str, ...] = (
    "add", "sub", "mul", "div", "min", "max", "ge", "gt", "le", "lt", "eq", "ne", "select",
)

COMPARISONS: frozenset[str] = frozenset({"ge", "gt", "le", "lt", "eq", "ne"})

# Algorithms taking the third input src2.
TERNARY: frozenset[str] = frozenset({"select"})


def broadcast_dims(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The numpy broadcast of ``shapes``; ValueError when they do not broadcast."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"shapes {', '.join(map(str, shapes))} do not broadcast") from None
