"""Streams: ordered (or not) submission of commands to an engine, each returning an Event."""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

import attrs
import numpy as np
import pyopencl as cl
import trio

from ._event import Event
from ._instruments import INSTRUMENTS
from ._memory import Memory, _reads_directly, stage
from ._primitive import Primitive
from ._values._errors import (
    ArgumentMismatchError,
    EngineMismatchError,
    InvalidArgumentError,
)
from .actors import (
    Barrier,
    Command,
    KernelLaunch,
    KernelSequence,
    LaunchPlan,
    Marker,
    ReadBuffer,
    StreamActor,
    Submission,
    WriteBuffer,
)
from .actors._allocator import note_uses

if TYPE_CHECKING:
    from ._engine import Engine  # _engine imports this module: for annotations only

# The default of every ``deps``: ``deps is _NO_DEPS`` skips ``check_deps`` on the hot path.
_NO_DEPS = ()


def _started() -> int:
    """When a submitting call began, for instruments' host spans; 0 while none watches."""
    return time.perf_counter_ns() if INSTRUMENTS.submit_hooks else 0


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
    """``deps`` as a tuple of Submissions / pyopencl Events (an Event stands for its submission,
    which is all the stream actor sees), or a typed error naming the culprit."""
    if not deps and (deps is None or isinstance(deps, (list, tuple))):
        return ()
    if isinstance(deps, (Event, cl.Event)) or not isinstance(deps, (list, tuple)):
        raise InvalidArgumentError(
            f"deps must be a list of triodnn.Event or pyopencl.Event, got {type(deps).__name__}"
        )
    checked = []
    for i, dep in enumerate(deps):
        if isinstance(dep, Event):
            dep = dep.submission
        elif not isinstance(dep, (Submission, cl.Event)):  # Submission: deps checked once already
            raise InvalidArgumentError(
                f"deps[{i}] is {type(dep).__name__}; expected triodnn.Event or pyopencl.Event"
            )
        checked.append(dep)
    return tuple(checked)


@attrs.define(eq=False)
class Stream:
    """Submits work to one engine. Create with ``await engine.stream(flags)``.

    Submissions never block: they hand the command to the stream actor and return an ``Event``
    at once. The actor enqueues in submission order; with ``out_of_order``, only the ``deps``
    order commands. ``StreamFlags.profiling`` in ``flags`` says whether the stream records device
    times (the runtime adds it when an instrument needs them).

    A stream takes submissions from the trio run of its runtime only: from another thread (or
    another thread's ``trio.run``) each raises ``WrongThreadError`` before anything is enqueued
    or told to instruments. A blocking portal's streams take them from any thread.
    """

    engine: Engine
    flags: StreamFlags
    _actor: StreamActor = attrs.field(repr=False)
    strategy: str = attrs.field(default="in_order")
    # Instruments told of every completion on this stream, asked when it opened.
    _watchers: tuple = attrs.field(default=(), repr=False)
    # The runtime's, where the watchers' tasks run.
    _nursery: trio.Nursery = attrs.field(alias="nursery", kw_only=True, repr=False)

    @property
    def cl_queues(self) -> tuple[cl.CommandQueue, ...]:
        """The OpenCL queues behind the stream (several when the strategy is ``lanes``)."""
        return tuple(self._actor.queues)

    @property
    def closed(self) -> bool:
        return self._actor.closed

    @property
    def in_order(self) -> bool:
        """Whether the stream runs its commands in submission order (one in-order queue)."""
        return self._actor.mode == "in_order"

    @property
    def watched(self) -> bool:
        """Whether instruments (a trace, verbose) hear of this stream's commands one by one; a
        recorded sequence (a compiled partition's kernels, a graph request) is then submitted
        command by command, so that each shows."""
        return bool(INSTRUMENTS.submit_hooks or INSTRUMENTS.enqueue_hooks or self._watchers)

    def check_can_submit(self, label: str) -> None:
        """Raise now what a submission named ``label`` would meet: the stream closed (its
        refusal), or the caller off its trio run (``WrongThreadError``). For a submitter that
        takes something (a scratch set) before it submits."""
        actor = self._actor
        if actor.closed:
            raise actor.refusal(str(self.engine))
        if not actor.on_run_thread():
            # Built only for a culprit: an f-string per request cost more than the identity test.
            actor.check_thread(label, f"submitted to a stream of {self.engine}")

    def submit_sequence(self, label: str, plan: LaunchPlan, buffers: tuple, keys: tuple, after: tuple,
                        deps: tuple, uses: tuple, uploads: tuple = (), downloads: tuple = ()) -> Event:
        """Submit ``plan``'s kernels (``KernelSequence``) as one command named ``label``, after
        ``deps`` (checked already), with ``uploads`` and ``downloads`` (``(cl buffer, host
        array)`` pairs: contiguous arrays of the buffers' bytes) around them; its Event.
        ``uses``: every buffer it touches once (a user allocator's go back to its ``free`` after
        this command). Callers are the recorders of the graph layer; instruments see the
        command as one."""
        self.check_can_submit(label)
        actor = self._actor
        submission = Submission(actor, label)
        actor.submit(KernelSequence(submission, deps, plan, buffers, keys, after, uploads, downloads))
        note_uses(uses, submission)
        return Event(submission)

    def _submission(self, label: str) -> Submission:
        self.check_can_submit(label)
        return Submission(self._actor, label)

    def _hand_over(self, command: Command, started: int = 0) -> Event:
        """Tell the instruments, give ``command`` to the stream actor (which may enqueue it at
        once, so the instruments hear of the submission first); its Event."""
        if INSTRUMENTS.submit_hooks:  # all that instruments cost here while none watches commands
            INSTRUMENTS.command_submitted(self, command, started)
        self._actor.submit(command)
        event = Event(command.submission)
        if self._watchers:
            self._nursery.start_soon(INSTRUMENTS.watch_completion, self._watchers, self, command, event)
        return event

    def execute(self, primitive: Primitive, args: dict, deps=_NO_DEPS) -> Event:
        """Run ``primitive`` on ``args`` (name → Memory) after ``deps``; returns its Event."""
        started = time.perf_counter_ns() if INSTRUMENTS.submit_hooks else 0  # _started(), inlined
        if deps is not _NO_DEPS:
            deps = check_deps(deps)
        if primitive.engine is not self.engine and (
            primitive.engine.cl_context.int_ptr != self.engine.cl_context.int_ptr
        ):
            raise EngineMismatchError(
                f"primitive {primitive.label} was created on {primitive.engine}, "
                f"not on this stream's {self.engine}"
            )
        across = getattr(primitive, "submit_across", None)
        if across is not None:  # a cross-engine reorder: copies around the kernel, see there
            return across(self, args, deps)
        buffers = primitive.kernel_buffers(args, self.engine)
        # _launch, inlined: the hot path, where each Python call costs about 2% of execute().
        actor = self._actor
        if actor.closed:
            raise actor.refusal(str(self.engine))
        if not actor.on_run_thread():
            actor.check_thread(primitive.label, f"submitted to a stream of {self.engine}")
        submission = Submission(actor, primitive.label)
        command = KernelLaunch(submission, deps, primitive, buffers)
        if INSTRUMENTS.submit_hooks:
            INSTRUMENTS.command_submitted(self, command, started)
        actor.submit(command)
        event = Event(submission)
        if self._watchers:
            self._nursery.start_soon(INSTRUMENTS.watch_completion, self._watchers, self, command, event)
        note_uses(buffers, submission)
        return event

    def submit_kernel(self, primitive: Primitive, buffers: tuple, deps, started: int = 0) -> Event:
        """``primitive`` on ``buffers`` (its kernel's arguments, in order, checked by the caller)
        after ``deps``: for a primitive that binds its own buffers (the cross-engine reorder)."""
        return self._launch(primitive, buffers, check_deps(deps), started)

    def _launch(self, primitive: Primitive, buffers: tuple, deps: tuple, started: int) -> Event:
        submission = self._submission(primitive.label)
        event = self._hand_over(KernelLaunch(submission, deps, primitive, buffers), started)
        note_uses(buffers, submission)  # user-allocated buffers go back to their free after this
        return event

    def write(self, memory: Memory, array, deps=_NO_DEPS) -> Event:
        """Copy host ``array`` into ``memory`` after ``deps``.

        A C-contiguous array of the memory's dtype is read in place when the copy runs: leave it
        unchanged until the event completes (the stream holds a reference until then).
        """
        started = _started()
        deps = check_deps(deps)
        buffer = self._buffer_of(memory, "memory")
        staging = stage(memory.desc, array)
        return self._copy(WriteBuffer, f"write:{memory.desc}", deps, buffer, staging, started)

    def read(self, memory: Memory, out: np.ndarray, deps=_NO_DEPS) -> Event:
        """Copy ``memory`` into host array ``out`` (C-contiguous, shape ``dims``) after ``deps``.

        ``out`` must stay untouched until the event completes. For strided or bf16 memory use
        ``await memory.to_numpy()``.
        """
        deps = check_deps(deps)
        if not _reads_directly(memory.desc):
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
        return self.read_bytes(memory, out, deps)

    def read_bytes(self, memory: Memory, host: np.ndarray, deps) -> Event:
        """Copy ``memory``'s bytes, gaps included, into the flat ``host`` array, unconverted:
        ``Memory.to_numpy`` and the cross-engine reorder stage through it."""
        started = _started()
        buffer = self._buffer_of(memory, "memory")
        return self._copy(ReadBuffer, f"read:{memory.desc}", check_deps(deps), buffer, host, started)

    def write_bytes(self, memory: Memory, host: np.ndarray, deps) -> Event:
        """Copy the flat ``host`` array (``memory``'s bytes, gaps included) into ``memory``,
        unconverted: the cross-engine reorder's side of its copies through the host."""
        started = _started()
        buffer = self._buffer_of(memory, "memory")
        return self._copy(WriteBuffer, f"write:{memory.desc}", check_deps(deps), buffer, host, started)

    def _copy(self, kind: type[ReadBuffer | WriteBuffer], label: str, deps: tuple, buffer: cl.Buffer,
              host: np.ndarray, started: int) -> Event:
        submission = self._submission(label)
        event = self._hand_over(kind(submission, deps, buffer, host), started)
        note_uses((buffer,), submission)
        return event

    def named_marker(self, label: str, deps) -> Event:
        """A marker named ``label`` (as instruments show it): completes when ``deps`` have (or
        all before it, in order). The cross-engine reorder ends its copies with one."""
        started = _started()
        return self._hand_over(Marker(self._submission(label), check_deps(deps)), started)

    def marker(self, deps=_NO_DEPS) -> Event:
        """An event that completes when every command submitted so far (or ``deps``) has."""
        return self.named_marker("marker", deps)

    def barrier(self, deps=_NO_DEPS) -> Event:
        """Like ``marker``, and every later command of this stream waits for it too."""
        started = _started()
        return self._hand_over(Barrier(self._submission("barrier"), check_deps(deps)), started)

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
            strategy=self.strategy, queues=len(self._actor.queues), submitted=self._actor.submitted,
            enqueued_directly=self._actor.direct,
        )


@attrs.frozen
class StreamStatistics:
    """``submitted``: commands enqueued (a compiled partition's run counts once);
    ``enqueued_directly``: those the submitting call enqueued itself, without waiting for the
    stream actor's task (all but those behind a dependency still waiting in another stream)."""

    strategy: str
    queues: int
    submitted: int
    enqueued_directly: int = 0
