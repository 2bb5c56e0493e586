"""The reorder descriptor: copy a tensor into another layout and/or data type; and the cache key
of a reorder between memories of two OpenCL contexts (``Engine.create_reorder``)."""

from __future__ import annotations

import attrs

from ._errors import ArgumentMismatchError
from ._keys import EngineIdentity
from ._memory_desc import MemoryDesc
from ._op_desc import WITH_PACKED, Arg, OpDesc, memory_desc, op_kind


@op_kind
@attrs.frozen(cache_hash=True)
class ReorderDesc(OpDesc):
    """``dst = src`` converted to ``dst``'s layout and data type; the dims must match.

    Any strides on either side and any pair of f32, f16, bf16, s32, s8, u8 and boolean. Values
    pass through f32; integer destinations round to nearest even and saturate, NaN becomes 0; f16
    and bf16 destinations round to nearest even and keep NaN; a boolean destination holds
    ``value != 0`` (see ``triodnn.kernels.reorder``). One data type on both sides copies the
    stored bits; with one dense layout too, a plain copy (``impl`` ``ocl:copy:…``).
    Between memories of two engines (OpenCL contexts), ``await engine.create_reorder(src, dst,
    src_engine=..., dst_engine=...)`` builds the cross-engine reorder.
    """

    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    dst: MemoryDesc = attrs.field(validator=memory_desc("dst"))

    kind = "reorder"
    ARGS = (Arg("src", dtypes=WITH_PACKED), Arg("dst", output=True, dtypes=WITH_PACKED))

    def __attrs_post_init__(self) -> None:
        if self.dst.dims != self.src.dims:
            raise ArgumentMismatchError(
                f"dst dims {self.dst.dims} differ from src dims {self.src.dims}; "
                "a reorder changes layout or data type, never the shape"
            )


@attrs.frozen(cache_hash=True)
class CrossEngineReorderDesc(OpDesc):
    """The primitive cache's op descriptor for a reorder between two OpenCL contexts: the
    reorder and both engines' identities (device and context), as oneDNN's reorder key records
    its engines. The kernel is the reorder's own. Not an ``op_kind`` (its kind is the reorder's),
    so cache blobs leave it out: a context does not outlive its process."""

    reorder: ReorderDesc
    src_engine: EngineIdentity
    dst_engine: EngineIdentity

    kind = "reorder"

    # Its arguments are its reorder's: delegated rather than declared, the fields are not memories.
    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        return self.reorder.arg_descs

    def check_supported(self) -> None:
        self.reorder.check_supported()

    @property
    def label(self) -> str:
        return "reorder:cross_engine"
