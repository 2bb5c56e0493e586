"""The compiler role of a device actor: program builds, from source or from a binary.

Program builds take 0.15–0.8 s on PoCL and release the GIL, so they run in worker threads under
a capacity limiter, inside the device actor's nursery (``build``) or the calling task's
(``compile_here``): a requester that is cancelled stops waiting, and the build still finishes for
whoever asks next. PoCL compiles a kernel's work-group function again at its first launch
(35–140 ms), so a build also launches each kernel once, on one work-group, before handing it out:
the first real execution is then as fast as any other.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import pyopencl as cl
import trio

from .._values._errors import BuildError, ClosedError
from .._values._kernel_spec import KernelConfig, KernelSpec
from .._values._op_desc import OpDesc
from ..kernels import generate, local_memory_bytes, program_source
from ..kernels._ptx import retarget
from ._channels import take_queued
from ._program_binary import program_binary
from ._reply import ReplySlot

if TYPE_CHECKING:
    from ._allocator import DeviceAllocator


def build_program(context: cl.Context, device: cl.Device, source: str, options: tuple[str, ...] = (), *,
                  ptx_target: str | None = None) -> cl.Program:
    """``source`` built for ``device``; with ``ptx_target`` (a ``KernelSpec``'s), built to PTX
    first, then that PTX retargeted (``kernels._ptx.retarget``) and built again, the program
    returned. Raises ``cl.Error`` as a build does."""
    program = cl.Program(context, source).build(options=list(options))
    if ptx_target is None:
        return program
    ptx = program_binary(program, device).decode()
    return cl.Program(context, [device], [retarget(ptx, ptx_target).encode()]).build(options=list(options))


@attrs.frozen
class BuildRequest:
    """What to compile: a primitive descriptor for a kernel configuration, from source or binary.

    The descriptor's ``generate(config)`` runs in the build thread too: source generation is the
    descriptor's business and may take its time.
    """

    desc: OpDesc = attrs.field(eq=False)
    config: KernelConfig
    options: tuple[str, ...] = ()
    # Reads the binary to load (a cached implementation's ``PrimitiveImpl.binary``); None, or a
    # reader that gives None, builds from source.
    binary: Callable[[], bytes | None] | None = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen
class BuiltKernel:
    """A kernel ready on this engine's context, and what makes it context-independent."""

    spec: KernelSpec = attrs.field(eq=False)
    program: cl.Program = attrs.field(eq=False)
    kernel: cl.Kernel = attrs.field(eq=False)
    device: cl.Device = attrs.field(eq=False, repr=False)
    seconds: float
    # Loaded from a binary (counted as a load, not a build); its binary is then known.
    loaded: bool = False
    # The device binary, read at the first ``binary()`` and kept. PoCL answers
    # clGetProgramInfo(BINARIES) by compiling every kernel of the program once more, for any
    # work-group size: 27 s on top of a 14 s build for an f16 6x64 register-block matmul, about
    # as long as the build for most kernels (half of a cold test run's compiling). Read eagerly,
    # every cold primitive paid it; read lazily, only a second context or a cache blob does.
    known_binary: list = attrs.field(factory=lambda: [None], eq=False, repr=False)
    binary_lock: threading.Lock = attrs.field(factory=threading.Lock, eq=False, repr=False)
    # The addresses of the buffers ``kernel`` holds as arguments now (the stream actor skips
    # ``set_args`` when a launch passes the same ones: 1-3 µs of the 10 µs an NVIDIA enqueue
    # costs). Addresses, not buffers: holding them would keep freed buffers' memory alive; a new
    # buffer at a freed one's address is the same handle to OpenCL, so skipping is still right.
    bound: list = attrs.field(factory=lambda: [None], eq=False, repr=False)

    def binary(self) -> bytes:
        """The program's device binary (blocking: the first call may compile on PoCL)."""
        with self.binary_lock:
            if self.known_binary[0] is None:
                self.known_binary[0] = program_binary(self.program, self.device)
            return self.known_binary[0]

    def binary_reader(self) -> BinaryReader:
        """``PrimitiveImpl.binary`` for this kernel's cache entry."""
        reader = BinaryReader()
        reader.also_from(self)
        return reader


class BinaryReader:
    """Reads a cache entry's binary from a kernel some context holds for it, None when none
    does. Weak references: the cache entry must not keep an evicted program alive (the kernel
    cache times program releases)."""

    def __init__(self) -> None:
        self._kernels: list[weakref.ref[BuiltKernel]] = []

    def also_from(self, built: BuiltKernel) -> None:
        """``built`` (another context's kernel of the entry) may be read from too."""
        for ref in self._kernels:
            if ref() is built:
                return  # every cache hit on a context passes here: no new list then
        self._kernels = [ref for ref in self._kernels if ref() is not None] + [weakref.ref(built)]

    def __call__(self) -> bytes | None:
        for ref in self._kernels:  # a new list on each change: safe to walk from a worker thread
            built = ref()
            if built is not None:
                try:
                    return built.binary()
                except cl.Error:
                    continue  # that context cannot answer any more (a lost device): the next, or a build
        return None


class Compiler:
    """Builds programs for one device in one context, and counts them.

    Requests sent with ``build``/``submit`` run in the nursery that ``serve`` is given (the device
    actor's); ``compile_here`` builds from the calling task. The warm-up launch takes its buffers
    from ``allocator`` (the engine's, so a caller's allocator sees them too).
    """

    def __init__(
        self, device: cl.Device, context: cl.Context, allocator: DeviceAllocator, *, build_threads: int = 2
    ) -> None:
        self.device = device
        self.context = context
        self._allocator = allocator
        self._send, self._recv = trio.open_memory_channel(math.inf)
        self._limiter = trio.CapacityLimiter(build_threads)
        self._warm_queue: cl.CommandQueue | None = None
        self._build_end_listeners: list[Callable[[], None]] = []
        self.programs_built = 0
        self.programs_loaded = 0
        self.builds_in_flight = 0
        self.closed = False

    def on_build_end(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the trio thread) each time a build ends, ``builds_in_flight``
        already counting it out."""
        self._build_end_listeners.append(listener)

    async def serve(self, nursery: trio.Nursery) -> None:
        """Start each request sent to this compiler in ``nursery``, until ``close``.

        Requests queued after a cancellation stopped the receive (a requester still running
        sends before its own checkpoint) get ``ClosedError`` rather than a reply that never
        comes, and later submissions are refused."""
        try:
            async for request, reply in self._recv:
                nursery.start_soon(self._build, request, reply)
        finally:
            self.close()
            for _request, reply in take_queued(self._recv):
                reply.set_error(ClosedError("the engine closed before the build started"))

    def close(self) -> None:
        self.closed = True
        self._send.close()

    def submit(self, request: BuildRequest, reply) -> None:
        """Build ``request`` in the serving nursery and fill ``reply`` (``set_value``/``set_error``)."""
        try:
            self._send.send_nowait((request, reply))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ClosedError("the engine is closed (its runtime has shut down)") from None

    async def build(self, request: BuildRequest) -> BuiltKernel:
        """Compile (or load) in a worker thread of the actor's nursery; the caller only waits."""
        reply = ReplySlot()
        self.submit(request, reply)
        return await reply.get()

    async def compile_here(self, request: BuildRequest) -> BuiltKernel:
        """Compile in a worker thread, from the calling task (the cache actor's build task).

        The cache actor's nursery already owns the build, so going through this actor's channel
        would only add a scheduler batch before the compile starts, the batch in which a
        thousand coalescing requesters take their first step.
        """
        if self.closed:
            raise ClosedError("the engine is closed (its runtime has shut down)")
        self.builds_in_flight += 1
        try:
            built = await trio.to_thread.run_sync(self._build_in_thread, request, limiter=self._limiter)
        finally:
            self._build_ended()
        self.programs_built += 1
        return built

    async def _build(self, request: BuildRequest, reply) -> None:
        self.builds_in_flight += 1
        try:
            built = await trio.to_thread.run_sync(self._build_in_thread, request, limiter=self._limiter)
        except BaseException as exc:  # delivered to the requester, never lost in the nursery
            if isinstance(exc, Exception):
                reply.set_error(exc)
            else:  # the actor itself is being cancelled: its waiters were not
                reply.set_error(ClosedError("the engine closed before the build finished"))
                raise
        else:
            if built.loaded:
                self.programs_loaded += 1
            else:
                self.programs_built += 1
            reply.set_value(built)
        finally:
            self._build_ended()

    def _build_ended(self) -> None:
        self.builds_in_flight -= 1
        for listener in self._build_end_listeners:
            listener()

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
        binary = None if request.binary is None else request.binary()
        try:
            if binary is None:
                program = build_program(self.context, self.device, program_source(spec, request.config),
                                        request.options, ptx_target=spec.ptx_target)
            else:
                program = cl.Program(self.context, [self.device], [binary]).build(options=list(request.options))
        except cl.Error as exc:
            raise BuildError(
                f"OpenCL build of kernel {spec.name!r} ({request.desc.label}) failed on "
                f"{self.device.name.strip()}:\n{exc}"
            ) from None
        kernel = cl.Kernel(program, spec.name)
        # PoCL compiles the work-group function at a kernel's first launch (35-140 ms): launch
        # one work-group now, so the first execution is as fast as any.
        arg_descs = request.desc.arg_descs
        self._warm_up(kernel, spec.local_size, [arg_descs[name].nbytes for name in spec.arg_names])
        return BuiltKernel(spec, program, kernel, self.device, time.perf_counter() - started,
                           loaded=binary is not None, known_binary=[binary])

    def _warm_up(self, kernel: cl.Kernel, local_size: tuple[int, ...], buffer_bytes: list[int]) -> None:
        if self._warm_queue is None:
            self._warm_queue = cl.CommandQueue(self.context, self.device)
        # With a caller's allocator, the warm-up's buffers come from it too (in this build
        # thread), and go back to it once the launch has completed.
        buffers, launched = [], None
        try:
            for n in buffer_bytes:
                buffers.append(self._allocator.scratch(n))
            kernel.set_args(*buffers)
            launched = cl.enqueue_nd_range_kernel(self._warm_queue, kernel, local_size, local_size)
            launched.wait()
        finally:
            for buffer in buffers:
                self._allocator.free_scratch(buffer, launched)
