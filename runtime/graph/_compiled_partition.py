"""Compiled partitions: a partition's plan with its primitives created, ready to execute."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import trio

from .._errors import (
    ArgumentMismatchError,
    EngineMismatchError,
    InvalidArgumentError,
)
from .._event import Event
from .._memory import Memory
from .._memory_desc import MemoryDesc
from .._stream import Stream, StreamFlags
from ._fusion import find_chains
from ._logical_tensor import LogicalTensor, dense_strides
from ._lowering import Builder, Plan
from ._op import Op
from ._tensor import Tensor

if TYPE_CHECKING:
    from .._engine import Engine
    from ._partition import Partition

# Primitive arguments a step writes; every other argument is read.
_WRITTEN = frozenset({"dst", "mean", "variance"})


@attrs.define(eq=False)
class CompiledPartition:
    """A partition compiled for one engine and one set of input and output shapes.

    ``execute(stream, inputs, outputs, deps=...)`` submits its primitives and returns at once
    with an ``Event``; on an out-of-order stream each primitive waits only for the ones that
    produce its inputs. Temporaries are allocated per execution, so executions may overlap.
    """

    partition: Partition
    engine: Engine
    inputs: tuple[LogicalTensor, ...]
    outputs: tuple[LogicalTensor, ...]
    _plan: Plan = attrs.field(repr=False)
    _primitives: list = attrs.field(repr=False)
    _in_flight: list = attrs.field(factory=list, init=False, repr=False)

    @property
    def primitives(self) -> list:
        return list(self._primitives)

    def query_logical_tensor(self, lt_id: int) -> LogicalTensor:
        """An input or output port with the shape and layout compilation settled on."""
        for lt in (*self.inputs, *self.outputs):
            if lt.id == lt_id:
                return lt
        raise InvalidArgumentError(
            f"logical tensor {lt_id} is not a port of compiled partition {self.partition.id} "
            f"(ports: {[lt.id for lt in (*self.inputs, *self.outputs)]})"
        )

    def inplace_ports(self) -> list[tuple[int, int]]:
        """(input id, output id) pairs that may share a buffer; none yet (issue 6 adds them)."""
        return []

    def _bind(self, given, ports: tuple[LogicalTensor, ...], role: str) -> list[Tensor]:
        if isinstance(given, dict):
            by_id = dict(given)
        else:
            given = list(given)
            for t in given:
                if not isinstance(t, Tensor):
                    raise InvalidArgumentError(f"{role} holds {type(t).__name__}, expected triodnn.graph.Tensor")
            by_id = {t.logical_tensor.id: t for t in given}
        bound = []
        for lt in ports:
            tensor = by_id.get(lt.id)
            if tensor is None:
                raise InvalidArgumentError(
                    f"compiled partition {self.partition.id}: {role} lack a tensor for logical "
                    f"tensor {lt.id}"
                )
            if not isinstance(tensor, Tensor):
                raise InvalidArgumentError(f"{role}[{lt.id}] is {type(tensor).__name__}, expected triodnn.graph.Tensor")
            want = lt.memory_desc()
            if tensor.memory.desc != want:
                raise ArgumentMismatchError(
                    f"{role}: tensor for logical tensor {lt.id} has memory {tensor.memory.desc}; "
                    f"the compiled partition expects {want}"
                )
            if tensor.memory.engine.cl_context.int_ptr != self.engine.cl_context.int_ptr:
                raise EngineMismatchError(
                    f"{role}: tensor for logical tensor {lt.id} lives on {tensor.memory.engine}, "
                    f"not on {self.engine}"
                )
            bound.append(tensor)
        extra = sorted(set(by_id) - {lt.id for lt in ports})
        if extra:
            raise InvalidArgumentError(
                f"compiled partition {self.partition.id}: {role} name logical tensor ids {extra}, "
                f"which are not its ports {[lt.id for lt in ports]}"
            )
        return bound

    def execute(self, stream: Stream, inputs, outputs, deps=()) -> Event:
        """Submit the partition; returns the Event of its completion."""
        if not isinstance(stream, Stream):
            raise InvalidArgumentError(f"stream is {type(stream).__name__}, expected triodnn.Stream")
        if stream.engine.cl_context.int_ptr != self.engine.cl_context.int_ptr:
            raise EngineMismatchError(
                f"compiled partition {self.partition.id} was compiled for {self.engine}, "
                f"not for the stream's {stream.engine}"
            )
        ins = self._bind(inputs, self.inputs, "inputs")
        outs = self._bind(outputs, self.outputs, "outputs")
        self._in_flight = [(event, temps) for event, temps in self._in_flight if not event.done]

        memories: list[Memory] = []
        temps: list[Memory] = []
        for slot in self._plan.slots:
            if slot.role == "input":
                memories.append(ins[slot.index].memory)
            elif slot.role == "output":
                memories.append(outs[slot.index].memory)
            else:
                memory = self.engine.memory(MemoryDesc((max(slot.nbytes, 1),), "u8"))
                temps.append(memory)
                memories.append(memory)

        views: dict = {}

        def memory_of(view) -> Memory:
            base = memories[view.slot]
            if base.desc == view.desc:
                return base
            key = (view.slot, view.desc)
            if key not in views:
                views[key] = base.view(view.desc)
            return views[key]

        in_order = StreamFlags.out_of_order not in stream.flags
        writer: dict[int, Event] = {}
        readers: dict[int, list[Event]] = {}
        events: list[Event] = []
        consumed: set[int] = set()
        user_deps = tuple(deps)
        last = None
        for step, primitive in zip(self._plan.steps, self._primitives):
            args = {name: memory_of(view) for name, view in step.args}
            if in_order:
                step_deps = user_deps if last is None else ()
            else:
                step_deps = list(user_deps)
                for name, view in step.args:
                    if view.slot in writer:
                        step_deps.append(writer[view.slot])
                    if name in _WRITTEN:
                        step_deps.extend(readers.get(view.slot, ()))
            last = stream.execute(primitive, args, deps=step_deps)
            events.append(last)
            for name, view in step.args:
                if name in _WRITTEN:
                    if view.slot in writer:
                        consumed.add(id(writer[view.slot]))
                    writer[view.slot] = last
                    readers[view.slot] = []
                else:
                    readers.setdefault(view.slot, []).append(last)
                    if view.slot in writer:
                        consumed.add(id(writer[view.slot]))
        if last is None:
            done = stream.marker(deps=user_deps)
        elif in_order:
            done = last
        else:
            sinks = [e for e in events if id(e) not in consumed]
            done = sinks[0] if len(sinks) == 1 else stream.marker(deps=sinks)
        if temps:
            # OpenCL keeps a released buffer until its commands finish, but the stream actor
            # enqueues later: hold the temporaries until the partition completes.
            self._in_flight.append((done, (temps, views)))
        return done


def _shaped(lt: LogicalTensor, shapes: dict, ports: dict[int, LogicalTensor]) -> LogicalTensor:
    if lt.id in ports:
        return ports[lt.id]
    shape = shapes[lt.id]
    return lt.evolve(shape=shape, layout_type="strided", strides=dense_strides(shape), layout_id=None)


async def compile_partition(partition: Partition, engine: Engine, inputs: list[LogicalTensor],
                            outputs: list[LogicalTensor], shapes: dict, *,
                            fuse: bool = True) -> CompiledPartition:
    """The partition's plan, post-op chains fused into their anchors unless ``fuse`` is False,
    with every primitive created (concurrently, through the primitive cache)."""
    ports = {lt.id: lt for lt in (*inputs, *outputs)}
    builder = Builder(inputs, outputs)
    shaped_ops = [Op(op.id, op.kind, [_shaped(lt, shapes, ports) for lt in op.inputs],
                     [_shaped(lt, shapes, ports) for lt in op.outputs], dict(op.attrs), op.name)
                  for op in partition.ops]
    chains = find_chains(shaped_ops, {lt.id for lt in outputs}) if fuse else {}
    absorbed = {op_id for chain in chains.values() for op_id in chain.absorbed}
    for op in shaped_ops:
        if op.id not in absorbed:
            builder.lower(op, chains.get(op.id))
    plan = builder.plan
    primitives: list = [None] * len(plan.steps)

    async def create(i: int, desc) -> None:
        primitives[i] = await engine.create_primitive(desc)

    async with trio.open_nursery() as nursery:
        for i, step in enumerate(plan.steps):
            nursery.start_soon(create, i, step.desc)
    return CompiledPartition(partition, engine, tuple(inputs), tuple(outputs), plan, primitives)
