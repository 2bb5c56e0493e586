"""The static quantization descriptor: oneDNN Graph's Quantize and Dequantize, scales and zero
points given as attributes (doc/graph/operations/Quantize.md, Dequantize.md)."""

from __future__ import annotations

import math

import attrs

from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._op_desc import WITH_PACKED, Arg, OpDesc, memory_desc, op_kind

QUANTIZE_ALGS = ("quantize", "dequantize")
FLOATS = ("f32", "f16", "bf16")
# What Quantize makes and Dequantize reads: oneDNN's s8, u8, f8_e4m3, f8_e5m2, and the 4-bit
# integers (the kernel stores every element once, so packed stores are safe; see _dtype_io).
QUANTIZED = ("s8", "u8", "f8_e4m3", "f8_e5m2", "s4", "u4")
_F8 = ("f8_e4m3", "f8_e5m2")


def check_sides(alg: str, src: MemoryDesc, dst: MemoryDesc) -> MemoryDesc:
    """What every (de)quantization checks: the direction, same dims on both sides, a float type
    on the float side and a quantized one on the other (typed errors naming each). Returns the
    quantized side."""
    if alg not in QUANTIZE_ALGS:
        raise InvalidArgumentError(f"alg {alg!r} is not one of {', '.join(QUANTIZE_ALGS)}")
    if dst.dims != src.dims:
        raise ArgumentMismatchError(f"dst dims {dst.dims} differ from src dims {src.dims}")
    low, high = (src, dst) if alg == "dequantize" else (dst, src)
    if high.dtype not in FLOATS:
        raise InvalidArgumentError(f"{alg}: the float side has dtype {high.dtype!r}; supported: {', '.join(FLOATS)}")
    if low.dtype not in QUANTIZED:
        raise InvalidArgumentError(
            f"{alg}: the quantized side has dtype {low.dtype!r}; supported: {', '.join(QUANTIZED)}")
    return low


def _floats(value) -> tuple[float, ...]:
    return tuple(float(v) for v in value)


def _ints(value) -> tuple[int, ...]:
    out = []
    for v in value:
        if isinstance(v, bool) or int(v) != v:
            raise InvalidArgumentError(f"zps {tuple(value)!r} must be integers")
        out.append(int(v))
    return tuple(out)


@op_kind
@attrs.frozen(cache_hash=True)
class QuantizeDesc(OpDesc):
    """``alg`` "quantize": ``dst = round(src / scale + zp)`` into a quantized type (nearest even,
    saturated to the integer type's range, NaN to 0; an f8 dst rounds as oneDNN's f8 conversion);
    "dequantize": ``dst = (src - zp) * scale`` into a float type. f32 math either way.

    ``axis`` None is per-tensor (one scale, at most one zero point); an axis (negative counts
    from the end) is per-channel, one scale (and zero point) per index along it. ``zps`` empty
    means zero. f8 types take no zero points other than 0, as in oneDNN.
    """

    alg: str
    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    dst: MemoryDesc = attrs.field(validator=memory_desc("dst"))
    scales: tuple[float, ...] = attrs.field(converter=_floats)
    zps: tuple[int, ...] = attrs.field(default=(), converter=_ints)
    axis: int | None = None

    kind = "quantize"
    ARGS = (Arg("src", dtypes=WITH_PACKED), Arg("dst", output=True, dtypes=WITH_PACKED))

    def __attrs_post_init__(self) -> None:
        low = check_sides(self.alg, self.src, self.dst)
        channels = 1
        if self.axis is not None:
            ndims = self.src.ndims
            if isinstance(self.axis, bool) or not -ndims <= int(self.axis) < ndims:
                raise InvalidArgumentError(f"axis {self.axis!r} is out of range for {ndims} dims")
            self._set("axis", int(self.axis) % ndims)
            channels = self.src.dims[self.axis]
        what = "per-tensor quantization" if self.axis is None else (
            f"per-channel quantization over axis {self.axis} ({channels} channels)")
        if len(self.scales) != channels:
            raise ArgumentMismatchError(f"{len(self.scales)} scales for {what}; expected {channels}")
        if not all(math.isfinite(s) and s != 0.0 for s in self.scales):
            raise InvalidArgumentError(f"scales {self.scales!r} must be finite and nonzero")
        if len(self.zps) not in (0, channels):
            raise ArgumentMismatchError(f"{len(self.zps)} zps for {what}; expected 0 or {channels}")
        if low.dtype in _F8 and any(self.zps):
            raise InvalidArgumentError(f"zps {self.zps!r}: {low.dtype} quantization takes no zero points")

    @property
    def label(self) -> str:
        return self.alg
