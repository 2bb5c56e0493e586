"""The dynamic quantization descriptor: oneDNN Graph's DynamicQuantize and DynamicDequantize,
scales and zero points given as tensors at execution (doc/graph/operations/DynamicDequantize.md)."""

from __future__ import annotations

import attrs

from ._errors import ArgumentMismatchError
from ._memory_desc import MemoryDesc
from ._op_desc import WITH_PACKED, Arg, OpDesc, memory_desc, op_kind
from ._quantize_desc import FLOATS, check_sides

ZERO_POINT_TYPES = ("s8", "u8", "s32", "s4", "u4")


def _group(value) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


def check_groups(operand: str, dims: tuple[int, ...], group_shape: tuple[int, ...], **tensors) -> None:
    """``ArgumentMismatchError`` unless ``group_shape`` divides ``dims`` (``operand``'s, one positive
    divisor a dim) and each of ``tensors`` (scales, zero points; None where absent) has dims
    ``dims // group_shape``, one value per group."""
    if len(group_shape) != len(dims) or any(g < 1 or d % g for g, d in zip(group_shape, dims)):
        raise ArgumentMismatchError(
            f"group_shape {group_shape} does not divide {operand} dims {dims} (one positive divisor a dim)")
    expected = tuple(d // g for d, g in zip(dims, group_shape))
    for name, md in tensors.items():
        if md is not None and md.dims != expected:
            raise ArgumentMismatchError(
                f"{name} dims {md.dims} do not match {operand} dims {dims} in groups of {group_shape}: "
                f"expected {expected}")


@op_kind
@attrs.frozen(cache_hash=True)
class DynamicQuantizeDesc(OpDesc):
    """``alg`` "quantize": ``dst = round(src / scale + zp)``; "dequantize":
    ``dst = (src - zp) * scale``; f32 math, stores as ``QuantizeDesc``'s.

    One form covers oneDNN's per-tensor, per-channel and per-group quantization: ``scales`` (and
    ``zps``, when given) have src's rank, and element ``i`` of src takes the scale at
    ``i // group_shape`` on every dim, so ``scales.dims == src.dims // group_shape``. Per tensor
    is ``group_shape == src.dims`` (scales all 1s), per channel along ``axis`` is src's dims with
    1 on the axis. The graph op gives the scales that rank (a view: no copy).
    """

    alg: str
    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    scales: MemoryDesc = attrs.field(validator=memory_desc("scales"))
    dst: MemoryDesc = attrs.field(validator=memory_desc("dst"))
    group_shape: tuple[int, ...] = attrs.field(converter=_group)
    zps: MemoryDesc | None = None

    kind = "dynamic_quantize"
    ARGS = (Arg("src", dtypes=WITH_PACKED), Arg("scales", dtypes=FLOATS),
            Arg("zps", optional=True, dtypes=ZERO_POINT_TYPES), Arg("dst", output=True, dtypes=WITH_PACKED))

    def __attrs_post_init__(self) -> None:
        check_sides(self.alg, self.src, self.dst)
        check_groups("src", self.src.dims, self.group_shape, scales=self.scales, zps=self.zps)

    @property
    def label(self) -> str:
        return f"dynamic_{self.alg}"
