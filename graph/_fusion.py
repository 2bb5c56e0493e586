"""Post-op fusion inside a partition: chains of eltwise and binary ops ride on their anchor.

oneDNN's fusion patterns put a matmul or convolution (or a binary, eltwise, softmax or
normalization op) and the elementwise ops that follow it into one kernel: the chain becomes the
anchor's post-op attribute, applied to each value before it is stored, so the intermediate
tensors never reach memory. This module finds such chains; the lowering attaches them.

A chain grows from an anchor's output while:

- the current tensor is f32, not an output of the partition, and read by exactly one op (the
  next link), except for swish: ``x * sigmoid(x)`` reads ``x`` twice and becomes one
  ``eltwise swish`` link;
- the next op is a unary eltwise op, a BiasAdd (on a matmul or convolution), or an arithmetic
  binary op whose other operand is ready before the anchor runs (a partition input, or made by
  an earlier op), is f32 and broadcasts to the current tensor, which it does not enlarge;
  sub and div need the chain's value on the left.
"""

from __future__ import annotations

import attrs

from ._logical_tensor import LogicalTensor, known_shape
from ._op import Op, producers_and_consumers
from ._op_registry import graph_op
from .ops.binary import COMMUTATIVE_KINDS, POST_OP_ALGORITHMS
from .ops.eltwise import UNARY_ELTWISE_KINDS, eltwise_parameters


@attrs.frozen
class Chain:
    """Post-ops for one anchor: ``entries`` are ``("eltwise", alg, alpha, beta)`` or
    ``("binary", alg, operand logical tensor, bias data_format or None)``; ``final`` the tensor
    the fused primitive writes; ``absorbed`` the ids of the ops it replaces."""

    entries: tuple
    final: LogicalTensor
    absorbed: frozenset[int]


def _anchor_ok(op: Op) -> bool:
    """Whether ``op`` can carry post-ops: its kind's family says (``GraphOp.post_op_anchor``)."""
    rule = graph_op(op.kind).post_op_anchor
    return rule is not None and len(op.outputs) == 1 and rule(op)


def _broadcasts_into(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    if len(small) > len(big):
        return False
    return all(s in (1, b) for s, b in zip(reversed(small), reversed(big)))


def find_chains(ops: list[Op], output_ids: set[int]) -> dict[int, Chain]:
    """``{anchor op id: Chain}`` for the partition's ``ops`` (topological order)."""
    position = {op.id: i for i, op in enumerate(ops)}
    producer, consumers = producers_and_consumers(ops)
    chains: dict[int, Chain] = {}
    absorbed: set[int] = set()
    inside: set[int] = set()            # tensors a chain keeps in registers
    written_at: dict[int, int] = {}     # a chain's final tensor -> its anchor's position

    def ready_before(lt: LogicalTensor, anchor: Op) -> bool:
        """Made before the anchor's primitive runs (the lowering keeps the ops' order, a
        fused chain taking its anchor's place)."""
        if lt.id in inside:
            return False
        if lt.id in written_at:
            return written_at[lt.id] < position[anchor.id]
        made_by = producer.get(lt.id)
        return made_by is None or position[made_by.id] < position[anchor.id]

    for anchor in ops:
        if anchor.id in absorbed or not _anchor_ok(anchor):
            continue
        entries: list[tuple] = []  # Chain.entries, as the loop finds them
        taken: set[int] = set()
        current = anchor.outputs[0]
        while current.dtype == "f32" and current.id not in output_ids:
            readers = consumers.get(current.id, [])
            if len(readers) == 2:  # swish: x * sigmoid(x)
                sig = next((r for r in readers if r.kind == "Sigmoid"), None)
                mul = next((r for r in readers if r.kind == "Multiply"), None)
                if sig is None or mul is None or sig.outputs[0].id in output_ids:
                    break
                if [r.id for r in consumers.get(sig.outputs[0].id, [])] != [mul.id] or \
                        {lt.id for lt in mul.inputs} != {current.id, sig.outputs[0].id}:
                    break
                entries.append(("eltwise", "swish", 1.0, 0.0))
                taken |= {sig.id, mul.id}
                current = mul.outputs[0]
                continue
            if len(readers) != 1:
                break
            link = readers[0]
            if link.kind in UNARY_ELTWISE_KINDS:
                alg, alpha, beta = eltwise_parameters(link.kind, link.attrs)
                entries.append(("eltwise", alg, alpha, beta))
            elif link.kind == "BiasAdd" and anchor.kind in ("MatMul", "Convolution") and not entries \
                    and len(anchor.inputs) == 2:
                bias = link.inputs[1]
                if bias.dtype != "f32" or not ready_before(bias, anchor):
                    break
                fmt = link.attrs.get("data_format", "NXC")
                if anchor.kind == "Convolution" and fmt != anchor.attrs.get("data_format", "NXC"):
                    break
                if anchor.kind == "MatMul" and fmt == "NCX" and len(known_shape(current)) > 2:
                    break
                entries.append(("binary", "add", bias, fmt))
            elif link.kind in POST_OP_ALGORITHMS and link.attrs.get("auto_broadcast", "numpy") in ("numpy", "none"):
                first, second = link.inputs
                if first.id == current.id and second.id != current.id:
                    other = second
                elif second.id == current.id and link.kind in COMMUTATIVE_KINDS:
                    other = first
                else:
                    break
                if other.dtype != "f32" or not ready_before(other, anchor) or other.shape is None:
                    break
                if known_shape(link.outputs[0]) != known_shape(current) or \
                        not _broadcasts_into(other.shape, known_shape(current)):
                    break
                entries.append(("binary", POST_OP_ALGORITHMS[link.kind], other, None))
            else:
                break
            taken.add(link.id)
            current = link.outputs[0]
        if entries:
            chains[anchor.id] = Chain(tuple(entries), current, frozenset(taken))
            absorbed |= taken
            inside |= {lt.id for op in ops if op.id in taken or op.id == anchor.id
                       for lt in op.outputs} - {current.id}
            written_at[current.id] = position[anchor.id]
    return chains
