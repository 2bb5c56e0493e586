"""Int8 convolution fusion inside a partition: Dequantize(src) + Dequantize(weights) ->
Convolution (+ post-ops) [-> Quantize] as one ``ConvolutionDesc`` carrying the quantizations, as
oneDNN fuses its int8 convolution patterns (``int8_conv_post_ops_fusion``).

The pattern, around a Convolution anchor (the int8 matmul's, ``_int8_matmul``, with a
convolution's checks): each of its two first inputs is a Dequantize's f32 output of an s8/u8
tensor, per tensor, read by nothing else and not a partition output (no TypeCast: the kernel
does not round the dequantized values to bf16); an optional bias; the post-op chain
``_fusion.find_chains`` found; an optional per-tensor Quantize to s8/u8 of the chain's last
tensor, its only reader. Weights dequantized per output channel (one zero point for all) fuse
too: the kernel scales by the src scale alone and the channel scales follow as the chain's first
post-op, a multiply by a hidden constant, with a bias moved after it (the bias must be f32 then,
as post-op operands are), so the order is oneDNN's: sum x scales, + bias, post-ops, quantize.

The kernel sums the zero-point-shifted integers exactly in f32 (below 2^24) and multiplies by the
two scales once: op by op, each dequantized input is rounded to f32 first, so the two differ by
f32 roundings only.
"""

from __future__ import annotations

import attrs
import numpy as np

from .._values._quantization import Quantization
from ._fusion import Chain
from ._int8_matmul import _dequantized, _zps, _zps_fit
from ._logical_tensor import LogicalTensor, known_shape
from ._lowering import Builder
from ._op import Op, producers_and_consumers
from .ops.convolution import lower_convolution


@attrs.frozen
class Int8ConvMatch:
    src_deq: Op
    wei_deq: Op
    quantize: Op | None
    absorbed: frozenset[int]
    # Per-channel weights: the hidden f32 constant of the channel scales (shape (OC,)).
    channel_scales: LogicalTensor | None = None

    def constant(self) -> tuple[LogicalTensor, np.ndarray] | None:
        """The hidden constant this match reads (its channel scales), if any."""
        if self.channel_scales is None:
            return None
        return self.channel_scales, np.asarray(self.wei_deq.attrs["scales"], np.float32)


def _static(op: Op) -> Quantization:
    zps = _zps(op)
    dtype = op.outputs[0].dtype if op.kind == "Quantize" else op.inputs[0].dtype
    return Quantization(dtype, float(op.attrs["scales"][0]), zps[0] if zps else 0)


def _per_tensor(op: Op) -> bool:
    return op.attrs.get("qtype", "per_tensor") == "per_tensor" and len(op.attrs.get("scales", ())) == 1 \
        and len(_zps(op)) <= 1


def _per_output_channel(op: Op, conv: Op) -> bool:
    """Weights dequantized per channel along the convolution's output channels, one zero point
    for all, and a bias (if any) of f32 (it becomes a post-op operand)."""
    a = op.attrs
    rank = len(known_shape(op.inputs[0]))
    oc_axis = 0 if conv.attrs.get("weights_format", "XIO") == "OIX" else rank - 1
    scales, zps = a.get("scales", ()), _zps(op)
    return a.get("qtype") == "per_channel" and int(a.get("axis", 1)) % rank == oc_axis \
        and len(scales) == known_shape(op.inputs[0])[oc_axis] and len(set(zps)) <= 1 \
        and (len(conv.inputs) < 3 or conv.inputs[2].dtype == "f32")


def find_int8_convolutions(ops: list[Op], output_ids: set[int], chains: dict[int, Chain],
                           next_id: int = 0) -> dict[int, Int8ConvMatch]:
    """``{Convolution op id: Int8ConvMatch}`` for the partition's ``ops`` and their post-op
    ``chains``. Always where it matches: the kernel reads one byte where op by op a Dequantize
    wrote and the convolution read four. Per-channel matches take hidden constant ids from
    ``next_id`` on (``Int8ConvMatch.constant``)."""
    producer, consumers = producers_and_consumers(ops)
    matches: dict[int, Int8ConvMatch] = {}
    for op in ops:
        if op.kind != "Convolution" or len(op.outputs) != 1 or len(op.inputs) < 2:
            continue
        found = [_dequantized(lt, producer, consumers, output_ids) for lt in op.inputs[:2]]
        if any(f is None or f[1] for f in found):  # no match, or a TypeCast in between
            continue
        (src_deq, _), (wei_deq, _) = found  # type: ignore[misc]
        per_channel = not _per_tensor(wei_deq)
        if not _per_tensor(src_deq) or (per_channel and not _per_output_channel(wei_deq, op)):
            continue
        if not (_zps_fit(src_deq, src_deq.inputs[0].dtype) and _zps_fit(wei_deq, wei_deq.inputs[0].dtype)):
            continue
        if len(op.inputs) > 2 and op.inputs[2].dtype not in ("f32", "f16", "bf16"):
            continue
        chain = chains.get(op.id)
        if chain is not None and any(entry[0] == "sum" for entry in chain.entries):
            continue
        last = chain.final if chain is not None else op.outputs[0]
        quantize = None
        readers = consumers.get(last.id, [])
        if last.id not in output_ids and len(readers) == 1 and readers[0].kind == "Quantize" \
                and _per_tensor(readers[0]) and readers[0].outputs[0].dtype in ("s8", "u8") \
                and last.dtype == "f32" and _zps_fit(readers[0], readers[0].outputs[0].dtype) \
                and known_shape(readers[0].outputs[0]) == known_shape(last):
            quantize = readers[0]
        taken = {src_deq.id, wei_deq.id} | ({quantize.id} if quantize is not None else set())
        scales = None
        if per_channel:
            scales = LogicalTensor(next_id, "f32", [len(wei_deq.attrs["scales"])], layout_type="strided")
            next_id += 1
        matches[op.id] = Int8ConvMatch(src_deq, wei_deq, quantize, frozenset(taken), scales)
    return matches


def lower_int8_convolution(b: Builder, op: Op, match: Int8ConvMatch, chain: Chain | None) -> None:
    """One ``ConvolutionDesc`` with ``src_quant``/``weights_quant`` [and ``dst_quant``] for ``op``,
    reading the Dequantizes' int8 inputs (same dims) and writing the Quantize's output, or the
    chain's."""
    b.views[op.inputs[0].id] = b.view(match.src_deq.inputs[0])
    b.views[op.inputs[1].id] = b.view(match.wei_deq.inputs[0])
    weights_quant = _static(match.wei_deq)
    if match.channel_scales is not None:
        # Scaled by the src scale in the kernel, then by each channel's as the first post-op;
        # the bias follows it, so it leaves the convolution for the chain.
        weights_quant = attrs.evolve(weights_quant, scale=1.0)
        fmt = op.attrs.get("data_format", "NXC")
        entries: tuple = (("binary", "mul", match.channel_scales, fmt),)
        if len(op.inputs) > 2:
            entries += (("binary", "add", op.inputs[2], fmt),)
            op = Op(op.id, op.kind, list(op.inputs[:2]), list(op.outputs), dict(op.attrs), op.name)
        rest = chain if chain is not None else Chain((), op.outputs[0], frozenset())
        chain = Chain(entries + rest.entries, rest.final, rest.absorbed)
    options = dict(src_quant=_static(match.src_deq), weights_quant=weights_quant,
                   dst_quant=_static(match.quantize) if match.quantize is not None else None)
    b.lower(op, chain, lowering=lambda b, op: lower_convolution(b, op, **options),
            final=match.quantize.outputs[0] if match.quantize is not None else None)
