"""A graph request as one recorded command: uploads, every partition's kernels, read-backs.

A runner whose run is a straight line (``GraphRunner._recordable``: every step compiled, outputs
read back directly) used to submit each request as separate commands: a write per input, a
``KernelSequence`` per partition, a read per output, each with its submission, event and
dependency list, and to allocate and free every intermediate buffer per request. A
``RequestRecording`` works out once per runner what a request submits:

* a table of the request's buffers: graph inputs, every step's outputs, each partition's
  scratch and hidden constants, and for each kernel of each partition, which of them its
  arguments are (from the partitions' ``Replay``);
* *buffer sets*: the device buffers of one request (inputs it uploads, intermediates, outputs,
  scratch) with a kernel object per kernel whose arguments stay set, kept between requests. A
  set is reused once its last request has completed (at once on the in-order stream that ran it),
  else another is made, up to ``MAX_SETS`` and ``SET_BYTES`` in all; past that a request waits
  on the device for the oldest set's last request.

A request then costs one ``KernelSequence`` with its uploads and downloads: one submission, one
event, one completion to await, no buffer allocated. Kernel arguments are set again only when an
input given as a device buffer (a ``Tensor``, a constant tensor cache entry) is another buffer
than the set's last request used. Streams that instruments watch get the command-by-command
path (``Execution``), so that a trace shows each kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .._event import Event
from .._memory import Memory, _reads_directly, stage
from .._stream import Stream, check_deps
from .._values._dtypes import PACKED_TYPES
from .._values._memory_desc import MemoryDesc
from ..actors import LaunchPlan
from ._replay import allocate_temporaries, step_waits

if TYPE_CHECKING:
    from .._engine import Engine
    from ._execution import Step
    from ._logical_tensor import LogicalTensor

# Buffer sets one runner keeps at most, and their bytes in all: a set holds every intermediate of
# a request, so a large graph keeps fewer (at least one; one larger than SET_BYTES is not
# recorded and each request allocates its own buffers as before).
MAX_SETS = 8
SET_BYTES = 256 << 20


class _BufferSet:
    """One request's device buffers and kernel objects, and the last request that used them."""

    __slots__ = ("memories", "table", "inputs", "plan", "last", "number", "stream", "input_key", "args",
                 "keys", "after", "uses")

    def __init__(self, memories: list[Memory], table: list, inputs: list, plan: LaunchPlan) -> None:
        self.memories = memories     # every buffer the set owns
        self.table = table           # the request's buffers by table index (inputs filled per request)
        self.inputs = inputs         # per graph input: the set's upload buffer (made at first upload)
        self.plan = plan
        self.last: Event | None = None
        self.number = 0              # which request of the recording the last one was
        self.stream: Stream | None = None
        self.input_key: tuple | None = None  # the input buffers the kernels' arguments hold now
        self.args: tuple = ()
        self.keys: tuple = ()
        self.after: tuple = ()
        self.uses: tuple = ()

    def free_for(self, stream: Stream) -> bool:
        last = self.last
        if last is None:
            return True
        if self.stream is stream and stream.in_order:
            return True  # one in-order queue: the new request starts after the last one ends
        return last.done  # a status poll: completed or failed


class RequestRecording:
    """The recorded form of a runner's request (see the module docstring)."""

    def __init__(self, engine: Engine, inputs: tuple[LogicalTensor, ...], outputs: tuple[LogicalTensor, ...],
                 steps: tuple[Step, ...], desc_of, label: str) -> None:
        self._engine = engine
        self.label = label
        # The table: graph inputs, step outputs, every partition's scratch, hidden constants.
        index: dict[int, int] = {lt.id: k for k, lt in enumerate(inputs)}
        self._input_descs = tuple(desc_of(lt) for lt in inputs)
        # Inputs whose memory holds a C-contiguous array's bytes as they are (no layout, no packing).
        self._plain = tuple(_reads_directly(d) and d.dtype not in PACKED_TYPES for d in self._input_descs)
        owned: list[MemoryDesc] = []
        for step in steps:
            for lt in step.outputs:
                index[lt.id] = len(inputs) + len(owned)
                owned.append(desc_of(lt))
        replays = []
        for step in steps:
            assert step.compiled is not None, "a recordable runner has compiled steps only"
            if step.compiled.replay is not None:
                replays.append((step.compiled, step.compiled.replay, step.compiled.hidden_inputs))
        scratch_at = len(inputs) + len(owned)
        hidden_at = scratch_at + sum(len(replay.scratch_bytes) for _, replay, _ in replays)
        fixed: list[Memory] = []
        scratch_sizes: list[int] = []
        launches, labels, overlaps, arg_table, written = [], [], [], [], []
        for compiled, replay, hidden in replays:
            ports = [index[lt.id] for lt in compiled.inputs]
            ports += [hidden_at + len(fixed) + k for k in range(len(hidden))]
            ports += [index[lt.id] for lt in compiled.outputs]
            assert len(ports) == replay.ports, "a replay's ports: the inputs, hidden ones, the outputs"
            ports += [scratch_at + len(scratch_sizes) + k for k in range(len(replay.scratch_bytes))]
            fixed.extend(tensor.memory for tensor in hidden)
            scratch_sizes.extend(replay.scratch_bytes)
            for positions, writes, primitive in zip(replay.arg_positions, replay.written, replay.primitives):
                arg_table.append(tuple(ports[p] for p in positions))
                written.append(writes)
                launches.append(primitive.launch)
                labels.append(primitive.label)
                overlaps.append(primitive.overlaps)
        self._arg_table = tuple(arg_table)
        self._written = tuple(written)
        self._launches = (launches, labels, overlaps)
        self._owned = tuple(owned)
        self._scratch_sizes = tuple(scratch_sizes)
        self._fixed = tuple(fixed)
        self._outputs = tuple((index[lt.id], desc_of(lt)) for lt in outputs)
        self._inputs = len(inputs)
        set_bytes = sum(d.nbytes for d in (*self._input_descs, *owned)) + sum(scratch_sizes)
        self._max_sets = min(MAX_SETS, SET_BYTES // max(set_bytes, 1))
        self._sets: list[_BufferSet] = []
        self._requests = 0
        self.kernels = len(arg_table)

    @property
    def usable(self) -> bool:
        """Whether requests go this way: a buffer set fits ``SET_BYTES``, and there are kernels."""
        return self._max_sets >= 1 and self.kernels > 0

    @property
    def buffer_sets(self) -> int:
        return len(self._sets)

    @property
    def buffers(self) -> int:
        """Device buffers the kept sets hold."""
        return sum(len(each.memories) for each in self._sets)

    def release(self) -> None:
        """Free the kept buffer sets (at runtime shutdown, once every queue has finished; a later
        request makes new ones)."""
        sets, self._sets = self._sets, []
        for each in sets:
            for memory in each.memories:
                memory._release(after=each.last)

    def release_scratch(self) -> None:
        """The runtime's shutdown hook (its scratch owners): ``release``."""
        self.release()

    def submit(self, stream: Stream, sources: list, deps: tuple):
        """Submit one request: ``sources`` per graph input, a host array (uploaded into the set's
        buffer) or a ``Memory`` (used as it is); after ``deps``. Returns (its Event, the host
        arrays its outputs arrive in, as the outputs' memory descriptors lay them out)."""
        chosen, extra = self._set_for(stream)
        table = chosen.table
        uploads = []
        for k, source in enumerate(sources):
            if type(source) is np.ndarray:
                memory = chosen.inputs[k]
                if memory is None:
                    memory = chosen.inputs[k] = self._engine.memory(self._input_descs[k])
                    chosen.memories.append(memory)
                buffer = memory.cl_buffer
                desc = self._input_descs[k]
                # Bound inputs come converted and shaped already (``_bind_inputs``): staging is
                # a check then, 8 µs a request under cProfile on the H200, skipped when it holds.
                if not self._plain[k] or source.dtype != desc.numpy_dtype or not source.flags.c_contiguous:
                    source = stage(desc, source)
                uploads.append((buffer, source))
            else:
                buffer = source.cl_buffer
            table[k] = buffer
        input_key = tuple([table[k].int_ptr for k in range(self._inputs)])
        if input_key != chosen.input_key:
            args = tuple([tuple([table[p] for p in positions]) for positions in self._arg_table])
            chosen.args = args
            chosen.keys = tuple([tuple([b.int_ptr for b in step]) for step in args])
            # Buffers by the first table position holding them: inputs may alias each other.
            first: dict[int, int] = {}
            key = tuple(first.setdefault(b.int_ptr, p) for p, b in enumerate(table))
            chosen.after = step_waits(self._arg_table, self._written, key)
            chosen.uses = tuple({b.int_ptr: b for b in table}.values())
            chosen.input_key = input_key
        outs = [np.empty(desc.dims, desc.numpy_dtype) for _, desc in self._outputs]
        downloads = tuple((table[position], out) for (position, _), out in zip(self._outputs, outs))
        if extra is not None:
            deps = (*deps, *check_deps([extra]))
        event = stream.submit_sequence(self.label, chosen.plan, chosen.args, chosen.keys, chosen.after, deps,
                                       chosen.uses, tuple(uploads), downloads)
        self._requests += 1
        chosen.last, chosen.number, chosen.stream = event, self._requests, stream
        return event, outs

    def _set_for(self, stream: Stream) -> tuple[_BufferSet, Event | None]:
        """A buffer set free for a request on ``stream``, and what the request must wait for first."""
        for each in self._sets:
            if each.free_for(stream):
                return each, None
        if len(self._sets) >= self._max_sets:
            oldest = min(self._sets, key=lambda s: s.number)
            return oldest, oldest.last
        made = self._new_set()
        self._sets.append(made)
        return made, None

    def _new_set(self) -> _BufferSet:
        engine = self._engine
        memories: list[Memory] = []
        try:
            for desc in self._owned:
                memories.append(engine.memory(desc))
            memories.extend(allocate_temporaries(engine, self._scratch_sizes))
        except BaseException:
            for memory in memories:
                memory.release()
            raise
        table: list = [None] * self._inputs + [m.cl_buffer for m in memories] + [m.cl_buffer for m in self._fixed]
        launches, labels, overlaps = self._launches
        plan = LaunchPlan(launches, labels, overlaps)
        return _BufferSet(memories, table, [None] * self._inputs, plan)
