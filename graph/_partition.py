"""Partitions: groups of ops that compile together, with their input and output ports."""

from __future__ import annotations

import attrs

from .._engine import Engine
from .._portal_route import portal_of
from .._values._errors import InvalidArgumentError, ShapeInferenceError, UnsupportedError
from . import _compiled_partition
from ._compiled_partition import CompiledPartition
from ._compiled_partition_cache import compile_cached
from ._layouts import resolve_input_layout, resolve_output_layout
from ._logical_tensor import UNKNOWN_DIM, LogicalTensor, known_shape
from ._op import Op
from ._shape_inference import infer_output_shapes


def _fits(shape: tuple[int, ...] | None, declared: tuple[int, ...] | None) -> bool:
    """Whether ``shape`` is one that ``declared`` allows: same rank, every dim equal or -1 there.
    An unknown rank allows any, and so does a lone -1: oneDNN writes an unknown rank as one
    unknown dim, which reads back as ``(-1,)`` (its public gemma2 graph declares outputs so)."""
    if declared is None or declared == (UNKNOWN_DIM,):
        return True
    return shape is not None and len(shape) == len(declared) and all(
        d in (-1, s) for s, d in zip(shape, declared)
    )


@attrs.define(eq=False)
class Partition:
    """Ops of one graph that compile into one ``CompiledPartition``.

    ``input_ports`` are the logical tensors the partition reads from outside (graph inputs or
    other partitions' outputs), in first-use order; ``output_ports`` the tensors it produces
    that something outside reads or that leave the graph.
    """

    id: int
    ops: tuple[Op, ...]
    input_ports: tuple[LogicalTensor, ...]
    output_ports: tuple[LogicalTensor, ...]
    is_supported: bool
    engine_kind: str
    fpmath_mode: str
    # Input ports that ops outside the partition read too: never in-place candidates.
    shared_inputs: frozenset = attrs.field(default=frozenset(), kw_only=True)

    @property
    def op_kinds(self) -> tuple[str, ...]:
        return tuple(op.kind for op in self.ops)

    def __repr__(self) -> str:
        state = "" if self.is_supported else " unsupported"
        ins = ",".join(str(lt.id) for lt in self.input_ports)
        outs = ",".join(str(lt.id) for lt in self.output_ports)
        return f"Partition({self.id}{state}: {'+'.join(self.op_kinds)} [{ins}] -> [{outs}])"

    # -- shapes ---------------------------------------------------------------------------------

    def _bind(self, inputs, outputs) -> tuple[list[LogicalTensor], list[LogicalTensor]]:
        """The caller's logical tensors in port order, checked against the ports by id."""
        def by_port(given, ports, role):
            if given is None:
                return list(ports)
            given = list(given)
            for lt in given:
                if not isinstance(lt, LogicalTensor):
                    raise InvalidArgumentError(f"{role} holds {type(lt).__name__}, expected LogicalTensor")
            by_id = {lt.id: lt for lt in given}
            missing = [p.id for p in ports if p.id not in by_id]
            if missing:
                raise InvalidArgumentError(
                    f"partition {self.id}: {role} lack logical tensor ids {missing} "
                    f"(ports: {[p.id for p in ports]})"
                )
            unknown = sorted(set(by_id) - {p.id for p in ports})
            if unknown:
                raise InvalidArgumentError(
                    f"partition {self.id}: {role} name logical tensor ids {unknown}, which are not "
                    f"its ports {[p.id for p in ports]}"
                )
            return [by_id[p.id] for p in ports]

        return by_port(inputs, self.input_ports, "inputs"), by_port(outputs, self.output_ports, "outputs")

    def _as_declared(self, inputs: list[LogicalTensor]) -> bool:
        """Whether ``inputs`` (in port order) have shapes the graph's input ports allow: then
        every shape the graph declares downstream must hold too. Other shapes are new ones
        (recompiling for them), which make the graph's downstream shapes stale."""
        return all(_fits(lt.shape, port.shape) for lt, port in zip(inputs, self.input_ports))

    def infer_shape(self, inputs=None, outputs=None) -> list[LogicalTensor]:
        """The output ports with shapes inferred from ``inputs`` (default: the ports as built)."""
        ins, outs = self._bind(inputs, outputs)
        shapes = self._infer(ins, outs, declared=inputs is None or self._as_declared(ins))
        return [lt.evolve(shape=shapes[lt.id], strides=None if lt.layout_type != "strided"
                          or lt.strides is None or len(lt.strides) != len(shapes[lt.id]) or -1 in lt.strides
                          else lt.strides) for lt in outs]

    def _infer(self, inputs: list[LogicalTensor], outputs: list[LogicalTensor], *,
               declared: bool) -> dict[int, tuple]:
        """Every tensor's shape from the inputs'. Shapes the caller states for outputs must
        agree; so must the graph's own where the inputs have the graph's shapes (``declared``),
        rank included, a -1 dim or an unknown rank allowing any; new input shapes re-infer
        everything downstream, as recompiling for a new shape should."""
        shapes: dict[int, tuple[int, ...]] = {}
        for lt in inputs:
            if not lt.is_shape_known:
                raise ShapeInferenceError(
                    f"partition {self.id}: input logical tensor {lt.id} has shape "
                    f"{'unknown' if lt.shape is None else list(lt.shape)}; inputs need known shapes"
                )
            shapes[lt.id] = known_shape(lt)
        given = {lt.id: lt for lt in outputs}
        if not declared:
            given = {i: lt for i, lt in given.items() if lt.shape is not None}
        for op in self.ops:
            in_shapes = [shapes[lt.id] for lt in op.inputs]
            out_shapes = infer_output_shapes(op.kind, op.attrs, in_shapes, len(op.outputs))
            for lt, shape in zip(op.outputs, out_shapes):
                shape = tuple(shape)
                stated = given.get(lt.id, lt if declared else None)
                if stated is not None and stated.shape is not None and not _fits(shape, stated.shape):
                    raise ShapeInferenceError(
                        f"op {op.id} ({op.kind}): output logical tensor {lt.id} is declared "
                        f"{list(stated.shape)} but its inputs {[list(s) for s in in_shapes]} give {list(shape)}"
                    )
                shapes[lt.id] = shape
        return shapes

    # -- compilation ------------------------------------------------------------------------------

    def compile(self, engine: Engine, inputs=None, outputs=None):
        """Shapes inferred, layouts resolved, primitives created (through the primitive cache):
        ``await partition.compile(engine)``. Given an engine of a blocking portal it compiles
        there and returns the compiled partition, wrapped (no ``portal.wrap`` needed first)."""
        portal = portal_of(engine)
        if portal is not None:
            return portal.run(self._compile, engine, inputs, outputs)
        return self._compile(engine, inputs, outputs)

    async def _compile(self, engine: Engine, inputs=None, outputs=None) -> CompiledPartition:
        if not self.is_supported:
            raise UnsupportedError(
                f"partition {self.id} ({'+'.join(self.op_kinds)}) is not supported; run it another way"
            )
        ins, outs = self._bind(inputs, outputs)
        ins = [resolve_input_layout(lt) for lt in ins]
        shapes = self._infer(ins, outs if outputs is not None else [],
                             declared=inputs is None or self._as_declared(ins))
        if outputs is None and inputs is not None:
            # The graph's output strides were for its own shapes; new shapes get dense ones.
            outs = [lt.evolve(shape=None, strides=None,
                              layout_type="undef" if lt.layout_type == "strided" else lt.layout_type)
                    for lt in outs]
        outs = [resolve_output_layout(lt, shapes[lt.id]) for lt in outs]
        # Looked up at call time, through the module: the cache tests count compiles by
        # replacing ``_compiled_partition.compile_partition``.
        return await compile_cached(self, engine, ins, outs, shapes,
                                    _compiled_partition.compile_partition)
