"""Streams: ordered (or not) submission of commands to an engine, each returning an Event."""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

import attrs
import numpy as np
import pyopencl as cl

from . import _trace
from . import _verbose as verbose
from ._values._errors import (
    ArgumentMismatchError,
    ClosedError,
    EngineMismatchError,
    InvalidArgumentError,
)
from ._event import Event
from ._memory import Memory, _is_row_major, stage
from .actors import Submission
from .actors._engine_actor import note_uses
from .actors._stream_actor import BARRIER, KERNEL, MARKER, READ, WRITE, StreamActor

if TYPE_CHECKING:
    from ._engine import Engine
    from ._primitive import Primitive


class StreamFlags(enum.Flag):
    """How a stream orders its commands, and whether it records device times."""

    in_order = 1
    out_of_order = 2
    profiling = 4


def check_flags(flags) -> StreamFlags:
    if not isinstance(flags, StreamFlags):
        raise InvalidArgumentError(f"flags {flags!r} is not a triodnn.StreamFlags value")
    if StreamFlags.in_order in flags and StreamFlags.out_of_order in flags:
        raise InvalidArgumentError(f"flags {flags!r} asks for both in_order and out_of_order")
    if StreamFlags.out_of_order not in flags:
        flags |= StreamFlags.in_order
    return flags


def check_deps(deps) -> tuple:
    """``deps`` as a tuple of Events / pyopencl Events, or a typed error naming the culprit."""
    if not deps and (deps is None or isinstance(deps, (list, tuple))):
        return ()
    if isinstance(deps, (Event, cl.Event)) or not isinstance(deps, (list, tuple)):
        raise InvalidArgumentError(
            f"deps must be a list of triodnn.Event or pyopencl.Event, got {type(deps).__name__}"
        )
    for i, dep in enumerate(deps):
        if not isinstance(dep, (Submission, cl.Event)):
            raise InvalidArgumentError(
                f"deps[{i}] is {type(dep).__name__}; expected triodnn.Event or pyopencl.Event"
            )
    return tuple(deps)


@attrs.define(eq=False)
class Stream:
    """Submits work to one engine. Create with ``await engine.stream(flags)``.

    Submissions never block: they hand the command to the stream actor and return an ``Event``
    at once. The actor enqueues in submission order; with ``out_of_order``, only the ``deps``
    order commands.
    """

    engine: Engine
    flags: StreamFlags
    _actor: StreamActor = attrs.field(repr=False)
    strategy: str = attrs.field(default="in_order")
    _completion: object = attrs.field(init=False, repr=False)
    _profiling: bool = attrs.field(init=False, repr=False)
    _verbose_exec: bool = attrs.field(init=False, repr=False)

    @property
    def cl_queues(self) -> tuple[cl.CommandQueue, ...]:
        """The OpenCL queues behind the stream (several when the strategy is ``lanes``)."""
        return tuple(self._actor.queues)

    @property
    def closed(self) -> bool:
        return self._actor.closed

    def __attrs_post_init__(self) -> None:
        self._completion = self.engine._runtime._completion
        self._verbose_exec = verbose.level() >= 2
        # Verbose level 2 reports device times, so the runtime opens such streams with profiling.
        self._profiling = StreamFlags.profiling in self.flags or self._verbose_exec

    def _event(self, label: str, started: int = 0) -> Event:
        if self._actor.closed:
            raise ClosedError(f"stream of {self.engine} is closed (its runtime has shut down)")
        if _trace.recorder is not None:  # all that tracing costs when off, with _submit's check
            return _trace.recorder.event(self, label, started)
        return Event(self._actor, label, completion=self._completion, profiling=self._profiling)

    def execute(self, primitive: Primitive, args: dict, deps=()) -> Event:
        """Run ``primitive`` on ``args`` (name → Memory) after ``deps``; returns its Event."""
        started = time.perf_counter_ns() if _trace.recorder is not None else 0
        deps = check_deps(deps)
        if primitive.engine is not self.engine and (
            primitive.engine.cl_context.int_ptr != self.engine.cl_context.int_ptr
        ):
            raise EngineMismatchError(
                f"primitive {primitive.label} was created on {primitive.engine}, "
                f"not on this stream's {self.engine}"
            )
        across = getattr(primitive, "_submit_across", None)
        if across is not None:  # a cross-engine reorder: copies around the kernel, see there
            return across(self, args, deps)
        return self._submit_kernel(primitive, primitive._buffers(args, self.engine), deps, started)

    def _submit_kernel(self, primitive: Primitive, buffers: tuple, deps: tuple, started: int = 0) -> Event:
        event = self._event(primitive.label, started)
        self._submit(
            (KERNEL, event, deps, primitive._kernel, buffers, primitive.spec.global_size,
             primitive.spec.local_size)
        )
        note_uses(buffers, event)  # user-allocated buffers go back to their free after this
        if self._verbose_exec:
            self.engine._runtime._nursery.start_soon(verbose.report_execution, self.engine, primitive, event)
        return event

    def write(self, memory: Memory, array, deps=()) -> Event:
        """Copy host ``array`` into ``memory`` after ``deps``.

        A C-contiguous array of the memory's dtype is read in place when the copy runs: leave it
        unchanged until the event completes (the stream holds a reference until then).
        """
        deps = check_deps(deps)
        buffer = self._buffer_of(memory, "memory")
        staging = stage(memory.desc, array)
        event = self._event(f"write:{memory.desc}")
        self._submit((WRITE, event, deps, buffer, staging))
        note_uses((buffer,), event)
        return event

    def read(self, memory: Memory, out: np.ndarray, deps=()) -> Event:
        """Copy ``memory`` into host array ``out`` (C-contiguous, shape ``dims``) after ``deps``.

        ``out`` must stay untouched until the event completes. For strided or bf16 memory use
        ``await memory.to_numpy()``.
        """
        deps = check_deps(deps)
        if not _is_row_major(memory.desc) or memory.desc.dtype == "bf16":
            raise ArgumentMismatchError(
                f"read needs row-major memory of a numpy dtype, got {memory.desc}; "
                "use await memory.to_numpy()"
            )
        if (
            not isinstance(out, np.ndarray)
            or out.shape != memory.desc.dims
            or out.dtype != memory.desc.numpy_dtype
            or not out.flags.c_contiguous
            or not out.flags.writeable
        ):
            raise ArgumentMismatchError(
                f"out must be a writeable C-contiguous {memory.desc.numpy_dtype} array of shape "
                f"{memory.desc.dims}, got {getattr(out, 'dtype', type(out).__name__)} "
                f"{getattr(out, 'shape', '')}"
            )
        return self._read_raw(memory, out, deps)

    def _read_raw(self, memory: Memory, host: np.ndarray, deps) -> Event:
        deps = check_deps(deps)
        buffer = self._buffer_of(memory, "memory")
        event = self._event(f"read:{memory.desc}")
        self._submit((READ, event, deps, buffer, host))
        note_uses((buffer,), event)
        return event

    def _write_raw(self, memory: Memory, host: np.ndarray, deps) -> Event:
        """Copy the flat ``host`` array (``memory``'s bytes, gaps included) into ``memory``."""
        deps = check_deps(deps)
        buffer = self._buffer_of(memory, "memory")
        event = self._event(f"write:{memory.desc}")
        self._submit((WRITE, event, deps, buffer, host))
        note_uses((buffer,), event)
        return event

    def _marker(self, label: str, deps) -> Event:
        """A marker named ``label``: completes when ``deps`` have (or all before it, in order)."""
        event = self._event(label)
        self._submit((MARKER, event, check_deps(deps)))
        return event

    def marker(self, deps=()) -> Event:
        """An event that completes when every command submitted so far (or ``deps``) has."""
        event = self._event("marker")
        self._submit((MARKER, event, check_deps(deps)))
        return event

    def barrier(self, deps=()) -> Event:
        """Like ``marker``, and every later command of this stream waits for it too."""
        event = self._event("barrier")
        self._submit((BARRIER, event, check_deps(deps)))
        return event

    def _submit(self, request: tuple) -> None:
        """Hand ``request`` (op, event, deps, …) to the stream actor."""
        self._actor.submit(request)
        if type(request[1]) is not Event:  # a TracedEvent, made while a trace records
            request[1]._command.trace.submitted(request)

    async def wait(self) -> None:
        """Wait until every command submitted so far has completed."""
        await self.marker()

    def _buffer_of(self, memory, name: str) -> cl.Buffer:
        if not isinstance(memory, Memory):
            raise InvalidArgumentError(f"{name} is {type(memory).__name__}, expected triodnn.Memory")
        if memory.engine is not self.engine and (
            memory.engine.cl_context.int_ptr != self.engine.cl_context.int_ptr
        ):
            raise EngineMismatchError(
                f"{name} lives on {memory.engine}, another OpenCL context than this stream's "
                f"{self.engine}; reorder it across engines first"
            )
        return memory.cl_buffer

    def statistics(self) -> StreamStatistics:
        return StreamStatistics(
            strategy=self.strategy, queues=len(self._actor.queues), submitted=self._actor.submitted
        )


@attrs.frozen
class StreamStatistics:
    strategy: str
    queues: int
    submitted: int
