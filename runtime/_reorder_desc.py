"""The reorder operation descriptor: copy a tensor into another layout and/or data type."""

from __future__ import annotations

import attrs

from ._errors import ArgumentMismatchError, UnsupportedError
from ._memory_desc import MemoryDesc
from ._primitive_desc import _memory_desc
from .kernels import KernelConfig, KernelSpec
from .kernels import reorder as reorder_kernels


@attrs.frozen(cache_hash=True)
class ReorderDesc:
    """``dst = src`` converted to ``dst``'s layout and data type; the dims must match.

    Any strides on either side and any pair of f32, f16, bf16, s32, s8, u8. Values pass through
    f32; integer destinations round to nearest even and saturate, NaN becomes 0; f16 and bf16
    destinations round to nearest even and keep NaN (see ``triodnn.kernels.reorder``). One data
    type and one dense layout on both sides make a plain copy (``impl`` ``ocl:copy:…``).
    """

    src: MemoryDesc = attrs.field(validator=_memory_desc("src"))
    dst: MemoryDesc = attrs.field(validator=_memory_desc("dst"))

    kind = "reorder"

    def __attrs_post_init__(self) -> None:
        if self.dst.dims != self.src.dims:
            raise ArgumentMismatchError(
                f"dst dims {self.dst.dims} differ from src dims {self.src.dims}; "
                "a reorder changes layout or data type, never the shape"
            )

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        return {"src": self.src, "dst": self.dst}

    @property
    def label(self) -> str:
        return "reorder"

    def check_supported(self) -> None:
        for name, desc in self.arg_descs.items():
            if desc.dtype not in reorder_kernels.DTYPES:
                raise UnsupportedError(
                    f"reorder: {name} has dtype {desc.dtype!r}; supported: "
                    f"{', '.join(reorder_kernels.DTYPES)}"
                )

    def generate(self, config: KernelConfig) -> KernelSpec:
        self.check_supported()
        return reorder_kernels.generate(
            dims=self.src.dims,
            src_dtype=self.src.dtype,
            src_strides=self.src.strides,
            dst_dtype=self.dst.dtype,
            dst_strides=self.dst.strides,
            config=config,
        )
