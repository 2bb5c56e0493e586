"""Validation of post-op chains, the ``post_ops`` field of EltwiseDesc, BinaryDesc, MatmulDesc,
ConvolutionDesc, SoftmaxDesc and the normalization descriptors; and their ``output_scale``.

A chain is a tuple of plain tuples (so descriptors stay hashable values that cache blobs store):

- ``("eltwise", alg[, alpha[, beta]])``, alpha/beta resolved to the algorithm's defaults when
  omitted or None, normalised to ``("eltwise", alg, alpha, beta)``;
- ``("sum"[, scale])``, scale 1 when omitted, normalised to ``("sum", scale)``;
- ``("binary", alg, src1)`` with ``src1`` a MemoryDesc broadcasting to dst (aligned right).

Errors name the offending entry, ``post_ops[i]``.

``output_scale`` (oneDNN v2's output scales) multiplies the primitive's result before the chain.
Generators know nothing of it: ``generate_scaled`` hands them the chain with a leading
``("eltwise", "linear", output_scale, 0.0)``.
"""

from __future__ import annotations

import math
from typing import Callable

import attrs
import numpy as np

from ._values._errors import ArgumentMismatchError, InvalidArgumentError
from ._values._memory_desc import MemoryDesc
from .kernels import _post_ops as post_op_kernels
from .kernels import KernelSpec
from .kernels import eltwise as eltwise_kernels


def _finite(where: str, name: str, value) -> float:
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{where}: {name} {value!r} is not a number")
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{where}: {name} {value!r} is not a number") from None
    if not math.isfinite(result):
        raise InvalidArgumentError(f"{where}: {name} {value!r} must be finite")
    return result


def _eltwise(where: str, op: tuple) -> tuple:
    if not 2 <= len(op) <= 4:
        raise InvalidArgumentError(f"{where}: eltwise post-op is ('eltwise', alg, alpha, beta), got {op!r}")
    alg = op[1]
    if alg not in eltwise_kernels.ALGORITHMS:
        raise InvalidArgumentError(
            f"{where}: {alg!r} is not an eltwise algorithm; known: {', '.join(eltwise_kernels.ALGORITHMS)}"
        )
    alpha = op[2] if len(op) > 2 else None
    beta = op[3] if len(op) > 3 else None
    alpha = None if alpha is None else _finite(where, "alpha", alpha)
    beta = None if beta is None else _finite(where, "beta", beta)
    alpha, beta = eltwise_kernels.parameters(alg, alpha, beta)
    if alg == "clip" and alpha > beta:
        raise InvalidArgumentError(f"{where}: clip needs alpha <= beta, got alpha={alpha} beta={beta}")
    if alg in eltwise_kernels.NONZERO_ALPHA and alpha == 0.0:
        raise InvalidArgumentError(f"{where}: {alg} divides by alpha: alpha must be nonzero")
    return ("eltwise", alg, alpha, beta)


def _sum(where: str, op: tuple) -> tuple:
    if len(op) > 2:
        raise InvalidArgumentError(f"{where}: sum post-op is ('sum', scale), got {op!r}")
    return ("sum", _finite(where, "scale", op[1]) if len(op) > 1 else 1.0)


def _binary(where: str, op: tuple, dst_dims: tuple[int, ...]) -> tuple:
    if len(op) != 3:
        raise InvalidArgumentError(f"{where}: binary post-op is ('binary', alg, src1), got {op!r}")
    _, alg, src1 = op
    if alg not in post_op_kernels.BINARY_ALGORITHMS:
        raise InvalidArgumentError(
            f"{where}: {alg!r} is not a binary post-op algorithm; known: "
            f"{', '.join(post_op_kernels.BINARY_ALGORITHMS)}"
        )
    if not isinstance(src1, MemoryDesc):
        raise InvalidArgumentError(f"{where}: src1 is {type(src1).__name__}, expected triodnn.MemoryDesc")
    try:
        fits = src1.ndims <= len(dst_dims) and np.broadcast_shapes(src1.dims, dst_dims) == tuple(dst_dims)
    except ValueError:
        fits = False
    if not fits:
        raise ArgumentMismatchError(f"{where}: src1 dims {src1.dims} do not broadcast to dst dims {dst_dims}")
    return ("binary", alg, src1)


def check(post_ops, dst_dims: tuple[int, ...]) -> tuple:
    """The normalised chain; InvalidArgumentError / ArgumentMismatchError naming ``post_ops[i]``."""
    if isinstance(post_ops, list):
        post_ops = tuple(post_ops)
    if not isinstance(post_ops, tuple):
        raise InvalidArgumentError(f"post_ops is {type(post_ops).__name__}, expected a tuple of post-ops")
    chain = []
    for i, op in enumerate(post_ops):
        where = f"post_ops[{i}]"
        if isinstance(op, list):
            op = tuple(op)
        if not isinstance(op, tuple) or not op:
            raise InvalidArgumentError(f"{where} is {op!r}, expected a tuple such as ('eltwise', 'relu')")
        kind = op[0]
        if kind == "eltwise":
            chain.append(_eltwise(where, op))
        elif kind == "sum":
            chain.append(_sum(where, op))
        elif kind == "binary":
            chain.append(_binary(where, op, dst_dims))
        else:
            raise InvalidArgumentError(
                f"{where}: unknown post-op kind {kind!r}; known: {', '.join(post_op_kernels.KINDS)}"
            )
    return tuple(chain)


def eq_key(post_ops) -> tuple:
    """Equality and hash key: floats with their sign (-0.0 and 0.0 bake different literals)."""
    if not isinstance(post_ops, tuple):
        return post_ops
    return tuple(
        tuple((v, math.copysign(1.0, v) < 0) if isinstance(v, float) else v for v in op)
        if isinstance(op, tuple) else op
        for op in post_ops
    )


def _output_scale(value) -> float:
    # The same rules and messages as _primitive_desc._finite_float, which cannot be imported
    # here: _primitive_desc imports this module.
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"output_scale {value!r} is not a number") from None
    if not math.isfinite(result):
        raise InvalidArgumentError(f"output_scale {value!r} must be finite")
    return result


def _float_key(value: float) -> tuple[float, bool]:
    """-0.0 and 0.0 bake different literals (as _primitive_desc._float_key)."""
    return (value, math.copysign(1.0, value) < 0)


def output_scale_field():
    """The ``output_scale`` descriptor field: keyword-only, a finite float, 1.0 by default."""
    return attrs.field(default=1.0, kw_only=True, converter=_output_scale, eq=_float_key)


def generate_scaled(
    make_kernel: Callable[[tuple], KernelSpec], post_ops: tuple, output_scale: float
) -> KernelSpec:
    """``make_kernel(chain)`` for a descriptor's validated ``post_ops`` and ``output_scale``.

    A scale other than 1 reaches the generator as a leading ``linear`` eltwise post-op, so the
    generator numbers the chain's binary operands one further than the user did; the spec's
    ``arg_names``, which bind the buffers by position, are renamed back to the user's
    ``post_op_{i}_src1`` (the kernel source keeps the generator's parameter names).
    """
    if output_scale == 1.0:
        return make_kernel(post_ops)
    chain = (("eltwise", "linear", output_scale, 0.0),) + post_ops
    spec = make_kernel(chain)
    user_names = dict(zip(post_op_kernels.arg_names(chain), post_op_kernels.arg_names(post_ops)))
    return attrs.evolve(spec, arg_names=tuple(user_names.get(name, name) for name in spec.arg_names))
