"""Compiled partitions: a partition's plan with its primitives created, ready to execute."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs
import numpy as np
import trio

from .._engine import Engine
from .._event import Event
from .._memory import Memory
from .._stream import Stream, StreamFlags, check_deps
from .._values._errors import (
    ArgumentMismatchError,
    EngineMismatchError,
    InvalidArgumentError,
    UnsupportedError,
)
from .._values._memory_desc import MemoryDesc
from ..kernels import sdpa as sdpa_kernel
from ..kernels import sdpa_backward as sdpa_backward_kernel  # fused SDPA backward
from ._fusion import find_chains
from ._int8_convolution import find_int8_convolutions, lower_int8_convolution  # int8 convolution fusion
from ._int8_matmul import find_int8_matmuls, lower_int8_matmul  # int8 matmul fusion
from ._logical_tensor import LogicalTensor, dense_strides, known_shape
from ._lowering import Builder, Plan
from ._memory_plan import MemoryPlan, plan_memory
from ._op import Op
from ._replay import Replay, allocate_temporaries
from ._sdpa_backward_pattern import find_sdpa_backward, lower_sdpa_backward  # fused SDPA backward
from ._sdpa_pattern import find_sdpa
from ._tensor import Tensor
from ._weights_decompression import find_dequantizing_matmuls, lower_dequantizing_matmul  # int4/int8 weights

if TYPE_CHECKING:
    # Annotations only: a partition compiles into this module's CompiledPartition.
    from ._partition import Partition

@attrs.frozen
class CompiledPartitionMemory:
    """Bytes one execution of a compiled partition allocates for temporaries (``scratch``),
    what they would take without planning, and the inputs' and outputs' own bytes."""

    scratch_bytes: int
    unplanned_scratch_bytes: int
    scratch_buffers: int
    temporaries: int
    in_place_steps: int
    port_bytes: int

    @property
    def peak_bytes(self) -> int:
        return self.scratch_bytes + self.port_bytes


@attrs.define(eq=False)
class CompiledPartition:
    """A partition compiled for one engine and one set of input and output shapes.

    ``execute(stream, inputs, outputs, deps=...)`` submits its primitives and returns at once
    with an ``Event``; on an out-of-order stream each primitive waits only for the ones that
    produce its inputs. The primitives go as one recorded command (``_replay``) unless an
    instrument watches the stream. Scratch buffers are kept between executions and a set is
    reused only once its last execution cannot interfere, so executions may overlap.
    """

    partition: Partition
    engine: Engine
    inputs: tuple[LogicalTensor, ...]
    outputs: tuple[LogicalTensor, ...]
    _plan: Plan = attrs.field(repr=False)
    _primitives: list = attrs.field(repr=False)
    _memory: MemoryPlan = attrs.field(default=None, repr=False)
    # Constants the plan reads after the inputs (slots of role "input" past the ports): the
    # zeros and identities that stand for empty work (``_without_empty_work``).
    _hidden: tuple[Tensor, ...] = attrs.field(default=(), repr=False)
    _replay: Replay | None = attrs.field(default=None, init=False, repr=False)
    _descs: dict = attrs.field(factory=dict, init=False, repr=False)  # id(ports) -> their MemoryDescs

    def __attrs_post_init__(self) -> None:
        if self._memory is None:
            self._memory = plan_memory(self._plan)

    def memory_statistics(self) -> CompiledPartitionMemory:
        """Device memory an execution allocates besides its inputs and outputs: with the plan
        (buffers shared between temporaries whose lives do not overlap, in-place steps) and
        what one buffer per temporary would take."""
        ports = sum(lt.nbytes for lt in (*self.inputs, *self.outputs))
        return CompiledPartitionMemory(
            scratch_bytes=self._memory.scratch_bytes,
            unplanned_scratch_bytes=self._memory.unplanned_bytes,
            scratch_buffers=len(self._memory.buffer_bytes),
            temporaries=sum(1 for slot in self._plan.slots if slot.role == "temp"),
            in_place_steps=self._memory.in_place_steps,
            port_bytes=ports,
        )

    @property
    def primitives(self) -> list:
        return list(self._primitives)

    @property
    def replay(self) -> Replay | None:
        """Its kernels' recorded form (made at first use; None when it has no kernels): what a
        graph runner's recorded request (``_recorded_request``) builds on."""
        if self._replay is None and self._primitives:
            self._replay = Replay(self.engine, self._plan, self._memory, self._primitives,
                                  f"partition {self.partition.id}")
        return self._replay

    @property
    def hidden_inputs(self) -> tuple[Tensor, ...]:
        """Constants the kernels read after the input ports (the zeros and identities that
        stand for empty work): the replay's inputs are the ports, then these."""
        return self._hidden

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
        """``(input id, output id)`` pairs that may share one buffer, oneDNN's in-place rule:
        the same memory descriptor, an input that is not constant and that nothing outside the
        partition reads, and no step reading the input after the output is first written
        (an elementwise step reading it at the index it writes, a binary post-op operand
        included, is fine). Pass the same ``Tensor`` (or memory) for both to save a buffer;
        the execution stays correct either way."""
        steps = self._plan.steps
        pairs = []
        for i, in_lt in enumerate(self.inputs):
            if in_lt.property_type == "constant" or in_lt.id in self.partition.shared_inputs:
                continue
            in_slot = self._slot_of("input", i)
            for j, out_lt in enumerate(self.outputs):
                out_slot = self._slot_of("output", j)
                if in_slot is None or out_slot is None or in_lt.memory_desc() != out_lt.memory_desc():
                    continue
                if _reads_before_writes(steps, in_slot, out_slot):
                    pairs.append((in_lt.id, out_lt.id))
                    break
        return pairs

    def _slot_of(self, role: str, index: int) -> int | None:
        for k, slot in enumerate(self._plan.slots):
            if slot.role == role and slot.index == index:
                return k
        return None

    def _port_descs(self, ports: tuple[LogicalTensor, ...]) -> tuple[MemoryDesc, ...]:
        # ``memory_desc()`` builds and validates a new descriptor per call: 8 of them were 45% of
        # an MLP execution's host time on PoCL (cProfile), so each port's is worked out once.
        descs = self._descs.get(id(ports))
        if descs is None:
            descs = self._descs[id(ports)] = tuple(lt.memory_desc() for lt in ports)
        return descs

    def _bind(self, given, ports: tuple[LogicalTensor, ...], role: str) -> list[Tensor]:
        descs = self._port_descs(ports)
        if type(given) is list and len(given) == len(ports):
            # The common call: one Tensor per port, in port order.
            context = self.engine.cl_context.int_ptr
            for tensor, lt, want in zip(given, ports, descs):
                if type(tensor) is not Tensor or tensor.logical_tensor.id != lt.id:
                    break
                memory = tensor.memory
                if memory.desc is not want and memory.desc != want:
                    break  # the general path names the culprit
                if memory.engine is not self.engine and memory.engine.cl_context.int_ptr != context:
                    break
            else:
                return given
        if isinstance(given, dict):
            by_id = dict(given)
        else:
            given = list(given)
            for t in given:
                if not isinstance(t, Tensor):
                    raise InvalidArgumentError(f"{role} holds {type(t).__name__}, expected triodnn.graph.Tensor")
            by_id = {t.logical_tensor.id: t for t in given}
        bound = []
        for lt, want in zip(ports, descs):
            tensor = by_id.get(lt.id)
            if tensor is None:
                raise InvalidArgumentError(
                    f"compiled partition {self.partition.id}: {role} lack a tensor for logical "
                    f"tensor {lt.id}"
                )
            if not isinstance(tensor, Tensor):
                raise InvalidArgumentError(f"{role}[{lt.id}] is {type(tensor).__name__}, expected triodnn.graph.Tensor")
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
        deps = check_deps(deps) if deps else ()
        scalars: list[Memory] = []
        if any(lt.property_type == "host_scalar" for lt in self.inputs):
            inputs, writes, scalars = self._host_scalars(stream, inputs)
            deps = (*deps, *check_deps(writes))
        done = None
        try:
            ins = self._bind(inputs, self.inputs, "inputs")
            outs = self._bind(outputs, self.outputs, "outputs")
            done = self._submit(stream, ins, outs, deps)
        finally:
            # Freed once the execution is done with them (at once when it never started).
            for memory in scalars:
                memory.release_after(done)
        return done

    def _host_scalars(self, stream: Stream, inputs):
        """``inputs`` with each number given for a ``host_scalar`` port (a Python or numpy
        number, a 0-d or one-element array) replaced by a Tensor over a new small buffer, the
        events of the writes that fill them, and those buffers. A buffer per execution, written
        on ``stream``: an execution never waits for another's value, and the partition's
        kernels read it as any input (none takes a scalar by value)."""
        positional = not isinstance(inputs, dict)
        given = list(inputs) if positional else dict(inputs)
        writes: list[Event] = []
        memories: list[Memory] = []
        for i, lt in enumerate(self.inputs):
            if lt.property_type != "host_scalar":
                continue
            if positional:
                if len(given) != len(self.inputs) or isinstance(given[i], Tensor):
                    continue
                value = given[i]
            else:
                if lt.id not in given or isinstance(given[lt.id], Tensor):
                    continue
                value = given[lt.id]
            if isinstance(value, Memory) or value is None:
                continue  # _bind names what is wrong
            array = np.asarray(value)
            if array.size != 1 or array.dtype == object:
                raise ArgumentMismatchError(
                    f"inputs: host scalar {lt.id} takes one number, got {type(value).__name__} "
                    f"of shape {array.shape}"
                )
            desc = self._port_descs(self.inputs)[i]
            memory = self.engine.memory(desc)
            try:
                writes.append(stream.write(memory, array.reshape(desc.dims)))
            except BaseException:
                memory.release()
                for m in memories:
                    m.release()
                raise
            memories.append(memory)
            tensor = Tensor(lt, self.engine, memory=memory)
            if positional:
                given[i] = tensor
            else:
                given[lt.id] = tensor
        return given, writes, memories

    def _submit(self, stream: Stream, ins: list[Tensor], outs: list[Tensor], deps) -> Event:
        if self._hidden:
            ins = [*ins, *self._hidden]
        if not self._primitives:
            return stream.marker(deps=deps)
        if not stream.watched:
            replay = self.replay
            assert replay is not None, "a partition with primitives has a replay"
            return replay.run(stream, ins, outs, deps)
        # Instruments watch: submit kernel by kernel, so that each shows as a command of its own.
        temps = allocate_temporaries(self.engine, self._memory.buffer_bytes)
        memories: list[Memory] = []
        for i, slot in enumerate(self._plan.slots):
            if slot.role == "input":
                memories.append(ins[slot.index].memory)
            elif slot.role == "output":
                memories.append(outs[slot.index].memory)
            else:
                memories.append(temps[self._memory.buffer_of[i]])

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
        # Hazards are per buffer, not per slot: planned temporaries share buffers, and a user
        # may pass one memory as an input and an output (an in-place port).
        buffer_key = [m.cl_buffer.int_ptr for m in memories]
        writer: dict[int, Event] = {}
        readers: dict[int, list[Event]] = {}
        events: list[Event] = []
        consumed: set[int] = set()
        user_deps = tuple(deps)
        last = None
        step_deps: tuple[Event, ...] | list[Event]
        for step, primitive in zip(self._plan.steps, self._primitives):
            args = {name: memory_of(view) for name, view in step.args}
            written = step.desc.output_names
            if in_order:
                step_deps = user_deps if last is None else ()
            else:
                waits = list(user_deps)
                for name, view in step.args:
                    key = buffer_key[view.slot]
                    if key in writer:
                        waits.append(writer[key])
                    if name in written:
                        waits.extend(readers.get(key, ()))
                step_deps = waits
            last = stream.execute(primitive, args, deps=step_deps)
            events.append(last)
            for name, view in step.args:
                key = buffer_key[view.slot]
                if key in writer:
                    consumed.add(id(writer[key]))
                if name in written:
                    for reader in readers.get(key, ()):
                        consumed.add(id(reader))
                    writer[key] = last
                    readers[key] = []
                else:
                    readers.setdefault(key, []).append(last)
        if last is None:
            done = stream.marker(deps=user_deps)
        elif in_order:
            done = last
        else:
            sinks = [e for e in events if id(e) not in consumed]
            done = sinks[0] if len(sinks) == 1 else stream.marker(deps=sinks)
        # Released now, with ``done``, which completes after every step: the submissions hold
        # the buffers until enqueued and OpenCL until their commands finish; a user allocator's
        # free gets ``done`` once it is enqueued.
        for temp in temps:
            temp.release_after(done)
        return done


_SAME_INDEX_READS = frozenset({"src", "src0", "src1"})


def _reads_before_writes(steps, in_slot: int, out_slot: int) -> bool:
    """Whether every read of ``in_slot`` happens before ``out_slot`` is first written, or in
    the writing step itself at the index written (an elementwise kernel with the same layout)."""
    first_write = next((k for k, step in enumerate(steps)
                        if any(v.slot == out_slot and n in step.desc.output_names for n, v in step.args)), None)
    if first_write is None:
        return False
    for k, step in enumerate(steps):
        for name, view in step.args:
            if view.slot != in_slot or k < first_write:
                continue
            if k > first_write:
                return False
            dst = dict(step.args).get("dst")
            same_index = name in _SAME_INDEX_READS or name.startswith("post_op_")
            if not (getattr(step.desc, "kind", None) in ("eltwise", "binary", "matmul", "convolution")
                    and same_index and dst is not None and dst.slot == out_slot and view.desc == dst.desc):
                return False
            if getattr(step.desc, "kind", None) in ("matmul", "convolution") and not name.startswith("post_op_"):
                return False
    return True


def _shaped(lt: LogicalTensor, shapes: dict, ports: dict[int, LogicalTensor]) -> LogicalTensor:
    if lt.id in ports:
        return ports[lt.id]
    shape = shapes[lt.id]
    return lt.evolve(shape=shape, layout_type="strided", strides=dense_strides(shape), layout_id=None)


# The ops that take s64 tensors (oneDNN Graph's dropout seeds and offsets): they move and
# convert values. Kernels compute in f32, exact only to 2**24, so arithmetic on s64 would
# quietly round seeds; it is refused instead.
_S64_KINDS = frozenset({"Reorder", "TypeCast", "StaticReshape", "StaticTranspose", "End",
                        "Dropout"})  # Dropout: its kernel reads seed/offset as 64-bit


def _check_s64(ops: list[Op]) -> None:
    for op in ops:
        if op.kind in _S64_KINDS:
            continue
        wide = [lt.id for lt in (*op.inputs, *op.outputs) if lt.dtype == "s64"]
        if wide:
            raise UnsupportedError(
                f"op {op.id} ({op.kind}): s64 tensor(s) {wide} are not supported; triodnn takes "
                f"s64 only in {', '.join(sorted(_S64_KINDS - {'End'}))} (kernels compute in f32, "
                "exact only to 2**24): TypeCast to f32 or s32 first"
            )


# What a reduction over no elements gives: its identity (mean: 0/0).
_EMPTY_REDUCTION = {"ReduceSum": 0.0, "ReduceL1": 0.0, "ReduceL2": 0.0, "ReduceProd": 1.0,
                    "ReduceMax": -math.inf, "ReduceMin": math.inf, "ReduceMean": math.nan}


def _filled(lt_id: int, like: LogicalTensor, value: float) -> tuple[LogicalTensor, np.ndarray]:
    """A hidden constant input shaped as ``like``, every element ``value`` (integer types
    take the nearest value they hold, 0 for NaN)."""
    shape = known_shape(like)
    lt = LogicalTensor(lt_id, like.dtype, shape, layout_type="strided")
    if like.dtype in ("s8", "u8", "s32", "s64"):
        info = np.iinfo(like.dtype.replace("s", "int").replace("u8", "uint8"))
        value = 0 if math.isnan(value) else min(max(value, info.min), info.max)
        return lt, np.full(shape, int(value), dtype=np.int64)
    return lt, np.full(shape, value, dtype=np.float32 if like.dtype != "boolean" else bool)


def _without_empty_work(ops: list[Op], next_id: int) -> tuple[list[Op], list[tuple[LogicalTensor, np.ndarray]]]:
    """``ops`` with no op touching an empty tensor (a 0 dim), and the constants they read.

    OpenCL refuses a kernel of global size 0 and a buffer of 0 bytes, and triodnn's
    descriptors have positive dims, so empty work lowers to no step: an op whose outputs are
    all empty is dropped (its outputs' placeholder buffers are never read). One that makes
    elements out of nothing becomes a copy of a constant: a MatMul over K = 0 gives zeros
    (plus its bias), a reduction over an empty axis its identity, as oneDNN's do; a Concat
    skips its empty inputs. Any other op with an empty input and a non-empty output is an
    ``UnsupportedError``."""
    kept: list[Op] = []
    constants: list[tuple[LogicalTensor, np.ndarray]] = []
    for op in ops:
        if not any(lt.is_empty for lt in (*op.inputs, *op.outputs)):
            kept.append(op)
            continue
        if all(lt.is_empty for lt in op.outputs):
            continue
        out = op.outputs[0]
        if op.kind == "Concat":
            rest = [lt for lt in op.inputs if not lt.is_empty]
            if len(rest) == 1:
                kept.append(Op(op.id, "Reorder", rest, [out], {}, op.name))
            else:
                kept.append(Op(op.id, "Concat", rest, [out], dict(op.attrs), op.name))
            continue
        if op.kind == "MatMul" and len(op.outputs) == 1 and not any(lt.is_empty for lt in op.inputs[2:]):
            value = 0.0
        elif op.kind in _EMPTY_REDUCTION and len(op.outputs) == 1:
            value = _EMPTY_REDUCTION[op.kind]
        else:
            empty = [lt.id for lt in op.inputs if lt.is_empty]
            raise UnsupportedError(
                f"op {op.id} ({op.kind}) makes elements of output {out.id} {list(known_shape(out))} "
                f"out of empty input(s) {empty}: triodnn computes that only for MatMul (K = 0), "
                "the reductions and Concat"
            )
        lt, array = _filled(next_id, out, value)
        next_id += 1
        constants.append((lt, array))
        if op.kind == "MatMul" and len(op.inputs) > 2:
            add_attrs: dict = {"auto_broadcast": "numpy"}
            kept.append(Op(op.id, "Add", [lt, op.inputs[2]], [out], add_attrs, op.name))
        else:
            kept.append(Op(op.id, "Reorder", [lt], [out], {}, op.name))
    return kept, constants


def _fusion_pays(match, engine: Engine) -> bool:
    """Whether the fused attention kernel beats the ops one by one for this match's sizes on the
    engine's kernel configuration (``kernels.sdpa.fusion_pays``)."""
    q, v = known_shape(match.query), known_shape(match.value)
    sq, d = q[-2], q[-1]
    skv, dv = (v[-1], v[-2]) if match.value_transposed else (v[-2], v[-1])
    return sdpa_kernel.fusion_pays(sq, skv, d, dv, engine.kernel_config, probs_quantized=match.probs_quant is not None)


def _backward_pays(match, engine: Engine) -> bool:
    """Whether the fused SDPA backward beats the ops one by one for this match's sizes on the
    engine's kernel configuration (``kernels.sdpa_backward.fusion_pays``)."""
    (sq, d), skv, dv = known_shape(match.query)[-2:], known_shape(match.key)[-2], known_shape(match.value)[-1]
    return sdpa_backward_kernel.fusion_pays(sq, skv, d, dv, engine.kernel_config)


async def compile_partition(partition: Partition, engine: Engine, inputs: list[LogicalTensor],
                            outputs: list[LogicalTensor], shapes: dict, *,
                            fuse: bool = True) -> CompiledPartition:
    """The partition's plan, post-op chains fused into their anchors unless ``fuse`` is False,
    with every primitive created (concurrently, through the primitive cache)."""
    ports = {lt.id: lt for lt in (*inputs, *outputs)}
    shaped_ops = [Op(op.id, op.kind, [_shaped(lt, shapes, ports) for lt in op.inputs],
                     [_shaped(lt, shapes, ports) for lt in op.outputs], dict(op.attrs), op.name)
                  for op in partition.ops]
    _check_s64(shaped_ops)
    constants: list[tuple[LogicalTensor, np.ndarray]] = []
    # Ids for hidden constants: past every tensor of the partition.
    next_id = max((lt.id for op in shaped_ops for lt in (*op.inputs, *op.outputs)), default=0) + 1
    if any(lt.is_empty for op in shaped_ops for lt in (*op.inputs, *op.outputs)):
        shaped_ops, constants = _without_empty_work(shaped_ops, next_id)
    output_ids = {lt.id for lt in outputs}
    # Lowered where its last op was: every input (V, the mask) exists by then.
    attention = {m.ops[-1]: m for m in find_sdpa(shaped_ops, output_ids)
                 if _fusion_pays(m, engine)} if fuse else {}
    in_attention = {op_id for m in attention.values() for op_id in m.ops}
    # SDPA backward: dQ, dK, dV as two fused primitives, lowered at the match's last op.
    backward = {m.ops[-1]: m for m in find_sdpa_backward(shaped_ops, output_ids)
                if _backward_pays(m, engine)} if fuse else {}
    in_backward = {op_id for m in backward.values() for op_id in m.ops}
    rest = [op for op in shaped_ops if op.id not in in_attention | in_backward]
    chains = find_chains(rest, output_ids) if fuse else {}
    absorbed = in_attention | {op_id for chain in chains.values() for op_id in chain.absorbed}
    # Int8 matmul fusion: Dequantize -> MatMul (+ chain) [-> Quantize] as one primitive.
    int8 = find_int8_matmuls(rest, output_ids, chains, engine.kernel_config) if fuse else {}
    absorbed |= {op_id for match in int8.values() for op_id in match.absorbed}
    next_id += len(constants)
    int8_conv = find_int8_convolutions(rest, output_ids, chains, next_id=next_id) if fuse else {}
    absorbed |= {op_id for match in int8_conv.values() for op_id in match.absorbed}
    constants += [c for c in (match.constant() for match in int8_conv.values()) if c is not None]
    # Weights decompression: DynamicDequantize(weights) -> MatMul (+ chain) as one primitive.
    decompressed = find_dequantizing_matmuls(rest, output_ids, engine.kernel_config) if fuse else {}
    absorbed |= {op_id for match in decompressed.values() for op_id in match.absorbed}
    builder = Builder([*inputs, *(lt for lt, _ in constants)], outputs, fpmath_mode=partition.fpmath_mode)
    for op in shaped_ops:
        if op.id in backward:
            lower_sdpa_backward(builder, op, backward[op.id])
        elif op.id in in_backward:
            continue
        elif op.id in attention:
            builder.lower_sdpa(op, attention[op.id])
        elif op.id in int8:
            lower_int8_matmul(builder, op, int8[op.id], chains.get(op.id))
        elif op.id in int8_conv:
            lower_int8_convolution(builder, op, int8_conv[op.id], chains.get(op.id))
        elif op.id in decompressed:
            lower_dequantizing_matmul(builder, op, decompressed[op.id], chains.get(op.id))
        elif op.id not in absorbed:
            builder.lower(op, chains.get(op.id))
    plan = builder.plan
    primitives: list = [None] * len(plan.steps)

    async def create(i: int, desc) -> None:
        primitives[i] = await engine.create_primitive(desc)

    async with trio.open_nursery() as nursery:
        for i, step in enumerate(plan.steps):
            nursery.start_soon(create, i, step.desc)
    hidden = []
    try:
        for lt, array in constants:
            hidden.append(await Tensor.from_numpy(lt, engine, array))
    except BaseException:
        for tensor in hidden:
            tensor.release()
        raise
    return CompiledPartition(partition, engine, tuple(inputs), tuple(outputs), plan, primitives,
                             hidden=tuple(hidden))
