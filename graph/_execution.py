"""Whole graphs as DAGs of partitions on one stream: ``GraphRunner.run``.

    runner = await triodnn.graph.compile_graph(graph, engine, policy="fusion",
                                               handlers={"Wildcard": numpy_function})
    outputs = await runner.run(stream, {input_id: array_or_tensor})      # {output_id: array}

``run`` submits every partition to the one stream it is given. A partition waits only for the
events of the partitions (or uploads, or handler writes) that produce its inputs, so on an
out-of-order stream independent branches overlap; on an in-order stream the same DAG runs in
submission order. A handler step reads its inputs after their producers' events, runs the
function in a worker thread (by default), writes its outputs on the stream, and the partitions
downstream depend on those writes' events. Buffers the runner allocates (uploaded inputs,
intermediates) are released once the events of all their consumers have completed, never
earlier (one releaser task per run polls and waits for them); outputs are read back as numpy arrays,
or handed over as ``Tensor``s.

Constants. An input whose logical tensor is ``constant`` and that comes as a numpy array goes
through the constant tensor cache (``_constant_cache``): uploaded at its first run, reused by later
runs while it is the same array. ``runner.set_constants({id: array_or_tensor})`` (or
``compile_graph(..., constants=)``) gives the runner inputs once, for every later run and ``map``
request that omits them, whatever their property type.

``compile_graph`` (``_compile_graph``) builds the runner from ``Step``s; ``runner.map``
(``_pipeline``) pushes many requests through it, each one ``Execution`` of this module.
"""

from __future__ import annotations

import collections.abc
from typing import Any

import attrs
import numpy as np
import trio

from .._engine import Engine
from .._event import Event
from .._memory import Memory, _reads_directly
from .._stream import Stream, check_deps
from .._values._dtypes import check_input, convert_input
from .._values._errors import (
    ArgumentMismatchError,
    ClosedError,
    EngineMismatchError,
    InvalidArgumentError,
    MissingArgumentError,
)
from .._values._memory_desc import MemoryDesc
from . import _constant_cache
from ._compiled_partition import CompiledPartition
from ._graph import Graph
from ._handlers import Handler, check_results
from ._logical_tensor import LogicalTensor, known_shape
from ._partition import Partition
from ._pipeline import Pipeline
from ._recorded_request import RequestOutputs, RequestRecording
from ._tensor import Tensor

__all__ = ["Execution", "GraphRunner", "GraphRunnerStatistics", "Step"]


@attrs.frozen
class GraphRunnerStatistics:
    """Counts over a runner's life: runs started and finished (``map`` requests included),
    partitions submitted, handler calls, the buffers it allocated and released for runs (live is
    the difference: outputs handed over as Tensors are the caller's and count as released), and
    the input arrays it wrote to the device (``uploads``: every array input of a run, a constant
    only when the constant tensor cache missed or did not take it, and ``set_constants``'s).
    Buffers of the constant tensor cache and of ``set_constants`` are not the runs'.
    ``runs_cancelled`` counts runs that ended by cancellation (a ``map`` block left early, a
    cancel scope around ``run``): started = finished + cancelled + failed."""

    runs_started: int
    runs_finished: int
    runs_cancelled: int
    partitions_submitted: int
    handler_calls: int
    buffers_allocated: int
    buffers_released: int
    uploads: int
    # Sets of input shapes compiled: 1 for a runner of known shapes; a ``DynamicGraphRunner``'s
    # statistics add up its runners and count them here.
    compiled_shapes: int = 1
    # Sets of device buffers kept for recorded requests (``_recorded_request``): each holds one
    # request's uploaded inputs, intermediates, outputs and scratch, reused request after request.
    # Not counted in ``buffers_allocated``, which counts the buffers of single runs;
    # ``request_buffers`` is how many device buffers the sets hold (``release_request_buffers``).
    request_buffer_sets: int = 0
    request_buffers: int = 0
    # Where the runner's weights live: the inputs it holds from ``set_constants`` (or
    # ``compile_graph(constants=)``), and the device bytes of those it uploaded itself (Tensors
    # and Memory given are the caller's). These are not in the constant tensor cache, whose
    # statistics (``constant_tensor_cache_statistics``) count constant inputs given per run.
    constants: int = 0
    constant_bytes: int = 0

    @property
    def live_buffers(self) -> int:
        return self.buffers_allocated - self.buffers_released


@attrs.define(eq=False)
class Step:
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


@attrs.frozen
class _InputFacts:
    """The graph inputs' ids (in order and as a set) and, per input, its logical tensor, memory
    descriptor, shape and whether it is empty."""

    ids: tuple[int, ...]
    id_set: frozenset[int]
    rows: tuple[tuple[LogicalTensor, MemoryDesc, tuple[int, ...], bool], ...]


class _RunCounters:
    """A runner's counters of ``GraphRunnerStatistics``: its runs (``Execution``,
    ``SubmittedRequest``) add to them as they go."""

    __slots__ = ("by_name",)

    def __init__(self) -> None:
        # The statistics' fields without a default: those the runs count (the rest the runner
        # knows itself).
        self.by_name = {field.name: 0 for field in attrs.fields(GraphRunnerStatistics)
                        if field.default is attrs.NOTHING}

    def add(self, name: str, n: int = 1) -> None:
        self.by_name[name] += n

    def add_if_cancelled(self, exc: BaseException) -> None:
        """Count a run that ``exc`` ended by cancellation (``trio.Cancelled``, alone or in a
        group of nothing else)."""
        if isinstance(exc, BaseExceptionGroup):
            rest = exc.split(trio.Cancelled)[1]
            cancelled = rest is None
        else:
            cancelled = isinstance(exc, trio.Cancelled)
        if cancelled:
            self.by_name["runs_cancelled"] += 1


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
    _steps: tuple[Step, ...] = attrs.field(alias="steps", repr=False)
    # The handlers it was compiled with (normalised): what compiling the graph again for other
    # shapes needs (``DynamicBatcher``'s batch sizes).
    handlers: dict = attrs.field(factory=dict, repr=False, kw_only=True)
    _consumers: dict[int, int] = attrs.field(init=False, repr=False)
    _counters: _RunCounters = attrs.field(init=False, repr=False, factory=_RunCounters)
    _descs: dict[int, MemoryDesc] = attrs.field(init=False, repr=False, factory=dict)
    _recorded: bool | None = attrs.field(init=False, repr=False, default=None)  # see recordable
    # A request as one recorded command (``_recorded_request``): made at the first request that
    # can go that way; False when the runner's requests cannot.
    _recording: RequestRecording | bool | None = attrs.field(init=False, repr=False, default=None)
    # Inputs given once (set_constants): used by every run that omits them.
    _constants: dict[int, Tensor] = attrs.field(init=False, repr=False, factory=dict)
    # The ids of ``_constants`` whose buffers the runner uploaded (arrays given), not the caller's.
    _uploaded_constants: set[int] = attrs.field(init=False, repr=False, factory=set)
    _facts: _InputFacts | None = attrs.field(init=False, repr=False, default=None)  # _input_facts

    def __attrs_post_init__(self) -> None:
        consumers: dict[int, int] = {}
        for step in self._steps:
            for lt in step.inputs:
                consumers[lt.id] = consumers.get(lt.id, 0) + 1
        self._consumers = consumers

    @property
    def steps(self) -> tuple[Step, ...]:
        """The DAG's steps, each partition compiled or run by a handler, in the order a run
        submits them."""
        return self._steps

    @property
    def compiled_partitions(self) -> tuple[CompiledPartition, ...]:
        return tuple(step.compiled for step in self._steps if step.compiled is not None)

    @property
    def unsupported_partitions(self) -> tuple[Partition, ...]:
        return tuple(step.partition for step in self._steps if step.compiled is None)

    def statistics(self) -> GraphRunnerStatistics:
        recording = self._recording
        held = {"constants": len(self._constants),
                "constant_bytes": sum(self._constants[i].memory.desc.nbytes for i in self._uploaded_constants)}
        if isinstance(recording, RequestRecording):
            return GraphRunnerStatistics(**self._counters.by_name, **held, request_buffer_sets=recording.buffer_sets,
                                         request_buffers=recording.buffers)
        return GraphRunnerStatistics(**self._counters.by_name, **held)

    def release_request_buffers(self) -> None:
        """Free the device buffers kept between requests (``statistics().request_buffers``); a
        later request makes them again. They go by themselves with the runner or the runtime."""
        if isinstance(self._recording, RequestRecording):
            self._recording.release()

    @property
    def constants(self) -> dict[int, Tensor]:
        """The inputs given with ``set_constants`` (a copy: change them with ``set_constants``)."""
        return dict(self._constants)

    async def set_constants(self, constants) -> None:
        """Give the runner some of its inputs once: ``{input id: array, Tensor or Memory}``.
        Every later ``run`` and ``map`` request may omit those ids (one that gives one uses its
        own value). Arrays are uploaded now, into buffers the runner owns, and awaited, so the
        caller may reuse them; Tensors and Memory are the caller's, used as they are, read only.
        ``None`` for an id takes its value back. Calling it again replaces the values it names:
        runs already started keep those they started with (a replaced upload is freed when the
        last of them ends). Any graph input may be given, constant or not: the caller promises
        its values stay as given. Nothing changes when any entry is bad (typed errors)."""
        if not isinstance(constants, collections.abc.Mapping):
            raise InvalidArgumentError(
                f"constants is {type(constants).__name__}; expected a dict of graph input id -> array, "
                "Tensor or Memory"
            )
        by_id = {lt.id: lt for lt in self.inputs}
        staged: dict[int, Any] = {}
        for lt_id, value in constants.items():
            lt = by_id.get(lt_id)
            if lt is None:
                raise InvalidArgumentError(
                    f"constants name id {lt_id!r}, which is no graph input {sorted(by_id)}"
                )
            if value is None:
                staged[lt_id] = None
                continue
            if isinstance(value, Memory):
                value = Tensor(lt, value.engine, memory=value)
            if isinstance(value, Tensor):
                staged[lt_id] = self._check_tensor(value, lt, "constants")
                continue
            array = np.asarray(value)
            shape = known_shape(lt)
            if array.shape != shape:
                raise ArgumentMismatchError(
                    f"constants[{lt_id}] has shape {array.shape}; graph input {lt_id} is {shape}"
                )
            desc = self.memory_desc(lt)
            staged[lt_id] = (np.zeros(desc.dims, desc.numpy_dtype) if lt.is_empty else
                             convert_input(array, desc.dtype, f"constants[{lt_id}]").reshape(desc.dims))
        uploaded: dict[int, Tensor] = {}
        try:
            for lt_id, value in staged.items():
                if isinstance(value, np.ndarray):
                    lt = by_id[lt_id]
                    tensor = uploaded[lt_id] = _tensor(lt, self.engine, self.engine.memory(self.memory_desc(lt)))
                    await tensor.memory.write(value)
                    self._counters.add("uploads")
        except BaseException:
            for tensor in uploaded.values():
                tensor.memory.release()
            raise
        for lt_id, value in staged.items():
            if value is None:
                self._constants.pop(lt_id, None)
            else:
                # A replaced upload of ours goes with its last reference (a run still using it).
                self._constants[lt_id] = uploaded[lt_id] if lt_id in uploaded else value
            if lt_id in uploaded:
                self._uploaded_constants.add(lt_id)
            else:
                self._uploaded_constants.discard(lt_id)

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
                  as_tensors: bool | collections.abc.Iterable[int] = False) -> dict:
        """Run the graph once on ``stream``; returns ``{output id: numpy array}`` (or ``Tensor``
        with ``as_tensors``, then the caller's to release) once every output is ready.
        ``as_tensors`` may name some output ids instead of all: those stay on the device as
        ``Tensor``s (a training step's saved activations, the next graph's inputs), the rest
        are read back.

        ``inputs`` maps every graph input id to an array (uploaded with a write on ``stream``;
        the runner frees the buffer after its last consumer), a ``Tensor`` or a ``Memory``
        (used as is, read only). ``deps``: events every submission of this run waits for (the
        writes of the caller's input tensors, say). ``outputs`` may give ``Tensor``s to write
        some outputs into; they must share no buffer with an input tensor.
        """
        execution = self._execution(stream, inputs, deps, outputs, self._tensor_outputs(as_tensors),
                                    copy_inputs=False)
        return await execution.run()

    # -- many requests -----------------------------------------------------------------------

    def map(self, inputs, *, stream: Stream, max_in_flight: int = 4, deps=(),
            as_tensors: bool | collections.abc.Iterable[int] = False) -> Pipeline:
        """``run`` over each input dict of ``inputs`` (an iterable or async iterable), at most
        ``max_in_flight`` at a time, results in input order: a ``Pipeline`` to enter::

            async with runner.map(inputs, stream=stream, max_in_flight=4) as results:
                async for outputs in results:
                    ...

        The requests run in a nursery the ``async with`` block owns: leaving it (the end of the
        inputs, a ``break``, an exception, a cancellation) stops pulling inputs and cancels the
        requests in flight, whose buffers are released, before the block exits. Arrays are
        copied when their request starts, so the iterable may reuse them, except those of
        ``constant`` inputs, which the caller promises not to change (copying them would defeat
        the constant tensor cache). Each request gets its own outputs; ``deps`` and
        ``as_tensors`` are ``run``'s, for every request."""
        self._check_stream(stream)
        deps = list(check_deps(deps))
        as_tensors = self._tensor_outputs(as_tensors)
        return Pipeline(inputs, lambda item: self._execution(stream, item, deps, None, as_tensors, copy_inputs=True),
                        max_in_flight)

    def make_request(self, stream, item, deps, as_tensors) -> Execution:
        """One engine pool request: ``map``'s, with ``as_tensors`` as ``run`` takes it."""
        return self._execution(stream, item, deps, None, self._tensor_outputs(as_tensors), copy_inputs=True)

    # -- what its runs (Execution) ask of it ------------------------------------------------

    def recordable(self) -> bool:
        """Whether a run can go as one straight line (``Execution._run_recorded``): every step
        compiled, each step's inputs graph inputs or outputs of steps before it, every graph
        output produced by a step and readable by a plain read (row-major, not bf16)."""
        recordable = self._recorded
        if recordable is None:
            produced = {lt.id for lt in self.inputs}
            recordable = True
            for step in self._steps:
                if step.compiled is None or any(lt.id not in produced for lt in step.inputs):
                    recordable = False
                    break
                produced.update(lt.id for lt in step.outputs)
            inputs = {lt.id for lt in self.inputs}
            for lt in self.outputs:
                desc = self.memory_desc(lt)
                if lt.id in inputs or lt.id not in produced or not _reads_directly(desc) or lt.is_empty:
                    recordable = False
            self._recorded = recordable
        return recordable

    def consumer_count(self, lt_id: int) -> int:
        """How many steps read logical tensor ``lt_id``: a run frees its buffer after the last."""
        return self._consumers.get(lt_id, 0)

    def memory_desc(self, lt: LogicalTensor) -> MemoryDesc:
        """The memory descriptor of ``lt``'s buffers, worked out once per logical tensor: runs
        allocate and check with it."""
        desc = self._descs.get(lt.id)
        if desc is None:
            desc = self._descs[lt.id] = lt.memory_desc()
        return desc

    # -- internals ---------------------------------------------------------------------------

    def _check_stream(self, stream) -> None:
        check_stream(stream, self.engine)

    def _execution(self, stream, inputs, deps, outputs, as_tensors, *, copy_inputs) -> Execution:
        self._check_stream(stream)
        deps = list(check_deps(deps))
        recording = None if outputs else self._recording_for(stream, as_tensors)
        if copy_inputs and recording is not None and recording.staged:
            copy_inputs = False  # the submission copies them anyway, into pinned memory
        values = self._bind_inputs(inputs, copy_inputs)
        given_outputs = self._bind_outputs(outputs, values)
        return Execution(self, self._counters, stream, values, deps, given_outputs, as_tensors, recording)

    def _tensor_outputs(self, as_tensors) -> frozenset[int]:
        """The output ids ``as_tensors`` hands over as Tensors: all (True), none (False), or
        those it names."""
        ids = [lt.id for lt in self.outputs]
        if isinstance(as_tensors, bool):
            return frozenset(ids) if as_tensors else frozenset()
        if isinstance(as_tensors, (str, bytes)) or not isinstance(as_tensors, collections.abc.Iterable):
            raise InvalidArgumentError(
                f"as_tensors is {type(as_tensors).__name__}; expected a bool or graph output ids"
            )
        named = list(as_tensors)
        unknown = [i for i in named if i not in ids]
        if unknown:
            raise InvalidArgumentError(f"as_tensors names {unknown}, which are not graph outputs {ids}")
        return frozenset(named)

    def _bind_inputs(self, inputs, copy: bool) -> dict[int, Any]:
        if not isinstance(inputs, collections.abc.Mapping):
            raise InvalidArgumentError(
                f"inputs is {type(inputs).__name__}; expected a dict of graph input id -> array, "
                "Tensor or Memory"
            )
        facts = self._input_facts()
        ids = facts.ids
        constants = self._constants
        missing = [i for i in ids if i not in inputs and i not in constants]
        if missing:
            given = f"; set_constants gave {sorted(constants)}" if constants else ""
            keys = sorted(inputs, key=repr)
            hint = ""
            if any(not isinstance(k, int) for k in keys):
                hint = "; the keys are logical tensor ids, ints: int(key) if they came as strings"
            raise MissingArgumentError(
                f"inputs lack graph input ids {missing}: they give {keys} (the graph inputs are "
                f"{list(ids)}{given}){hint}"
            )
        extra = [i for i in inputs if i not in facts.id_set]
        if extra:
            raise InvalidArgumentError(
                f"inputs name ids {sorted(extra, key=repr)}, which are not graph inputs {list(ids)}"
            )
        values: dict[int, Any] = {}
        for lt, desc, shape, empty in facts.rows:
            if lt.id not in inputs:
                values[lt.id] = constants[lt.id]
                continue
            value = inputs[lt.id]
            if isinstance(value, Memory):
                value = Tensor(lt, value.engine, memory=value)
            if isinstance(value, Tensor):
                value = self._check_tensor(value, lt, "inputs")
            else:
                constant = lt.property_type == "constant"
                original = value
                array = np.asarray(value)
                if lt.property_type == "host_scalar" and array.size == 1:
                    array = array.reshape(shape)  # a number, 0-d or [1]: one value either way
                if array.shape != shape:
                    raise ArgumentMismatchError(
                        f"inputs[{lt.id}] has shape {array.shape}; graph input {lt.id} is "
                        f"{shape}"
                    )
                if constant:
                    # Checked now, converted at upload: the cache keys on the caller's array.
                    check_input(array, desc.dtype, f"inputs[{lt.id}]")
                else:
                    # The input policy, at bind time so a bad value fails the call that gave it;
                    # a conversion is a copy already, so map copies only arrays it kept as is.
                    # A matching dtype costs 0.3 µs here (timeit, a 4x8 f32 array, 2-core VM).
                    converted = convert_input(array, desc.dtype, f"inputs[{lt.id}]")
                    if copy and np.may_share_memory(converted, array):
                        converted = converted.copy()
                    array = converted
                if empty:
                    array = np.zeros(desc.dims, desc.numpy_dtype)  # its placeholder's one element
                value = array if array.shape == desc.dims else array.reshape(desc.dims)
                if constant:
                    # The cache keys on the caller's array: its base object, weakly. A value that
                    # was no array, or a reshape that had to copy, is a new object every run.
                    root = None
                    if isinstance(original, np.ndarray):
                        root = _constant_cache.array_root(original)
                        if _constant_cache.array_root(value) is not root:
                            root = None
                    value = _ConstantArray(value, root)
            values[lt.id] = value
        return values

    def _input_facts(self) -> _InputFacts:
        """What binding needs of the graph inputs, worked out once: on the request path each
        ``LogicalTensor`` property costs a call. Binding the MLP request of bench_pipeline (one
        array, four inputs given once) took a median 14.3 µs, 12.6 µs with these (5 processes
        each, alternating, this 2-core VM)."""
        facts = self._facts
        if facts is None:
            ids = tuple(lt.id for lt in self.inputs)
            rows = tuple((lt, self.memory_desc(lt), known_shape(lt), lt.is_empty) for lt in self.inputs)
            facts = self._facts = _InputFacts(ids, frozenset(ids), rows)
        return facts

    def _check_tensor(self, tensor: Tensor, lt: LogicalTensor, role: str) -> Tensor:
        """``tensor`` as ``lt``'s: its memory must be what the graph expects, on its engine, not
        released. A tensor of another logical tensor (another graph's output: a forward's saved
        activation fed to its backward) comes back as a Tensor of ``lt`` over the same memory,
        since partitions bind tensors by logical tensor id."""
        if tensor.released:
            raise ClosedError(f"{role}[{lt.id}] was released")
        want = self.memory_desc(lt)
        if tensor.memory.desc != want:
            raise ArgumentMismatchError(
                f"{role}[{lt.id}] has memory {tensor.memory.desc}; the graph expects {want}"
            )
        if tensor.memory.engine.cl_context.int_ptr != self.engine.cl_context.int_ptr:
            raise EngineMismatchError(
                f"{role}[{lt.id}] lives on {tensor.memory.engine}, not on {self.engine}"
            )
        if tensor.logical_tensor.id != lt.id:
            return _tensor(lt, tensor.engine, tensor.memory)
        return tensor

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
            tensor = self._check_tensor(tensor, by_id[lt_id], "outputs")
            shared = input_buffers.get(tensor.memory.cl_buffer.int_ptr)
            if shared is not None:
                raise InvalidArgumentError(
                    f"outputs[{lt_id}] shares its buffer with inputs[{shared}]; the runner does not "
                    "order writes after reads across partitions, give it a buffer of its own"
                )
            bound[lt_id] = tensor
        return bound

    def _recording_for(self, stream: Stream, as_tensors) -> RequestRecording | None:
        """The recorded command a request on ``stream`` (with no outputs given) goes as, or None:
        outputs handed over as Tensors, a stream instruments watch, a run that is no straight
        line (``recordable``) or buffers too large to keep take the other paths."""
        if as_tensors or stream.watched or not self.recordable():
            return None
        return self._request_recording()

    def _request_recording(self) -> RequestRecording | None:
        """The recorded form of a request (``recordable`` runners only), made at first use;
        None when its buffers would not fit ``SET_BYTES`` or it has no kernels."""
        recording = self._recording
        if recording is None:
            made = RequestRecording(self.engine, self.inputs, self.outputs, self._steps, self.memory_desc,
                                    f"graph request ({len(self._steps)} partitions)")
            recording = self._recording = made if made.usable else False
            if made.usable:
                self.engine.keep_until_shutdown(made)
        return recording if isinstance(recording, RequestRecording) else None


def check_stream(stream, engine: Engine) -> None:
    """``stream`` is a triodnn Stream of ``engine``'s OpenCL context, or a typed error."""
    if type(stream) is Stream and stream.engine is engine:
        return  # the common case, without reading the contexts (two property calls each)
    if not isinstance(stream, Stream):
        raise InvalidArgumentError(f"stream is {type(stream).__name__}, expected triodnn.Stream")
    if stream.engine.cl_context.int_ptr != engine.cl_context.int_ptr:
        raise EngineMismatchError(f"the graph was compiled for {engine}, not for the stream's {stream.engine}")


_TENSOR_FIELDS = tuple(f.name for f in attrs.fields(Tensor))


class _ConstantArray:
    """A ``constant`` input given as an array: ``array`` shaped as its memory, ``root`` the
    caller's array's base object the cache keys on (None: upload it every run)."""

    __slots__ = ("array", "root")

    def __init__(self, array: np.ndarray, root: np.ndarray | None) -> None:
        self.array = array
        self.root = root


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
    # A constant from the cache: pinned until every consumer has submitted.
    lease: _constant_cache.Entry | None = None

    @property
    def bound(self) -> Tensor:
        """``tensor`` where it is known to be there: the slot was produced (bound, then published)."""
        assert self.tensor is not None, "a produced slot has its tensor"
        return self.tensor


class SubmittedRequest:
    """A request submitted as one recorded command: ``await result()`` for its outputs, once;
    ``abandon()`` when nobody will (a closing pipeline). Either settles its constant leases."""

    __slots__ = ("_outputs", "_counters", "_event", "_outs", "_leases", "_settled")

    def __init__(self, outputs: tuple[LogicalTensor, ...], counters: _RunCounters, outs: RequestOutputs,
                 leases: list) -> None:
        self._outputs = outputs          # the runner's graph outputs, in the order outs holds them
        self._counters = counters        # the runner's
        self._event = outs.event
        self._outs = outs
        self._leases = leases
        self._settled = False

    async def result(self) -> dict:
        succeeded = False
        try:
            await self._event
            results: dict[int, Any] = {}
            for lt, out in zip(self._outputs, self._outs.take()):
                out = out.reshape(lt.shape)
                results[lt.id] = out.astype(bool) if lt.dtype == "boolean" else out
            self._counters.add("runs_finished")
            succeeded = True
            return results
        except BaseException as exc:
            self._counters.add_if_cancelled(exc)
            raise
        finally:
            self._settle(failed=not succeeded)

    def abandon(self) -> None:
        """Nobody will await it: count it cancelled and hand back its constants (the command
        still runs to its end; its buffers are the runner's)."""
        if not self._settled:
            self._counters.add("runs_cancelled")
            self._settle(failed=True)

    def _settle(self, failed: bool) -> None:
        if self._settled:
            return
        self._settled = True
        self._outs.drop()
        for entry in self._leases:
            _constant_cache.release(entry, [self._event], failed=failed)
        if self._leases:
            _constant_cache.settle(self._leases)


class Execution:
    """One run of a GraphRunner: submits its steps, releases its buffers, gathers its outputs.
    It asks the runner through ``steps``, ``memory_desc``, ``consumer_count`` and ``recordable``
    (besides its public fields), and adds to the runner's counters, which the runner hands it."""

    def __init__(self, runner: GraphRunner, counters: _RunCounters, stream: Stream, values: dict, deps: list,
                 given_outputs: dict[int, Tensor], as_tensors: frozenset[int],
                 recording: RequestRecording | None) -> None:
        self._runner = runner
        self._counters = counters  # the runner's statistics, which the run adds to
        self._recording = recording  # the recorded command it goes as (GraphRunner._recording_for)
        self._stream = stream
        self._values = values
        self._deps = deps
        self._given_outputs = given_outputs
        self._as_tensors = as_tensors       # the output ids handed over as Tensors
        self._slots: dict[int, _Slot] = {}
        self._results: dict[int, Any] = {}
        self._error: BaseException | None = None
        self._nursery: trio.Nursery  # run()'s, open before anything is submitted
        self._to_release: list[_Slot] = []
        self._releasing = False
        self._succeeded = False
        self._leased: list[_constant_cache.Entry] = []

    async def run(self) -> dict:
        runner = self._runner
        if self._recording is not None:
            return await self._run_request(self._recording)
        if not self._given_outputs and not self._as_tensors and runner.recordable():
            return await self._run_recorded()
        self._counters.add("runs_started")
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
                if lt.id in self._as_tensors and slot.owned:
                    slot.owned = False          # the caller's now
                    self._counters.add("buffers_released")
            self._counters.add("runs_finished")
            self._succeeded = True
            return results
        except BaseException as exc:
            self._counters.add_if_cancelled(exc)
            raise
        finally:
            self._release_all()

    async def _run_request(self, recording: RequestRecording) -> dict:
        """The whole request as one recorded command (``_recorded_request``): uploads, every
        partition's kernels and the read-backs in one submission, into buffers the runner keeps;
        one completion to await. Measured on PoCL (bench_pipeline, the 2-layer MLP) against
        ``_run_recorded``, which submits each upload, partition and read apart and allocates the
        request's buffers: see BENCHMARKS.md, the request path."""
        self._counters.add("runs_started")
        try:
            submitted = self._submit_request(recording)
        except BaseException as exc:
            self._counters.add_if_cancelled(exc)
            raise
        return await submitted.result()

    def submit(self) -> SubmittedRequest | None:
        """Submit the request now if it goes as one recorded command (``run``'s fast path), for
        a caller that awaits ``result()`` later without a task of its own (``map``); None when
        it takes another path (``run`` it then). Raises what submitting raises."""
        if self._recording is None:
            return None
        self._counters.add("runs_started")
        return self._submit_request(self._recording)

    def _submit_request(self, recording: RequestRecording) -> SubmittedRequest:
        runner = self._runner
        stream = self._stream
        counters = self._counters
        # Before a buffer set is taken or a constant leased for a request that cannot be submitted.
        stream.check_can_submit(recording.label)
        deps = list(self._deps)
        sources: list = []
        leases: list[_constant_cache.Entry] = []
        uploads = 0
        try:
            for lt in runner.inputs:
                value = self._values[lt.id]
                if isinstance(value, Tensor):
                    sources.append(value.memory)
                    continue
                if type(value) is _ConstantArray:
                    got = self._acquire_constant(lt, value)
                    if got is not None:
                        entry, missed = got
                        leases.append(entry)
                        sources.append(entry.memory)
                        if entry.upload is not None:
                            deps.append(entry.upload)
                        if missed:
                            counters.add("uploads")
                        continue
                    value = value.array
                sources.append(value)
                uploads += 1
            outs = recording.submit(self._stream, sources, check_deps(deps))
        except BaseException:
            for entry in leases:
                _constant_cache.release(entry, [], failed=True)
            if leases:
                _constant_cache.settle(leases)
            raise
        counters.add("uploads", uploads)
        counters.add("partitions_submitted", len(runner.steps))
        return SubmittedRequest(runner.outputs, counters, outs, leases)

    async def _run_recorded(self) -> dict:
        """The whole graph as a straight line of submissions: every step compiled, each step's
        inputs produced by the steps before it, outputs read back (``GraphRunner.recordable``).
        No nursery, no task, no per-tensor bookkeeping: measured on PoCL (bench_pipeline, the
        2-layer MLP), the general path cost ~160 µs per request more than a hand-written loop
        over ``CompiledPartition.execute``. Buffers the run allocates go when it ends: by then
        every command has completed (each partition feeds an output, whose read was awaited);
        on a failure or cancellation, commands still running keep their OpenCL buffers."""
        runner, stream = self._runner, self._stream
        engine = runner.engine
        counters = self._counters
        counters.add("runs_started")
        user = self._deps
        tensors: dict[int, Tensor] = {}
        events: dict[int, Event] = {}   # logical tensor id -> the event that produces it
        owned: list[Memory] = []
        leases: dict[int, tuple[_constant_cache.Entry, list]] = {}   # id -> (entry, its uses)
        try:
            for lt in runner.inputs:
                value = self._values[lt.id]
                if isinstance(value, Tensor):
                    tensors[lt.id] = value
                    continue
                if type(value) is _ConstantArray:
                    got = self._acquire_constant(lt, value)
                    if got is not None:
                        entry, missed = got
                        leases[lt.id] = (entry, [])
                        self._leased.append(entry)
                        tensors[lt.id] = _tensor(lt, engine, entry.memory)
                        if entry.upload is not None:
                            events[lt.id] = entry.upload
                        if missed:
                            counters.add("uploads")
                        continue
                    value = value.array
                memory = engine.memory(runner.memory_desc(lt))
                owned.append(memory)
                counters.add("buffers_allocated")
                tensors[lt.id] = _tensor(lt, engine, memory)
                events[lt.id] = stream.write(memory, value)
                counters.add("uploads")
            for step in runner.steps:
                outs = []
                for lt in step.outputs:
                    memory = engine.memory(runner.memory_desc(lt))
                    owned.append(memory)
                    counters.add("buffers_allocated")
                    tensor = tensors[lt.id] = _tensor(lt, engine, memory)
                    outs.append(tensor)
                deps = user + [events[lt.id] for lt in step.inputs if lt.id in events]
                compiled = step.compiled
                assert compiled is not None, "a recordable runner has compiled steps only"
                done = compiled.execute(stream, [tensors[lt.id] for lt in step.inputs], outs, deps=deps)
                counters.add("partitions_submitted")
                for lt in step.outputs:
                    events[lt.id] = done
                for lt in step.inputs:
                    if lt.id in leases:
                        leases[lt.id][1].append(done)
            reads = []
            for lt in runner.outputs:
                memory = tensors[lt.id].memory
                out = np.empty(memory.desc.dims, dtype=memory.desc.numpy_dtype)
                producer = events.get(lt.id)
                reads.append((lt, out, stream.read(memory, out, deps=[producer] if producer is not None else [])))
            results: dict[int, Any] = {}
            for lt, out, read in reads:
                await read
                out = out.reshape(lt.shape)
                results[lt.id] = out.astype(bool) if lt.dtype == "boolean" else out
            counters.add("runs_finished")
            self._succeeded = True
            return results
        except BaseException as exc:
            counters.add_if_cancelled(exc)
            raise
        finally:
            for memory in owned:
                memory.release()
                counters.add("buffers_released")
            for entry, uses in leases.values():
                _constant_cache.release(entry, uses, failed=not self._succeeded)
            if self._leased:
                _constant_cache.settle(self._leased)

    # -- bookkeeping ---------------------------------------------------------------------------

    def _slot(self, lt: LogicalTensor) -> _Slot:
        slot = self._slots.get(lt.id)
        if slot is None:
            slot = self._slots[lt.id] = _Slot(lt, waiting=self._runner.consumer_count(lt.id))
        return slot

    def _allocate(self, slot: _Slot) -> Tensor:
        given = self._given_outputs.get(slot.lt.id)
        if given is not None:
            slot.tensor = given
            return given
        engine = self._runner.engine
        slot.tensor = _tensor(slot.lt, engine, engine.memory(self._runner.memory_desc(slot.lt)))
        slot.owned = True
        self._counters.add("buffers_allocated")
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
        if slot.waiting == 0 and slot.lease is not None:
            lease, slot.lease = slot.lease, None
            _constant_cache.release(lease, slot.consumer_events)
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
            self._counters.add("buffers_released")

    def _release_all(self) -> None:
        # Only buffers of a failed or cancelled run are left here. Commands already submitted
        # on them still complete: a stream's submissions hold the OpenCL buffers they use.
        for slot in self._slots.values():
            self._release(slot)
            if slot.lease is not None:
                lease, slot.lease = slot.lease, None
                _constant_cache.release(lease, slot.consumer_events, failed=not self._succeeded)
        if self._leased:
            _constant_cache.settle(self._leased)

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
            elif type(value) is _ConstantArray:
                self._bind_constant(slot, value)
            else:
                tensor = self._allocate(slot)
                self._publish(slot, self._stream.write(tensor.memory, value))
                self._counters.add("uploads")
        for step in runner.steps:
            if step.compiled is not None and all(self._slot(lt).produced for lt in step.inputs):
                self._execute(step, step.compiled)
            else:
                self._nursery.start_soon(self._run_step, step)
        # Outputs: reads (or completions) of those produced already are awaited by one task,
        # in order, so a run costs one wake-up where the device finishes them together.
        ready: list[_Slot] = []
        later: list[_Slot] = []
        for lt in runner.outputs:
            slot = self._slot(lt)
            (ready if slot.produced and self._readable(slot) else later).append(slot)
        if ready:
            self._nursery.start_soon(self._collect_submitted,
                                     [(slot, self._submit_read(slot)) for slot in ready])
        for slot in later:
            self._nursery.start_soon(self._collect, slot)

    def _acquire_constant(self, lt: LogicalTensor, value: _ConstantArray):
        """The constant tensor cache's (entry, missed) for a constant array input, uploading it
        on a miss; None where the cache does not take it (the run uploads its own copy)."""
        engine = self._runner.engine
        if value.root is None:
            _constant_cache.note_uncached(engine)
            return None
        return _constant_cache.acquire(engine, self._stream, self._runner.memory_desc(lt), value.array, value.root)

    def _bind_constant(self, slot: _Slot, value: _ConstantArray) -> None:
        """A constant array input: the cache's device copy (uploaded on a miss), or, where the
        cache does not take it, an upload of this run's own."""
        runner = self._runner
        engine = runner.engine
        got = self._acquire_constant(slot.lt, value)
        if got is None:
            tensor = self._allocate(slot)
            self._publish(slot, self._stream.write(tensor.memory, value.array))
            self._counters.add("uploads")
            return
        entry, missed = got
        slot.lease = entry
        self._leased.append(entry)
        slot.tensor = _tensor(slot.lt, engine, entry.memory)
        if missed:
            self._counters.add("uploads")
        self._publish(slot, entry.upload)

    async def _run_step(self, step: Step) -> None:
        try:
            for lt in step.inputs:
                await self._wait_produced(self._slot(lt))
            if step.compiled is not None:
                self._execute(step, step.compiled)
            else:
                await self._call_handler(step)
        except Exception as exc:
            self._fail(exc)

    def _execute(self, step: Step, compiled: CompiledPartition) -> None:
        ins = [self._slot(lt) for lt in step.inputs]
        outs = [self._slot(lt) for lt in step.outputs]
        tensors = [self._allocate(slot) for slot in outs]
        event = compiled.execute(self._stream, [s.tensor for s in ins], tensors,
                                      deps=self._deps_of(ins))
        self._counters.add("partitions_submitted")
        for slot in outs:
            self._publish(slot, event)
        for slot in ins:
            self._consumed(slot, event)

    async def _call_handler(self, step: Step) -> None:
        ins = [self._slot(lt) for lt in step.inputs]
        values = {}
        for slot in ins:
            values[slot.lt.id] = await self._read(slot, self._deps_of([slot]))
        for slot in ins:
            self._consumed(slot)       # read back: the handler's copy is all it needs
        handler = step.handler
        assert handler is not None, "a step without a compiled partition has a handler"
        try:
            results = await handler(step.partition, [values[i] for i in step.call_ids])
        except Exception as exc:
            exc.add_note(f"in the handler of {step.describe()}")
            raise
        self._counters.add("handler_calls")
        results = check_results(step.describe(), step.outputs, results)
        for lt, array in zip(step.outputs, results):
            slot = self._slot(lt)
            tensor = self._allocate(slot)
            # A tensor the caller gave may still be read by their own commands: after deps.
            self._publish(slot, self._stream.write(tensor.memory, array, deps=self._deps))

    # -- reading -------------------------------------------------------------------------------

    def _readable(self, slot: _Slot) -> bool:
        """Whether the run's stream can read the slot directly (row-major, a numpy dtype)."""
        desc = slot.bound.memory.desc
        return slot.lt.id in self._as_tensors or _reads_directly(desc)

    def _submit_read(self, slot: _Slot):
        """(host array, event) of a read of ``slot`` on the run's stream, after its producer;
        for Tensor outputs, (None, the producer's event)."""
        if slot.lt.id in self._as_tensors:
            return None, slot.event
        memory = slot.bound.memory
        desc = memory.desc
        out = np.empty(desc.dims, dtype=desc.numpy_dtype)
        deps = [slot.event] if slot.event is not None else []
        return out, self._stream.read(memory, out, deps=deps)

    def _finish(self, slot: _Slot, out) -> None:
        if slot.lt.id in self._as_tensors:
            self._results[slot.lt.id] = slot.tensor
            return
        # An empty output's buffer is a one-element placeholder (LogicalTensor.memory_desc).
        out = np.empty(slot.lt.shape, out.dtype) if slot.lt.is_empty else out.reshape(slot.lt.shape)
        self._results[slot.lt.id] = out.astype(bool) if slot.lt.dtype == "boolean" else out
        self._consumed(slot)

    async def _read(self, slot: _Slot, deps: list) -> np.ndarray:
        """The slot's values as a new array, read on the run's stream (no head-of-line wait
        behind other runs on the engine's host stream) where the layout allows."""
        tensor = slot.bound
        desc = tensor.memory.desc
        if not _reads_directly(desc):
            return await tensor.to_numpy(deps=deps)
        out = np.empty(desc.dims, dtype=desc.numpy_dtype)
        await self._stream.read(tensor.memory, out, deps=deps)
        out = np.empty(slot.lt.shape, out.dtype) if slot.lt.is_empty else out.reshape(slot.lt.shape)
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
                self._results[slot.lt.id] = await slot.bound.to_numpy(deps=deps)
                self._consumed(slot)
        except Exception as exc:
            self._fail(exc)
