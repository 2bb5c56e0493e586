"""Scaled-dot-product attention inside a partition: the op chain that one fused SdpaDesc runs.

oneDNN fuses ``MatMul(Q, K) -> [Multiply|Divide by a one-element scale] -> [Add mask] ->
SoftMax(last axis) -> MatMul(·, V)`` into one kernel that never writes the score matrix. The
match requires each intermediate to be f32, read only by the next op and not a partition
output; the first MatMul not to transpose Q (K may come either way: ``transpose_b`` or an
explicit (…, D, Skv) layout), the second not to transpose the probabilities, and neither to
carry a bias. Masks that are boolean Selects are left to the op-by-op lowering: their fill value
is a runtime input, which a fused additive mask cannot take.
"""

from __future__ import annotations

import attrs

from ._logical_tensor import LogicalTensor, known_shape
from ._op import Op


@attrs.frozen
class SdpaMatch:
    query: LogicalTensor
    key: LogicalTensor
    key_transposed: bool       # the graph's K is (…, D, Skv): the kernel reads it as (…, Skv, D)
    value: LogicalTensor
    value_transposed: bool
    scale: LogicalTensor | None
    scale_mode: str
    mask: LogicalTensor | None
    output: LogicalTensor
    ops: tuple[int, ...]       # ids of the ops it replaces, the first MatMul first


def find_sdpa(ops: list[Op], output_ids: set[int]) -> list[SdpaMatch]:
    readers: dict[int, list[Op]] = {}
    for op in ops:
        for lt in op.inputs:
            readers.setdefault(lt.id, []).append(op)

    def only_reader(lt: LogicalTensor) -> Op | None:
        if lt.id in output_ids or lt.dtype != "f32":
            return None
        found = readers.get(lt.id, [])
        return found[0] if len(found) == 1 else None

    matches, taken = [], set()
    for first in ops:
        if first.kind != "MatMul" or first.id in taken or len(first.inputs) != 2:
            continue
        if first.attrs.get("transpose_a") or any(len(known_shape(lt)) < 2 for lt in first.inputs):
            continue
        chain = [first.id]
        scale, scale_mode, mask = None, "multiply", None
        current = first.outputs[0]
        step = only_reader(current)
        if step is not None and step.kind in ("Multiply", "Divide") and step.inputs[0].id == current.id \
                and step.inputs[1].shape is not None and _numel(step.inputs[1].shape) == 1:
            scale, scale_mode = step.inputs[1], "multiply" if step.kind == "Multiply" else "divide"
            chain.append(step.id)
            current = step.outputs[0]
            step = only_reader(current)
        elif step is not None and step.kind == "Multiply" and step.inputs[1].id == current.id \
                and step.inputs[0].shape is not None and _numel(step.inputs[0].shape) == 1:
            scale = step.inputs[0]
            chain.append(step.id)
            current = step.outputs[0]
            step = only_reader(current)
        if step is not None and step.kind == "Add" and known_shape(step.outputs[0]) == known_shape(current):
            other = step.inputs[1] if step.inputs[0].id == current.id else step.inputs[0]
            if other.id != current.id and other.dtype in ("f32", "bf16", "f16"):
                mask = other
                chain.append(step.id)
                current = step.outputs[0]
                step = only_reader(current)
        if step is None or step.kind != "SoftMax" or len(step.outputs) != 1 or \
                step.attrs.get("axis", -1) % len(known_shape(current)) != len(known_shape(current)) - 1 or \
                step.attrs.get("mode", "none") not in ("none", "inf_as_zero"):
            continue
        chain.append(step.id)
        current = step.outputs[0]
        second = only_reader(current)
        if second is None or second.kind != "MatMul" or len(second.inputs) != 2 or \
                second.inputs[0].id != current.id or second.attrs.get("transpose_a") or \
                len(known_shape(second.inputs[1])) < 2:
            continue
        chain.append(second.id)
        q, k = first.inputs
        matches.append(SdpaMatch(
            query=q, key=k, key_transposed=not first.attrs.get("transpose_b", False),
            value=second.inputs[1], value_transposed=bool(second.attrs.get("transpose_b", False)),
            scale=scale, scale_mode=scale_mode, mask=mask, output=second.outputs[0], ops=tuple(chain)))
        taken.update(chain)
    return matches


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
