"""Operation descriptors for sum and concat: N inputs named ``src0`` .. ``src{N-1}``, then ``dst``.

Both take their sources as a tuple of MemoryDesc (a list is accepted and stored as a tuple, so the
descriptor stays a hashable cache key). Errors name the offending argument (``srcs[i]``,
``scales``, ``axis``, ``dst``) and read like those of the other kinds, whose checks they share.

Every source and dst may have its own data type (``AnyStorage``): values are converted through f32.
"""

from __future__ import annotations

import attrs

from ._values._errors import ArgumentMismatchError, InvalidArgumentError
from ._values._memory_desc import MemoryDesc
from ._primitive_desc import AnyStorage, _finite_float, _float_key, _memory_desc
from ._reduction_desc import _to_axis
from .kernels import KernelConfig, KernelSpec
from .kernels import concat as concat_kernels
from .kernels import sum as sum_kernels

MAX_INPUTS = 64


def _to_srcs(value) -> tuple[MemoryDesc, ...]:
    if isinstance(value, (MemoryDesc, str, bytes)) or value is None:
        raise InvalidArgumentError(
            f"srcs is {type(value).__name__}, expected a tuple of triodnn.MemoryDesc"
        )
    try:
        srcs = tuple(value)
    except TypeError:
        raise InvalidArgumentError(
            f"srcs is {type(value).__name__}, expected a tuple of triodnn.MemoryDesc"
        ) from None
    if not 1 <= len(srcs) <= MAX_INPUTS:
        raise InvalidArgumentError(f"srcs has {len(srcs)} inputs; 1 to {MAX_INPUTS} are supported")
    for i, md in enumerate(srcs):
        _memory_desc(f"srcs[{i}]")(None, None, md)
    return srcs


def _to_scales(value) -> tuple[float, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        raise InvalidArgumentError(f"scales {value!r} is not a sequence of numbers")
    try:
        items = tuple(value)
    except TypeError:
        raise InvalidArgumentError(f"scales {value!r} is not a sequence of numbers") from None
    return tuple(_finite_float(f"scales[{i}]")(v) for i, v in enumerate(items))


def _scales_key(scales) -> tuple | None:
    # -0.0 and 0.0 bake different literals (the sign of a zero sum can differ): different keys.
    return None if scales is None else tuple(_float_key(s) for s in scales)


def _src_args(srcs: tuple[MemoryDesc, ...], dst: MemoryDesc) -> dict[str, MemoryDesc]:
    descs = {f"src{i}": md for i, md in enumerate(srcs)}
    descs["dst"] = dst
    return descs


@attrs.frozen(cache_hash=True)
class SumDesc(AnyStorage):
    """``dst = sum_i scales[i] * srcs[i]``, oneDNN's sum primitive.

    Every source has the same dims, each in any layout; ``scales`` defaults to 1.0 for each input
    (the descriptor stores the resolved tuple, so an explicit default and an omitted one are one
    primitive); ``dst`` defaults to the dense row-major tensor of those dims, in srcs[0]'s data
    type. ``dst`` may be the same memory as ``src0`` when their descriptors are equal (in place).
    """

    srcs: tuple[MemoryDesc, ...] = attrs.field(converter=_to_srcs)
    scales: tuple[float, ...] | None = attrs.field(default=None, converter=_to_scales, eq=_scales_key)
    dst: MemoryDesc = attrs.field(default=None)

    kind = "sum"

    def __attrs_post_init__(self) -> None:
        dims = self.srcs[0].dims
        for i, md in enumerate(self.srcs[1:], start=1):
            if md.dims != dims:
                raise ArgumentMismatchError(f"srcs[{i}] dims {md.dims} differ from srcs[0] dims {dims}")
        if self.scales is None:
            object.__setattr__(self, "scales", (1.0,) * len(self.srcs))
        elif len(self.scales) != len(self.srcs):
            raise InvalidArgumentError(
                f"scales has {len(self.scales)} values for {len(self.srcs)} srcs; give one per input"
            )
        if self.dst is None:
            object.__setattr__(self, "dst", MemoryDesc(dims, self.srcs[0].dtype))
        _memory_desc("dst")(self, None, self.dst)
        if self.dst.dims != dims:
            raise ArgumentMismatchError(f"dst dims {self.dst.dims} differ from srcs dims {dims}")

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        return _src_args(self.srcs, self.dst)

    @property
    def label(self) -> str:
        return f"sum:{len(self.srcs)}"


    def generate(self, config: KernelConfig) -> KernelSpec:
        self.check_supported()
        return sum_kernels.generate(
            dims=self.dst.dims,
            src_strides=tuple(md.strides for md in self.srcs),
            scales=self.scales,
            dst_strides=self.dst.strides,
            config=config,
            src_dtypes=tuple(md.dtype for md in self.srcs),
            dst_dtype=self.dst.dtype,
        )


@attrs.frozen(cache_hash=True)
class ConcatDesc(AnyStorage):
    """``dst = concatenate(srcs, axis)``, oneDNN's concat primitive.

    Every source has the same number of dimensions and the same dims off ``axis``; each in any
    layout. ``axis`` may be negative, as numpy's; it is stored normalised. ``dst`` defaults to the
    dense row-major tensor whose ``axis`` extent is the sources' sum, in srcs[0]'s data type.
    Sources of dst's data type are copied bit for bit; others are converted through f32.
    """

    srcs: tuple[MemoryDesc, ...] = attrs.field(converter=_to_srcs)
    axis: int = attrs.field(converter=_to_axis)
    dst: MemoryDesc = attrs.field(default=None)

    kind = "concat"

    def __attrs_post_init__(self) -> None:
        first = self.srcs[0]
        ndims = first.ndims
        if not -ndims <= self.axis < ndims:
            raise InvalidArgumentError(
                f"axis {self.axis} is out of range for srcs of {ndims} dimensions {first.dims}"
            )
        axis = self.axis % ndims
        object.__setattr__(self, "axis", axis)
        for i, md in enumerate(self.srcs[1:], start=1):
            if md.ndims != ndims:
                raise ArgumentMismatchError(
                    f"srcs[{i}] dims {md.dims} have {md.ndims} dimensions; srcs[0] dims {first.dims} have {ndims}"
                )
            if any(d != d0 for k, (d, d0) in enumerate(zip(md.dims, first.dims)) if k != axis):
                raise ArgumentMismatchError(
                    f"srcs[{i}] dims {md.dims} differ from srcs[0] dims {first.dims} off axis {axis}"
                )
        dims = list(first.dims)
        dims[axis] = sum(md.dims[axis] for md in self.srcs)
        dims = tuple(dims)
        if self.dst is None:
            object.__setattr__(self, "dst", MemoryDesc(dims, first.dtype))
        _memory_desc("dst")(self, None, self.dst)
        if self.dst.dims != dims:
            raise ArgumentMismatchError(
                f"dst dims {self.dst.dims} differ from the concatenation's dims {dims} (axis {axis})"
            )

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        return _src_args(self.srcs, self.dst)

    @property
    def label(self) -> str:
        return f"concat:{len(self.srcs)}:axis{self.axis}"


    def generate(self, config: KernelConfig) -> KernelSpec:
        self.check_supported()
        return concat_kernels.generate(
            src_dims=tuple(md.dims for md in self.srcs),
            src_strides=tuple(md.strides for md in self.srcs),
            axis=self.axis,
            dst_strides=self.dst.strides,
            config=config,
            src_dtypes=tuple(md.dtype for md in self.srcs),
            dst_dtype=self.dst.dtype,
        )
