"""The PReLU backward descriptor: the gradients of ``src >= 0 ? src : weights * src`` with
respect to src and to the (broadcast) weights, as a value."""

from __future__ import annotations

import attrs

from ._errors import ArgumentMismatchError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, check_memory_desc, memory_desc, op_kind


@op_kind
@attrs.frozen(cache_hash=True)
class PreluBackwardDesc(OpDesc):
    """oneDNN's PReLU backward: ``diff_src = src > 0 ? diff_dst : weights * diff_dst`` and
    ``diff_weights`` the sum, over the dims where the weights broadcast, of
    ``src > 0 ? 0 : diff_dst * src`` (oneDNN's ref_prelu: at ``src == 0`` the slope side).

    ``weights`` broadcasts one way to ``src`` as in ``PreluDesc`` (right-aligned, each dim 1 or
    src's). ``diff_dst`` and ``diff_src`` have src's dims, ``diff_weights`` the weights'; they
    default to src's and the weights' layout and data type. Any storage types, f32 math.
    """

    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    weights: MemoryDesc = attrs.field(validator=memory_desc("weights"))
    diff_dst: MemoryDesc = attrs.field(validator=memory_desc("diff_dst"))
    diff_src: MemoryDesc = attrs.field(default=None)
    diff_weights: MemoryDesc = attrs.field(default=None)

    kind = "prelu_backward"
    ARGS = (Arg("src"), Arg("weights"), Arg("diff_dst"), Arg("diff_src", output=True),
            Arg("diff_weights", output=True))

    def __attrs_post_init__(self) -> None:
        src, weights = self.src.dims, self.weights.dims
        if len(weights) > len(src) or any(w not in (1, s) for w, s in zip(reversed(weights), reversed(src))):
            raise ArgumentMismatchError(
                f"weights dims {weights} do not broadcast to src dims {src} (each weights dim, "
                f"right-aligned, must be 1 or src's)"
            )
        if self.diff_dst.dims != src:
            raise ArgumentMismatchError(f"diff_dst dims {self.diff_dst.dims} differ from src dims {src}")
        if self.diff_src is None:
            self._set("diff_src", self.src)
        check_memory_desc("diff_src", self.diff_src)
        if self.diff_src.dims != src:
            raise ArgumentMismatchError(f"diff_src dims {self.diff_src.dims} differ from src dims {src}")
        if self.diff_weights is None:
            self._set("diff_weights", self.weights)
        check_memory_desc("diff_weights", self.diff_weights)
        if self.diff_weights.dims != weights:
            raise ArgumentMismatchError(
                f"diff_weights dims {self.diff_weights.dims} differ from weights dims {weights}"
            )
