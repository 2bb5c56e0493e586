"""Replaying a compiled partition: its kernels submitted as one recorded command.

``CompiledPartition.execute`` used to submit each primitive through ``Stream.execute`` (a
submission, an event, argument checks, ``set_args``), allocate its temporaries and make views of
them, at every run. Measured on an H100: 188 µs of caller time per run of a 3-kernel MLP (raw
pyopencl enqueues the three in ~30 µs). A ``Replay`` works all of that out once:

* which buffer each kernel argument is, as an index into the run's slots (ports, then scratch);
* a ``LaunchPlan`` (``triodnn.actors``) with a kernel object per step, whose arguments stay set
  while a run's buffers are those of the run before (the same tensors, the same scratch:
  compared by address);
* on out-of-order streams, which earlier steps each step waits for (per buffer, as
  ``execute`` always did), worked out once per way the ports alias each other;
* scratch buffers, kept between runs: a set is reused when its last run has completed, or at
  once on the in-order stream that ran it (the queue orders the runs), else another set is made.

A run then costs one ``KernelSequence`` command, one submission and one event. The per-primitive
path stays for streams that instruments watch (a trace shows each kernel) and is what a
``Replay`` is checked against in the tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyopencl as cl

from .._event import Event
from .._memory import Memory
from .._stream import Stream
from .._values._memory_desc import MemoryDesc
from ..actors import LaunchPlan, Submission, execution_status

if TYPE_CHECKING:
    from .._engine import Engine
    from ._lowering import Plan
    from ._memory_plan import MemoryPlan

_COMPLETE = cl.command_execution_status.COMPLETE
# Scratch sets one partition keeps at most: beyond, a run waits for the oldest set's last run.
MAX_SCRATCH_SETS = 8


class _Scratch:
    """One set of scratch buffers and the last run that used it."""

    __slots__ = ("memories", "buffers", "last", "stream")

    def __init__(self, memories: list[Memory]) -> None:
        self.memories = memories
        self.buffers = tuple(m.cl_buffer for m in memories)
        self.last: Submission | None = None
        self.stream: Stream | None = None  # the stream of the last run

    def free_for(self, stream: Stream) -> bool:
        last = self.last
        if last is None or last.completed or last.failure is not None:
            return True
        if self.stream is stream and stream.in_order:
            return True  # one in-order queue: the new run starts after the last one ends
        native = last.native
        return native is not None and execution_status(native) <= _COMPLETE


def allocate_temporaries(engine: Engine, sizes) -> list[Memory]:
    """One u8 memory per planned scratch buffer; on an allocation error, none (those made are
    released at once, which hands them back to a user allocator)."""
    temps: list[Memory] = []
    try:
        for size in sizes:
            temps.append(engine.memory(MemoryDesc((size,), "u8")))
    except BaseException:
        for temp in temps:
            temp.release()
        raise
    return temps


class Replay:
    """The recorded form of one compiled partition's plan (see the module docstring)."""

    def __init__(self, engine: Engine, plan: Plan, memory: MemoryPlan, primitives: list, label: str) -> None:
        self._engine = engine
        self._memory = memory
        self.label = label
        ports = [i for i, slot in enumerate(plan.slots) if slot.role != "temp"]
        n_inputs = sum(1 for slot in plan.slots if slot.role == "input")
        # A run's buffers: inputs by port index, outputs by port index, then the scratch buffers.
        position = {}
        for i, slot in enumerate(plan.slots):
            if slot.role == "input":
                position[i] = slot.index
            elif slot.role == "output":
                position[i] = n_inputs + slot.index
            else:
                position[i] = len(ports) + memory.buffer_of[i]
        # Per kernel: the position in a run's buffers of each argument, and whether it writes it.
        self.arg_positions: list[tuple[int, ...]] = []
        self.written: list[tuple[bool, ...]] = []
        for step, primitive in zip(plan.steps, primitives, strict=True):
            views = dict(step.args)
            names = primitive.launch.spec.arg_names
            self.arg_positions.append(tuple(position[views[name].slot] for name in names))
            written = primitive.desc.output_names
            self.written.append(tuple(name in written for name in names))
        self.primitives = tuple(primitives)
        self.ports = len(ports)  # a run's buffers before the scratch ones
        self.scratch_bytes = tuple(memory.buffer_bytes)
        self._plan = LaunchPlan([p.launch for p in primitives], [p.label for p in primitives],
                                [p.overlaps for p in primitives])
        self._scratch: list[_Scratch] = []
        # Addresses only: holding a run's buffers would keep their memory after they are freed.
        self._last_key: tuple | None = None
        self._last_keys: tuple = ()
        self._after: dict[tuple, tuple] = {}

    def _scratch_for(self, stream: Stream) -> tuple[_Scratch, tuple]:
        """A scratch set free for a run on ``stream``, and what the run must wait for first."""
        for scratch in self._scratch:
            if scratch.free_for(stream):
                return scratch, ()
        if len(self._scratch) >= MAX_SCRATCH_SETS:
            oldest = min(self._scratch, key=lambda s: s.last.seq if s.last is not None else -1)
            return oldest, (oldest.last,)
        scratch = _Scratch(allocate_temporaries(self._engine, self._memory.buffer_bytes))
        if not self._scratch:
            self._engine.keep_until_shutdown(self)
        self._scratch.append(scratch)
        return scratch, ()

    def release_scratch(self) -> None:
        """Free the kept scratch buffers (the runtime's shutdown calls this once every queue has
        finished; a later run allocates again)."""
        scratch, self._scratch = self._scratch, []
        self._last_key = None
        for each in scratch:
            for memory in each.memories:
                memory.release_after(None if each.last is None else Event(each.last))

    def run(self, stream: Stream, inputs: list, outputs: list, deps: tuple) -> Event:
        stream.check_can_submit(self.label)  # before a scratch set is taken for a run that never happens
        scratch, extra = self._scratch_for(stream)
        buffers = tuple(t.memory.cl_buffer for t in inputs) + tuple(t.memory.cl_buffer for t in outputs) \
            + scratch.buffers
        key = tuple([b.int_ptr for b in buffers])
        args = tuple([tuple([buffers[p] for p in positions]) for positions in self.arg_positions])
        if key == self._last_key:
            keys = self._last_keys  # the same objects: the plan's kernels keep their arguments
        else:
            keys = tuple([tuple([key[p] for p in positions]) for positions in self.arg_positions])
            self._last_key, self._last_keys = key, keys
        if stream.in_order:
            after = ()
        else:
            first: dict[int, int] = {}
            after = self._after_for(tuple(first.setdefault(k, i) for i, k in enumerate(key)))
        deps = tuple(deps) + extra if extra else tuple(deps)
        # ``buffers`` as its uses: user-allocated buffers go back to their free after this.
        event = stream.submit_sequence(self.label, self._plan, args, keys, after, deps, buffers)
        scratch.last, scratch.stream = event.submission, stream
        return event

    def _after_for(self, key: tuple) -> tuple:
        """``step_waits`` for a run whose buffers ``key`` names, kept per such key."""
        after = self._after.get(key)
        if after is None:
            after = self._after[key] = in_line(step_waits(self.arg_positions, self.written, key))
        return after


def in_line(after: tuple) -> tuple:
    """``after`` as a ``KernelSequence`` takes it: empty when every step waits for the one
    before (the stream actor then enqueues the steps in line, on one lane), else as it is."""
    if all(i - 1 in waits for i, waits in enumerate(after) if i):
        return ()
    return after


def step_waits(arg_positions, written, key: tuple) -> tuple:
    """For each kernel, the earlier kernels it waits for on an out-of-order stream: the last
    writer of each buffer it touches, and the readers since that write of each buffer it
    writes. ``arg_positions[i]`` are kernel ``i``'s arguments as positions in a run's buffers,
    ``written[i]`` whether it writes each; ``key`` names each position's buffer by the first
    position holding the same buffer, so ports that alias each other (an in-place pair) and
    shared scratch order correctly."""
    writer: dict[int, int] = {}
    readers: dict[int, list[int]] = {}
    steps = []
    for i, (positions, writes_of) in enumerate(zip(arg_positions, written)):
        waits: set[int] = set()
        for p, writes in zip(positions, writes_of):
            buffer = key[p]
            if buffer in writer:
                waits.add(writer[buffer])
            if writes:
                waits.update(readers.get(buffer, ()))
        waits.discard(i)
        for p, writes in zip(positions, writes_of):
            buffer = key[p]
            if writes:
                writer[buffer] = i
                readers[buffer] = []
            else:
                readers.setdefault(buffer, []).append(i)
        steps.append(tuple(sorted(waits)))
    return tuple(steps)
