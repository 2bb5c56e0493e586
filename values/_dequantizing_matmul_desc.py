"""The weights-decompression matmul descriptor: integer weights dequantized inside the matmul.

oneDNN's matmul takes int4/int8 weights with grouped scales and zero points ("weights
decompression", the large language models' weight-only quantization), and oneDNN Graph fuses
DynamicDequantize -> MatMul into it. Op by op, the dequantization writes the whole weight matrix
in a float type before the product reads it back: for the int4 gated MLP of oneDNN's suite
(4096 x 14336 weights, M = 1), 235 MB written and read per matmul where the packed weights are
29 MB. A kind of its own, as ``QuantizedMatmulDesc``: the scales and zero points are tensors
given at execution, and they mean nothing to any other matmul.
"""

from __future__ import annotations

import attrs

from . import _post_ops
from ._dynamic_quantize_desc import ZERO_POINT_TYPES, check_groups
from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, check_memory_desc, op_kind

FLOATS = ("f32", "f16", "bf16")
WEIGHT_TYPES = ("s4", "u4", "s8", "u8")


def _group(value) -> tuple[int, int]:
    group = tuple(int(v) for v in value)
    if len(group) != 2:
        raise InvalidArgumentError(f"group_shape {tuple(value)!r} needs two sizes (along K, along N)")
    return group


@op_kind
@attrs.frozen(cache_hash=True)
class DequantizingMatmulDesc(OpDesc):
    """``dst = src @ W (+ post-ops)`` where ``W = dequantized((weights - zps) * scales)``.

    ``src`` [M, K] and ``dst`` [M, N] are f32, f16 or bf16; ``weights`` [K, N] (any strides: a
    transposed layout is a stride) are s4, u4, s8 or u8. ``scales`` (f32/f16/bf16) and ``zps``
    (optional, s8/u8/s32/s4/u4) are tensors of dims ``(K // group_shape[0], N // group_shape[1])``:
    weight ``(k, n)`` takes the scale and zero point at ``(k // gk, n // gn)``, so per tensor,
    per output channel and per group along K or N are one form, as ``DynamicQuantizeDesc``'s.

    Each dequantized weight is computed in f32 and rounded to ``dequantized`` (the type
    DynamicDequantize's output had in the graph, default f32), then the products accumulate in
    f32, as the op-by-op graph computes them. ``post_ops`` as ``MatmulDesc``'s.
    """

    src: MemoryDesc
    weights: MemoryDesc
    scales: MemoryDesc
    dst: MemoryDesc
    group_shape: tuple[int, int] = attrs.field(converter=_group)
    zps: MemoryDesc | None = None
    dequantized: str = attrs.field(default="f32", kw_only=True)
    post_ops: tuple = attrs.field(default=(), kw_only=True, eq=_post_ops.eq_key)

    kind = "dequantizing_matmul"
    ARGS = (
        Arg("src", dtypes=FLOATS), Arg("weights", dtypes=WEIGHT_TYPES), Arg("scales", dtypes=FLOATS),
        Arg("zps", optional=True, dtypes=ZERO_POINT_TYPES), Arg("dst", output=True, dtypes=FLOATS),
    )

    def __attrs_post_init__(self) -> None:
        for name in ("src", "weights", "scales", "dst"):
            md = getattr(self, name)
            check_memory_desc(name, md)
            if md.ndims != 2:
                raise InvalidArgumentError(f"{name} dims {md.dims} need exactly 2 dimensions")
        if self.dequantized not in FLOATS:
            raise InvalidArgumentError(f"dequantized {self.dequantized!r} must be one of {', '.join(FLOATS)}")
        (m, k), (k2, n) = self.src.dims, self.weights.dims
        if k != k2:
            raise ArgumentMismatchError(
                f"src dims {self.src.dims} have K={k} but weights dims {self.weights.dims} have K={k2}")
        if self.dst.dims != (m, n):
            raise ArgumentMismatchError(f"dst dims {self.dst.dims} differ from src @ weights dims {(m, n)}")
        if self.zps is not None:
            check_memory_desc("zps", self.zps)
        check_groups("weights", self.weights.dims, self.group_shape, scales=self.scales, zps=self.zps)
        self._set("post_ops", _post_ops.check(self.post_ops, (m, n)))
