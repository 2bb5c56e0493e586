"""The softmax backward descriptor: the gradient of softmax or logsoftmax over one axis, as a value."""

from __future__ import annotations

import attrs

from ._axes import axis_index, to_axis
from ._errors import ArgumentMismatchError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, algorithm, check_memory_desc, memory_desc, op_kind
from ._softmax_desc import SOFTMAX_ALGORITHMS


@op_kind
@attrs.frozen(cache_hash=True)
class SoftmaxBackwardDesc(OpDesc):
    """oneDNN's softmax backward over ``axis`` from the forward's ``dst`` and ``diff_dst``:
    ``softmax``: ``diff_src = dst * (diff_dst - sum(diff_dst * dst))``; ``logsoftmax``:
    ``diff_src = diff_dst - exp(dst) * sum(diff_dst)``, the sums over the axis.

    ``axis`` may be negative and is stored normalised, as ``SoftmaxDesc``'s. ``diff_dst`` and
    ``diff_src`` must have dst's dims; ``diff_src`` defaults to ``diff_dst``'s layout and data
    type. Any strides and storage types, f32 math.
    """

    alg: str = attrs.field(validator=algorithm("a softmax", SOFTMAX_ALGORITHMS))
    dst: MemoryDesc = attrs.field(validator=memory_desc("dst"))
    diff_dst: MemoryDesc = attrs.field(validator=memory_desc("diff_dst"))
    diff_src: MemoryDesc = attrs.field(default=None)
    axis: int = attrs.field(default=-1, converter=axis_index)

    kind = "softmax_backward"
    ARGS = (Arg("dst"), Arg("diff_dst"), Arg("diff_src", output=True))

    def __attrs_post_init__(self) -> None:
        ndims = self.dst.ndims
        self._set("axis", to_axis(self.axis, ndims, f"dst of {ndims} dimensions {self.dst.dims}"))
        if self.diff_dst.dims != self.dst.dims:
            raise ArgumentMismatchError(f"diff_dst dims {self.diff_dst.dims} differ from dst dims {self.dst.dims}")
        if self.diff_src is None:
            self._set("diff_src", self.diff_dst)
        check_memory_desc("diff_src", self.diff_src)
        if self.diff_src.dims != self.dst.dims:
            raise ArgumentMismatchError(f"diff_src dims {self.diff_src.dims} differ from dst dims {self.dst.dims}")
