"""The device actor: owns one OpenCL context on one device, and groups the narrow roles that work
on it (after tinygrad's device.py): ``compiler`` builds programs, ``kernels`` keeps the per-context
resources of cached primitives, ``allocator`` makes and frees buffers (through the caller's
allocator, when one was given). Its nursery runs the compiler's builds and loads, and the
allocator's frees that wait for a use's enqueue.
"""

from __future__ import annotations

import attrs
import pyopencl as cl
import trio

from .._values._keys import PrimitiveImpl, PrimitiveKey
from ._allocator import DeviceAllocator
from ._compiler import BinaryReader, BuildRequest, BuiltKernel, Compiler
from ._health import DeviceHealth
from ._kernel_cache import KernelCache


@attrs.frozen
class EngineActorStatistics:
    """Live device buffers, programs compiled from source, programs loaded from binaries.

    (The record keeps the name ``engine.statistics()`` has always shown.)
    """

    live_buffers: int
    live_bytes: int
    programs_built: int
    programs_loaded: int
    builds_in_flight: int
    resources: int


class DeviceActor:
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
        # Whether the context still works (a probe after each device-side failure).
        self.health = DeviceHealth(context, device, f"{device.name.strip()} (context {context.int_ptr:#x})")
        # ``allocator``: the caller's (``allocate`` and ``free`` callables) or None for cl.Buffer.
        self.allocator = DeviceAllocator(device, context, allocator, health=self.health)
        self.compiler = Compiler(device, context, self.allocator, build_threads=build_threads)
        self.kernels = KernelCache(self.compiler, resource_capacity)
        self.closed = False

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self.allocator.run_frees_in(nursery)
                self.health.run_probes_in(nursery)
                task_status.started(self)
                await self.compiler.serve(nursery)
        finally:
            self.allocator.run_frees_in(None)
            self.health.run_probes_in(None)

    def close(self) -> None:
        self.closed = True
        self.compiler.close()

    def statistics(self) -> EngineActorStatistics:
        allocator, compiler = self.allocator, self.compiler
        return EngineActorStatistics(
            allocator.live_buffers, allocator.live_bytes, compiler.programs_built,
            compiler.programs_loaded, compiler.builds_in_flight, len(self.kernels),
        )

    # -- what an engine asks of its device when it creates a primitive ------------------------

    async def build(self, key: PrimitiveKey) -> PrimitiveImpl:
        """Compile ``key`` from source in a worker thread, from the calling task (the primitive
        cache's build task owns it), keep the kernel as this context's, and return the
        context-independent implementation the cache stores."""
        built = await self.compiler.compile_here(BuildRequest(key.desc, key.config, key.build_options))
        kept = self.kernels.adopt(key, built)
        return PrimitiveImpl(key, built.spec, kept.binary_reader(), built.seconds)

    async def kernel_for(self, impl: PrimitiveImpl) -> BuiltKernel:
        """This context's kernel of a cached implementation: kept, being loaded, or loaded now
        from its binary (a hit made on another context of the device loads once; built from
        source where the building context no longer holds the program)."""
        key = impl.key
        built = await self.kernels.get(
            key, lambda: BuildRequest(key.desc, key.config, key.build_options, binary=impl.binary)
        )
        if isinstance(impl.binary, BinaryReader):
            impl.binary.also_from(built)
        return built
