"""The eltwise backward descriptor: ``diff_src = diff_dst * alg'(src)`` elementwise, as a value."""

from __future__ import annotations

import attrs

from ._algorithms import NONZERO_ALPHA, eltwise_parameters
from ._eltwise_desc import parameter_field
from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._op_desc import OMITTED, Arg, OpDesc, algorithm, check_memory_desc, memory_desc, op_kind

# The algorithms with a backward pass (oneDNN Graph's *Backward eltwise ops), named as the forward
# ones, and whether each can take the forward's dst instead of its src (oneDNN's
# *_use_dst_for_bwd algorithms: only those whose derivative is a function of dst).
ELTWISE_BACKWARD_ALGORITHMS: dict[str, bool] = {
    "abs": False,
    "clip": True,
    "elu": True,
    "gelu_erf": False,
    "gelu_tanh": False,
    "hardsigmoid": False,
    "hardswish": False,
    "mish": False,
    "relu": True,
    "sigmoid": True,
    "soft_relu": False,
    "sqrt": True,
    "tanh": True,
}


@op_kind
@attrs.frozen(cache_hash=True)
class EltwiseBackwardDesc(OpDesc):
    """``diff_src = diff_dst * alg'(x)`` elementwise, ``x`` the forward's src, or its dst when
    ``use_dst`` (the algorithms of ``ELTWISE_BACKWARD_ALGORITHMS`` marked True).

    ``alpha``/``beta`` mean what they mean forward (``EltwiseDesc``) and default the same way.
    ``clip`` is oneDNN's clip_v2 backward, the one the graph API's Clamp uses: the gradient passes
    where ``alpha < x < beta``, both bounds excluded (with use_dst, x = beta is the clipped value).
    ``diff_dst`` and ``diff_src`` have src_or_dst's dims; ``diff_src`` defaults to
    ``src_or_dst``'s layout and data type. Any storage types, f32 math.
    """

    alg: str = attrs.field(validator=algorithm("an eltwise backward", tuple(ELTWISE_BACKWARD_ALGORITHMS)))
    src_or_dst: MemoryDesc = attrs.field(validator=memory_desc("src_or_dst"))
    diff_dst: MemoryDesc = attrs.field(validator=memory_desc("diff_dst"))
    diff_src: MemoryDesc = attrs.field(default=None)
    alpha: float = parameter_field("alpha")
    beta: float = parameter_field("beta")
    use_dst: bool = attrs.field(default=False, kw_only=True)

    kind = "eltwise_backward"
    ARGS = (Arg("src_or_dst"), Arg("diff_dst"), Arg("diff_src", output=True))

    def __attrs_post_init__(self) -> None:
        alpha, beta = eltwise_parameters(
            self.alg,
            None if self.alpha is OMITTED else self.alpha,
            None if self.beta is OMITTED else self.beta,
        )
        self._set("alpha", alpha)
        self._set("beta", beta)
        if not isinstance(self.use_dst, bool):
            raise InvalidArgumentError(f"use_dst must be a bool, got {self.use_dst!r}")
        if self.use_dst and not ELTWISE_BACKWARD_ALGORITHMS[self.alg]:
            raise InvalidArgumentError(
                f"{self.alg} backward needs the forward's src: use_dst=True is not defined for it"
            )
        if self.use_dst and self.alg in ("relu", "elu") and self.alpha < 0:
            # A negative alpha makes dst's sign differ from src's: dst no longer tells the branch.
            raise InvalidArgumentError(f"{self.alg} backward with use_dst needs alpha >= 0, got {self.alpha}")
        if self.diff_dst.dims != self.src_or_dst.dims:
            raise ArgumentMismatchError(
                f"diff_dst dims {self.diff_dst.dims} differ from src_or_dst dims {self.src_or_dst.dims}"
            )
        if self.diff_src is None:
            self._set("diff_src", self.src_or_dst)
        check_memory_desc("diff_src", self.diff_src)
        if self.diff_src.dims != self.src_or_dst.dims:
            raise ArgumentMismatchError(
                f"diff_src dims {self.diff_src.dims} differ from src_or_dst dims {self.src_or_dst.dims}"
            )
        if self.alg == "clip" and self.alpha > self.beta:
            raise InvalidArgumentError(f"clip needs alpha <= beta, got alpha={self.alpha} beta={self.beta}")
        if self.alg in NONZERO_ALPHA and self.alpha == 0.0:
            raise InvalidArgumentError(
                f"{self.alg} divides by alpha: alpha must be nonzero, got {self.alpha}"
            )
