"""The algorithm vocabulary of eltwise and binary operations, shared by their descriptors, post-op
chains and graph ops: names, oneDNN's default parameters, and broadcasting.

Kernels implement exactly these names (``kernels.eltwise`` and ``kernels.binary`` check their
tables against them at import); descriptors validate against them without importing any kernel.
"""

from __future__ import annotations

import numpy as np

from ._errors import InvalidArgumentError

# oneDNN's eltwise algorithms (``leaky_relu`` is ``relu`` under the graph API's name), in the
# order the kernels list them.
ELTWISE_ALGORITHMS: tuple[str, ...] = (
    "relu", "gelu_tanh", "tanh", "sigmoid", "exp", "log", "abs", "sqrt", "square", "clip",
    "leaky_relu", "elu", "swish", "round", "linear", "pow", "reciprocal",
    "gelu_erf", "hardswish", "hardsigmoid", "mish", "soft_relu",
)

# (alpha, beta) of an algorithm whose parameters oneDNN fixes or defaults: the graph API's
# HardSwish is x * max(0, min(1, x/6 + 1/2)), and soft_relu without alpha is log(1 + e^x) (oneDNN
# v2's soft_relu, v3's soft_relu with alpha = 1). Where oneDNN asks the caller, the default is
# what the name means elsewhere (torch, the graph API's ops): swish x * sigmoid(x) (SiLU), elu
# with alpha 1, hardsigmoid relu6(x + 3) / 6 (as hardswish), linear and pow the identity. With 0
# they computed x / 2, a wrong elu below 0, and constants; a user's 166 wrong results came from
# swish's. Everything else defaults to (0, 0) (relu's 0 is its slope below 0); clip has no
# default and needs both bounds.
ELTWISE_DEFAULTS: dict[str, tuple[float, float]] = {
    "hardswish": (1.0 / 6.0, 0.5),
    "soft_relu": (1.0, 0.0),
    "swish": (1.0, 0.0),
    "elu": (1.0, 0.0),
    "hardsigmoid": (1.0 / 6.0, 0.5),
    "linear": (1.0, 0.0),
    "pow": (1.0, 1.0),
}

# Algorithms whose parameters have no default: omitting them is an error naming them.
ELTWISE_REQUIRED: dict[str, str] = {"clip": "alpha (the lower bound) and beta (the upper bound)"}

# Algorithms dividing by alpha: alpha = 0 has no meaning there.
NONZERO_ALPHA: frozenset[str] = frozenset({"soft_relu"})


def eltwise_parameters(alg: str, alpha: float | None, beta: float | None) -> tuple[float, float]:
    """``alpha`` and ``beta`` with None replaced by the algorithm's default; InvalidArgumentError
    where the algorithm has none (``ELTWISE_REQUIRED``)."""
    if alg in ELTWISE_REQUIRED and (alpha is None or beta is None):
        raise InvalidArgumentError(f"{alg} needs {ELTWISE_REQUIRED[alg]}: they have no default")
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
