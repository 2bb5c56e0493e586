"""The softmax descriptor: softmax or logsoftmax over one axis, as a value."""

from __future__ import annotations

import attrs

from . import _post_ops
from ._axes import axis_index, to_axis
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, algorithm, memory_desc, op_kind

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
    the result before the store (the forms README.md lists under "Post-op chains"); a binary operand broadcasts
    to dst and is the argument ``post_op_{i}_src1``.
    """

    alg: str = attrs.field(validator=algorithm("a softmax", SOFTMAX_ALGORITHMS))
    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    dst: MemoryDesc = attrs.field(default=None)
    axis: int = attrs.field(default=-1, converter=axis_index)
    post_ops: tuple = attrs.field(default=(), kw_only=True, eq=_post_ops.eq_key)
    output_scale: float = _post_ops.output_scale_field()

    kind = "softmax"
    ARGS = (Arg("src"), Arg("dst", output=True))

    def __attrs_post_init__(self) -> None:
        ndims = self.src.ndims
        self._set("axis", to_axis(self.axis, ndims, f"src of {ndims} dimensions {self.src.dims}"))
        self._dst_like_src(self.src, self.dst)
        self._set("post_ops", _post_ops.check(self.post_ops, self.dst.dims))
