"""Engines: one OpenCL device in one context, with its identity."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar, overload

import attrs
import numpy as np
import pyopencl as cl
import trio

from ._cross_engine_reorder import CrossEngineReorder
from ._instruments import INSTRUMENTS
from ._memory import Memory
from ._primitive import Primitive
from ._stream import Stream, StreamFlags
from ._values import _cache_blob
from ._values._dtypes import input_dtype_of
from ._values._errors import (
    CacheBlobError,
    ClosedError,
    DeviceLostError,
    EngineMismatchError,
    InvalidArgumentError,
)
from ._values._keys import DeviceIdentity, DeviceInfo, EngineIdentity, PrimitiveImpl, PrimitiveKey
from ._values._memory_desc import MemoryDesc
from ._values._op_desc import OpDesc
from ._values._reorder_desc import CrossEngineReorderDesc, ReorderDesc
from ._version import __version__
from .actors import BuiltKernel, CacheActor, DeviceActor, DeviceHealth, OutOfOrderStrategy
from .kernels import KERNELS, KernelConfig, select_config

if TYPE_CHECKING:
    from ._runtime import Runtime

ENGINE_KINDS = ("cpu", "gpu", "any")

P = TypeVar("P", bound=Primitive)


@attrs.define(eq=False)
class Engine:
    """One OpenCL device in one context. Open with ``await runtime.engine(kind, index)``."""

    kind: str
    index: int
    info: DeviceInfo = attrs.field(repr=False)
    _actor: DeviceActor = attrs.field(alias="actor", repr=False)
    _runtime: Runtime = attrs.field(alias="runtime", repr=False)
    out_of_order_strategy: OutOfOrderStrategy = attrs.field(repr=False, default=None)
    # The in-order stream memory copies go through: attached by ``Runtime.open_engine`` before
    # it returns the engine (the stream needs the engine).
    _host_stream: Stream = attrs.field(init=False, repr=False)
    # Out-of-order stream that cross-engine reorders copy through on this side; opened lazily.
    _transfer_stream: Stream | None = attrs.field(default=None, init=False, repr=False)
    _config: KernelConfig = attrs.field(init=False, repr=False)
    _device_identity: DeviceIdentity = attrs.field(init=False, repr=False)
    _build_options: tuple[str, ...] = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._config = select_config(
            self.info.type, self.info.max_work_group_size, self.info.local_mem_size, self.info.splits_float16_calls,
            self.info.native_vector_width, self.info.nvidia_sm,
        )
        self._device_identity = DeviceIdentity.of(self.info)
        # OpenCL lets f32 division and sqrt be off by 2.5-3 ulp; where the device can round them
        # correctly, ask for it, so binary div matches numpy as add and mul do.
        correct = self.info.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT
        self._build_options = ("-cl-fp32-correctly-rounded-divide-sqrt",) if correct else ()

    def __str__(self) -> str:
        # The context tells two engines of one device apart (ocl_interop.make_engine, a second
        # runtime): EngineMismatchError's messages print both sides.
        return f"{self.kind}:{self.index} ({self.info.name}, context {self._actor.context.int_ptr:#x})"

    @property
    def host_stream(self) -> Stream:
        """The in-order stream ``Memory.write`` and ``Memory.to_numpy`` copy through."""
        return self._host_stream

    def attach_host_stream(self, stream: Stream) -> None:
        """Make ``stream`` the ``host_stream``: the runtime does, once, as it opens the engine
        (a stream needs its engine first)."""
        self._host_stream = stream

    @property
    def kernel_config(self) -> KernelConfig:
        """The kernel configuration chosen for this device (work-group size, local memory,
        vector width): what the graph layer's fusion decisions weigh."""
        return self._config

    @property
    def buffer_releaser(self) -> Callable[..., None]:
        """The allocator's ``release_buffer(buffer, nbytes, after=submission)`` for this
        engine's buffers: what a ``Memory``'s finalizer holds, without holding the engine."""
        return self._actor.allocator.release_buffer

    @property
    def partition_cache(self) -> CacheActor:
        """The actor of the compiled-partition cache this engine's runtime compiles through."""
        return self._runtime.partition_cache

    def opened_by(self, runtime: Runtime) -> bool:
        """Whether ``runtime`` opened this engine (and serves its actors)."""
        return self._runtime is runtime

    @property
    def identity(self) -> EngineIdentity:
        return EngineIdentity(self._device_identity, self.cl_context.int_ptr)

    @property
    def cl_context(self) -> cl.Context:
        return self._actor.context

    @property
    def cl_device(self) -> cl.Device:
        return self._actor.device

    @property
    def closed(self) -> bool:
        return self._actor.closed

    @property
    def health(self) -> DeviceHealth:
        """The record of whether this engine's OpenCL context still works (``lost``), which its
        streams and allocations consult."""
        return self._actor.health

    @property
    def lost(self) -> DeviceLostError | None:
        """None while the device works; once a failed command was followed by a failed probe,
        the ``DeviceLostError`` every later submission, allocation and creation here raises."""
        return self._actor.health.lost

    async def check_device(self) -> None:
        """Probe the device now with a tiny command (or join the probe triodnn started after a
        failure); ``DeviceLostError`` if it no longer works. An engine pool or a health check
        calls this after an ``ExecutionError`` to tell a bad request from a dead device."""
        self._runtime.check_thread(str(self), "checked")
        await self._actor.health.check()

    @property
    def allocator(self):
        """The ``ocl_interop.Allocator`` every buffer of this engine comes from, or None (the
        engine allocates ``pyopencl.Buffer``s itself)."""
        return self._actor.allocator.user

    def statistics(self):
        """Live buffers and bytes, programs built, builds in flight (a frozen record)."""
        return self._actor.statistics()

    def memory(self, desc: MemoryDesc) -> Memory:
        """A new, uninitialised memory object of ``desc`` on this engine."""
        if not isinstance(desc, MemoryDesc):
            raise InvalidArgumentError(f"desc is {type(desc).__name__}, expected triodnn.MemoryDesc")
        if self._actor.closed:
            raise ClosedError(f"engine {self} is closed (its runtime has shut down)")
        return Memory(self, desc, buffer=self._actor.allocator.allocate(desc.nbytes))

    async def from_numpy(self, array, desc: MemoryDesc | None = None) -> Memory:
        """A memory object holding a copy of ``array`` (dense row-major unless ``desc`` says).

        Without ``desc`` the memory takes the array's own data type where triodnn has it, else
        f32 for floats (float64) and s32 for integers (int64, checked to fit): the input policy
        of ``Memory.write`` (docs/runtime.md, Inputs), which converts into ``desc``'s type otherwise."""
        array = np.asarray(array)
        if desc is None:
            desc = MemoryDesc(tuple(array.shape), input_dtype_of(array.dtype))
        memory = self.memory(desc)
        try:
            await memory.write(array)
        except BaseException:
            memory.release()
            raise
        return memory

    @property
    def stages_copies(self) -> bool:
        """Whether host copies to and from this device are faster through pinned host memory
        (``pinned_host_array``): a device with memory of its own, not one sharing the host's."""
        return not self._actor.allocator.device.host_unified_memory

    def pinned_host_array(self, nbytes: int) -> np.ndarray:
        """``nbytes`` (uint8) of host memory this device copies to and from fastest, page-locked
        where the driver does that; freed with the array. ``OutOfMemoryError`` when refused."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 1:
            raise InvalidArgumentError(f"nbytes must be a positive int, got {nbytes!r}")
        if self._actor.closed:
            raise ClosedError(f"engine {self} is closed (its runtime has shut down)")
        self._runtime.check_thread(str(self), "asked for a pinned host array")
        return self._actor.allocator.pinned_host_array(int(nbytes))

    def keep_until_shutdown(self, owner) -> None:
        """Have the runtime call ``owner.release_scratch()`` at shutdown, once every queue has
        finished and while the engines (a user allocator's ``free``) are still open: for device
        buffers kept between runs (a compiled partition's scratch, a runner's request buffers).
        Held weakly: an owner that goes away frees its buffers itself."""
        self._runtime.keep_until_shutdown(owner)

    def check_thread(self, label: str, doing: str) -> None:
        """``WrongThreadError`` unless the caller runs in the trio run of this engine's runtime:
        ``Runtime.check_thread``. Builds, kernel loads and streams are served there."""
        self._runtime.check_thread(label, doing)

    async def stream(self, flags: StreamFlags = StreamFlags.in_order) -> Stream:
        """A new stream on this engine; ``out_of_order`` picks the device's strategy."""
        return await self._runtime.open_stream(self, flags)

    async def stream_on_queue(self, queue: cl.CommandQueue, flags: StreamFlags) -> Stream:
        """A stream that submits into the caller's ``queue`` of this engine, with ``flags`` that
        match the queue's properties (``ocl_interop.make_stream`` checked both)."""
        return await self._runtime.open_stream(self, flags, queue=queue)

    async def create_primitive(self, desc: OpDesc) -> Primitive:
        """``desc`` (an EltwiseDesc, BinaryDesc …) compiled for this engine, through the cache.

        A cache hit on this engine costs dictionary lookups; a hit made on another context of
        the same device loads the cached binary here once; a miss compiles in a worker thread of
        the cache actor's nursery, and concurrent requests for the key wait for that one build.
        """
        if type(desc) not in KERNELS:  # the op registry: a kernel module declared this kind
            raise InvalidArgumentError(f"desc is {type(desc).__name__}, not a triodnn primitive descriptor")
        check = getattr(desc, "check_supported", None)
        if check is not None:
            check()  # once, before any cache is touched: a refused request leaves nothing behind
        return await self._create(desc)

    @overload
    async def _create(self, desc: OpDesc) -> Primitive: ...
    @overload
    async def _create(self, desc: OpDesc, key_desc: OpDesc, make: type[P], **extra: Any) -> P: ...
    async def _create(
        self, desc: OpDesc, key_desc: OpDesc | None = None, make: type[Primitive] = Primitive, **extra: Any
    ) -> Primitive:
        """``desc`` through the cache under ``key_desc`` (default ``desc``), as a ``make``."""
        # Constants only: every cache hit passes here, and nothing needs formatting unless refused.
        self._runtime.check_thread(desc.kind, "primitive requested")
        if self._actor.health.lost is not None:
            self._actor.health.refuse(f"{desc.kind} primitive requested on {self}")
        started = time.perf_counter()
        key_desc = desc if key_desc is None else key_desc
        key = PrimitiveKey(
            kind=key_desc.kind,
            desc=key_desc,
            attr=(),
            impl=self._config.name,
            config=self._config,
            engine_kind=self.info.type,
            runtime_kind="ocl",
            device=self._device_identity,
            build_options=self._build_options,
        )
        impl, how = await self._runtime.primitive_cache.get(key, functools.partial(self._build_impl, key))
        built = await self._resources_from(impl)
        primitive = make(
            self, desc, built, build_seconds=impl.build_seconds, entry=impl,
            **extra,
        )
        INSTRUMENTS.primitive_created(self, primitive, how, started, time.perf_counter() - started)
        return primitive

    async def create_reorder(
        self, src: MemoryDesc, dst: MemoryDesc, *, src_engine: Engine | None = None,
        dst_engine: Engine | None = None,
    ) -> Primitive:
        """A reorder from ``src`` on ``src_engine`` to ``dst`` on ``dst_engine`` (oneDNN's
        ``reorder::primitive_desc(src_engine, src_md, dst_engine, dst_md)``); both engines
        default to this one, which must be one of them.

        The primitive runs on the executing engine, ``primitive.engine``: the GPU side when one
        side is a GPU, else the source engine. Execute it on a stream of that engine with
        ``{"src": memory on src_engine, "dst": memory on dst_engine}``. Engines of one OpenCL
        context give a plain reorder (``create_primitive(ReorderDesc(src, dst))``). Across two
        contexts the data moves through the host: the engine that does not execute reads ``src``
        or writes ``dst`` with an out-of-order transfer stream of its own, the executing stream
        writes or reads a temporary around the conversion kernel, each step an event dependency
        of the next; the returned event, on the executing stream, completes once ``dst`` is
        written. The cache key holds both engines' identities (``EngineIdentity``).
        """
        src_engine = self if src_engine is None else src_engine
        dst_engine = self if dst_engine is None else dst_engine
        for name, engine in (("src_engine", src_engine), ("dst_engine", dst_engine)):
            if not isinstance(engine, Engine):
                raise InvalidArgumentError(f"{name} is {type(engine).__name__}, expected triodnn.Engine")
            if not engine.opened_by(self._runtime):
                raise EngineMismatchError(f"{name} {engine} belongs to another runtime than {self}")
            if engine.closed:
                raise ClosedError(f"{name} {engine} is closed (its runtime has shut down)")
        src_ctx, dst_ctx = src_engine.cl_context.int_ptr, dst_engine.cl_context.int_ptr
        if self.cl_context.int_ptr not in (src_ctx, dst_ctx):
            raise EngineMismatchError(
                f"engine {self} is neither src_engine ({src_engine}) nor dst_engine ({dst_engine}); "
                "call create_reorder on one of them"
            )
        desc = ReorderDesc(src, dst)
        desc.check_supported()
        if src_ctx == dst_ctx:
            return await src_engine._create(desc)
        on_dst = dst_engine.info.type == "gpu" and src_engine.info.type != "gpu"
        executing, peer = (dst_engine, src_engine) if on_dst else (src_engine, dst_engine)
        key_desc = CrossEngineReorderDesc(desc, src_engine.identity, dst_engine.identity)
        primitive = await executing._create(
            desc, key_desc, CrossEngineReorder, src_engine=src_engine, dst_engine=dst_engine
        )
        primitive.copy_through(await peer._open_transfer_stream())
        return primitive

    async def _open_transfer_stream(self) -> Stream:
        if self._transfer_stream is None:
            stream = await self.stream(StreamFlags.out_of_order)
            if self._transfer_stream is None:  # else a concurrent call won; this one stays idle
                self._transfer_stream = stream
        return self._transfer_stream

    def primitive_cache_blob(self, primitives: Iterable[Primitive] | None = None) -> bytes:
        """Every cached implementation for this engine's device, or only those ``primitives``
        were made from, as bytes: what ``load_primitive_cache_blob`` needs, in a new process, to
        create them without compiling. The whole cache of a long-lived process can be hundreds of
        programs (a test process's took a minute to write); a graph's primitives are its own."""
        if primitives is None:
            candidates = self._runtime.primitive_cache.cache.values()
        else:
            candidates = list({p.cache_entry.key: p.cache_entry for p in primitives}.values())
        impls = [
            impl for impl in candidates
            if impl.key.device == self._device_identity and _cache_blob.serializable(impl.key)
        ]
        # The engine's own float16 answer goes with the entries: a process that ran other
        # configurations on this device (tests of GPU-shaped kernels on a CPU) holds entries of
        # both answers, and a loader guessing from them would take the wrong one and build again.
        return _cache_blob.dump(impls, self._device_identity, __version__,
                                splits_float16_calls=self.info.splits_float16_calls)

    async def load_primitive_cache_blob(self, blob: bytes) -> int:
        """Put the blob's implementations into the primitive cache and load their binaries on this
        engine; returns how many entered the cache (none at capacity 0, none already there).
        ``CacheBlobError`` for a blob of another device or
        triodnn version, or a corrupt one; nothing is loaded then."""
        return await self.load_primitive_impls(_cache_blob.load(blob, self._device_identity, __version__))

    async def load_primitive_impls(self, impls: list[PrimitiveImpl]) -> int:
        """``load_primitive_cache_blob`` for a blob already read: ``Runtime.engine(cache_blob=)``
        reads it before the engine opens, to check it and to skip the device's probes."""
        self._runtime.check_thread("a primitive cache blob", f"loaded into engine {self}")
        cache = self._runtime.primitive_cache.cache
        inserted = 0
        async with trio.open_nursery() as nursery:
            for impl in impls:
                inserted += cache.insert(impl.key, impl)
                nursery.start_soon(self._resources_from, impl)
        return inserted

    async def create_primitive_from_cache_blob(self, blob: bytes) -> Primitive:
        """The primitive stored by ``primitive.cache_blob()``, loaded from its binary (no compile).
        Its implementation also enters the primitive cache."""
        impls = _cache_blob.load(blob, self._device_identity, __version__)
        if len(impls) != 1:
            raise CacheBlobError(f"blob holds {len(impls)} primitives; expected one (primitive.cache_blob())")
        (impl,) = impls
        self._runtime.check_thread(impl.key.desc.label, f"loaded from a cache blob into engine {self}")
        self._runtime.primitive_cache.cache.insert(impl.key, impl)
        built = await self._resources_from(impl)
        return Primitive(
            self, impl.key.desc, built, build_seconds=impl.build_seconds,
            entry=impl,
        )

    async def _resources_from(self, impl: PrimitiveImpl) -> BuiltKernel:
        return await self._actor.kernel_for(impl)

    async def _build_impl(self, key: PrimitiveKey) -> PrimitiveImpl:
        """The primitive cache's build of ``key``: the device builds, the instruments hear of it."""
        impl = await self._actor.build(key)
        INSTRUMENTS.build_finished(self, key.desc, impl.build_seconds)
        return impl
