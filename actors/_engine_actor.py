"""The engine actor: owns one OpenCL context on one device, builds programs, keeps per-context
primitive resources and allocates buffers (through the caller's allocator, when one was given).

Program builds take 0.15–0.8 s on PoCL and release the GIL, so they run in worker threads under
a capacity limiter, inside the actor's own nursery: a requester that is cancelled stops waiting,
and the build still finishes for whoever asks next. PoCL compiles a kernel's work-group function
again at its first launch (35–140 ms), so a build also launches each kernel once, on one
work-group, before handing it out: the first real execution is then as fast as any other.
"""

from __future__ import annotations

import collections
import math
import threading
import time
import warnings
from collections.abc import Callable

import attrs
import pyopencl as cl
import trio

from .._values._errors import BuildError, ClosedError, ExecutionError, InvalidArgumentError, TriodnnError
from ..kernels import generate, local_memory_bytes, program_source
from ._program_binary import program_binary
from ._reply import ReplySlot

_COMPLETE = cl.command_execution_status.COMPLETE
_OOO = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
# A buffer kernels read and write and the host copies both ways: none of these flags.
_RESTRICTING_FLAGS = (
    cl.mem_flags.READ_ONLY | cl.mem_flags.WRITE_ONLY | cl.mem_flags.HOST_NO_ACCESS
    | cl.mem_flags.HOST_READ_ONLY | cl.mem_flags.HOST_WRITE_ONLY
)


@attrs.define(eq=False)
class UserAllocation:
    """A buffer from a caller's allocator, not yet handed back to its ``free``, and the submitted
    commands that may still use it (``note_uses``), pruned of finished ones as it grows."""

    buffer: cl.Buffer
    nbytes: int
    uses: list = attrs.field(factory=list)
    last: object = None  # the most recent use, even when pruned
    after: object = None  # a submission the owner says completes after every use
    prune_at: int = 16

    def note(self, submission) -> None:
        self.last = submission
        self.uses.append(submission)
        if len(self.uses) >= self.prune_at:
            self.uses = [u for u in self.uses if _may_be_running(u)]
            self.prune_at = max(16, 2 * len(self.uses))


def _may_be_running(submission) -> bool:
    """Not known to be finished: waiting to be enqueued, or enqueued and not complete."""
    if submission.native is None:
        return submission.failure is None
    return submission.native.command_execution_status > _COMPLETE


# Buffers of user allocators not yet freed, by cl_mem handle (process-wide: a stream of any engine
# on the context may use them). Streams report every command's buffers to ``note_uses``.
_user_allocations: dict[int, UserAllocation] = {}


def note_uses(buffers, submission) -> None:
    """Record ``submission`` as a use of each of ``buffers`` that a user allocator made (a
    dictionary test when no engine has an allocator)."""
    if _user_allocations:
        for buffer in buffers:
            record = _user_allocations.get(buffer.int_ptr)
            if record is not None:
                record.note(submission)


@attrs.frozen
class BuildRequest:
    """What to compile: a primitive descriptor for a kernel configuration, from source or binary.

    The descriptor's ``generate(config)`` runs in the build thread too: source generation is the
    descriptor's business and may take its time.
    """

    desc: object = attrs.field(eq=False)
    config: object
    options: tuple[str, ...] = ()
    binary: bytes | None = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen
class BuiltKernel:
    """A kernel ready on this engine's context, and what makes it context-independent."""

    spec: object = attrs.field(eq=False)
    program: cl.Program = attrs.field(eq=False)
    kernel: cl.Kernel = attrs.field(eq=False)
    binary: bytes = attrs.field(eq=False, repr=False)
    seconds: float


@attrs.frozen
class EngineActorStatistics:
    """Live device buffers, programs compiled from source, programs loaded from binaries."""

    live_buffers: int
    live_bytes: int
    programs_built: int
    programs_loaded: int
    builds_in_flight: int
    resources: int


@attrs.define(eq=False)
class _ResourceLoad:
    """Reply slot of a load from binary: keeps the result as the engine's resources for ``key``."""

    actor: EngineActor
    key: object
    slot: ReplySlot

    def set_value(self, built: BuiltKernel) -> None:
        del self.actor._resource_loads[self.key]
        self.actor._remember(self.key, built)
        self.slot.set_value(built)

    def set_error(self, error: BaseException) -> None:
        del self.actor._resource_loads[self.key]
        self.slot.set_error(error)


class EngineActor:
    def __init__(
        self,
        device: cl.Device,
        context: cl.Context,
        *,
        build_threads: int = 2,
        resource_capacity=lambda: 1024,
        allocator=None,
    ) -> None:
        self.device = device
        self.context = context
        self.max_alloc_bytes = int(device.max_mem_alloc_size)
        # The caller's allocator (``allocate`` and ``free`` callables) or None for cl.Buffer.
        self.allocator = allocator
        self.alignment = max(1, int(device.mem_base_addr_align) // 8)
        self._release_queue: cl.CommandQueue | None = None
        self._nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: int | None = None
        self._send, self._recv = trio.open_memory_channel(math.inf)
        self._limiter = trio.CapacityLimiter(build_threads)
        self._warm_queue: cl.CommandQueue | None = None
        self._live_buffers = 0
        self._live_bytes = 0
        self._programs_built = 0
        self._programs_loaded = 0
        self._builds_in_flight = 0
        # Per-context objects of cached primitives, by primitive cache key: a cache hit on this
        # engine is then a dictionary lookup, a hit from another context one load from binary.
        self._resources: collections.OrderedDict[object, BuiltKernel] = collections.OrderedDict()
        self._resource_loads: dict[object, ReplySlot] = {}
        self._graveyard: list[BuiltKernel] = []
        # LRU-bounded like the primitive cache, whose capacity it follows (a callable, so a
        # change of capacity applies at the next insertion).
        self._resource_capacity = resource_capacity
        self.closed = False

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._thread = threading.get_ident()
        try:
            async with trio.open_nursery() as builds:
                self._nursery = builds  # also runs the frees that wait for a use's enqueue
                task_status.started(self)
                async for request, reply in self._recv:
                    builds.start_soon(self._build, request, reply)
        finally:
            self._nursery = None

    def close(self) -> None:
        self.closed = True
        self._send.close()

    def statistics(self) -> EngineActorStatistics:
        return EngineActorStatistics(
            self._live_buffers, self._live_bytes, self._programs_built, self._programs_loaded,
            self._builds_in_flight, len(self._resources),
        )

    # -- builds ------------------------------------------------------------------------------

    async def build(self, request: BuildRequest) -> BuiltKernel:
        """Compile (or load) in a worker thread of the actor's nursery; the caller only waits."""
        reply = ReplySlot()
        try:
            self._send.send_nowait((request, reply))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ClosedError("the engine is closed (its runtime has shut down)") from None
        return await reply.get()

    async def compile_here(self, request: BuildRequest) -> BuiltKernel:
        """Compile in a worker thread, from the calling task (the cache actor's build task).

        The cache actor's nursery already owns the build, so going through this actor's channel
        would only add a scheduler batch before the compile starts, the batch in which a
        thousand coalescing requesters take their first step.
        """
        if self.closed:
            raise ClosedError("the engine is closed (its runtime has shut down)")
        self._builds_in_flight += 1
        try:
            built = await trio.to_thread.run_sync(self._build_in_thread, request, limiter=self._limiter)
        finally:
            self._builds_in_flight -= 1
            self._bury_if_idle()
        self._programs_built += 1
        return built

    def adopt(self, key, built: BuiltKernel) -> None:
        """Keep ``built`` as this engine's resources for cache key ``key`` (the first one wins)."""
        if key in self._resources:
            self._graveyard.append(built)  # released later, see _bury_if_idle
            self._bury_if_idle()
        else:
            self._remember(key, built)

    def _remember(self, key, built: BuiltKernel) -> None:
        self._resources[key] = built
        self._resources.move_to_end(key)
        while len(self._resources) > self._resource_capacity():
            self._graveyard.append(self._resources.popitem(last=False)[1])
        self._bury_if_idle()

    def _bury_if_idle(self) -> None:
        # Releasing a program while PoCL compiles another blocks in clReleaseProgram with the
        # GIL held (75-105 ms measured): drop unused resources only when no build runs here.
        if self._graveyard and not self._builds_in_flight:
            self._graveyard.clear()

    async def resources(self, key, make_load: Callable[[], BuildRequest]) -> BuiltKernel:
        """This engine's kernel for ``key``: kept, being loaded, or loaded now from ``make_load()``
        (called only then: a hit builds no request).

        Concurrent requests for one key share one load, which runs in the actor's nursery: a
        requester that is cancelled stops waiting, the load goes on for the others.
        """
        built = self._resources.get(key)
        if built is not None:
            self._resources.move_to_end(key)
            return built  # no checkpoint: the caller's cache lookup made one
        slot = self._resource_loads.get(key)
        if slot is None:
            slot = self._resource_loads[key] = ReplySlot()
            try:
                self._send.send_nowait((make_load(), _ResourceLoad(self, key, slot)))
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                del self._resource_loads[key]
                raise ClosedError("the engine is closed (its runtime has shut down)") from None
        try:
            return await slot.get()
        except TriodnnError as exc:
            raise type(exc)(str(exc)) from exc  # a fresh exception for each waiter

    async def _build(self, request: BuildRequest, reply: ReplySlot) -> None:
        self._builds_in_flight += 1
        try:
            built = await trio.to_thread.run_sync(self._build_in_thread, request, limiter=self._limiter)
        except BaseException as exc:  # delivered to the requester, never lost in the nursery
            if isinstance(exc, Exception):
                reply.set_error(exc)
            else:  # the actor itself is being cancelled: its waiters were not
                reply.set_error(ClosedError("the engine closed before the build finished"))
                raise
        else:
            if request.binary is None:
                self._programs_built += 1
            else:
                self._programs_loaded += 1
            reply.set_value(built)
        finally:
            self._builds_in_flight -= 1
            self._bury_if_idle()

    def _build_in_thread(self, request: BuildRequest) -> BuiltKernel:
        started = time.perf_counter()
        spec = generate(request.desc, request.config)
        needed = local_memory_bytes(spec.source)
        offered = int(self.device.local_mem_size)
        if needed > offered:
            # Generators size tiles to config.local_memory, the device's figure unless a caller
            # forced another configuration; a kernel past the device would fail at launch, later
            # and less clearly (Oclgrind: "total local memory size exceeds device maximum").
            raise BuildError(
                f"kernel {spec.name!r} ({request.desc.label}) declares {needed} bytes of __local memory; "
                f"{self.device.name.strip()} offers {offered}"
            )
        if request.binary is None:
            program = cl.Program(self.context, program_source(spec, request.config))
        else:
            program = cl.Program(self.context, [self.device], [request.binary])
        try:
            program.build(options=list(request.options))
        except cl.Error as exc:
            raise BuildError(
                f"OpenCL build of kernel {spec.name!r} ({request.desc.label}) failed on "
                f"{self.device.name.strip()}:\n{exc}"
            ) from None
        kernel = cl.Kernel(program, spec.name)
        # PoCL compiles the work-group function at a kernel's first launch (35-140 ms): launch
        # one work-group now, so the first execution is as fast as any, and take the binary after.
        arg_descs = request.desc.arg_descs
        self._warm_up(kernel, spec.local_size, [arg_descs[name].nbytes for name in spec.arg_names])
        binary = request.binary if request.binary is not None else program_binary(program, self.device)
        return BuiltKernel(spec, program, kernel, binary, time.perf_counter() - started)

    def _warm_up(self, kernel: cl.Kernel, local_size: tuple[int, ...], buffer_bytes: list[int]) -> None:
        if self._warm_queue is None:
            self._warm_queue = cl.CommandQueue(self.context, self.device)
        if self.allocator is None:
            buffers = [cl.Buffer(self.context, cl.mem_flags.READ_WRITE, n) for n in buffer_bytes]
            kernel.set_args(*buffers)
            cl.enqueue_nd_range_kernel(self._warm_queue, kernel, local_size, local_size).wait()
            return
        # The warm-up's buffers come from the caller's allocator too (in this build thread), and
        # go back to it once the launch has completed.
        buffers, launched = [], None
        try:
            for n in buffer_bytes:
                buffers.append(self._user_allocate(n))
            kernel.set_args(*buffers)
            launched = cl.enqueue_nd_range_kernel(self._warm_queue, kernel, local_size, local_size)
            launched.wait()
        finally:
            for buffer in buffers:
                self._call_free(buffer, launched)

    # -- memory ------------------------------------------------------------------------------

    def allocate(self, nbytes: int) -> cl.Buffer:
        """A device buffer of ``nbytes`` (from the caller's allocator when the engine has one);
        counted until ``release_buffer``."""
        if nbytes > self.max_alloc_bytes:
            raise InvalidArgumentError(
                f"a buffer of {nbytes} bytes exceeds the device's largest allocation "
                f"({self.max_alloc_bytes} bytes)"
            )
        if self.allocator is None:
            buffer = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, nbytes)
        else:
            buffer = self._user_allocate(nbytes)
            _user_allocations[buffer.int_ptr] = UserAllocation(buffer, nbytes)
        self._live_buffers += 1
        self._live_bytes += nbytes
        return buffer

    def release_buffer(self, buffer: cl.Buffer, nbytes: int, *, after=None) -> None:
        """Stop counting ``buffer``; a default buffer is freed when its last reference goes, a
        user allocator's goes back to its ``free`` once every command using it is enqueued
        (``after``: a submission that completes after every use, when the owner knows one).

        No explicit ``buffer.release()``: a submission still in a stream actor's channel holds
        the pyopencl object, and releasing it under that submission would crash the enqueue.
        Called from a finalizer, this may run in any thread.
        """
        self._live_buffers -= 1
        self._live_bytes -= nbytes
        if self.allocator is None:
            return
        record = _user_allocations.pop(buffer.int_ptr, None)
        if record is not None:
            record.after = after
            self._retire(record)

    # User allocations go back to ``allocator.free`` with an event after which nothing uses them:
    # once every use is enqueued (a task of the actor's nursery waits for that), the one command
    # still running, a marker on a queue of the actor's waiting for several, or the last use when
    # all are complete (None when nothing ever used the buffer).

    def _retire(self, record: UserAllocation) -> None:
        """Hand ``record`` back now or once its uses are enqueued; never raises (it may run in a
        finalizer or a trio ``run_sync_soon`` callback)."""
        on_trio_thread = threading.get_ident() == self._thread
        if self._nursery is not None and not on_trio_thread:
            try:
                self._token.run_sync_soon(self._retire, record)
                return
            except trio.RunFinishedError:
                pass  # the run has ended: its streams finished every command
        candidates = [*record.uses, record.after] if record.after is not None else record.uses
        waiting = [u for u in candidates if u.pending_submit]
        if waiting and self._nursery is not None and on_trio_thread:
            try:
                self._nursery.start_soon(self._retire_when_enqueued, record, waiting)
                return
            except RuntimeError:
                pass  # the nursery is closing: the streams have already finished
        self._free_now(record)

    async def _retire_when_enqueued(self, record: UserAllocation, waiting: list) -> None:
        with trio.CancelScope(shield=True):  # stream actors settle every submission, even cancelled
            for submission in waiting:
                await submission.wait_submitted()
        self._free_now(record)

    def _free_now(self, record: UserAllocation) -> None:
        try:
            event = self._last_use(record)
        except cl.Error:
            # The marker could not be enqueued (rare): a thread waits for the uses, then frees.
            running = [u.native for u in record.uses if u.native is not None]

            def wait_then_free() -> None:
                try:
                    cl.wait_for_events(running)
                except cl.Error:
                    pass  # failed commands are over too
                self._call_free(record.buffer, running[-1])

            if running:
                threading.Thread(target=wait_then_free, name="triodnn-allocator-free", daemon=True).start()
                return
            event = None
        self._call_free(record.buffer, event)

    def _last_use(self, record: UserAllocation) -> cl.Event | None:
        after = record.after
        if after is not None and after.native is not None:
            return after.native
        running = [u.native for u in record.uses if u.native is not None
                   and u.native.command_execution_status > _COMPLETE]
        if not running:
            last = record.last
            return last.native if last is not None else None
        if len(running) == 1:
            return running[0]
        if self._release_queue is None:
            ooo = self.device.queue_properties & _OOO
            self._release_queue = cl.CommandQueue(self.context, self.device, _OOO if ooo else 0)
        marker = cl.enqueue_marker(self._release_queue, wait_for=running)
        self._release_queue.flush()
        return marker

    def _user_allocate(self, nbytes: int):
        """A buffer of at least ``nbytes`` from the caller's allocator, checked."""
        allocate = self.allocator.allocate
        try:
            buffer = allocate(nbytes, self.alignment, self.device, self.context)
        except Exception as exc:
            raise ExecutionError(
                f"allocator.allocate({nbytes}, {self.alignment}, ...) raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        problem = self._check_user_buffer(buffer, nbytes)
        if problem is not None:
            if buffer is not None and not (
                isinstance(buffer, cl.Buffer) and buffer.int_ptr in _user_allocations
            ):
                self._call_free(buffer, None)  # the allocation is the caller's again
            raise InvalidArgumentError(f"allocator.allocate({nbytes}, ...) returned {problem}")
        return buffer

    def _check_user_buffer(self, buffer, nbytes: int) -> str | None:
        if not isinstance(buffer, cl.Buffer):
            if isinstance(buffer, cl.SVMPointer):
                return ("an SVM allocation; triodnn takes pyopencl.Buffer allocations only "
                        "(SVM is not supported yet)")
            return f"{type(buffer).__name__}, expected a pyopencl.Buffer"
        if buffer.context.int_ptr != self.context.int_ptr:
            return "a buffer of another OpenCL context than the engine's"
        if buffer.size < nbytes:
            return f"a buffer of {buffer.size} bytes, too small"
        if buffer.flags & _RESTRICTING_FLAGS:
            return (f"a buffer with flags {buffer.flags:#x}; kernels read and write it and the "
                    "host copies both ways (READ_WRITE, no READ_ONLY/WRITE_ONLY/HOST_* flags)")
        if buffer.int_ptr in _user_allocations:
            return "a buffer triodnn still holds (returned earlier and not freed yet)"
        return None

    def _call_free(self, buffer, event: cl.Event | None) -> None:
        try:
            self.allocator.free(buffer, self.device, self.context, event)
        except Exception as exc:  # nobody to raise to: a finalizer, a callback, a cleanup
            warnings.warn(
                f"allocator.free raised {type(exc).__name__}: {exc} (the buffer counts as freed)",
                RuntimeWarning, stacklevel=2,
            )
