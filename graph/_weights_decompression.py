"""Weights decompression inside a partition: DynamicDequantize(weights) -> MatMul (+ post-ops) as
one ``DequantizingMatmulDesc``, as oneDNN fuses its int4/int8 weight-only quantized matmuls
(the gated MLP of large language models, ``complex_fusion/mlp/gated-mlp-int4.json``).

The pattern, around a MatMul anchor: rank-2 src and weights, no bias, no transposes; its weights
are a DynamicDequantize's output of an s4/u4/s8/u8 tensor, read by nothing else and not a
partition output; the dequantization's groups divide the weights (per tensor, per channel or per
group, along K or N); the post-op chain is the one ``_fusion.find_chains`` found. The kernel
dequantizes each weight in registers and rounds it to the DynamicDequantize's output type, then
accumulates in f32, as the matmul op by op reads that type.

Fused where it was measured to pay: the CPU's blocked kernel (``kernels.dequantizing_matmul``,
9x op by op at the gated MLP's 1 x 4096 x 14336). Elsewhere the ops run one by one: on an H200
the plain kernel ran that MLP 3.5x slower than they do (BENCHMARKS.md §19).
"""

from __future__ import annotations

import attrs

from .._values._dequantizing_matmul_desc import FLOATS, WEIGHT_TYPES, DequantizingMatmulDesc
from .._values._dynamic_quantize_desc import ZERO_POINT_TYPES
from .._values._kernel_spec import KernelConfig
from ..kernels.dequantizing_matmul import fusion_pays
from ._fusion import Chain
from ._logical_tensor import known_shape
from ._lowering import Builder
from ._op import Op, producers_and_consumers
from ._shape_inference import quantization_groups
from .ops.quantization import grouped_view


@attrs.frozen
class DecompressionMatch:
    """One fused matmul: the DynamicDequantize of its weights, their groups along K and N, and the
    op ids it replaces but the MatMul's."""

    dequantize: Op
    group_shape: tuple[int, int]
    absorbed: frozenset[int]


def find_dequantizing_matmuls(ops: list[Op], output_ids: set[int], config: KernelConfig) -> dict[int, DecompressionMatch]:
    """``{MatMul op id: DecompressionMatch}`` for the partition's ``ops``."""
    producer, consumers = producers_and_consumers(ops)
    matches: dict[int, DecompressionMatch] = {}
    for op in ops:
        if op.kind != "MatMul" or len(op.inputs) != 2 or len(op.outputs) != 1:
            continue
        if op.attrs.get("transpose_a") or op.attrs.get("transpose_b"):
            continue
        src, weights, dst = op.inputs[0], op.inputs[1], op.outputs[0]
        if any(len(known_shape(lt)) != 2 for lt in (src, weights, dst)):
            continue
        if src.dtype not in FLOATS or dst.dtype not in FLOATS or weights.dtype not in FLOATS:
            continue
        deq = producer.get(weights.id)
        if deq is None or deq.kind != "DynamicDequantize" or weights.id in output_ids \
                or [c.id for c in consumers.get(weights.id, [])] != [op.id]:
            continue
        packed, scales = deq.inputs[0], deq.inputs[1]
        zps = deq.inputs[2] if len(deq.inputs) > 2 else None
        if packed.dtype not in WEIGHT_TYPES or scales.dtype not in FLOATS \
                or (zps is not None and zps.dtype not in ZERO_POINT_TYPES):
            continue
        dims = known_shape(packed)
        group = quantization_groups(deq.kind, deq.attrs, dims, known_shape(scales))
        if not fusion_pays(dims[1], (group[0], group[1]), config):
            continue
        matches[op.id] = DecompressionMatch(deq, (group[0], group[1]), frozenset({deq.id}))
    return matches


def lower_dequantizing_matmul(b: Builder, op: Op, match: DecompressionMatch, chain: Chain | None) -> None:
    """One ``DequantizingMatmulDesc`` for ``op``, reading the DynamicDequantize's inputs."""
    deq = match.dequantize
    k, n = known_shape(deq.inputs[0])
    placed = (k // match.group_shape[0], n // match.group_shape[1])

    def lowering(b: Builder, op: Op) -> None:
        inputs = {"src": b.view(op.inputs[0]), "weights": b.view(deq.inputs[0]),
                  "scales": grouped_view(b, deq.inputs[1], placed)}
        if len(deq.inputs) > 2:
            inputs["zps"] = grouped_view(b, deq.inputs[2], placed)

        def make(src, weights, scales, dst, zps=None):
            return DequantizingMatmulDesc(src, weights, scales, dst, match.group_shape, zps,
                                          dequantized=deq.outputs[0].dtype)

        b.run(op, make, inputs, {"dst": b.output(op.outputs[0])})

    b.lower(op, chain, lowering=lowering)
