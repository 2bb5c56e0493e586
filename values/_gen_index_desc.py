"""The GenIndex descriptor: fill a tensor with each element's coordinate along one axis."""

from __future__ import annotations

import attrs

from ._axes import axis_index, to_axis
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, memory_desc, op_kind

# The dst types GenIndex writes: oneDNN Graph's s32 indices, and f32 for masks built in f32.
GEN_INDEX_DTYPES: tuple[str, ...] = ("s32", "f32")


@op_kind
@attrs.frozen(cache_hash=True)
class GenIndexDesc(OpDesc):
    """``dst[i...] = i[axis]`` (oneDNN Graph's GenIndex); ``dst`` is s32 or f32, any strides.

    ``axis`` may be negative, as numpy's; it is stored normalised."""

    dst: MemoryDesc = attrs.field(validator=memory_desc("dst"))
    axis: int = attrs.field(converter=axis_index)

    kind = "gen_index"
    ARGS = (Arg("dst", output=True, dtypes=GEN_INDEX_DTYPES),)

    def __attrs_post_init__(self) -> None:
        self._set("axis", to_axis(self.axis, self.dst.ndims, f"dst dims {self.dst.dims}"))
