"""A graph request as one recorded command: uploads, every partition's kernels, read-backs.

A runner whose run is a straight line (``GraphRunner.recordable``: every step compiled, outputs
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
* on a device with memory of its own (``Engine.stages_copies``: a GPU), pinned host arrays per
  set: each upload is copied into one at submission (so the caller may reuse its array at
  once, and ``map`` copies nothing more) and each read-back lands in one and is copied out when
  the request's result is taken; the set stays taken until then. Measured on an H200
  (``Allocator.pinned_host_array``): read-backs took half the time of those into pageable memory.

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
from ._replay import allocate_temporaries, in_line, step_waits

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
                 "keys", "after", "uses", "staged_in", "staged_out", "downloads", "held")

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
        # Pinned host arrays the uploads copy from and the read-backs land in (``staged``
        # recordings), per input (made at first upload) and per output.
        self.staged_in: list = [None] * len(inputs)  # as flat bytes
        self.staged_out: list = []
        self.downloads: tuple = ()   # staged: the (buffer, flat bytes of staged_out) pairs, fixed per set
        self.held = False  # staged outputs not copied out yet: the set is not free

    def free_for(self, stream: Stream, staged: bool) -> bool:
        if self.held:
            return False
        last = self.last
        if last is None:
            return True
        if not staged and self.stream is stream and stream.in_order:
            # One in-order queue: the new request starts after the last one ends. Not so with
            # staging: its host arrays are written at submission, before the queue gets there.
            return True
        return last.done  # a status poll: completed or failed


class RequestOutputs:
    """A submitted request's read-backs: ``take()`` once its event has completed (the output
    arrays, copied out of pinned staging where the request used it), or ``drop()``; either frees
    the buffer set for the next request."""

    __slots__ = ("event", "_arrays", "_set")

    def __init__(self, event: Event, arrays: list, held: _BufferSet | None) -> None:
        self.event = event
        self._arrays = arrays
        self._set = held

    def take(self) -> list[np.ndarray]:
        arrays = self._arrays
        if self._set is not None:
            arrays = [array.copy() for array in arrays]
            self.drop()
        return arrays

    def drop(self) -> None:
        if self._set is not None:
            self._set.held = False
            self._set = None


class RequestRecording:
    """The recorded form of a runner's request (see the module docstring)."""

    def __init__(self, engine: Engine, inputs: tuple[LogicalTensor, ...], outputs: tuple[LogicalTensor, ...],
                 steps: tuple[Step, ...], desc_of, label: str) -> None:
        self._engine = engine
        self.label = label
        # The table: graph inputs, step outputs, every partition's scratch, hidden constants.
        index: dict[int, int] = {lt.id: k for k, lt in enumerate(inputs)}
        self._input_descs = tuple(desc_of(lt) for lt in inputs)
        self._input_dtypes = tuple(d.numpy_dtype for d in self._input_descs)
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
        # Copies through pinned host memory where the device has memory of its own (a GPU); a
        # device sharing the host's copies straight from and into the caller's arrays.
        self.staged = engine.stages_copies
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
                memory.release_after(each.last)

    def release_scratch(self) -> None:
        """The runtime's shutdown hook (its scratch owners): ``release``."""
        self.release()

    def submit(self, stream: Stream, sources: list, deps: tuple) -> RequestOutputs:
        """Submit one request: ``sources`` per graph input, a host array (uploaded into the set's
        buffer) or a ``Memory`` (used as it is); after ``deps``. With ``staged``, host arrays are
        copied into pinned memory here, so the caller may reuse them at once; without, they are
        read when the upload runs. Returns the request's outputs to take once its event is done
        (arrays laid out as the outputs' memory descriptors say)."""
        chosen, extra = self._set_for(stream)
        table = chosen.table
        staged = self.staged
        uploads = []
        for k, source in enumerate(sources):
            if type(source) is np.ndarray:
                buffer = chosen.inputs[k]
                if buffer is None:
                    memory = self._engine.memory(self._input_descs[k])
                    chosen.memories.append(memory)
                    buffer = chosen.inputs[k] = memory.cl_buffer
                # Bound inputs come converted and shaped already (``_bind_inputs``): staging is
                # a check then, 8 µs a request under cProfile on the H200, skipped when it holds.
                if not self._plain[k] or source.dtype != self._input_dtypes[k] or not source.flags.c_contiguous:
                    source = stage(self._input_descs[k], source)
                if staged:
                    pinned = chosen.staged_in[k]
                    if pinned is None:
                        pinned = chosen.staged_in[k] = self._engine.pinned_host_array(source.nbytes).reshape(-1)
                    np.copyto(pinned, source.reshape(-1).view(np.uint8))
                    source = pinned
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
            chosen.after = in_line(step_waits(self._arg_table, self._written, key))
            chosen.uses = tuple({b.int_ptr: b for b in table}.values())
            chosen.input_key = input_key
            if staged:
                chosen.downloads = tuple((table[position], out.view(np.uint8).reshape(-1))
                                         for (position, _), out in zip(self._outputs, chosen.staged_out))
        if staged:
            outs = chosen.staged_out
            downloads = chosen.downloads
        else:
            outs = [np.empty(desc.dims, desc.numpy_dtype) for _, desc in self._outputs]
            downloads = tuple((table[position], out) for (position, _), out in zip(self._outputs, outs))
        if extra is not None:
            deps = (*deps, *check_deps([extra]))
        event = stream.submit_sequence(self.label, chosen.plan, chosen.args, chosen.keys, chosen.after, deps,
                                       chosen.uses, tuple(uploads), downloads)
        self._requests += 1
        chosen.last, chosen.number, chosen.stream = event, self._requests, stream
        chosen.held = staged
        return RequestOutputs(event, outs, chosen if staged else None)

    def _set_for(self, stream: Stream) -> tuple[_BufferSet, Event | None]:
        """A buffer set free for a request on ``stream``, and what the request must wait for first."""
        for each in self._sets:
            if each.free_for(stream, self.staged):
                return each, None
        if len(self._sets) >= self._max_sets:
            # Staged outputs not yet copied out are never overwritten: past the cap, the set of
            # the oldest request taken already is waited for on the device.
            free = [each for each in self._sets if not each.held]
            if free:
                oldest = min(free, key=lambda s: s.number)
                return oldest, oldest.last
        made = self._new_set()
        self._sets.append(made)
        return made, None

    def _new_set(self) -> _BufferSet:
        engine = self._engine
        memories: list[Memory] = []
        staged_out = []
        try:
            for desc in self._owned:
                memories.append(engine.memory(desc))
            memories.extend(allocate_temporaries(engine, self._scratch_sizes))
            if self.staged:
                staged_out = [engine.pinned_host_array(desc.nbytes).view(desc.numpy_dtype).reshape(desc.dims)
                              for _, desc in self._outputs]
        except BaseException:
            for memory in memories:
                memory.release()
            raise
        table: list = [None] * self._inputs + [m.cl_buffer for m in memories] + [m.cl_buffer for m in self._fixed]
        launches, labels, overlaps = self._launches
        plan = LaunchPlan(launches, labels, overlaps)
        made = _BufferSet(memories, table, [None] * self._inputs, plan)
        made.staged_out = staged_out
        return made
