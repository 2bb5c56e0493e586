"""The sum descriptor: N inputs named ``src0`` .. ``src{N-1}``, then ``dst``.

Errors name the offending argument (``srcs[i]``, ``scales``, ``dst``) and read like those of the
other kinds, whose checks they share. Every source and dst may have its own data type: values are
converted through f32.
"""

from __future__ import annotations

import attrs

from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._numbers import finite_float, float_key
from ._op_desc import Arg, OpDesc, check_memory_desc, op_kind
from ._variadic import to_srcs


def _to_scales(value) -> tuple[float, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        raise InvalidArgumentError(f"scales {value!r} is not a sequence of numbers")
    try:
        items = tuple(value)
    except TypeError:
        raise InvalidArgumentError(f"scales {value!r} is not a sequence of numbers") from None
    return tuple(finite_float(f"scales[{i}]")(v) for i, v in enumerate(items))


def _scales_key(scales) -> tuple | None:
    # -0.0 and 0.0 bake different literals (the sign of a zero sum can differ): different keys.
    return None if scales is None else tuple(float_key(s) for s in scales)


@op_kind
@attrs.frozen(cache_hash=True)
class SumDesc(OpDesc):
    """``dst = sum_i scales[i] * srcs[i]``, oneDNN's sum primitive.

    ``srcs``: a tuple of MemoryDesc (a list is stored as a tuple). Every source has the same dims,
    each in any layout; ``scales`` defaults to 1.0 for each input (the descriptor stores the
    resolved tuple, so an explicit default and an omitted one are one primitive); ``dst`` defaults
    to the dense row-major tensor of those dims, in srcs[0]'s data type. ``dst`` may be the same
    memory as ``src0`` when their descriptors are equal (in place). Any data types ("f32 math, any
    storage").
    """

    srcs: tuple[MemoryDesc, ...] = attrs.field(converter=to_srcs)
    # None (the default) becomes 1.0 per input in __attrs_post_init__.
    scales: tuple[float, ...] = attrs.field(default=None, converter=_to_scales, eq=_scales_key)
    dst: MemoryDesc = attrs.field(default=None)

    kind = "sum"
    ARGS = (Arg("srcs", variadic_prefix="src"), Arg("dst", output=True))

    def __attrs_post_init__(self) -> None:
        dims = self.srcs[0].dims
        for i, md in enumerate(self.srcs[1:], start=1):
            if md.dims != dims:
                raise ArgumentMismatchError(f"srcs[{i}] dims {md.dims} differ from srcs[0] dims {dims}")
        if self.scales is None:
            self._set("scales", (1.0,) * len(self.srcs))
        elif len(self.scales) != len(self.srcs):
            raise InvalidArgumentError(
                f"scales has {len(self.scales)} values for {len(self.srcs)} srcs; give one per input"
            )
        if self.dst is None:
            self._set("dst", MemoryDesc(dims, self.srcs[0].dtype))
        check_memory_desc("dst", self.dst)
        if self.dst.dims != dims:
            raise ArgumentMismatchError(f"dst dims {self.dst.dims} differ from srcs dims {dims}")

    @property
    def label(self) -> str:
        return f"sum:{len(self.srcs)}"
