"""Graphs: ops connected by logical tensors, checked as they are added, then partitioned."""

from __future__ import annotations

import attrs

from .._values._errors import InvalidGraphError
from .._values._fpmath import FPMATH_MODES
from ._logical_tensor import LogicalTensor
from ._op import Op
from ._op_schema import check_op
from ._partitioner import partition_graph

ENGINE_KINDS = ("cpu", "gpu", "any")
POLICIES = ("fusion", "debug")


@attrs.define(eq=False)
class Graph:
    """A oneDNN Graph: ``Graph(engine_kind)``, ``add_op`` for each op, then ``get_partitions``.

    ``add_op`` checks the op at once, so a bad graph fails where it is built: the op kind and
    attributes against the schema, every logical tensor against the ones already seen with the
    same id (they must be identical), and one producer per tensor. ``finalize`` checks that the
    ops form no cycle; ``get_partitions`` finalizes, and afterwards the graph is read-only.
    """

    engine_kind: str = "cpu"
    fpmath_mode: str = "strict"
    _ops: list[Op] = attrs.field(factory=list, init=False)
    _op_ids: set[int] = attrs.field(factory=set, init=False)
    _tensors: dict[int, LogicalTensor] = attrs.field(factory=dict, init=False)
    _producers: dict[int, Op] = attrs.field(factory=dict, init=False)
    _consumers: dict[int, list[Op]] = attrs.field(factory=dict, init=False)
    _finalized: bool = attrs.field(default=False, init=False)
    _partitioned: bool = attrs.field(default=False, init=False)
    _order: list[Op] | None = attrs.field(default=None, init=False)
    # Ports written in a serialized graph (oneDNN's input_ports / output_ports), kept for saving.
    input_ports: list[int] | None = attrs.field(default=None, kw_only=True)
    output_ports: list[int] | None = attrs.field(default=None, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if self.engine_kind not in ENGINE_KINDS:
            raise InvalidGraphError(
                f"engine_kind {self.engine_kind!r} is not one of {', '.join(ENGINE_KINDS)}"
            )
        if self.fpmath_mode not in FPMATH_MODES:
            raise InvalidGraphError(
                f"fpmath_mode {self.fpmath_mode!r} is not one of {', '.join(FPMATH_MODES)}"
            )

    # -- building ---------------------------------------------------------------------------

    def add_op(self, op: Op) -> None:
        """Add ``op`` after checking it; nothing is added when a check fails."""
        if self._partitioned:
            raise InvalidGraphError(
                f"op {getattr(op, 'id', op)!r} added after get_partitions(); build a new graph"
            )
        if not isinstance(op, Op):
            raise InvalidGraphError(f"add_op takes a triodnn.graph.Op, got {type(op).__name__}")
        if op.id in self._op_ids:
            raise InvalidGraphError(f"op id {op.id} ({op.kind}) is already in the graph")
        normalised = check_op(op.kind, op.attrs, len(op.inputs), len(op.outputs))
        seen: dict[int, LogicalTensor] = {}
        for role, tensors in (("input", op.inputs), ("output", op.outputs)):
            for lt in tensors:
                known = seen.get(lt.id, self._tensors.get(lt.id))
                if known is not None and known != lt:
                    raise InvalidGraphError(
                        f"op {op.id} ({op.kind}): {role} logical tensor {lt.id} is {_describe(lt)}, "
                        f"but the graph already has {_describe(known)} with that id"
                    )
                seen[lt.id] = lt
        out_ids = [lt.id for lt in op.outputs]
        for lt_id in out_ids:
            if lt_id in self._producers:
                raise InvalidGraphError(
                    f"op {op.id} ({op.kind}) outputs logical tensor {lt_id}, which op "
                    f"{self._producers[lt_id].id} ({self._producers[lt_id].kind}) already produces"
                )
        if len(set(out_ids)) != len(out_ids):
            raise InvalidGraphError(f"op {op.id} ({op.kind}) lists an output logical tensor twice: {out_ids}")
        if set(out_ids) & {lt.id for lt in op.inputs}:
            raise InvalidGraphError(
                f"op {op.id} ({op.kind}) consumes its own output {sorted(set(out_ids) & {lt.id for lt in op.inputs})}"
            )

        op.attrs = normalised
        self._ops.append(op)
        self._op_ids.add(op.id)
        self._tensors.update(seen)
        for lt in op.outputs:
            self._producers[lt.id] = op
        for lt in op.inputs:
            self._consumers.setdefault(lt.id, []).append(op)
        self._finalized = False
        self._order = None

    def finalize(self) -> None:
        """Check the graph is a DAG (InvalidGraphError naming an op on a cycle)."""
        if not self._ops:
            raise InvalidGraphError("the graph has no ops")
        self._order = self._topological_order()
        self._finalized = True

    def _topological_order(self) -> list[Op]:
        position = {id(op): i for i, op in enumerate(self._ops)}
        pending = {id(op): len({lt.id for lt in op.inputs if lt.id in self._producers}) for op in self._ops}
        ready = [op for op in self._ops if pending[id(op)] == 0]
        order: list[Op] = []
        while ready:
            ready.sort(key=lambda o: position[id(o)], reverse=True)
            op = ready.pop()
            order.append(op)
            done = set()
            for lt in op.outputs:
                for consumer in self._consumers.get(lt.id, ()):
                    if (id(consumer), lt.id) in done:
                        continue
                    done.add((id(consumer), lt.id))
                    pending[id(consumer)] -= 1
                    if pending[id(consumer)] == 0:
                        ready.append(consumer)
        if len(order) != len(self._ops):
            stuck = [op for op in self._ops if pending[id(op)] > 0]
            names = ", ".join(f"{op.id} ({op.kind})" for op in stuck[:4])
            raise InvalidGraphError(f"the graph has a cycle through ops {names}")
        return order

    # -- queries ----------------------------------------------------------------------------

    @property
    def ops(self) -> list[Op]:
        """The ops in topological order once finalized, else in the order added."""
        return list(self._order if self._order is not None else self._ops)

    @property
    def finalized(self) -> bool:
        return self._finalized

    def tensor(self, lt_id: int) -> LogicalTensor:
        return self._tensors[lt_id]

    def producer(self, lt_id: int) -> Op | None:
        return self._producers.get(lt_id)

    def consumers(self, lt_id: int) -> list[Op]:
        return list(self._consumers.get(lt_id, ()))

    def input_tensors(self) -> list[LogicalTensor]:
        """Tensors no op produces, in first-use order."""
        seen: dict[int, LogicalTensor] = {}
        for op in self.ops:
            for lt in op.inputs:
                if lt.id not in self._producers:
                    seen.setdefault(lt.id, lt)
        return list(seen.values())

    def output_tensors(self) -> list[LogicalTensor]:
        """Tensors produced and consumed by no op, or by an End op, in production order."""
        outs = []
        for op in self.ops:
            for lt in op.outputs:
                consumers = self._consumers.get(lt.id, ())
                if not consumers or any(c.kind == "End" for c in consumers):
                    outs.append(lt)
        return outs

    def get_partitions(self, policy: str = "fusion"):
        """Partitions covering every op (End ops excepted) in topological order.

        ``fusion`` groups connected supported ops as oneDNN's fusion patterns do; ``debug`` puts
        each op in its own partition. Unsupported ops (Wildcard, or kinds without a lowering)
        get unsupported partitions of their own.
        """
        if policy not in POLICIES:
            raise InvalidGraphError(f"policy {policy!r} is not one of {', '.join(POLICIES)}")
        if not self._finalized:
            self.finalize()
        self._partitioned = True
        return partition_graph(self, policy)


def _describe(lt: LogicalTensor) -> str:
    shape = "?" if lt.shape is None else list(lt.shape)
    return f"{lt.dtype} {shape} {lt.layout_type} {lt.property_type}"
