"""Validation of post-op chains, the ``post_ops`` field of EltwiseDesc, BinaryDesc, MatmulDesc,
ConvolutionDesc, SoftmaxDesc and the normalization descriptors; and their ``output_scale``.

A chain is a tuple of plain tuples (so descriptors stay hashable values that cache blobs store):

- ``("eltwise", alg[, alpha[, beta]])``, alpha/beta resolved to the algorithm's defaults when
  omitted or None, normalised to ``("eltwise", alg, alpha, beta)``;
- ``("sum"[, scale])``, scale 1 when omitted, normalised to ``("sum", scale)``;
- ``("binary", alg, src1)`` with ``src1`` a MemoryDesc broadcasting to dst (aligned right).

Errors name the offending entry, ``post_ops[i]``.

``output_scale`` (oneDNN v2's output scales) multiplies the primitive's result before the chain.
Generators know nothing of it: ``kernels._post_ops.generate_scaled`` hands them the chain with a
leading ``("eltwise", "linear", output_scale, 0.0)``.

Also the chain's vocabulary: post-op kinds, binary post-op algorithms, and the names of the
binary operands as execution arguments (``post_op_{i}_src1``).
"""

from __future__ import annotations

import attrs
import numpy as np

from ._algorithms import BINARY_ALGORITHMS, ELTWISE_ALGORITHMS, NONZERO_ALPHA, TERNARY, eltwise_parameters
from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._numbers import finite_float, float_key

KINDS: tuple[str, ...] = ("eltwise", "sum", "binary")

# Binary post-op algorithms: every binary algorithm but the ternary select.
BINARY_POST_OP_ALGORITHMS: tuple[str, ...] = tuple(a for a in BINARY_ALGORITHMS if a not in TERNARY)


def operand_name(index: int) -> str:
    """The execution argument of the binary operand of ``post_ops[index]``."""
    return f"post_op_{index}_src1"


def operands(chain: tuple) -> dict[str, MemoryDesc]:
    """``{argument name: memory descriptor}`` of the chain's binary operands, in chain order."""
    return {operand_name(i): op[2] for i, op in enumerate(chain) if op[0] == "binary"}


def arg_names(chain: tuple) -> tuple[str, ...]:
    return tuple(operands(chain))


def _finite(where: str, name: str, value) -> float:
    return finite_float(f"{where}: {name}")(value)


def _eltwise(where: str, op: tuple) -> tuple:
    if not 2 <= len(op) <= 4:
        raise InvalidArgumentError(f"{where}: eltwise post-op is ('eltwise', alg, alpha, beta), got {op!r}")
    alg = op[1]
    if alg not in ELTWISE_ALGORITHMS:
        raise InvalidArgumentError(
            f"{where}: {alg!r} is not an eltwise algorithm; known: {', '.join(ELTWISE_ALGORITHMS)}"
        )
    alpha = op[2] if len(op) > 2 else None
    beta = op[3] if len(op) > 3 else None
    alpha = None if alpha is None else _finite(where, "alpha", alpha)
    beta = None if beta is None else _finite(where, "beta", beta)
    try:
        alpha, beta = eltwise_parameters(alg, alpha, beta)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{where}: {exc}") from None
    if alg == "clip" and alpha > beta:
        raise InvalidArgumentError(f"{where}: clip needs alpha <= beta, got alpha={alpha} beta={beta}")
    if alg in NONZERO_ALPHA and alpha == 0.0:
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
    if alg not in BINARY_POST_OP_ALGORITHMS:
        raise InvalidArgumentError(
            f"{where}: {alg!r} is not a binary post-op algorithm; known: "
            f"{', '.join(BINARY_POST_OP_ALGORITHMS)}"
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
                f"{where}: unknown post-op kind {kind!r}; known: {', '.join(KINDS)}"
            )
    return tuple(chain)


def eq_key(post_ops) -> tuple:
    """Equality and hash key: floats with their sign (-0.0 and 0.0 bake different literals)."""
    if not isinstance(post_ops, tuple):
        return post_ops
    return tuple(
        tuple(float_key(v) if isinstance(v, float) else v for v in op)
        if isinstance(op, tuple) else op
        for op in post_ops
    )


def output_scale_field():
    """The ``output_scale`` descriptor field: keyword-only, a finite float, 1.0 by default."""
    return attrs.field(default=1.0, kw_only=True, converter=finite_float("output_scale"), eq=float_key)
