"""Int8 matmul fusion inside a partition: Dequantize -> MatMul (+ post-ops) [-> Quantize] as one
``QuantizedMatmulDesc``, as oneDNN fuses its int8 matmul patterns.

The pattern, around a MatMul anchor:

- each of its two first inputs is a Dequantize's f32 output of an s8/u8 tensor, optionally
  through one TypeCast to f16/bf16 (the int8 bf16 graphs); the Dequantize (and the TypeCast) are
  inside the partition and their outputs read by nothing else and not partition outputs;
- src's Dequantize is per tensor; weights' per tensor or per channel along the output channel N
  (the last axis, or the second to last with ``transpose_b``), as oneDNN's int8 matmul allows;
- the MatMul has two ranks >= 2 inputs (no vector products), an optional bias;
- its post-op chain is the one ``_fusion.find_chains`` found (eltwise, BiasAdd, binary);
- the chain's last tensor (or the MatMul's output) may feed one per-tensor Quantize to s8/u8,
  its only reader and not a partition output: the kernel then stores the quantized values;
- the sizes are ones where the fused kernel pays on the engine (``fusion_pays``: always on the
  CPU, small products on a GPU, where the f32 SGEMM beats the int32 kernels).

Anything else keeps running op by op. The fused result is the exact integer sum scaled once,
where op by op dequantizes each input to f32 (or bf16) first: they differ by the f32 (bf16)
roundings of the inputs' products and sums only.
"""

from __future__ import annotations

import math

import attrs

from .._values._kernel_spec import KernelConfig
from .._values._memory_desc import MemoryDesc
from .._values._quantization import RANGES
from .._values._quantized_matmul_desc import QuantizedMatmulDesc
from ..kernels.quantized_matmul import fusion_pays
from ._fusion import Chain
from ._logical_tensor import known_shape
from ._lowering import Builder
from ._op import Op, producers_and_consumers
from .ops.matmul import lower_matmul

_INT8 = ("s8", "u8")


@attrs.frozen
class Int8Match:
    """One fused int8 matmul: the Dequantize op of each input, the TypeCast ops between them and
    the MatMul, the optional Quantize after the chain, and every op id it replaces but the MatMul."""

    src_deq: Op
    wei_deq: Op
    quantize: Op | None
    absorbed: frozenset[int]


def _dequantized(lt, producer: dict, consumers: dict, output_ids: set[int]) -> tuple[Op, list[Op]] | None:
    """The Dequantize (and TypeCast) making MatMul input ``lt``, each read only on the way."""
    casts: list[Op] = []
    op = producer.get(lt.id)
    if op is not None and op.kind == "TypeCast" and lt.dtype in ("bf16", "f16"):
        casts.append(op)
        lt = op.inputs[0]
        op = producer.get(lt.id)
    if op is None or op.kind != "Dequantize" or lt.dtype != "f32" or op.inputs[0].dtype not in _INT8:
        return None
    for made in [op.outputs[0]] + [c.outputs[0] for c in casts]:
        if made.id in output_ids or len(consumers.get(made.id, ())) != 1:
            return None
    return op, casts


def find_int8_matmuls(ops: list[Op], output_ids: set[int], chains: dict[int, Chain],
                      config: KernelConfig) -> dict[int, Int8Match]:
    """``{MatMul op id: Int8Match}`` for the partition's ``ops`` (topological order) and their
    post-op ``chains`` (``_fusion.find_chains``), where the fused kernel pays for the engine's
    kernel ``config`` (``kernels.quantized_matmul.fusion_pays``)."""
    producer, consumers = producers_and_consumers(ops)
    matches: dict[int, Int8Match] = {}
    for op in ops:
        if op.kind != "MatMul" or len(op.outputs) != 1:
            continue
        if any(len(known_shape(lt)) < 2 for lt in op.inputs[:2]):
            continue
        out = known_shape(op.outputs[0])
        a = known_shape(op.inputs[0])
        k = a[-2] if op.attrs.get("transpose_a") else a[-1]
        if not fusion_pays(out[-2], out[-1], k, math.prod(out[:-2]), config):
            continue
        src_found, wei_found = (_dequantized(lt, producer, consumers, output_ids) for lt in op.inputs[:2])
        if src_found is None or wei_found is None:
            continue
        (src_deq, src_casts), (wei_deq, wei_casts) = src_found, wei_found
        if src_deq.attrs.get("qtype", "per_tensor") != "per_tensor":
            continue
        if wei_deq.attrs.get("qtype", "per_tensor") == "per_channel":
            rank = len(known_shape(wei_deq.inputs[0]))
            n_axis = rank - 2 if op.attrs.get("transpose_b") else rank - 1
            if int(wei_deq.attrs["axis"]) % rank != n_axis:
                continue
        elif wei_deq.attrs.get("qtype", "per_tensor") != "per_tensor":
            continue
        if len(op.inputs) > 2 and op.inputs[2].dtype not in ("f32", "f16", "bf16"):
            continue
        chain = chains.get(op.id)
        last = chain.final if chain is not None else op.outputs[0]
        quantize = None
        readers = consumers.get(last.id, [])
        if last.id not in output_ids and len(readers) == 1 and readers[0].kind == "Quantize" \
                and readers[0].attrs.get("qtype", "per_tensor") == "per_tensor" \
                and readers[0].outputs[0].dtype in _INT8 and last.dtype == "f32":
            quantize = readers[0]
        if not (_zps_fit(src_deq, src_deq.inputs[0].dtype) and _zps_fit(wei_deq, wei_deq.inputs[0].dtype)):
            continue
        if quantize is not None and not _zps_fit(quantize, quantize.outputs[0].dtype):
            quantize = None
        taken = {src_deq.id, wei_deq.id} | {c.id for c in src_casts + wei_casts}
        if quantize is not None:
            taken.add(quantize.id)
        matches[op.id] = Int8Match(src_deq, wei_deq, quantize, frozenset(taken))
    return matches


def _zps(op: Op) -> tuple[int, ...]:
    return tuple(int(z) for z in op.attrs.get("zps", ()))


def _zps_fit(op: Op, dtype: str) -> bool:
    """Zero points an int8 kernel can take: inside the quantized type's range (op by op, an
    outlier zero point is just arithmetic; the descriptor refuses it)."""
    low, high = RANGES[dtype]
    return all(low <= z <= high for z in _zps(op))


def lower_int8_matmul(b: Builder, op: Op, match: Int8Match, chain: Chain | None) -> None:
    """One ``QuantizedMatmulDesc`` for ``op`` (a ``_lowering.Builder``'s ``lower`` of the MatMul,
    reading the Dequantizes' int8 inputs and writing the Quantize's output, or the chain's)."""
    # The MatMul's lowering (transposes, vectors, bias) with the int8 tensors in place of the
    # dequantized ones: they have the same dims.
    b.views[op.inputs[0].id] = b.view(match.src_deq.inputs[0])
    b.views[op.inputs[1].id] = b.view(match.wei_deq.inputs[0])
    src_attrs, wei_attrs = match.src_deq.attrs, match.wei_deq.attrs
    src_zps, wei_zps = _zps(match.src_deq), _zps(match.wei_deq)
    options = dict(src_scale=src_attrs["scales"][0], src_zp=src_zps[0] if src_zps else 0,
                   wei_scales=tuple(wei_attrs["scales"]), wei_zps=wei_zps)
    if match.quantize is not None:
        q_zps = _zps(match.quantize)
        options.update(dst_scale=match.quantize.attrs["scales"][0], dst_zp=q_zps[0] if q_zps else 0)

    def make(src: MemoryDesc, weights: MemoryDesc, dst: MemoryDesc, bias: MemoryDesc | None = None):
        return QuantizedMatmulDesc(src, weights, dst, bias, **options)

    b.lower(op, chain, lowering=lambda b, op: lower_matmul(b, op, make),
            final=match.quantize.outputs[0] if match.quantize is not None else None)
