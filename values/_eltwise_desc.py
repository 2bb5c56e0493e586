"""The eltwise descriptor: ``dst = alg(src)`` elementwise, as a value."""

from __future__ import annotations

from typing import Any

import attrs

from . import _post_ops
from ._algorithms import ELTWISE_ALGORITHMS, NONZERO_ALPHA, eltwise_parameters
from ._errors import InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._numbers import finite_float, float_key
from ._op_desc import OMITTED, Arg, OpDesc, algorithm, memory_desc, op_kind


def parameter(name: str):
    """``finite_float``, letting ``OMITTED`` through for ``__attrs_post_init__`` to resolve once
    the algorithm is known."""
    convert_float = finite_float(name)

    def convert(value):
        return value if value is OMITTED else convert_float(value)

    return convert


def parameter_field(name: str) -> Any:
    """An ``alpha``/``beta`` field: ``OMITTED`` unless given, converted by ``parameter(name)``,
    compared by ``float_key``. A function, as ``_post_ops.output_scale_field``: type checkers then
    see the field's declared ``float`` (what ``__attrs_post_init__`` leaves), not the sentinel."""
    return attrs.field(default=OMITTED, converter=parameter(name), eq=float_key)


@op_kind
@attrs.frozen(cache_hash=True)
class EltwiseDesc(OpDesc):
    """``dst = alg(src)`` elementwise. ``dst`` defaults to ``src`` (same dims, layout and data
    type). ``src`` and ``dst`` may each have any data type; the math is f32 ("f32 math, any
    storage", as oneDNN's eltwise).

    An omitted ``alpha``/``beta`` takes oneDNN's value for the algorithm where it has one
    (hardswish 1/6 and 1/2, soft_relu alpha 1), else what the name means elsewhere (swish alpha 1,
    i.e. SiLU; elu alpha 1; hardsigmoid 1/6 and 1/2; linear and pow the identity, alpha 1 and beta
    1 for pow), else 0 (relu's slope below 0); clip needs both bounds. The descriptor holds the resolved number, so an
    explicit default and an omitted one are the same primitive.
    """

    alg: str = attrs.field(validator=algorithm("an eltwise", ELTWISE_ALGORITHMS))
    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    dst: MemoryDesc = attrs.field(default=None)
    alpha: float = parameter_field("alpha")
    beta: float = parameter_field("beta")
    post_ops: tuple = attrs.field(default=(), kw_only=True, eq=_post_ops.eq_key)

    kind = "eltwise"
    ARGS = (Arg("src"), Arg("dst", output=True))

    def __attrs_post_init__(self) -> None:
        alpha, beta = eltwise_parameters(
            self.alg,
            None if self.alpha is OMITTED else self.alpha,
            None if self.beta is OMITTED else self.beta,
        )
        self._set("alpha", alpha)
        self._set("beta", beta)
        self._dst_like_src(self.src, self.dst)
        if self.alg == "clip" and self.alpha > self.beta:
            raise InvalidArgumentError(f"clip needs alpha <= beta, got alpha={self.alpha} beta={self.beta}")
        if self.alg in NONZERO_ALPHA and self.alpha == 0.0:
            raise InvalidArgumentError(
                f"{self.alg} divides by alpha: alpha must be nonzero, got {self.alpha}"
            )
        self._set("post_ops", _post_ops.check(self.post_ops, self.dst.dims))
