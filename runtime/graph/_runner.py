"""Whole graphs as DAGs of partitions on one stream, and pipelines of requests through them.

    runner = await triodnn.graph.compile_graph(graph, engine, policy="fusion",
                                               handlers={"Wildcard": numpy_function})
    outputs = await runner.run(stream, {input_id: array_or_tensor})      # {output_id: array}
    async with runner.map(requests, stream=stream, max_in_flight=4) as results:
        async for outputs in results:                                     # in input order
            ...

``compile_graph`` partitions the graph and compiles every supported partition (concurrently,
each as soon as its inputs' shapes are known). Unsupported partitions (Wildcard ops, kinds
triodnn does not lower) run through user handlers: Python functions taking the partition's input
arrays and returning its output arrays.

``run`` submits every partition to the one stream it is given. A partition waits only for the
events of the partitions (or uploads, or handler writes) that produce its inputs, so on an
out-of-order stream independent branches overlap; on an in-order stream the same DAG runs in
submission order. A handler step reads its inputs after their producers' events, runs the
function in a worker thread (by default), writes its outputs on the stream, and the partitions
downstream depend on those writes' events. Buffers the runner allocates (uploaded inputs,
intermediates) are released once the events of all their consumers have completed, never
earlier (one releaser task per run polls and waits for them); outputs are read back as numpy arrays, or handed over as ``Tensor``s.

``map`` pushes a stream of requests through the runner with at most ``max_in_flight`` of them in
flight: a memory channel of ``max_in_flight`` slot tokens is the backpressure (a request starts
with a token, the consumer hands it back when it takes the result). Results come out in input
order; closing the pipeline (leaving its ``async with`` block, breaking out of a bare
``async for``, cancelling the consumer) cancels the requests in flight and releases every buffer
they hold.
"""

from __future__ import annotations

import collections.abc
import inspect
import weakref
from typing import TYPE_CHECKING, Any, Callable

import attrs
import numpy as np
import trio

from .._values._errors import (
    ArgumentMismatchError,
    ClosedError,
    EngineMismatchError,
    InvalidArgumentError,
    ShapeInferenceError,
    UnsupportedError,
)
from .._memory import Memory, _is_row_major
from .._values._memory_desc import MemoryDesc
from .._stream import Stream, check_deps
from ._graph import Graph
from ._layouts import resolve_input_layout, resolve_output_layout
from ._logical_tensor import LogicalTensor
from ._partition import Partition
from ._tensor import Tensor

if TYPE_CHECKING:
    from .._engine import Engine
    from .._event import Event
    from ._compiled_partition import CompiledPartition

__all__ = [
    "GraphRunner",
    "GraphRunnerStatistics",
    "Handler",
    "MissingHandlerError",
    "Pipeline",
    "PipelineStatistics",
    "compile_graph",
]


class MissingHandlerError(UnsupportedError):
    """A graph has an unsupported partition and ``handlers`` has nothing to run it with."""


@attrs.frozen
class Handler:
    """How an unsupported partition runs: ``fn(*input_arrays)`` returns its output array(s).

    ``fn`` gets one numpy array per input of the partition's op (``op.inputs`` order, a tensor
    read twice given twice; ``partition.input_ports`` for a partition of several ops) and
    returns one array, or a sequence with one per output (``partition.output_ports``), each of
    its output's shape (values are converted to its data type). With ``with_partition``, ``fn(partition, *arrays)``: the op's
    attributes are in ``partition.ops``. A coroutine function is awaited on the trio thread;
    other functions run in a worker thread (``trio.to_thread``) unless ``thread`` is False,
    for the cheap ones. A plain callable in ``handlers`` means ``Handler(fn)``.
    """

    fn: Callable = attrs.field()
    thread: bool = True
    with_partition: bool = False

    @fn.validator
    def _check_fn(self, attribute, value) -> None:
        if not callable(value):
            raise InvalidArgumentError(f"handler {value!r} is not callable")

    async def __call__(self, partition: Partition, arrays: list[np.ndarray]):
        args = (partition, *arrays) if self.with_partition else tuple(arrays)
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(*args)
        if self.thread:
            # Not abandoned on cancellation: a cancelled run waits for the thread, so nothing
            # it touches outlives the run.
            result = await trio.to_thread.run_sync(self.fn, *args)
        else:
            result = self.fn(*args)
        if inspect.isawaitable(result):
            result = await result
        return result


@attrs.frozen
class GraphRunnerStatistics:
    """Counts over a runner's life: runs started and finished (``map`` requests included),
    partitions submitted, handler calls, and the buffers it allocated and released (live is
    the difference: outputs handed over as Tensors are the caller's and count as released)."""

    runs_started: int
    runs_finished: int
    partitions_submitted: int
    handler_calls: int
    buffers_allocated: int
    buffers_released: int

    @property
    def live_buffers(self) -> int:
        return self.buffers_allocated - self.buffers_released


@attrs.define(eq=False)
class _Step:
    """One partition of the DAG: compiled, or run by a handler."""

    partition: Partition
    inputs: tuple[LogicalTensor, ...]
    outputs: tuple[LogicalTensor, ...]
    compiled: CompiledPartition | None = None
    handler: Handler | None = None
    # Handler steps: the input ids the handler's arrays are, in order (an op's inputs,
    # repeats included, for a one-op partition; else the input ports).
    call_ids: tuple[int, ...] = ()

    def describe(self) -> str:
        ops = ", ".join(f"op {op.id} {op.kind}" for op in self.partition.ops)
        return f"partition {self.partition.id} ({ops})"


def _ops_key(partition: Partition) -> tuple:
    # Partitions from separate get_partitions() calls are distinct objects: match by their ops.
    return ("ops", frozenset(op.id for op in partition.ops))


def _find_handler(partition: Partition, handlers: dict) -> Handler | None:
    """The handler for ``partition``: keyed by a Partition with its ops, its id, or the
    '+'-joined kinds of its ops (its op kind: unsupported partitions hold one op); the first
    of those present wins."""
    for key in (_ops_key(partition), partition.id, "+".join(partition.op_kinds)):
        found = handlers.get(key)
        if found is not None:
            return found
    return None


def _normalise_handlers(handlers, partitions: list[Partition]) -> dict:
    if handlers is None:
        return {}
    if not isinstance(handlers, collections.abc.Mapping):
        raise InvalidArgumentError(
            f"handlers is {type(handlers).__name__}; expected a dict keyed by op kind, partition id "
            "or Partition"
        )
    ids = {p.id for p in partitions}
    op_sets = {_ops_key(p) for p in partitions}
    out = {}
    for key, value in handlers.items():
        if isinstance(key, bool) or not isinstance(key, (str, int, Partition)):
            raise InvalidArgumentError(
                f"handlers key {key!r} is a {type(key).__name__}; keys are op kinds (str), "
                "partition ids (int) or Partitions"
            )
        if isinstance(key, int) and key not in ids:
            raise InvalidArgumentError(
                f"handlers key {key} is no partition id of this graph (ids {sorted(ids)})"
            )
        if isinstance(key, Partition):
            key = _ops_key(key)
            if key not in op_sets:
                raise InvalidArgumentError(
                    f"handlers key {key[1]!r} (op ids): no partition of this graph under this "
                    "policy has exactly those ops"
                )
        out[key] = value if isinstance(value, Handler) else Handler(value)
    return out


async def _gather(functions) -> None:
    """Run the async callables concurrently; the first failure cancels the rest and is raised
    as itself (not in an exception group)."""
    failure: list[BaseException] = []

    async def guarded(fn, nursery):
        try:
            await fn()
        except Exception as exc:
            if not failure:
                failure.append(exc)
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for fn in functions:
            nursery.start_soon(guarded, fn, nursery)
    if failure:
        raise failure[0]


async def compile_graph(graph: Graph, engine: Engine, *, policy: str = "fusion", handlers=None,
                        inputs=None) -> GraphRunner:
    """Partition ``graph`` with ``policy``, compile its supported partitions for ``engine`` and
    bind its unsupported ones to ``handlers``; returns a ``GraphRunner``.

    ``handlers`` maps op kinds (``"Wildcard"``), partition ids or ``Partition`` objects to
    ``Handler``s or plain callables. An unsupported partition without one raises
    ``MissingHandlerError`` naming its op kinds, before anything compiles. ``inputs``, logical
    tensors keyed by id like ``Partition.compile``'s, gives graph inputs new shapes or layouts;
    shapes are re-inferred downstream (handler outputs keep the shapes the graph declares).
    """
    if not isinstance(graph, Graph):
        raise InvalidArgumentError(f"graph is {type(graph).__name__}, expected triodnn.graph.Graph")
    partitions = graph.get_partitions(policy)
    handlers = _normalise_handlers(handlers, partitions)
    missing = [p for p in partitions if not p.is_supported and _find_handler(p, handlers) is None]
    if missing:
        names = "; ".join(
            f"partition {p.id}: " + ", ".join(f"op {op.id} ({op.kind}, {op.name!r})" for op in p.ops)
            for p in missing
        )
        kinds = sorted({kind for p in missing for kind in p.op_kinds})
        raise MissingHandlerError(
            f"graph ops of kind {', '.join(kinds)} are not supported by triodnn and handlers has "
            f"no entry for them ({names}); pass handlers={{{kinds[0]!r}: fn}} (op kind), "
            f"{{partition_id: fn}} or {{partition: fn}}"
        )

    graph_inputs = graph.input_tensors()
    given: dict[int, LogicalTensor] = {}
    if inputs is not None:
        for lt in inputs:
            if not isinstance(lt, LogicalTensor):
                raise InvalidArgumentError(f"inputs holds {type(lt).__name__}, expected LogicalTensor")
            given[lt.id] = lt
        unknown = sorted(set(given) - {lt.id for lt in graph_inputs})
        if unknown:
            raise InvalidArgumentError(
                f"inputs name logical tensor ids {unknown}, which are not graph inputs "
                f"{[lt.id for lt in graph_inputs]}"
            )
    known: dict[int, LogicalTensor] = {}
    for lt in graph_inputs:
        lt = given.get(lt.id, lt)
        if not lt.is_shape_known:
            raise ShapeInferenceError(
                f"graph input {lt.id} has shape {'unknown' if lt.shape is None else list(lt.shape)}; "
                "pass it with a known shape in inputs="
            )
        known[lt.id] = resolve_input_layout(lt)

    available = {lt.id: trio.Event() for p in partitions for lt in p.output_ports}
    steps: dict[int, _Step] = {}

    async def prepare(partition: Partition) -> None:
        for lt in partition.input_ports:
            if lt.id not in known:
                await available[lt.id].wait()
        ins = [known[lt.id] for lt in partition.input_ports]
        if partition.is_supported:
            compiled = await partition.compile(engine, ins, None)
            step = _Step(partition, tuple(compiled.inputs), tuple(compiled.outputs), compiled=compiled)
        else:
            outs = []
            for lt in partition.output_ports:
                if not lt.is_shape_known:
                    op = next(op for op in partition.ops if any(o.id == lt.id for o in op.outputs))
                    raise ShapeInferenceError(
                        f"op {op.id} ({op.kind}) runs through a handler, so its output {lt.id} needs a "
                        f"declared shape; it has {'unknown' if lt.shape is None else list(lt.shape)}"
                    )
                outs.append(resolve_output_layout(lt, tuple(lt.shape)))
            call = partition.ops[0].inputs if len(partition.ops) == 1 else partition.input_ports
            step = _Step(partition, tuple(ins), tuple(outs), handler=_find_handler(partition, handlers),
                         call_ids=tuple(lt.id for lt in call))
        steps[partition.id] = step
        for lt in step.outputs:
            known[lt.id] = lt
            available[lt.id].set()

    await _gather([lambda p=p: prepare(p) for p in partitions])
    output_ids = [lt.id for lt in graph.output_tensors()]
    return GraphRunner(
        graph, engine, policy, tuple(partitions),
        tuple(known[lt.id] for lt in graph_inputs),
        tuple(known[i] for i in output_ids),
        steps=tuple(steps[p.id] for p in partitions),
    )


@attrs.define(eq=False)
class GraphRunner:
    """A whole graph compiled for one engine: ``await run(...)`` one request, ``map(...)`` many.

    ``inputs`` and ``outputs`` are the graph's input and output logical tensors as compiled
    (shapes and layouts settled); ``partitions`` every partition, ``compiled_partitions`` the
    supported ones'. Create with ``await triodnn.graph.compile_graph(graph, engine, ...)``.
    """

    graph: Graph
    engine: Engine
    policy: str
    partitions: tuple[Partition, ...]
    inputs: tuple[LogicalTensor, ...]
    outputs: tuple[LogicalTensor, ...]
    _steps: tuple[_Step, ...] = attrs.field(alias="steps", repr=False)
    _consumers: dict[int, int] = attrs.field(init=False, repr=False)
    _counts: dict[str, int] = attrs.field(init=False, repr=False)
    _descs: dict[int, MemoryDesc] = attrs.field(init=False, repr=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        consumers: dict[int, int] = {}
        for step in self._steps:
            for lt in step.inputs:
                consumers[lt.id] = consumers.get(lt.id, 0) + 1
        self._consumers = consumers
        self._counts = dict.fromkeys(
            ("runs_started", "runs_finished", "partitions_submitted", "handler_calls",
             "buffers_allocated", "buffers_released"), 0)

    @property
    def compiled_partitions(self) -> tuple[CompiledPartition, ...]:
        return tuple(step.compiled for step in self._steps if step.compiled is not None)

    @property
    def unsupported_partitions(self) -> tuple[Partition, ...]:
        return tuple(step.partition for step in self._steps if step.compiled is None)

    def statistics(self) -> GraphRunnerStatistics:
        return GraphRunnerStatistics(**self._counts)

    def query_logical_tensor(self, lt_id: int) -> LogicalTensor:
        """A graph input or output as compiled."""
        for lt in (*self.inputs, *self.outputs):
            if lt.id == lt_id:
                return lt
        raise InvalidArgumentError(
            f"logical tensor {lt_id} is no graph input or output (inputs "
            f"{[lt.id for lt in self.inputs]}, outputs {[lt.id for lt in self.outputs]})"
        )

    # -- one request ------------------------------------------------------------------------

    async def run(self, stream: Stream, inputs, *, deps=(), outputs=None,
                  as_tensors: bool = False) -> dict:
        """Run the graph once on ``stream``; returns ``{output id: numpy array}`` (or ``Tensor``
        with ``as_tensors``, then the caller's to release) once every output is ready.

        ``inputs`` maps every graph input id to an array (uploaded with a write on ``stream``;
        the runner frees the buffer after its last consumer), a ``Tensor`` or a ``Memory``
        (used as is, read only). ``deps``: events every submission of this run waits for (the
        writes of the caller's input tensors, say). ``outputs`` may give ``Tensor``s to write
        some outputs into; they must share no buffer with an input tensor.
        """
        execution = self._execution(stream, inputs, deps, outputs, as_tensors, copy_inputs=False)
        return await execution.run()

    # -- many requests -----------------------------------------------------------------------

    def map(self, inputs, *, stream: Stream, max_in_flight: int = 4, deps=(),
            as_tensors: bool = False) -> Pipeline:
        """A ``Pipeline`` of ``run``s over ``inputs`` (an iterable or async iterable of input
        dicts), at most ``max_in_flight`` at a time, results in input order. Arrays are copied
        when their request starts, so the iterable may reuse them. Each request gets its own
        outputs. Use ``async with runner.map(...) as results: async for out in results:``
        (closing is then immediate), or ``async for out in runner.map(...)``."""
        return Pipeline(_PipelineCore(self, inputs, stream, max_in_flight, deps, as_tensors))

    # -- internals ---------------------------------------------------------------------------

    def _check_stream(self, stream) -> None:
        if not isinstance(stream, Stream):
            raise InvalidArgumentError(f"stream is {type(stream).__name__}, expected triodnn.Stream")
        if stream.engine.cl_context.int_ptr != self.engine.cl_context.int_ptr:
            raise EngineMismatchError(
                f"the graph was compiled for {self.engine}, not for the stream's {stream.engine}"
            )

    def _execution(self, stream, inputs, deps, outputs, as_tensors, *, copy_inputs) -> _Execution:
        self._check_stream(stream)
        deps = list(check_deps(deps))
        values = self._bind_inputs(inputs, copy_inputs)
        given_outputs = self._bind_outputs(outputs, values)
        return _Execution(self, stream, values, deps, given_outputs, bool(as_tensors))

    def _bind_inputs(self, inputs, copy: bool) -> dict[int, Any]:
        if not isinstance(inputs, collections.abc.Mapping):
            raise InvalidArgumentError(
                f"inputs is {type(inputs).__name__}; expected a dict of graph input id -> array, "
                "Tensor or Memory"
            )
        ids = [lt.id for lt in self.inputs]
        missing = [i for i in ids if i not in inputs]
        if missing:
            raise InvalidArgumentError(f"inputs lack graph input ids {missing} (inputs are {ids})")
        extra = sorted(set(inputs) - set(ids), key=repr)
        if extra:
            raise InvalidArgumentError(f"inputs name ids {extra}, which are not graph inputs {ids}")
        values: dict[int, Any] = {}
        for lt in self.inputs:
            value = inputs[lt.id]
            desc = self._desc(lt)
            if isinstance(value, Memory):
                value = Tensor(lt, value.engine, memory=value)
            if isinstance(value, Tensor):
                self._check_tensor(value, lt, "inputs")
            else:
                array = np.array(value, copy=True) if copy else np.asarray(value)
                if array.shape != tuple(lt.shape):
                    raise ArgumentMismatchError(
                        f"inputs[{lt.id}] has shape {array.shape}; graph input {lt.id} is "
                        f"{tuple(lt.shape)}"
                    )
                value = array.reshape(desc.dims)
            values[lt.id] = value
        return values

    def _check_tensor(self, tensor: Tensor, lt: LogicalTensor, role: str) -> None:
        want = self._desc(lt)
        if tensor.memory.desc != want:
            raise ArgumentMismatchError(
                f"{role}[{lt.id}] has memory {tensor.memory.desc}; the graph expects {want}"
            )
        if tensor.memory.engine.cl_context.int_ptr != self.engine.cl_context.int_ptr:
            raise EngineMismatchError(
                f"{role}[{lt.id}] lives on {tensor.memory.engine}, not on {self.engine}"
            )

    def _bind_outputs(self, outputs, values) -> dict[int, Tensor]:
        if outputs is None:
            return {}
        if not isinstance(outputs, collections.abc.Mapping):
            raise InvalidArgumentError(f"outputs is {type(outputs).__name__}; expected a dict of id -> Tensor")
        by_id = {lt.id: lt for lt in self.outputs}
        input_buffers = {v.memory.cl_buffer.int_ptr: i for i, v in values.items() if isinstance(v, Tensor)}
        bound = {}
        for lt_id, tensor in outputs.items():
            if lt_id not in by_id:
                raise InvalidArgumentError(
                    f"outputs name id {lt_id!r}, which is no graph output {sorted(by_id)}"
                )
            if isinstance(tensor, Memory):
                tensor = Tensor(by_id[lt_id], tensor.engine, memory=tensor)
            if not isinstance(tensor, Tensor):
                raise InvalidArgumentError(f"outputs[{lt_id}] is {type(tensor).__name__}, expected Tensor")
            self._check_tensor(tensor, by_id[lt_id], "outputs")
            shared = input_buffers.get(tensor.memory.cl_buffer.int_ptr)
            if shared is not None:
                raise InvalidArgumentError(
                    f"outputs[{lt_id}] shares its buffer with inputs[{shared}]; the runner does not "
                    "order writes after reads across partitions, give it a buffer of its own"
                )
            bound[lt_id] = tensor
        return bound

    def _count(self, name: str, n: int = 1) -> None:
        self._counts[name] += n

    def _desc(self, lt: LogicalTensor) -> MemoryDesc:
        desc = self._descs.get(lt.id)
        if desc is None:
            desc = self._descs[lt.id] = lt.memory_desc()
        return desc


_TENSOR_FIELDS = tuple(f.name for f in attrs.fields(Tensor))


def _tensor(lt: LogicalTensor, engine: Engine, memory: Memory) -> Tensor:
    """``Tensor(lt, engine, memory)`` for memory allocated with ``lt``'s descriptor, without
    computing that descriptor again (a third of a run's host time in graphs of small ops)."""
    if _TENSOR_FIELDS != ("logical_tensor", "engine", "memory"):   # Tensor changed: be safe
        return Tensor(lt, engine, memory=memory)
    tensor = object.__new__(Tensor)
    tensor.logical_tensor, tensor.engine, tensor.memory = lt, engine, memory
    return tensor


@attrs.define(eq=False)
class _Slot:
    """One logical tensor of one execution: its tensor, the event producing it, and its
    consumers (steps, the output read): how many have not submitted (or finished reading)
    yet, and the events of those that have."""

    lt: LogicalTensor
    waiting: int = 0
    consumer_events: list = attrs.field(factory=list)
    tensor: Tensor | None = None
    event: Event | None = None
    owned: bool = False
    produced: bool = False
    ready: trio.Event | None = None


class _Execution:
    """One run of a GraphRunner: submits its steps, releases its buffers, gathers its outputs."""

    def __init__(self, runner: GraphRunner, stream: Stream, values: dict, deps: list,
                 given_outputs: dict[int, Tensor], as_tensors: bool) -> None:
        self._runner = runner
        self._stream = stream
        self._values = values
        self._deps = deps
        self._given_outputs = given_outputs
        self._as_tensors = as_tensors
        self._slots: dict[int, _Slot] = {}
        self._results: dict[int, Any] = {}
        self._error: BaseException | None = None
        self._nursery: trio.Nursery | None = None
        self._to_release: list[_Slot] = []
        self._releasing = False

    async def run(self) -> dict:
        runner = self._runner
        runner._count("runs_started")
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    self._submit_all()
                except Exception as exc:
                    self._fail(exc)
            if self._error is not None:
                raise self._error
            results = {lt.id: self._results[lt.id] for lt in runner.outputs}
            for lt in runner.outputs:
                slot = self._slots[lt.id]
                if self._as_tensors and slot.owned:
                    slot.owned = False          # the caller's now
                    runner._count("buffers_released")
            runner._count("runs_finished")
            return results
        finally:
            self._release_all()

    # -- bookkeeping ---------------------------------------------------------------------------

    def _slot(self, lt: LogicalTensor) -> _Slot:
        slot = self._slots.get(lt.id)
        if slot is None:
            slot = self._slots[lt.id] = _Slot(lt, waiting=self._runner._consumers.get(lt.id, 0))
        return slot

    def _allocate(self, slot: _Slot) -> Tensor:
        given = self._given_outputs.get(slot.lt.id)
        if given is not None:
            slot.tensor = given
            return given
        engine = self._runner.engine
        slot.tensor = _tensor(slot.lt, engine, engine.memory(self._runner._desc(slot.lt)))
        slot.owned = True
        self._runner._count("buffers_allocated")
        return slot.tensor

    def _publish(self, slot: _Slot, event: Event | None) -> None:
        slot.event = event
        slot.produced = True
        if slot.ready is not None:
            slot.ready.set()

    async def _wait_produced(self, slot: _Slot) -> None:
        if not slot.produced:
            if slot.ready is None:
                slot.ready = trio.Event()
            await slot.ready.wait()

    def _consumed(self, slot: _Slot, event: Event | None = None) -> None:
        """A consumer of ``slot`` has submitted (its completion is ``event``) or finished
        reading (no event). After the last one, the buffer goes once their events complete."""
        if event is not None:
            slot.consumer_events.append(event)
        slot.waiting -= 1
        if slot.waiting == 0 and slot.owned:
            if slot.consumer_events:
                self._to_release.append(slot)
                if not self._releasing:
                    self._releasing = True
                    self._nursery.start_soon(self._releaser)
            else:
                self._release(slot)

    async def _releaser(self) -> None:
        """Releases queued buffers as their consumers' events complete: each pass frees every
        buffer whose events are done (a status poll), then waits for the oldest still running.
        One task and one wake-up per pass, not one per buffer: consumers mostly finish in the
        order they were submitted, so one wait usually finds several done."""
        try:
            while self._to_release:
                running = []
                for slot in self._to_release:
                    if all(event.done for event in slot.consumer_events):
                        self._release(slot)
                    else:
                        running.append(slot)
                self._to_release = running
                if running:
                    for event in running[0].consumer_events:
                        await event
        except Exception as exc:
            self._fail(exc)
        finally:
            self._releasing = False

    def _release(self, slot: _Slot) -> None:
        if slot.owned and slot.tensor is not None:
            slot.owned = False
            slot.tensor.memory.release()
            self._runner._count("buffers_released")

    def _release_all(self) -> None:
        # Only buffers of a failed or cancelled run are left here. Commands already submitted
        # on them still complete: a stream's submissions hold the OpenCL buffers they use.
        for slot in self._slots.values():
            self._release(slot)

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self._nursery.cancel_scope.cancel()

    def _deps_of(self, slots) -> list:
        return self._deps + [s.event for s in slots if s.event is not None]

    # -- submission ----------------------------------------------------------------------------

    def _submit_all(self) -> None:
        runner = self._runner
        for lt in runner.outputs:
            self._slot(lt).waiting += 1     # the output read (or the caller, for Tensors)
        for lt in runner.inputs:
            slot = self._slot(lt)
            value = self._values[lt.id]
            if isinstance(value, Tensor):
                slot.tensor = value
                self._publish(slot, None)
            else:
                tensor = self._allocate(slot)
                self._publish(slot, self._stream.write(tensor.memory, value))
        for step in runner._steps:
            if step.compiled is not None and all(self._slot(lt).produced for lt in step.inputs):
                self._execute(step)
            else:
                self._nursery.start_soon(self._run_step, step)
        # Outputs: reads (or completions) of those produced already are awaited by one task,
        # in order, so a run costs one wake-up where the device finishes them together.
        ready, later = [], []
        for lt in runner.outputs:
            slot = self._slot(lt)
            (ready if slot.produced and self._readable(slot) else later).append(slot)
        if ready:
            self._nursery.start_soon(self._collect_submitted,
                                     [(slot, self._submit_read(slot)) for slot in ready])
        for slot in later:
            self._nursery.start_soon(self._collect, slot)

    async def _run_step(self, step: _Step) -> None:
        try:
            for lt in step.inputs:
                await self._wait_produced(self._slot(lt))
            if step.compiled is not None:
                self._execute(step)
            else:
                await self._call_handler(step)
        except Exception as exc:
            self._fail(exc)

    def _execute(self, step: _Step) -> None:
        ins = [self._slot(lt) for lt in step.inputs]
        outs = [self._slot(lt) for lt in step.outputs]
        tensors = [self._allocate(slot) for slot in outs]
        event = step.compiled.execute(self._stream, [s.tensor for s in ins], tensors,
                                      deps=self._deps_of(ins))
        self._runner._count("partitions_submitted")
        for slot in outs:
            self._publish(slot, event)
        for slot in ins:
            self._consumed(slot, event)

    async def _call_handler(self, step: _Step) -> None:
        ins = [self._slot(lt) for lt in step.inputs]
        values = {}
        for slot in ins:
            values[slot.lt.id] = await self._read(slot, self._deps_of([slot]))
        for slot in ins:
            self._consumed(slot)       # read back: the handler's copy is all it needs
        try:
            results = await step.handler(step.partition, [values[i] for i in step.call_ids])
        except Exception as exc:
            exc.add_note(f"in the handler of {step.describe()}")
            raise
        self._runner._count("handler_calls")
        results = _check_results(step, results)
        for lt, array in zip(step.outputs, results):
            slot = self._slot(lt)
            tensor = self._allocate(slot)
            # A tensor the caller gave may still be read by their own commands: after deps.
            self._publish(slot, self._stream.write(tensor.memory, array, deps=self._deps))

    # -- reading -------------------------------------------------------------------------------

    def _readable(self, slot: _Slot) -> bool:
        """Whether the run's stream can read the slot directly (row-major, a numpy dtype)."""
        desc = slot.tensor.memory.desc
        return self._as_tensors or (_is_row_major(desc) and desc.dtype != "bf16")

    def _submit_read(self, slot: _Slot):
        """(host array, event) of a read of ``slot`` on the run's stream, after its producer;
        for Tensor outputs, (None, the producer's event)."""
        if self._as_tensors:
            return None, slot.event
        desc = slot.tensor.memory.desc
        out = np.empty(desc.dims, dtype=desc.numpy_dtype)
        deps = [slot.event] if slot.event is not None else []
        return out, self._stream.read(slot.tensor.memory, out, deps=deps)

    def _finish(self, slot: _Slot, out) -> None:
        if self._as_tensors:
            self._results[slot.lt.id] = slot.tensor
            return
        out = out.reshape(slot.lt.shape)
        self._results[slot.lt.id] = out.astype(bool) if slot.lt.dtype == "boolean" else out
        self._consumed(slot)

    async def _read(self, slot: _Slot, deps: list) -> np.ndarray:
        """The slot's values as a new array, read on the run's stream (no head-of-line wait
        behind other runs on the engine's host stream) where the layout allows."""
        tensor = slot.tensor
        desc = tensor.memory.desc
        if not _is_row_major(desc) or desc.dtype == "bf16":
            return await tensor.to_numpy(deps=deps)
        out = np.empty(desc.dims, dtype=desc.numpy_dtype)
        await self._stream.read(tensor.memory, out, deps=deps)
        out = out.reshape(slot.lt.shape)
        return out.astype(bool) if slot.lt.dtype == "boolean" else out

    async def _collect_submitted(self, reads) -> None:
        try:
            for slot, (out, event) in reads:
                if event is not None:
                    await event
                self._finish(slot, out)
        except Exception as exc:
            self._fail(exc)

    async def _collect(self, slot: _Slot) -> None:
        try:
            await self._wait_produced(slot)
            if self._readable(slot):
                out, event = self._submit_read(slot)
                if event is not None:
                    await event
                self._finish(slot, out)
            else:
                deps = [slot.event] if slot.event is not None else []
                self._results[slot.lt.id] = await slot.tensor.to_numpy(deps=deps)
                self._consumed(slot)
        except Exception as exc:
            self._fail(exc)


def _check_results(step: _Step, results) -> list[np.ndarray]:
    """The handler's return value as one array per output port, of the port's shape and
    storage layout (a fresh copy: the stream reads it when the write runs)."""
    n = len(step.outputs)
    if isinstance(results, (list, tuple)):
        results = list(results)
    elif n == 1:
        results = [results]
    else:
        raise ArgumentMismatchError(
            f"the handler of {step.describe()} returned {type(results).__name__}; it has {n} "
            "outputs, so it must return a sequence of that many arrays"
        )
    if len(results) != n:
        raise ArgumentMismatchError(
            f"the handler of {step.describe()} returned {len(results)} arrays for {n} outputs "
            f"{[lt.id for lt in step.outputs]}"
        )
    arrays = []
    for lt, result in zip(step.outputs, results):
        array = np.array(result, copy=True)
        if array.shape != tuple(lt.shape):
            raise ArgumentMismatchError(
                f"the handler of {step.describe()} returned shape {array.shape} for output "
                f"{lt.id}, which is {tuple(lt.shape)}"
            )
        arrays.append(array.reshape(lt.memory_desc().dims))
    return arrays


# -- pipelines -----------------------------------------------------------------------------------


@attrs.frozen
class PipelineStatistics:
    """Requests started and delivered so far, and the most ever in flight at once (started,
    not yet handed to the consumer)."""

    started: int
    delivered: int
    peak_in_flight: int

    @property
    def in_flight(self) -> int:
        return self.started - self.delivered


@attrs.define(eq=False)
class _Request:
    done: trio.Event = attrs.field(factory=trio.Event)
    result: dict | None = None
    error: BaseException | None = None
    end: bool = False
    handed: bool = False

    def discard(self) -> None:
        """Free the Tensors of a result nobody will take."""
        if self.result is not None and not self.handed:
            for value in self.result.values():
                if isinstance(value, Tensor):
                    value.memory.release()
            self.result = None


class _PipelineCore:
    """The state a pipeline's feeding task uses; it holds no reference to the ``Pipeline``,
    so dropping the ``Pipeline`` (a ``break`` out of a bare ``async for``) closes it."""

    def __init__(self, runner: GraphRunner, inputs, stream, max_in_flight, deps, as_tensors) -> None:
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise InvalidArgumentError(f"max_in_flight {max_in_flight!r} must be a positive integer")
        runner._check_stream(stream)
        if not isinstance(inputs, (collections.abc.Iterable, collections.abc.AsyncIterable)):
            raise InvalidArgumentError(
                f"inputs is {type(inputs).__name__}; expected an iterable or async iterable of input dicts"
            )
        self.runner = runner
        self.inputs = inputs
        self.stream = stream
        self.max_in_flight = max_in_flight
        self.deps = check_deps(deps)
        self.as_tensors = as_tensors
        # Backpressure: a request starts only with one of max_in_flight slot tokens, which the
        # consumer hands back when it takes the request's result; requests go to the consumer
        # in start order through a second channel (room for them all plus the end marker).
        self.slots_send, self.slots_recv = trio.open_memory_channel(max_in_flight)
        for _ in range(max_in_flight):
            self.slots_send.send_nowait(None)
        self.send, self.recv = trio.open_memory_channel(max_in_flight + 1)
        self.scope = trio.CancelScope()
        self.finished = trio.Event()
        self.state = "new"              # new, running, closed
        self.closing = False
        self.token: trio.lowlevel.TrioToken | None = None
        self.started = 0
        self.delivered = 0
        self.peak = 0
        self.feed_error: BaseException | None = None

    def start(self) -> None:
        if self.state == "new":
            self.state = "running"
            self.token = trio.lowlevel.current_trio_token()
            # A system task: it must outlive no runtime block and block no shutdown; a pipeline
            # dropped unclosed is cancelled from Pipeline.__del__.
            trio.lowlevel.spawn_system_task(self.feed, name=f"triodnn.graph pipeline {id(self):#x}")

    async def feed(self) -> None:
        try:
            with self.scope:
                async with trio.open_nursery() as nursery:
                    await self._feed(nursery)
        except Exception as exc:
            # The input generator's aclose failed, or a bug here: it must not crash the trio
            # run (this is a system task); the consumer gets it instead.
            self.closing = True
            self.feed_error = exc
        finally:
            self.send.close()
            if self.closing:
                self.discard_undelivered()
            self.finished.set()

    async def _feed(self, nursery: trio.Nursery) -> None:
        inputs = self.inputs
        agen = None
        if isinstance(inputs, collections.abc.AsyncIterable):
            agen = inputs.__aiter__()

            async def pull():
                return await agen.__anext__()
        else:
            it = iter(inputs)

            async def pull():
                try:
                    return next(it)
                except StopIteration:
                    raise StopAsyncIteration from None
        try:
            while True:
                await self.slots_recv.receive()
                request = _Request()
                try:
                    item = await pull()
                    execution = self.runner._execution(self.stream, item, self.deps, None,
                                                       self.as_tensors, copy_inputs=True)
                except StopAsyncIteration:
                    request.end = True
                    request.done.set()
                    self.send.send_nowait(request)
                    return
                except Exception as exc:
                    request.error = exc
                    request.done.set()
                    self.send.send_nowait(request)
                    return
                self.started += 1
                self.peak = max(self.peak, self.started - self.delivered)
                self.send.send_nowait(request)
                nursery.start_soon(self._request, request, execution)
        finally:
            # The pipeline consumed the iterable: close a generator it came from, as
            # ``aclosing`` would, so its cleanup runs now rather than at garbage collection.
            with trio.CancelScope(shield=True):
                if agen is not None and hasattr(agen, "aclose"):
                    await agen.aclose()
                elif inspect.isgenerator(inputs):
                    inputs.close()

    async def _request(self, request: _Request, execution: _Execution) -> None:
        try:
            request.result = await execution.run()
        except Exception as exc:
            request.error = exc
        finally:
            if self.closing:
                request.discard()
            request.done.set()

    def discard_undelivered(self) -> None:
        while True:
            try:
                request = self.recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            request.discard()

    async def next(self):
        if self.state == "closed":
            raise StopAsyncIteration
        self.start()
        request = None
        try:
            try:
                request = await self.recv.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                request = None
            if request is not None:
                await request.done.wait()
        except BaseException:
            # The consumer was cancelled (or interrupted) while waiting: close everything.
            with trio.CancelScope(shield=True):
                await self.aclose()
            if request is not None:
                request.discard()
            raise
        if request is None or request.end:
            await self.aclose()
            if request is None and self.feed_error is not None:
                raise self.feed_error
            raise StopAsyncIteration
        if request.error is not None:
            with trio.CancelScope(shield=True):
                await self.aclose()
            raise request.error
        if request.result is None:      # cancelled under us: the pipeline is closing
            await self.aclose()
            raise ClosedError("the pipeline was closed")
        request.handed = True
        self.delivered += 1
        self.slots_send.send_nowait(None)      # the next request may start
        return request.result

    async def aclose(self) -> None:
        if self.state == "new":
            self.state = "closed"
            self.send.close()
            return
        if not self.finished.is_set():
            self.closing = True
            self.scope.cancel()
        self.state = "closed"
        await self.finished.wait()
        self.discard_undelivered()

    def cancel_soon(self) -> None:
        """From ``Pipeline.__del__``: close a running pipeline nobody will iterate again."""
        if self.state != "running" or self.finished.is_set():
            if self.state != "new":
                self.discard_undelivered()
            return
        self.closing = True
        self.state = "closed"
        try:
            self.token.run_sync_soon(self.scope.cancel)
        except (trio.RunFinishedError, RuntimeError):
            pass


class Pipeline:
    """Results of ``GraphRunner.map``, in input order: ``async for outputs in pipeline``.

    At most ``max_in_flight`` requests are in flight (started and not yet handed to the
    consumer); the next input is pulled only when the consumer takes a result. ``async with`` closes it on
    exit, as ``await pipeline.aclose()`` does: requests in flight are cancelled, their buffers
    released, undelivered ``Tensor`` results freed. A bare ``async for`` the consumer breaks out
    of closes when the pipeline object is dropped; an error in a request or in the input
    iterable is raised at its place in the order, after the results before it.
    """

    def __init__(self, core: _PipelineCore) -> None:
        self._core = core
        # Only a weak link back: the core's task must not keep this object alive.
        self._finalizer = weakref.finalize(self, core.cancel_soon)

    def __aiter__(self) -> Pipeline:
        return self

    async def __anext__(self) -> dict:
        return await self._core.next()

    async def __aenter__(self) -> Pipeline:
        self._core.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        with trio.CancelScope(shield=True):
            await self._core.aclose()

    async def aclose(self) -> None:
        await self._core.aclose()

    @property
    def max_in_flight(self) -> int:
        return self._core.max_in_flight

    def statistics(self) -> PipelineStatistics:
        core = self._core
        return PipelineStatistics(core.started, core.delivered, core.peak)
