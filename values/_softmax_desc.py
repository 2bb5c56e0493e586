"""The softmax descriptor: softmax or logsoftmax over one axis, as a value."""

from __future__ import annotations

import attrs

from . import _post_ops
from ._axes import axis_index, to_axis
from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, algorithm, check_memory_desc, memory_desc, op_kind

SOFTMAX_ALGORITHMS: tuple[str, ...] = ("softmax", "logsoftmax")


@op_kind
@attrs.frozen(cache_hash=True)
class SoftmaxDesc(OpDesc):
    """``dst = alg(src)`` over ``axis``; ``alg`` is ``"softmax"`` or ``"logsoftmax"``.

    ``src`` and ``dst`` may each have any data type (f32 math, any storage), e.g. f32 scores
    into a bf16 or f16 dst; binary post-op operands are f32.

    ``axis`` may be negative, as numpy's; it is stored normalised, so ``axis=-1`` and the last
    index make one descriptor (and one cache entry). ``dst`` defaults to ``src`` (same dims and
    layout); any strides are accepted for either, the dims must match.

    ``output_scale`` (keyword, finite, default 1): oneDNN v2's output scale, multiplying the
    softmax (or logsoftmax) before the post-ops. ``post_ops`` (keyword): a chain of
    ``("eltwise", alg, alpha, beta)``, ``("sum", scale)`` and ``("binary", alg, src1)`` applied to
    the result before the store (the forms docs/primitives.md lists under "Post-op chains"); a binary operand broadcasts
    to dst and is the argument ``post_op_{i}_src1``.

    ``stats`` (keyword, optional output): oneDNN Graph's SoftMax second output, each row's
    ``max + log(sum(exp(x - max)))`` (the log-sum-exp, before any scale or post-op), dims of src
    with the axis 1, any strides and storage type. ``inf_as_zero`` (keyword, softmax only):
    oneDNN Graph's ``mode="inf_as_zero"``, a row of -inf only gives zeros (and a stats of -inf)
    instead of NaN.
    """

    alg: str = attrs.field(validator=algorithm("a softmax", SOFTMAX_ALGORITHMS))
    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    dst: MemoryDesc = attrs.field(default=None)
    axis: int = attrs.field(default=-1, converter=axis_index)
    post_ops: tuple = attrs.field(default=(), kw_only=True, eq=_post_ops.eq_key)
    output_scale: float = _post_ops.output_scale_field()
    stats: MemoryDesc | None = attrs.field(default=None, kw_only=True)
    inf_as_zero: bool = attrs.field(default=False, kw_only=True)

    kind = "softmax"
    ARGS = (Arg("src"), Arg("dst", output=True), Arg("stats", output=True, optional=True))

    def __attrs_post_init__(self) -> None:
        ndims = self.src.ndims
        self._set("axis", to_axis(self.axis, ndims, f"src of {ndims} dimensions {self.src.dims}"))
        self._dst_like_src(self.src, self.dst)
        self._set("post_ops", _post_ops.check(self.post_ops, self.dst.dims))
        if not isinstance(self.inf_as_zero, bool):
            raise InvalidArgumentError(f"inf_as_zero must be a bool, got {self.inf_as_zero!r}")
        if self.inf_as_zero and self.alg != "softmax":
            raise InvalidArgumentError(f"inf_as_zero applies to softmax only, not {self.alg}")
        if self.stats is not None:
            check_memory_desc("stats", self.stats)
            want = tuple(1 if i == self.axis else d for i, d in enumerate(self.src.dims))
            if self.stats.dims != want:
                raise ArgumentMismatchError(
                    f"stats dims {self.stats.dims} must be src dims {self.src.dims} with axis {self.axis} as 1: {want}"
                )
