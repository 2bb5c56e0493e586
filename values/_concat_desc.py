"""The concat descriptor: N inputs named ``src0`` .. ``src{N-1}``, then ``dst``.

Errors name the offending argument (``srcs[i]``, ``axis``, ``dst``) and read like those of the
other kinds, whose checks they share. Every source and dst may have its own data type.
"""

from __future__ import annotations

import attrs

from ._axes import axis_index, to_axis
from ._errors import ArgumentMismatchError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, check_memory_desc, op_kind
from ._variadic import to_srcs


@op_kind
@attrs.frozen(cache_hash=True)
class ConcatDesc(OpDesc):
    """``dst = concatenate(srcs, axis)``, oneDNN's concat primitive.

    ``srcs``: a tuple of MemoryDesc (a list is stored as a tuple). Every source has the same
    number of dimensions and the same dims off ``axis``; each in any layout. ``axis`` may be
    negative, as numpy's; it is stored normalised. ``dst`` defaults to the dense row-major tensor
    whose ``axis`` extent is the sources' sum, in srcs[0]'s data type. Sources of dst's data type
    are copied bit for bit; others are converted through f32.
    """

    srcs: tuple[MemoryDesc, ...] = attrs.field(converter=to_srcs)
    axis: int = attrs.field(converter=axis_index)
    dst: MemoryDesc = attrs.field(default=None)

    kind = "concat"
    ARGS = (Arg("srcs", variadic_prefix="src"), Arg("dst", output=True))

    def __attrs_post_init__(self) -> None:
        first = self.srcs[0]
        ndims = first.ndims
        axis = to_axis(self.axis, ndims, f"srcs of {ndims} dimensions {first.dims}")
        self._set("axis", axis)
        for i, md in enumerate(self.srcs[1:], start=1):
            if md.ndims != ndims:
                raise ArgumentMismatchError(
                    f"srcs[{i}] dims {md.dims} have {md.ndims} dimensions; srcs[0] dims {first.dims} have {ndims}"
                )
            if any(d != d0 for k, (d, d0) in enumerate(zip(md.dims, first.dims)) if k != axis):
                raise ArgumentMismatchError(
                    f"srcs[{i}] dims {md.dims} differ from srcs[0] dims {first.dims} off axis {axis}"
                )
        joined = list(first.dims)
        joined[axis] = sum(md.dims[axis] for md in self.srcs)
        dims = tuple(joined)
        if self.dst is None:
            self._set("dst", MemoryDesc(dims, first.dtype))
        check_memory_desc("dst", self.dst)
        if self.dst.dims != dims:
            raise ArgumentMismatchError(
                f"dst dims {self.dst.dims} differ from the concatenation's dims {dims} (axis {axis})"
            )

    @property
    def label(self) -> str:
        return f"concat:{len(self.srcs)}:axis{self.axis}"
