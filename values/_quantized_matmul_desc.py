"""The int8 matmul descriptor: dequantize -> matmul (+ post-ops) -> quantize as one primitive.

A kind of its own rather than more attributes on ``MatmulDesc``: the math differs (integer
accumulation of zero-point-shifted int8 values, not f32 math on any storage), the valid input
types differ (s8/u8 only) and the scales and zero points only mean something for it. Keeping them
off ``MatmulDesc`` leaves every f32/bf16 matmul's key, kernels and checks as they were, and the
registry maps one descriptor class to one generator, as for every other kind.

Scales and zero points are frozen values (oneDNN Graph's Quantize/Dequantize attributes), baked
into the kernel source as the static quantization kernel does: they are part of the key anyway.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from . import _post_ops
from ._algorithms import broadcast_dims
from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, check_memory_desc, op_kind
from ._quantization import RANGES

INT8 = ("s8", "u8")
FLOAT_DST = ("f32", "f16", "bf16")


def _floats(value) -> tuple[float, ...]:
    return tuple(float(v) for v in value)


def _ints(value) -> tuple[int, ...]:
    out = []
    for v in value:
        if isinstance(v, bool) or int(v) != v:
            raise InvalidArgumentError(f"zero points {tuple(value)!r} must be integers")
        out.append(int(v))
    return tuple(out)


def _scale(name: str, value: float) -> None:
    if not (math.isfinite(value) and value != 0.0):
        raise InvalidArgumentError(f"{name} {value!r} must be finite and nonzero")


@op_kind
@attrs.frozen(cache_hash=True)
class QuantizedMatmulDesc(OpDesc):
    """``dst = Q((src - src_zp) @ (weights - wei_zps) * src_scale * wei_scales + bias)``, batched as
    ``MatmulDesc`` (numpy broadcasting of the batch dims, any strides).

    ``src`` and ``weights`` are s8 or u8; their products accumulate in int32 (exact for
    ``K * 255 * 255 < 2**31``, K up to 33025). ``src_scale``/``src_zp``: per tensor (oneDNN's
    src). ``wei_scales``/``wei_zps``: one value (per tensor) or one per output channel N
    (``wei_zps`` empty means zero). The int32 sum becomes f32 times the f32 product of the two
    scales, then ``bias`` (f32/f16/bf16, broadcasting to dst) and ``post_ops`` (as MatmulDesc's)
    apply. ``Q``: for an s8/u8 ``dst``, ``round(y / dst_scale + dst_zp)`` to nearest even,
    saturated (oneDNN's Quantize); for an f32/f16/bf16 ``dst`` (the default f32), ``y /
    dst_scale`` (``dst_zp`` must then be 0).
    """

    src: MemoryDesc
    weights: MemoryDesc
    dst: MemoryDesc = attrs.field(default=None)
    bias: MemoryDesc | None = None
    src_scale: float = attrs.field(default=1.0, kw_only=True, converter=float)
    src_zp: int = attrs.field(default=0, kw_only=True)
    wei_scales: tuple[float, ...] = attrs.field(default=(1.0,), kw_only=True, converter=_floats)
    wei_zps: tuple[int, ...] = attrs.field(default=(), kw_only=True, converter=_ints)
    dst_scale: float = attrs.field(default=1.0, kw_only=True, converter=float)
    dst_zp: int = attrs.field(default=0, kw_only=True)
    post_ops: tuple = attrs.field(default=(), kw_only=True, eq=_post_ops.eq_key)

    kind = "quantized_matmul"
    ARGS = (
        Arg("src", dtypes=INT8), Arg("weights", dtypes=INT8),
        Arg("bias", optional=True, dtypes=FLOAT_DST),
        Arg("dst", output=True, dtypes=INT8 + FLOAT_DST),
    )

    def __attrs_post_init__(self) -> None:
        check_memory_desc("src", self.src)
        check_memory_desc("weights", self.weights)
        for name, md in (("src", self.src), ("weights", self.weights)):
            if md.ndims < 2:
                raise InvalidArgumentError(f"{name} dims {md.dims} need at least 2 dimensions (rows, columns)")
            if md.dtype not in INT8:
                raise InvalidArgumentError(f"{name} has dtype {md.dtype!r}; an int8 matmul takes s8 or u8")
        (m, k), (k2, n) = self.src.dims[-2:], self.weights.dims[-2:]
        if k != k2:
            raise ArgumentMismatchError(
                f"src dims {self.src.dims} have K={k} but weights dims {self.weights.dims} have K={k2}")
        try:
            batch = broadcast_dims(self.src.dims[:-2], self.weights.dims[:-2])
        except ValueError:
            raise ArgumentMismatchError(
                f"batch dims of src {self.src.dims[:-2]} and weights {self.weights.dims[:-2]} do not broadcast"
            ) from None
        dims = batch + (m, n)
        if self.dst is None:
            self._set("dst", MemoryDesc(dims, "f32"))
        check_memory_desc("dst", self.dst)
        if self.dst.dims != dims:
            raise ArgumentMismatchError(f"dst dims {self.dst.dims} differ from src @ weights dims {dims}")
        if self.dst.dtype not in INT8 + FLOAT_DST:
            raise InvalidArgumentError(f"dst has dtype {self.dst.dtype!r}; supported: {', '.join(INT8 + FLOAT_DST)}")
        if self.bias is not None:
            check_memory_desc("bias", self.bias)
            try:
                fits = self.bias.ndims <= len(dims) and np.broadcast_shapes(self.bias.dims, dims) == dims
            except ValueError:
                fits = False
            if not fits:
                raise ArgumentMismatchError(f"bias dims {self.bias.dims} do not broadcast to dst dims {dims}")
        self._set("src_zp", self._zp("src_zp", self.src_zp, self.src.dtype))
        self._set("dst_zp", self._zp("dst_zp", self.dst_zp, self.dst.dtype if self.dst.dtype in INT8 else None))
        _scale("src_scale", self.src_scale)
        _scale("dst_scale", self.dst_scale)
        if len(self.wei_scales) not in (1, n):
            raise ArgumentMismatchError(
                f"{len(self.wei_scales)} wei_scales; expected 1 (per tensor) or {n} (one per output channel)")
        for s in self.wei_scales:
            _scale("wei_scales", s)
        if len(self.wei_zps) not in (0, 1, n):
            raise ArgumentMismatchError(
                f"{len(self.wei_zps)} wei_zps; expected 0, 1 (per tensor) or {n} (one per output channel)")
        for z in self.wei_zps:
            self._zp("wei_zps", z, self.weights.dtype)
        self._set("post_ops", _post_ops.check(self.post_ops, dims))

    @staticmethod
    def _zp(name: str, value, dtype: str | None) -> int:
        """A zero point inside ``dtype``'s range (0 only, for a float dst)."""
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) != value:
            raise InvalidArgumentError(f"{name} {value!r} must be an integer")
        low, high = RANGES[dtype] if dtype in INT8 else (0, 0)
        if not low <= int(value) <= high:
            where = f"{dtype} range [{low}, {high}]" if dtype else "a float dst: it must be 0"
            raise InvalidArgumentError(f"{name} {value} is outside the {where}")
        return int(value)
