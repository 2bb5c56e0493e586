"""The engine actor: owns one OpenCL context on one device, builds programs and allocates buffers.

Program builds take 0.15–0.8 s on PoCL and release the GIL, so they run in worker threads under
a capacity limiter, inside the actor's own nursery: a requester that is cancelled stops waiting,
and the build still finishes for whoever asks next. PoCL compiles a kernel's work-group function
again at its first launch (35–140 ms), so a build also launches each kernel once, on one
work-group, before handing it out: the first real execution is then as fast as any other.
"""

from __future__ import annotations

import math
import time

import attrs
import pyopencl as cl
import trio

from .._errors import BuildError, ClosedError, InvalidArgumentError
from ._reply import ReplySlot


@attrs.frozen
class BuildRequest:
    """What to compile: one program, its kernel, and how to warm that kernel up."""

    source: str
    kernel_name: str
    options: tuple[str, ...] = ()
    warmup_local_size: tuple[int, ...] | None = None
    warmup_buffer_bytes: tuple[int, ...] = ()


@attrs.frozen
class BuiltKernel:
    program: cl.Program = attrs.field(eq=False)
    kernel: cl.Kernel = attrs.field(eq=False)
    build_seconds: float


@attrs.frozen
class EngineActorStatistics:
    live_buffers: int
    live_bytes: int
    programs_built: int
    builds_in_flight: int


class EngineActor:
    def __init__(self, device: cl.Device, context: cl.Context, *, build_threads: int = 2) -> None:
        self.device = device
        self.context = context
        self.max_alloc_bytes = int(device.max_mem_alloc_size)
        self._send, self._recv = trio.open_memory_channel(math.inf)
        self._limiter = trio.CapacityLimiter(build_threads)
        self._warm_queue: cl.CommandQueue | None = None
        self._live_buffers = 0
        self._live_bytes = 0
        self._programs_built = 0
        self._builds_in_flight = 0
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
            self._live_buffers, self._live_bytes, self._programs_built, self._builds_in_flight
        )

    # -- builds ------------------------------------------------------------------------------

    async def build(self, request: BuildRequest) -> BuiltKernel:
        reply = ReplySlot()
        try:
            self._send.send_nowait((request, reply))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ClosedError("the engine is closed (its runtime has shut down)") from None
        return await reply.get()

    async def _build(self, request: BuildRequest, reply: ReplySlot) -> None:
        self._builds_in_flight += 1
        try:
            built = await trio.to_thread.run_sync(self._build_in_thread, request, limiter=self._limiter)
        except BaseException as exc:  # delivered to the requester, never lost in the nursery
            reply.set_error(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            self._programs_built += 1
            reply.set_value(built)
        finally:
            self._builds_in_flight -= 1

    def _build_in_thread(self, request: BuildRequest) -> BuiltKernel:
        started = time.perf_counter()
        program = cl.Program(self.context, request.source)
        try:
            program.build(options=list(request.options))
        except cl.Error as exc:
            raise BuildError(
                f"OpenCL build of kernel {request.kernel_name!r} failed on {self.device.name.strip()}:\n{exc}"
            ) from None
        kernel = cl.Kernel(program, request.kernel_name)
        if request.warmup_local_size is not None:
            self._warm_up(kernel, request)
        return BuiltKernel(program, kernel, time.perf_counter() - started)

    def _warm_up(self, kernel: cl.Kernel, request: BuildRequest) -> None:
        if self._warm_queue is None:
            self._warm_queue = cl.CommandQueue(self.context, self.device)
        buffers = [cl.Buffer(self.context, cl.mem_flags.READ_WRITE, n) for n in request.warmup_buffer_bytes]
        try:
            kernel.set_args(*buffers)
            local = request.warmup_local_size
            cl.enqueue_nd_range_kernel(self._warm_queue, kernel, local, local).wait()
        finally:
            for buffer in buffers:
                buffer.release()

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
