"""The PReLU descriptor: ``dst = src >= 0 ? src : weights * src``, the slope broadcast to src."""

from __future__ import annotations

import attrs

from ._errors import ArgumentMismatchError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, memory_desc, op_kind


@op_kind
@attrs.frozen(cache_hash=True)
class PreluDesc(OpDesc):
    """oneDNN's PReLU forward: ``dst = src`` where ``src >= 0``, ``weights * src`` elsewhere.

    ``weights`` (the slope) broadcasts one way to ``src``, numpy's right alignment: each of its
    dims is 1 or src's, and it has no more dims than src (oneDNN's channel-wise, shared and
    whole-tensor cases are all of this form once the graph op has placed a 1-D slope). ``dst``
    defaults to ``src`` and must have its dims. Any storage type for each, f32 math.
    """

    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    weights: MemoryDesc = attrs.field(validator=memory_desc("weights"))
    dst: MemoryDesc = attrs.field(default=None)

    kind = "prelu"
    ARGS = (Arg("src"), Arg("weights"), Arg("dst", output=True))

    def __attrs_post_init__(self) -> None:
        src, weights = self.src.dims, self.weights.dims
        # One way only: the slope never widens dst, as oneDNN's prelu_desc_init requires.
        if len(weights) > len(src) or any(
            w not in (1, s) for w, s in zip(reversed(weights), reversed(src))
        ):
            raise ArgumentMismatchError(
                f"weights dims {weights} do not broadcast to src dims {src} (each weights dim, "
                f"right-aligned, must be 1 or src's)"
            )
        self._dst_like_src(self.src, self.dst)
