"""Ops: one operation of a graph, its kind, attributes and logical-tensor inputs and outputs."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from .._values._errors import InvalidGraphError
from ._logical_tensor import LogicalTensor


def _check_tensor(op_id: int, role: str, value) -> LogicalTensor:
    if not isinstance(value, LogicalTensor):
        raise InvalidGraphError(
            f"op {op_id}: {role} is {type(value).__name__}, expected triodnn.graph.LogicalTensor"
        )
    return value


def _tensors(value: Iterable[LogicalTensor]) -> list[LogicalTensor]:
    """Converter: ``list(value)`` (the elements are checked by ``Op.__attrs_post_init__``)."""
    return list(value)


@attrs.define(eq=False)
class Op:
    """An operation: ``Op(id, kind, inputs, outputs, attrs=..., name=...)``.

    ``kind`` is oneDNN Graph's op kind (``"MatMul"``, ``"SoftMax"`` …); ``attrs`` maps attribute
    names to Python values (bool, int, float, str, list of int, list of float). The graph checks
    kind and attributes against the op schema when the op is added, and keeps the normalised
    attributes (defaults filled in).
    """

    id: int
    kind: str
    inputs: list[LogicalTensor] = attrs.field(factory=list, converter=_tensors)
    outputs: list[LogicalTensor] = attrs.field(factory=list, converter=_tensors)
    attrs: dict = attrs.field(factory=dict, converter=dict)
    name: str = ""

    def __attrs_post_init__(self) -> None:
        if isinstance(self.id, bool) or not isinstance(self.id, int) or self.id < 0:
            raise InvalidGraphError(f"op id {self.id!r} must be a non-negative integer")
        if not isinstance(self.kind, str):
            raise InvalidGraphError(f"op {self.id}: kind {self.kind!r} must be a string")
        for i, lt in enumerate(self.inputs):
            _check_tensor(self.id, f"inputs[{i}]", lt)
        for i, lt in enumerate(self.outputs):
            _check_tensor(self.id, f"outputs[{i}]", lt)
        if not self.name:
            self.name = f"{self.kind}_{self.id}"

    def add_input(self, lt: LogicalTensor) -> Op:
        self.inputs.append(_check_tensor(self.id, "input", lt))
        return self

    def add_output(self, lt: LogicalTensor) -> Op:
        self.outputs.append(_check_tensor(self.id, "output", lt))
        return self

    def set_attr(self, name: str, value) -> Op:
        self.attrs[name] = value
        return self

    def __repr__(self) -> str:
        ins = ",".join(str(t.id) for t in self.inputs)
        outs = ",".join(str(t.id) for t in self.outputs)
        return f"Op({self.id} {self.kind} [{ins}] -> [{outs}])"


def producers_and_consumers(ops: Iterable[Op]) -> tuple[dict[int, Op], dict[int, list[Op]]]:
    """``({tensor id: the op making it}, {tensor id: the ops reading it, in order})`` over
    ``ops``: what every pattern matcher of a partition walks."""
    producers: dict[int, Op] = {}
    consumers: dict[int, list[Op]] = {}
    for op in ops:
        for lt in op.inputs:
            consumers.setdefault(lt.id, []).append(op)
        for lt in op.outputs:
            producers[lt.id] = op
    return producers, consumers
