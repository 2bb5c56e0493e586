"""The engine actor: owns one OpenCL context on one device, builds programs, keeps per-context
primitive resources and allocates buffers.

Program builds take 0.15–0.8 s on PoCL and release the GIL, so they run in worker threads under
a capacity limiter, inside the actor's own nursery: a requester that is cancelled stops waiting,
and the build still finishes for whoever asks next. PoCL compiles a kernel's work-group function
again at its first launch (35–140 ms), so a build also launches each kernel once, on one
work-group, before handing it out: the first real execution is then as fast as any other.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable

import attrs
import pyopencl as cl
import trio

from .._errors import BuildError, ClosedError, InvalidArgumentError, TriodnnError
from ._program_binary import program_binary
from ._reply import ReplySlot


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
    ) -> None:
        self.device = device
        self.context = context
        self.max_alloc_bytes = int(device.max_mem_alloc_size)
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
        async with trio.open_nursery() as builds:
            task_status.started(self)
            async for request, reply in self._recv:
                builds.start_soon(self._build, request, reply)

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
        spec = request.desc.generate(request.config)
        if request.binary is None:
            program = cl.Program(self.context, spec.source)
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
        buffers = [cl.Buffer(self.context, cl.mem_flags.READ_WRITE, n) for n in buffer_bytes]
        kernel.set_args(*buffers)
        cl.enqueue_nd_range_kernel(self._warm_queue, kernel, local_size, local_size).wait()

    # -- memory ------------------------------------------------------------------------------

    def allocate(self, nbytes: int) -> cl.Buffer:
        """A device buffer of ``nbytes``; counted until ``release_buffer``."""
        if nbytes > self.max_alloc_bytes:
            raise InvalidArgumentError(
                f"a buffer of {nbytes} bytes exceeds the device's largest allocation "
                f"({self.max_alloc_bytes} bytes)"
            )
        buffer = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, nbytes)
        self._live_buffers += 1
        self._live_bytes += nbytes
        return buffer

    def release_buffer(self, buffer: cl.Buffer, nbytes: int) -> None:
        """Stop counting ``buffer``; it is freed when its last reference goes.

        No explicit ``buffer.release()``: a submission still in a stream actor's channel holds
        the pyopencl object, and releasing it under that submission would crash the enqueue.
        """
        self._live_buffers -= 1
        self._live_bytes -= nbytes
