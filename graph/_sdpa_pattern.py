"""Scaled-dot-product attention inside a partition: the op chain that one fused SdpaDesc runs.

oneDNN fuses ``MatMul(Q, K) -> score ops -> SoftMax(last axis) -> MatMul(·, V)`` into one kernel
that never writes the score matrix. The score ops, in the order the kernel applies them (a graph
may name each at most once, in this order):

* ``Select(cond, scores, fill)`` or ``Select(cond, fill, scores)``, a boolean cond broadcasting to
  the scores and a one-element fill, when it comes before the scale (MHA-GPT: the kernel scales
  the fill as the graph does);
* ``Multiply`` or ``Divide`` by a one-element scale;
* soft-capping, ``Tanh -> Multiply`` by a one-element cap (gemma2: the Multiply before the Tanh
  is the scale); not after a Select;
* the Select, when it comes after the scale;
* ``Add`` of a float mask;
* an implicit causal mask: ``GenIndex(axis -2)`` and ``GenIndex(axis -1)`` of the scores,
  ``GreaterEqual(row, col)``, ``Select(ge, scores, fill)`` (masked scores become fill, not -inf):
  top-left; with ``Add(row, a)`` and/or ``Subtract(·, b)`` of one-element s32 tensors (host
  scalars) on the row index, bottom-right with the offset a - b read at run time; only where no
  other Select is in the chain (one fill).

The match requires each score intermediate to be f32, read only by the next op (the causal
mask's GenIndex ops aside) and not a partition output; the probabilities (SoftMax's output) may
be f32, f16 or bf16; SoftMax may have its second output, the statistics, which the kernel
writes. The first MatMul may not transpose Q (K may come either way: ``transpose_b`` or an
explicit (…, D, Skv) layout); the second takes the probabilities as its first input (V either
way), or, the transposed form (JAX), their ``StaticTranspose`` of the last two dims (optionally
through a Reorder) as its second input, V^T first: it then makes the output's transpose. Neither
MatMul may carry a bias. Data movement after the second MatMul (``StaticTranspose``,
``StaticReshape``, ``Reorder`` of the same type, each intermediate read only by the next) joins
the match: the kernel writes the last one's layout directly.

Quantized attention (oneDNN's int8 MHA and compressed-K/V graphs) joins the same match:

* Q, K or V may each be made by a ``Dequantize`` (static, per tensor, of s8/u8/s4/u4/f8) or a
  ``DynamicDequantize`` (K and V only, ``per_group`` over their last two dims, scales and
  optional zero points as tensors), optionally through one ``TypeCast`` to bf16/f16; the kernel
  reads the quantized tensor and dequantizes as it loads, rounding as the TypeCast does;
* SoftMax's output may go through [``TypeCast`` to f32 ->] ``Quantize`` -> ``Dequantize`` (per tensor,
  one scale and zero point, to s8/u8) [-> ``TypeCast``] before the second MatMul: the kernel's two-pass form;
* the output (after the data movement) may go through [``TypeCast`` to f32 ->] one per-tensor
  ``Quantize``: the kernel stores the quantized values;
* the scores may be bf16 or f16 (the first MatMul's output type) rather than f32: the kernel
  rounds each score op's result to it, as the graph does.

Each intermediate of these chains is read only by the next op and is not a partition output.
"""

from __future__ import annotations

import attrs

from .._values._quantization import QUANTIZED_TYPES, Quantization
from ._logical_tensor import LogicalTensor, known_shape
from ._op import Op, producers_and_consumers

_FLOATS = ("f32", "f16", "bf16")
_MOVES = ("StaticTranspose", "StaticReshape", "Reorder")


@attrs.frozen
class SdpaMatch:
    query: LogicalTensor
    key: LogicalTensor
    key_transposed: bool       # the graph's K is (…, D, Skv): the kernel reads it as (…, Skv, D)
    value: LogicalTensor
    value_transposed: bool     # the graph's V is (…, Dv, Skv)
    scale: LogicalTensor | None
    scale_mode: str
    mask: LogicalTensor | None
    output: LogicalTensor      # the second MatMul's output
    ops: tuple[int, ...]       # ids of the ops it replaces, the first MatMul first, the last op last
    softcap: LogicalTensor | None = None
    select_mask: LogicalTensor | None = None
    fill: LogicalTensor | None = None
    fill_if: bool = False
    fill_before_scale: bool = False
    causal: str | None = None
    causal_add: LogicalTensor | None = None  # bottom-right's run-time offset: causal_add - causal_sub
    causal_sub: LogicalTensor | None = None
    stats: LogicalTensor | None = None
    output_transposed: bool = False  # the second MatMul made (…, Dv, Sq): V^T @ P^T
    tail: tuple[Op, ...] = ()        # data movement after the second MatMul, in order
    final: LogicalTensor | None = None  # the tail's last output (the output without a tail)
    query_quant: Quantization | None = None
    key_quant: Quantization | None = None
    value_quant: Quantization | None = None
    key_scales: LogicalTensor | None = None
    key_zps: LogicalTensor | None = None
    value_scales: LogicalTensor | None = None
    value_zps: LogicalTensor | None = None
    probs_quant: Quantization | None = None
    dst_quant: Quantization | None = None
    score_rounding: str = "f32"


@attrs.define
class _Scores:
    """What the score ops between the MatMuls add up to, as the chain is read."""

    scale: LogicalTensor | None = None
    scale_mode: str = "multiply"
    softcap: LogicalTensor | None = None
    tanh: bool = False  # a Tanh waiting for its cap Multiply
    select_mask: LogicalTensor | None = None
    fill: LogicalTensor | None = None
    fill_if: bool = False
    fill_before_scale: bool = False
    mask: LogicalTensor | None = None
    causal: str | None = None
    causal_add: LogicalTensor | None = None
    causal_sub: LogicalTensor | None = None


def find_sdpa(ops: list[Op], output_ids: set[int]) -> list[SdpaMatch]:
    producers, readers = producers_and_consumers(ops)

    def only_reader(lt: LogicalTensor, dtypes: tuple[str, ...] = ("f32",)) -> Op | None:
        if lt.id in output_ids or lt.dtype not in dtypes:
            return None
        found = readers.get(lt.id, [])
        return found[0] if len(found) == 1 else None

    matches: list[SdpaMatch] = []
    taken: set[int] = set()
    for first in ops:
        if first.kind != "MatMul" or first.id in taken or len(first.inputs) != 2:
            continue
        if first.attrs.get("transpose_a") or any(len(known_shape(lt)) < 2 for lt in first.inputs):
            continue
        match = _match_from(first, only_reader, readers, output_ids)
        if match is not None:
            match = _quantized(match, producers, only_reader)
        if match is not None and not taken.intersection(match.ops):
            matches.append(match)
            taken.update(match.ops)
    return matches


def _match_from(first: Op, only_reader, readers, output_ids) -> SdpaMatch | None:
    chain = [first.id]
    sc = _Scores()
    current = first.outputs[0]
    scores = current.dtype  # f32, or bf16/f16 scores the kernel rounds as the graph does
    if scores not in _FLOATS:
        return None
    while True:
        causal = _causal_select(current, readers, output_ids, scores)
        if causal is not None:
            ids, fill, out, shift = causal
            if sc.select_mask is not None or sc.causal is not None or sc.tanh:
                return None
            sc.causal, sc.fill = ("bottom_right" if shift else "top_left"), fill
            sc.causal_add, sc.causal_sub = shift.get("causal_add"), shift.get("causal_sub")
            chain.extend(ids)
            current = out
            continue
        step = only_reader(current, (scores,))
        if step is None:
            return None
        if step.kind == "SoftMax":
            break
        if sc.causal is not None or not _score_step(step, current, sc):
            return None
        chain.append(step.id)
        current = step.outputs[0]
    softmax = step
    rank = len(known_shape(current))
    if sc.tanh or softmax.attrs.get("axis", -1) % rank != rank - 1 or \
            softmax.attrs.get("mode", "none") not in ("none", "inf_as_zero") or len(softmax.outputs) > 2:
        return None
    stats = softmax.outputs[1] if len(softmax.outputs) == 2 else None
    if stats is not None and (stats.dtype != "f32" or known_shape(stats) != known_shape(current)[:-1] + (1,)):
        return None
    chain.append(softmax.id)
    probs = softmax.outputs[0]
    round_trip = _probability_round_trip(probs, only_reader)
    if round_trip is False:
        return None
    probs_quant = None
    if round_trip is not None:
        probs_quant, probs, trip_ids = round_trip
        chain.extend(trip_ids)
    second = only_reader(probs, _FLOATS)
    transposed = False
    if second is not None and second.kind == "StaticTranspose" and _swaps_last_two(second.attrs.get("order"), rank):
        chain.append(second.id)
        probs_t = second.outputs[0]
        second = only_reader(probs_t, _FLOATS)
        if second is not None and second.kind == "Reorder" and second.outputs[0].dtype == probs_t.dtype:
            chain.append(second.id)
            probs_t = second.outputs[0]
            second = only_reader(probs_t, _FLOATS)
        if second is None or second.kind != "MatMul" or len(second.inputs) != 2 or \
                second.inputs[1].id != probs_t.id or second.attrs.get("transpose_b") or \
                len(known_shape(second.inputs[0])) < 2:
            return None
        transposed = True
        value, value_transposed = second.inputs[0], not second.attrs.get("transpose_a", False)
    elif second is None or second.kind != "MatMul" or len(second.inputs) != 2 or \
            second.inputs[0].id != probs.id or second.attrs.get("transpose_a") or \
            len(known_shape(second.inputs[1])) < 2:
        return None
    else:
        value, value_transposed = second.inputs[1], bool(second.attrs.get("transpose_b", False))
    chain.append(second.id)
    tail, final = [], second.outputs[0]
    while True:
        step = only_reader(final, _FLOATS)
        if step is None or step.kind not in _MOVES or len(step.inputs) != 1 or \
                step.outputs[0].dtype != final.dtype:
            break
        tail.append(step)
        chain.append(step.id)
        final = step.outputs[0]
    q, k = first.inputs
    return SdpaMatch(
        query=q, key=k, key_transposed=not first.attrs.get("transpose_b", False),
        value=value, value_transposed=value_transposed, scale=sc.scale, scale_mode=sc.scale_mode,
        mask=sc.mask, output=second.outputs[0], ops=tuple(chain), softcap=sc.softcap,
        select_mask=sc.select_mask, fill=sc.fill, fill_if=sc.fill_if,
        fill_before_scale=sc.fill_before_scale and sc.scale is not None, causal=sc.causal, stats=stats,
        causal_add=sc.causal_add, causal_sub=sc.causal_sub,
        output_transposed=transposed, tail=tuple(tail), final=final, score_rounding=scores,
        probs_quant=probs_quant)


def _score_step(step: Op, current: LogicalTensor, sc: _Scores) -> bool:
    """Take ``step`` (the only reader of the scores ``current``) into ``sc``; False where it is
    not a score op the kernel runs, or comes out of the kernel's order."""
    shape = known_shape(current)
    if step.kind in ("Multiply", "Divide") and len(step.inputs) == 2:
        at = [lt.id for lt in step.inputs].index(current.id)
        other = step.inputs[1 - at]
        if not _one_element(other) or other.id == current.id or (step.kind == "Divide" and at != 0):
            return False
        if sc.tanh:  # the cap after the Tanh
            if step.kind != "Multiply":
                return False
            sc.softcap, sc.tanh = other, False
            return True
        if sc.scale is not None or sc.softcap is not None or sc.mask is not None or \
                (sc.select_mask is not None and not sc.fill_before_scale):
            return False
        sc.scale, sc.scale_mode = other, "multiply" if step.kind == "Multiply" else "divide"
        return True
    if step.kind == "Tanh":
        if sc.softcap is not None or sc.tanh or sc.select_mask is not None or sc.mask is not None:
            return False
        sc.tanh = True
        return True
    if step.kind == "Select" and len(step.inputs) == 3:
        cond = step.inputs[0]
        if cond.id == current.id or cond.dtype != "boolean" or not _broadcasts(known_shape(cond), shape):
            return False
        if step.inputs[1].id == current.id:
            fill, fill_if = step.inputs[2], False
        elif step.inputs[2].id == current.id:
            fill, fill_if = step.inputs[1], True
        else:
            return False
        if sc.select_mask is not None or sc.mask is not None or sc.tanh or fill.id == current.id or \
                not _one_element(fill) or fill.dtype not in _FLOATS or known_shape(step.outputs[0]) != shape:
            return False
        sc.select_mask, sc.fill, sc.fill_if = cond, fill, fill_if
        sc.fill_before_scale = sc.scale is None
        return True
    if step.kind == "Add" and len(step.inputs) == 2 and known_shape(step.outputs[0]) == shape:
        other = step.inputs[1] if step.inputs[0].id == current.id else step.inputs[0]
        if other.id == current.id or other.dtype not in _FLOATS or sc.mask is not None or sc.tanh or \
                not _broadcasts(known_shape(other), shape):
            return False
        sc.mask = other
        return True
    return False


def _causal_select(scores: LogicalTensor, readers, output_ids, dtype: str = "f32"):
    """``(op ids, fill, masked scores)`` where ``scores`` is read by exactly GenIndex(-2),
    GenIndex(-1) and a Select of their GreaterEqual (the implicit top-left causal mask), else None."""
    found = readers.get(scores.id, [])
    if scores.id in output_ids or scores.dtype != dtype or len(found) != 3:
        return None
    rank = len(known_shape(scores))
    gens = {op.attrs.get("axis", 0) % rank: op for op in found if op.kind == "GenIndex"}
    select = [op for op in found if op.kind == "Select"]
    if set(gens) != {rank - 2, rank - 1} or len(select) != 1:
        return None
    select = select[0]
    row, col = gens[rank - 2].outputs[0], gens[rank - 1].outputs[0]
    # bottom-right: the row index shifted by Add(row, Skv) and Subtract(·, Sq), one-element s32
    # inputs (host scalars in oneDNN's graphs) the kernel reads at run time
    shift, shift_ops = {}, []
    for kind in ("Add", "Subtract"):
        found_shift = readers.get(row.id, [])
        if row.id in output_ids or len(found_shift) != 1 or found_shift[0].kind != kind:
            continue
        op = found_shift[0]
        at = [lt.id for lt in op.inputs].index(row.id)
        other = op.inputs[1 - at] if len(op.inputs) == 2 else None
        if other is None or (kind == "Subtract" and at != 0) or other.dtype != "s32" or not _one_element(other) or \
                op.outputs[0].dtype != "s32":
            return None
        shift["causal_add" if kind == "Add" else "causal_sub"] = other
        shift_ops.append(op.id)
        row = op.outputs[0]
    ge_readers = [readers.get(row.id, []), readers.get(col.id, [])]
    if any(len(r) != 1 or r[0].kind != "GreaterEqual" for r in ge_readers) or ge_readers[0][0] is not ge_readers[1][0]:
        return None
    ge = ge_readers[0][0]
    if [lt.id for lt in ge.inputs] != [row.id, col.id] or {row.id, col.id} & output_ids:
        return None
    cond = ge.outputs[0]
    if cond.id in output_ids or [op.id for op in readers.get(cond.id, [])] != [select.id]:
        return None
    if len(select.inputs) != 3 or select.inputs[0].id != cond.id or select.inputs[1].id != scores.id:
        return None
    fill = select.inputs[2]
    if not _one_element(fill) or fill.dtype not in _FLOATS or known_shape(select.outputs[0]) != known_shape(scores):
        return None
    ids = (gens[rank - 2].id, *shift_ops, gens[rank - 1].id, ge.id, select.id)
    return ids, fill, select.outputs[0], shift


def _swaps_last_two(order, rank: int) -> bool:
    if order is None or len(order) != rank:
        return False
    return [o % rank for o in order] == list(range(rank - 2)) + [rank - 1, rank - 2]


def _broadcasts(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    if len(shape) > len(to):
        return False
    return all(a in (1, b) for a, b in zip(shape[::-1], to[::-1]))


def _one_element(lt: LogicalTensor) -> bool:
    return lt.shape is not None and _numel(lt.shape) == 1


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# -- quantized attention ---------------------------------------------------------------------------


def _quantized(match: SdpaMatch, producers: dict[int, Op], only_reader) -> SdpaMatch | None:
    """``match`` with the quantization chains around it taken in (module docstring); the match as
    it was where there are none; None where a chain is there but the kernel cannot take it (a
    grouped query, a Quantize -> Dequantize pair with two scales...): then the ops run one by one."""
    changes: dict = {}
    ids: list[int] = []
    for name, lt in (("query", match.query), ("key", match.key), ("value", match.value)):
        found = _dequantized_input(lt, producers, only_reader)
        if found is None:
            continue
        if found is False:
            return None
        raw, quant, scales, zps, op_ids = found
        if quant.grouped:
            if name == "query":
                return None
            transposed = match.key_transposed if name == "key" else match.value_transposed
            if transposed:  # the kernel's view swaps the last two dims: so does the group
                quant = attrs.evolve(quant, group=quant.group[::-1])
            changes.update({f"{name}_scales": scales, f"{name}_zps": zps})
        changes.update({name: raw, f"{name}_quant": quant})
        ids.extend(op_ids)
    final = match.final if match.final is not None else match.output
    tail_ids: list[int] = []
    if not any(op.kind == "StaticReshape" for op in match.tail):  # a reshape may need the op-by-op tail
        stored = _quantized_output(final, only_reader)
        if stored is not None:
            changes["dst_quant"], out, tail_ids = stored
            changes["final"] = out
    if not changes:
        return match
    first, rest = match.ops[0], match.ops[1:]
    return attrs.evolve(match, ops=(first, *ids, *rest, *tail_ids), **changes)


def _dequantized_input(lt: LogicalTensor, producers: dict[int, Op], only_reader):
    """``(quantized tensor, Quantization, scales, zps, op ids)`` where ``lt`` is made by a
    [Dynamic]Dequantize [-> TypeCast] chain read only on the way; None where it is not; False
    where it is one the kernel cannot take."""
    op = producers.get(lt.id)
    ids, round_out = [], "f32"
    if op is None or op.kind not in ("TypeCast", "Dequantize", "DynamicDequantize") or only_reader(lt, _FLOATS) is None:
        return None
    if op.kind == "TypeCast" and lt.dtype in ("bf16", "f16") and op.inputs[0].dtype == "f32":
        if only_reader(op.inputs[0], ("f32",)) is not op:
            return None
        round_out, ids = lt.dtype, [op.id]
        op = producers.get(op.inputs[0].id)
    if op is None or op.kind not in ("Dequantize", "DynamicDequantize"):
        return None
    made = op.outputs[0]
    if made.dtype not in _FLOATS or op.inputs[0].dtype not in QUANTIZED_TYPES:
        return None
    if not ids:
        round_out = made.dtype
    raw = op.inputs[0]
    if op.kind == "Dequantize":
        scales, zps = op.attrs.get("scales", ()), op.attrs.get("zps", ())
        if op.attrs.get("qtype", "per_tensor") != "per_tensor" or len(scales) != 1 or len(zps) > 1:
            return False
        try:
            quant = Quantization(raw.dtype, float(scales[0]), int(zps[0]) if zps else 0, round_out=round_out)
        except ValueError:  # an outlier zero point: just arithmetic op by op
            return False
        return raw, quant, None, None, [op.id, *ids]
    rank = len(known_shape(raw))
    group = [int(g) for g in op.attrs.get("group_shape", ())]
    if op.attrs.get("qtype") != "per_group" or len(group) != rank or any(g != 1 for g in group[:-2]) or \
            len(op.inputs) not in (2, 3) or rank < 2:
        return False
    scales = op.inputs[1]
    zps = op.inputs[2] if len(op.inputs) == 3 else None
    if scales.dtype not in _FLOATS or (zps is not None and zps.dtype != raw.dtype):
        return False
    try:
        quant = Quantization(raw.dtype, group=tuple(group[-2:]), round_out=round_out)
    except ValueError:
        return False
    return raw, quant, scales, zps, [op.id, *ids]


def _probability_round_trip(probs: LogicalTensor, only_reader):
    """``(Quantization, the tensor the second MatMul reads, op ids)`` where SoftMax's output
    ``probs`` goes through [TypeCast to f32 ->] Quantize -> Dequantize [-> TypeCast], each read
    only on the way; None where it does not; False where the kernel cannot take the chain."""
    ids: list[int] = []
    current, round_in = probs, probs.dtype
    op = only_reader(current, _FLOATS)
    if op is not None and op.kind == "TypeCast" and op.outputs[0].dtype == "f32" and current.dtype != "f32":
        ids.append(op.id)
        current = op.outputs[0]
        op = only_reader(current, ("f32",))
    if op is None or op.kind != "Quantize":
        return None
    quantize = op
    stored = quantize.outputs[0]
    dequantize = only_reader(stored, QUANTIZED_TYPES)
    if dequantize is None or dequantize.kind != "Dequantize":
        return False
    ids += [quantize.id, dequantize.id]
    current = dequantize.outputs[0]
    round_out = current.dtype
    op = only_reader(current, _FLOATS)
    if op is not None and op.kind == "TypeCast" and op.outputs[0].dtype in ("bf16", "f16"):
        ids.append(op.id)
        current = op.outputs[0]
        round_out = current.dtype
    q_attrs, d_attrs = quantize.attrs, dequantize.attrs
    scales = list(q_attrs.get("scales", ()))
    zps = list(q_attrs.get("zps", ()) or [0])
    if any(a.get("qtype", "per_tensor") != "per_tensor" for a in (q_attrs, d_attrs)) or \
            stored.dtype not in QUANTIZED_TYPES or len(scales) != 1 or len(zps) != 1 or \
            list(d_attrs.get("scales", ())) != scales or list(d_attrs.get("zps", ()) or [0]) != zps:
        return False
    try:
        quant = Quantization(stored.dtype, float(scales[0]), int(zps[0]), round_in=round_in, round_out=round_out)
    except ValueError:
        return False
    return quant, current, ids


def _quantized_output(final: LogicalTensor, only_reader):
    """``(Quantization, quantized tensor, op ids)`` where ``final`` goes through [TypeCast to
    f32 ->] one per-tensor Quantize, each read only on the way; else None."""
    op = only_reader(final, _FLOATS)
    ids: list[int] = []
    round_in = final.dtype
    if op is not None and op.kind == "TypeCast" and op.outputs[0].dtype == "f32":
        ids.append(op.id)
        op = only_reader(op.outputs[0], ("f32",))
    if op is None or op.kind != "Quantize" or op.outputs[0].dtype not in QUANTIZED_TYPES:
        return None
    scales, zps = op.attrs.get("scales", ()), op.attrs.get("zps", ()) or [0]
    if op.attrs.get("qtype", "per_tensor") != "per_tensor" or len(scales) != 1 or len(zps) != 1:
        return None
    try:
        quant = Quantization(op.outputs[0].dtype, float(scales[0]), int(zps[0]), round_in=round_in)
    except ValueError:
        return None
    return quant, op.outputs[0], [*ids, op.id]
