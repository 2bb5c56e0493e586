"""How a quantized operand of a fused primitive maps to real values: oneDNN Graph's Dequantize /
DynamicDequantize (and the Quantize -> Dequantize round trip of attention probabilities) as a
frozen value a descriptor carries, so that the kernel applies it on the fly and the graph's
quantization ops need no kernel and no buffer of their own.

``real = (stored - zp) * scale``; quantizing is ``stored = saturate(round_half_even(real / scale
+ zp))``. A static quantization (oneDNN's per-tensor ``scales``/``zps`` attributes) bakes ``scale``
and ``zp`` into the kernel source: they are part of the primitive key anyway. A grouped one
(DynamicDequantize's ``per_group``: scales and zero points as run-time tensors) has ``scale`` None
and a ``group`` of (rows, cols) over the operand's last two dims; the descriptor then takes the
scales (and optional zero points) as memory arguments.

``round_in`` and ``round_out`` are the float types the graph rounds the values to on the way in
(the type a value had before the graph's TypeCast to f32 and Quantize) and out (a TypeCast after
the Dequantize): the kernel rounds the same way, so that its integers match the op-by-op graph's.
"""

from __future__ import annotations

import math

import attrs

from ._errors import InvalidArgumentError

INTEGER_TYPES: tuple[str, ...] = ("s8", "u8", "s4", "u4")
FLOAT8_TYPES: tuple[str, ...] = ("f8_e4m3", "f8_e5m2")
QUANTIZED_TYPES: tuple[str, ...] = INTEGER_TYPES + FLOAT8_TYPES
ROUNDINGS: tuple[str, ...] = ("f32", "bf16", "f16")
RANGES: dict[str, tuple[int, int]] = {"s8": (-128, 127), "u8": (0, 255), "s4": (-8, 7), "u4": (0, 15)}


def _check_dtype(instance, attribute, value) -> None:
    if value not in QUANTIZED_TYPES:
        raise InvalidArgumentError(f"quantized dtype {value!r} is not one of {', '.join(QUANTIZED_TYPES)}")


def _check_scale(instance, attribute, value) -> None:
    if value is not None and not (math.isfinite(value) and value != 0.0):
        raise InvalidArgumentError(f"quantization scale {value!r} must be finite and nonzero")


def _check_rounding(instance, attribute, value) -> None:
    if value not in ROUNDINGS:
        raise InvalidArgumentError(f"{attribute.name} {value!r} is not one of {', '.join(ROUNDINGS)}")


def _group(value) -> tuple[int, int] | None:
    if value is None:
        return None
    group = tuple(int(g) for g in value)
    if len(group) != 2 or min(group) < 1:
        raise InvalidArgumentError(f"group {tuple(value)!r} must be two positive sizes (rows, cols)")
    return group


@attrs.frozen
class Quantization:
    """One operand's quantization; see the module docstring."""

    dtype: str = attrs.field(validator=_check_dtype)
    scale: float | None = attrs.field(default=None, converter=attrs.converters.optional(float),
                                      validator=_check_scale)
    zp: int = attrs.field(default=0, converter=int)
    group: tuple[int, int] | None = attrs.field(default=None, converter=_group)
    round_in: str = attrs.field(default="f32", validator=_check_rounding)
    round_out: str = attrs.field(default="f32", validator=_check_rounding)

    def __attrs_post_init__(self) -> None:
        if (self.scale is None) == (self.group is None):
            raise InvalidArgumentError(
                "a quantization has either a static scale or a group of run-time scales, not "
                f"{'both' if self.scale is not None else 'neither'}")
        if self.dtype in FLOAT8_TYPES and self.zp:
            raise InvalidArgumentError(f"{self.dtype} has no zero point (zp={self.zp})")
        if self.dtype in RANGES:
            low, high = RANGES[self.dtype]
            if not low <= self.zp <= high:
                raise InvalidArgumentError(f"zero point {self.zp} is outside {self.dtype}'s range [{low}, {high}]")

    @property
    def grouped(self) -> bool:
        return self.group is not None

    @property
    def static_scale(self) -> float:
        """The static scale (a grouped quantization has none: its scales are run-time tensors)."""
        if self.scale is None:
            raise InvalidArgumentError("a grouped quantization has run-time scales, not a static one")
        return self.scale
