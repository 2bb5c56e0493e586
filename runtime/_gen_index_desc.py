"""The GenIndex descriptor: fill a tensor with each element's coordinate along one axis."""

from __future__ import annotations

import attrs

from ._values._errors import InvalidArgumentError, UnsupportedError
from ._values._memory_desc import MemoryDesc
from ._primitive_desc import _memory_desc
from ._reduction_desc import _to_axis
from .kernels import KernelConfig, KernelSpec
from .kernels import gen_index as gen_index_kernels


@attrs.frozen(cache_hash=True)
class GenIndexDesc:
    """``dst[i...] = i[axis]`` (oneDNN Graph's GenIndex); ``dst`` is s32 or f32, any strides."""

    dst: MemoryDesc = attrs.field(validator=_memory_desc("dst"))
    axis: int = attrs.field(converter=_to_axis)

    kind = "gen_index"

    def __attrs_post_init__(self) -> None:
        ndims = self.dst.ndims
        if not -ndims <= self.axis < ndims:
            raise InvalidArgumentError(f"axis {self.axis} is out of range for dst dims {self.dst.dims}")
        object.__setattr__(self, "axis", self.axis % ndims)

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        return {"dst": self.dst}

    @property
    def label(self) -> str:
        return "gen_index"

    def check_supported(self) -> None:
        if self.dst.dtype not in gen_index_kernels.DTYPES:
            raise UnsupportedError(
                f"gen_index: dst has dtype {self.dst.dtype!r}; supported: {', '.join(gen_index_kernels.DTYPES)}"
            )

    def generate(self, config: KernelConfig) -> KernelSpec:
        self.check_supported()
        return gen_index_kernels.generate(
            dims=self.dst.dims, dst_strides=self.dst.strides, axis=self.axis,
            dtype=self.dst.dtype, config=config,
        )
