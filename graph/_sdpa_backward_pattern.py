"""SDPA backward inside a partition (oneDNN's training SDPA backward graphs): the ops that two
fused ``SdpaBackwardDesc`` primitives (dQ; dK with dV) replace.

The pattern, as oneDNN's ``sdpa-plain-training-backward`` graphs write it:

- ``scores = MatMul(Q, K, transpose_b)``, then optionally ``Multiply`` or ``Divide`` by a
  one-element scale, then optionally ``Add`` of a mask broadcasting to the scores;
- ``P = Exp(Subtract(scores, stats))``, stats the forward's (…, Sq, 1) logsumexp;
- ``dV = MatMul(P, dO, transpose_a)``, P optionally through one ``TypeCast`` (bf16 graphs);
- ``dP = MatMul(dO, V, transpose_b)``; ``D = ReduceSum(Multiply(dO, O), last axis, keep_dims)``;
- ``dS = Multiply(P, Subtract(dP, D))``, then the scale's op again on the same scale tensor when
  the scores had one, optionally through one ``TypeCast``;
- ``dQ = MatMul(dS, K)``, ``dK = MatMul(dS, Q, transpose_a)``.

Q, K, V, O, dO, stats, the scale and the mask are partition inputs (no op inside makes them);
Q, K, V, O, dO have one data type (f32, bf16, f16) and the same batch dims (K/V heads broadcast
over query-head groups, GQA, stay op by op); every intermediate is f32 but the casts, read only
by the pattern's ops and not a partition output (a dS output, the dmask graphs, stays op by op),
and nothing carries a bias. The fused kernels keep P and dS in f32 where the bf16 graphs round
them to bf16 before the matmuls: they differ by those roundings only.
"""

from __future__ import annotations

from typing import TypeGuard

import attrs

from .._values._memory_desc import MemoryDesc
from .._values._sdpa_backward_desc import SdpaBackwardDesc
from ._logical_tensor import LogicalTensor, known_shape
from ._lowering import Builder, View
from ._op import Op, producers_and_consumers

_FLOATS = ("f32", "f16", "bf16")


@attrs.frozen
class SdpaBackwardMatch:
    query: LogicalTensor
    key: LogicalTensor
    value: LogicalTensor
    dst: LogicalTensor          # the forward's output O
    diff_dst: LogicalTensor
    stats: LogicalTensor
    scale: LogicalTensor | None
    scale_mode: str
    mask: LogicalTensor | None
    diff_query: LogicalTensor
    diff_key: LogicalTensor
    diff_value: LogicalTensor
    ops: tuple[int, ...]        # ids of the ops it replaces, the last in the partition's order last


class _Graph:
    def __init__(self, ops: list[Op], output_ids: set[int]):
        self.producer, self.consumers = producers_and_consumers(ops)
        self.output_ids = output_ids
        self.order = {op.id: i for i, op in enumerate(ops)}

    def made_by(self, lt: LogicalTensor, kind: str) -> Op | None:
        op = self.producer.get(lt.id)
        return op if op is not None and op.kind == kind and len(op.outputs) == 1 else None

    def readers(self, lt: LogicalTensor) -> list[Op]:
        return self.consumers.get(lt.id, [])

    def is_input(self, lt: LogicalTensor) -> bool:
        return lt.id not in self.producer


def _matmul(op: Op | None, ta: bool, tb: bool) -> TypeGuard[Op]:
    return (op is not None and op.kind == "MatMul" and len(op.inputs) == 2
            and bool(op.attrs.get("transpose_a", False)) == ta and bool(op.attrs.get("transpose_b", False)) == tb)


def _other(op: Op, lt: LogicalTensor) -> LogicalTensor | None:
    """The other input of a two-input op reading ``lt``."""
    ids = [x.id for x in op.inputs]
    if len(ids) != 2 or lt.id not in ids or ids[0] == ids[1]:
        return None
    return op.inputs[1 - ids.index(lt.id)]


def _match_at(exp: Op, g: _Graph) -> SdpaBackwardMatch | None:
    used = [exp]
    sub = g.made_by(exp.inputs[0], "Subtract")
    if sub is None or not g.is_input(sub.inputs[1]):
        return None
    used.append(sub)
    stats, x = sub.inputs[1], sub.inputs[0]
    mask = None
    add = g.made_by(x, "Add")
    if add is not None:
        first = g.producer.get(add.inputs[0].id)
        mask_lt = add.inputs[1]
        if first is None or not g.is_input(mask_lt):
            first, mask_lt = g.producer.get(add.inputs[1].id), add.inputs[0]
        if first is None or not g.is_input(mask_lt):
            return None
        used.append(add)
        mask, x = mask_lt, first.outputs[0]
    scale, scale_mode, scale_op = None, "multiply", None
    op = g.producer.get(x.id)
    if op is not None and op.kind in ("Multiply", "Divide"):
        candidates = [op.inputs[1]] if op.kind == "Divide" else [op.inputs[1], op.inputs[0]]
        for cand in candidates:
            other = _other(op, cand)
            if g.is_input(cand) and cand.shape is not None and _nelems(cand) == 1 and other is not None:
                scale, scale_mode, scale_op, x = cand, op.kind.lower(), op, other
                break
        if scale is None:
            return None
        used.append(op)
    qk = g.producer.get(x.id)
    if not _matmul(qk, False, True):
        return None
    used.append(qk)
    query, key = qk.inputs
    p = exp.outputs[0]
    p_readers = g.readers(p)
    dv_mm = mul_ds = cast_p = None
    for r in p_readers:
        if r.kind == "TypeCast" and cast_p is None:
            cast_p = r
        elif r.kind == "Multiply" and mul_ds is None:
            mul_ds = r
        elif _matmul(r, True, False) and r.inputs[0].id == p.id and dv_mm is None:
            dv_mm = r
        else:
            return None
    if cast_p is not None:
        if dv_mm is not None or len(g.readers(cast_p.outputs[0])) != 1:
            return None
        dv_mm = g.readers(cast_p.outputs[0])[0]
        if not _matmul(dv_mm, True, False) or dv_mm.inputs[0].id != cast_p.outputs[0].id:
            return None
        used.append(cast_p)
    if dv_mm is None or mul_ds is None:
        return None
    used += [dv_mm, mul_ds]
    diff_dst, diff_value = dv_mm.inputs[1], dv_mm.outputs[0]
    sub2 = g.made_by(_other(mul_ds, p) or p, "Subtract")
    if sub2 is None:
        return None
    used.append(sub2)
    dp_mm = g.producer.get(sub2.inputs[0].id)
    reduce = g.made_by(sub2.inputs[1], "ReduceSum")
    if not _matmul(dp_mm, False, True) or reduce is None or dp_mm.inputs[0].id != diff_dst.id:
        return None
    value = dp_mm.inputs[1]
    rank = len(known_shape(reduce.inputs[0]))
    axes = [int(a) % rank for a in reduce.attrs.get("axes", ())]
    if axes != [rank - 1] or not reduce.attrs.get("keep_dims", False):
        return None
    mul_o = g.made_by(reduce.inputs[0], "Multiply")
    if mul_o is None:
        return None
    dst = _other(mul_o, diff_dst)
    if dst is None:
        return None
    used += [dp_mm, reduce, mul_o]
    ds = mul_ds.outputs[0]
    if scale is not None and scale_op is not None:
        readers = g.readers(ds)
        if len(readers) != 1 or readers[0].kind != scale_op.kind or len(readers[0].inputs) != 2:
            return None
        by = readers[0].inputs[1] if scale_op.kind == "Divide" else _other(readers[0], ds)
        if by is None or by.id != scale.id or readers[0].inputs[0].id != ds.id and scale_op.kind == "Divide":
            return None
        used.append(readers[0])
        ds = readers[0].outputs[0]
    readers = g.readers(ds)
    if len(readers) == 1 and readers[0].kind == "TypeCast":
        used.append(readers[0])
        ds = readers[0].outputs[0]
        readers = g.readers(ds)
    dq_mm = next((r for r in readers if _matmul(r, False, False) and r.inputs[0].id == ds.id), None)
    dk_mm = next((r for r in readers if _matmul(r, True, False) and r.inputs[0].id == ds.id), None)
    if len(readers) != 2 or dq_mm is None or dk_mm is None:
        return None
    if dq_mm.inputs[1].id != key.id or dk_mm.inputs[1].id != query.id:
        return None
    used += [dq_mm, dk_mm]
    inputs = (query, key, value, dst, diff_dst)
    if not all(g.is_input(lt) for lt in (*inputs, stats)):
        return None
    dtype = query.dtype
    if dtype not in _FLOATS or any(lt.dtype != dtype for lt in inputs) or stats.dtype != "f32":
        return None
    if mask is not None and (mask.dtype not in _FLOATS or len(known_shape(mask)) > len(known_shape(query))):
        return None
    if scale is not None and scale.dtype not in _FLOATS:
        return None
    outs = (diff_query, diff_key, diff_value) = (dq_mm.outputs[0], dk_mm.outputs[0], diff_value)
    if any(lt.dtype not in _FLOATS for lt in outs):
        return None
    ids = {op.id for op in used}
    made = {lt.id for op in used for lt in op.outputs} - {lt.id for lt in outs}
    for lt_id in made:
        if lt_id in g.output_ids or any(r.id not in ids for r in g.consumers.get(lt_id, ())):
            return None
    for op in used:
        if op.kind != "TypeCast" and any(lt.id in made and lt.dtype != "f32" for lt in op.outputs):
            return None
    shapes = [known_shape(lt) for lt in (query, key, value, dst, diff_dst, stats)]
    q, k, v, o, do, st = shapes
    if len(q) < 2 or not (len(q) == len(k) == len(v) == len(o) == len(do) == len(st)):
        return None
    batch = q[:-2]
    if k[:-2] != batch or v[:-2] != batch or o != batch + (q[-2], v[-1]) or do != o \
            or st != batch + (q[-2], 1) or k[-1] != q[-1] or v[-2] != k[-2]:
        return None  # GQA (K/V broadcast over query heads) and anything else stays op by op
    return SdpaBackwardMatch(query, key, value, dst, diff_dst, stats, scale, scale_mode, mask,
                             diff_query, diff_key, diff_value,
                             tuple(sorted(ids, key=g.order.__getitem__)))


def _nelems(lt: LogicalTensor) -> int:
    n = 1
    for d in known_shape(lt):
        n *= d
    return n


def find_sdpa_backward(ops: list[Op], output_ids: set[int]) -> list[SdpaBackwardMatch]:
    """The SDPA backward matches among the partition's ``ops`` (topological order), each op in
    one match at most."""
    g = _Graph(ops, output_ids)
    matches: list[SdpaBackwardMatch] = []
    taken: set[int] = set()
    for op in ops:
        if op.kind != "Exp" or len(op.inputs) != 1:
            continue
        try:
            match = _match_at(op, g)
        except TypeError:  # an unknown rank: not ours to fuse
            match = None
        if match is not None and not taken & set(match.ops):
            matches.append(match)
            taken |= set(match.ops)
    return matches


def lower_sdpa_backward(b: Builder, last: Op, match: SdpaBackwardMatch) -> None:
    """The two fused primitives (dQ; dK and dV) in place of ``match``'s ops, at ``last``."""
    inputs = {name: b.view(getattr(match, name))
              for name in ("query", "key", "value", "dst", "diff_dst", "stats")}
    if match.scale is not None:
        view = b.view(match.scale)
        inputs["scale"] = View(view.slot, MemoryDesc((1,), view.desc.dtype))
    if match.mask is not None:
        inputs["mask"] = b.view(match.mask)

    def maker(part: str):
        def make(query, key, value, dst, diff_dst, stats, **rest):
            return SdpaBackwardDesc(part, query, key, value, dst, diff_dst, stats,
                                    scale_mode=match.scale_mode, **rest)
        return make

    # The rows' D = rowsum(dO * O), computed once by the dq kernel and read by the dkdv one.
    delta = b.temp(MemoryDesc(inputs["stats"].desc.dims, "f32"))
    b.run(last, maker("dq"), inputs, {"diff_query": b.output(match.diff_query), "delta_out": delta})
    b.run(last, maker("dkdv"), {**inputs, "delta": delta}, {"diff_key": b.output(match.diff_key),
                                                            "diff_value": b.output(match.diff_value)})
