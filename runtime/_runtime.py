"""The runtime: the nursery that the engine, stream and completion actors live in."""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import weakref
from collections.abc import AsyncIterator

import pyopencl as cl
import trio

from ._engine import ENGINE_KINDS, DeviceInfo, Engine
from ._instruments import INSTRUMENTS, add_instrument
from ._stream import Stream, StreamFlags, check_flags
from ._values import _cache_blob
from ._values._errors import (
    CacheBlobError,
    ClosedError,
    EngineNotFoundError,
    ExecutionError,
    InvalidArgumentError,
    OutOfMemoryError,
)
from ._values._keys import DeviceIdentity, PrimitiveImpl
from ._verbose import VERBOSE
from ._version import __version__
from .actors import (
    CacheActor,
    CompletionActor,
    DeviceActor,
    DeviceRecord,
    StreamActor,
    UnusableDevice,
    choose_out_of_order_strategy,
    context_pool,
    describe_device,
    device_kind,
    float16_calls_split,
    global_compiled_partition_cache,
    global_primitive_cache,
    list_devices,
    registered_devices,
    setup_problems,
    vouch_for,
)
from .actors import unusable_devices as _unusable_devices

DEFAULT_ENGINE_ENV = "TRIODNN_ENGINE"

_current: contextvars.ContextVar[Runtime | None] = contextvars.ContextVar("triodnn_runtime", default=None)


def current_runtime() -> Runtime:
    """The runtime of the innermost ``open_runtime()`` block around the calling task."""
    runtime = _current.get()
    if runtime is None or runtime.closed:
        raise ClosedError("no open triodnn runtime here; use `async with triodnn.open_runtime():`")
    return runtime


def _read_blob(blob: bytes, device: cl.Device) -> tuple[list[PrimitiveImpl], bool | None]:
    """A cache blob's implementations for ``device``, and whether kernels pass float16 calls
    split there: the answer its writing engine recorded, else the one its entries'
    configurations agree on (None when they differ or there are none: the device is probed).
    ``CacheBlobError`` for a blob of another device or triodnn version."""
    identity = DeviceIdentity.of(DeviceInfo(**describe_device(device), splits_float16_calls=False))
    impls, recorded = _cache_blob.load_with_answer(blob, identity, __version__)
    if recorded is not None:
        return impls, recorded
    splits = {impl.key.config.split_float16_calls for impl in impls}
    return impls, splits.pop() if len(splits) == 1 else None


def _vouch_from_blob(blob: bytes) -> None:
    """The CPU device a cache blob was made on needs no compiler probe (``vouch_for``); a blob
    of no registered device changes nothing, and ``engine()`` then refuses it as before."""
    for device, _ in registered_devices():
        if device_kind(device) != "cpu":
            continue
        try:
            _, split = _read_blob(blob, device)
        except CacheBlobError:
            continue
        if split is not None:  # an unknown answer is the probe's to give
            vouch_for(device, split)
        return


def parse_engine_spec(text: str) -> tuple[str, int]:
    """``"cpu"``, ``"gpu:1"``, ``"any:0"`` → (kind, index)."""
    kind, _, index = text.strip().partition(":")
    try:
        number = int(index) if index else 0
    except ValueError:
        raise InvalidArgumentError(f"engine {text!r} is not KIND[:INDEX] (e.g. cpu, gpu:1)") from None
    return kind, number


def _resource_capacity() -> int:
    # Engines keep kernels for as many keys as the primitive cache, and at least 16, so that a
    # build's own engine still holds its kernel when the cache is small or disabled.
    return max(16, global_primitive_cache().capacity)


def available_engines() -> list[DeviceRecord]:
    """Every OpenCL device an engine can open, with its kind and index: a CPU device whose
    compiler cannot build is left out (``triodnn.unusable_devices()`` says why)."""
    return list_devices()


def unusable_devices() -> list[UnusableDevice]:
    """The registered devices triodnn leaves out, each with the reason and the fix (a CPU device
    whose compiler cannot build: PyPI's PoCL on CPUs its LLVM does not know)."""
    return _unusable_devices()


def default_engine_spec() -> str:
    """``$TRIODNN_ENGINE``, else ``cpu:0`` where a CPU device works, else ``gpu:0`` where a GPU
    is registered, else ``cpu:0`` (whose error then says what to install). Never a simulator:
    Oclgrind, which the test extra registers, would run everything thousands of times slower."""
    spec = os.environ.get(DEFAULT_ENGINE_ENV)
    if spec:
        return spec
    if list_devices("cpu", limit=1) or not list_devices("gpu", limit=1):
        return "cpu:0"
    return "gpu:0"


def find_device(kind: str, index: int) -> DeviceRecord:
    """The usable device ``kind:index``, probing devices in order only as far as it needs.
    Blocking on a CPU device's first probe in the process: call from a worker thread."""
    if kind not in ENGINE_KINDS:
        raise InvalidArgumentError(f"engine kind {kind!r} is not one of {', '.join(ENGINE_KINDS)}")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise InvalidArgumentError(f"engine index {index!r} must be a non-negative integer")
    matching = list_devices(None if kind == "any" else kind, limit=index + 1)
    if index < len(matching):
        return matching[index]
    records = list_devices()
    found = ", ".join(f"{r.label} ({r.device.name.strip()}, {r.platform.name.strip()})" for r in records)
    problems = "".join(f"; {line}" for line in setup_problems())
    hint = ""
    if kind == "cpu" and not matching and not problems:  # an unusable device's reason names the fix
        hint = ("; no CPU OpenCL device works here: pip install 'triodnn[cpu-intel]' (Intel's CPU "
                "runtime, from PyPI) or the distribution's PoCL (apt-get install pocl-opencl-icd)")
    raise EngineNotFoundError(
        f"no {kind} engine with index {index}; available: {found or 'no usable OpenCL device at all'}"
        f"{problems}{hint}"
    )


class _RuntimeActors:
    """The actors of one runtime, by the order they stop in, and the nursery they serve in.
    ``open_runtime`` owns it: it starts the cache actors, lends it to the ``Runtime`` (which
    starts the actors of the engines and streams it opens) and stops them all as its block ends."""

    def __init__(self, nursery: trio.Nursery, completion_scope: trio.CancelScope) -> None:
        self.nursery = nursery
        self.completion_scope = completion_scope
        # Compiled partitions: their compiles create primitives through the primitive cache's
        # actor and may use streams, so theirs stops first.
        self.partition_caches: list[tuple[CacheActor, trio.Event]] = []
        self.streams: list[tuple[StreamActor, trio.Event]] = []
        self.caches: list[tuple[CacheActor, trio.Event]] = []
        self.engines: list[tuple[DeviceActor, trio.Event]] = []
        # Holders of kept scratch buffers (``graph._replay.Replay``), released at shutdown.
        self.scratch_owners: weakref.WeakSet = weakref.WeakSet()
        # Engines whose context goes back to the context pool when the runtime has stopped.
        self.lent_contexts: list[DeviceActor] = []

    async def start(self, actor, registry: list) -> None:
        """Start ``actor`` serving in the nursery; ``registry`` (one of the lists above) says
        when it stops."""
        exited = trio.Event()

        async def run(task_status=trio.TASK_STATUS_IGNORED):
            try:
                await actor.serve(task_status=task_status)
            finally:
                exited.set()

        await self.nursery.start(run)
        registry.append((actor, exited))

    async def stop(self, runtime: Runtime) -> None:
        """Partition compiles finish, streams drain and finish their queues, engines finish their
        builds, then callbacks stop. Compiled partitions of ``runtime``'s engines, useless once
        the engines close, leave the process-global cache (not counted as evictions)."""
        for registry in (self.partition_caches, self.streams, self.caches, self.engines):
            for actor, _ in registry:
                actor.close()
            for _, exited in registry:
                await exited.wait()
            if registry is self.streams:
                # Scratch buffers compiled partitions keep between runs: every queue is finished,
                # and the engines (a user allocator's free) are still open.
                for owner in list(self.scratch_owners):
                    owner.release_scratch()
        global_compiled_partition_cache().discard_if(lambda key, compiled: _compiled_by(compiled, runtime))
        # Only now: a compiled partition's key names its engine's context, so another runtime
        # given the context before the discard above could have found this runtime's entries.
        # A context found lost stays out.
        for actor in self.lent_contexts:
            if actor.health.lost is None:
                context_pool().keep(actor.device, actor.context)
        self.lent_contexts.clear()
        self.completion_scope.cancel()


def _compiled_by(compiled, runtime: Runtime) -> bool:
    """Whether a compiled-partition cache entry was compiled on an engine ``runtime`` opened."""
    engine = getattr(compiled, "engine", None)
    return isinstance(engine, Engine) and engine.opened_by(runtime)


class Runtime:
    """Holds the actors of one ``open_runtime()`` block; open engines from it."""

    def __init__(self, actors: _RuntimeActors, completion: CompletionActor, primitive_cache: CacheActor,
                 partition_cache: CacheActor) -> None:
        self._actors = actors
        self._completion = completion
        self._cache_actor = primitive_cache
        self._partition_cache_actor = partition_cache
        self.closed = False

    @property
    def primitive_cache(self) -> CacheActor:
        """The actor of the process-global primitive cache, serving this runtime's engines."""
        return self._cache_actor

    @property
    def partition_cache(self) -> CacheActor:
        """The actor of the process-global compiled-partition cache, serving this runtime's engines."""
        return self._partition_cache_actor

    async def engine(self, kind: str | None = None, index: int | None = None, *,
                     cache_blob: bytes | None = None) -> Engine:
        """Open an engine (a new OpenCL context) on device ``kind:index``.

        With no arguments: ``$TRIODNN_ENGINE`` if set (``gpu:0`` …), else the first CPU device
        whose compiler works (``default_engine_spec``). CPU runtimes count in the measured order
        (``CPU_RUNTIME_ORDER``): PyPI's PoCL, which ``pyopencl[pocl]`` installs everywhere, then
        Intel's CPU runtime (``triodnn[cpu-intel]``), which works on CPUs that PoCL's LLVM does
        not know.

        ``cache_blob`` (``engine.primitive_cache_blob()`` of an engine on this device): checked
        first (``CacheBlobError`` for another device or version, before any engine opens), then
        loaded into the new engine as ``load_primitive_cache_blob`` does; the device facts its
        entries record stand in for the probes a first engine of a process runs (the float16
        call probe: a PoCL build, 0.7-0.9 s with PoCL's cache off), so a warm start compiles
        nothing at all.
        """
        self.check_thread(f"engine {kind or 'default'}:{index or 0}", "requested")
        if cache_blob is not None:  # before the default is looked for: that probes cpu:0
            await trio.to_thread.run_sync(_vouch_from_blob, cache_blob)
        if kind is None:
            spec = await trio.to_thread.run_sync(default_engine_spec)
            kind, default_index = parse_engine_spec(spec)
            index = default_index if index is None else index
        # Discovery probes CPU compilers (a build, up to 1 s, once per process): off this thread.
        record = await trio.to_thread.run_sync(find_device, kind, 0 if index is None else index)
        impls, split = _read_blob(cache_blob, record.device) if cache_blob is not None else (None, None)
        # Creating a context can take a driver's whole initialisation (CUDA's, on NVIDIA): keep
        # it off the trio thread.
        # A CPU device's context may be one a closed runtime left idle (``ContextPool``).
        try:
            context = await trio.to_thread.run_sync(context_pool().open_context, record.device)
        except cl.Error as exc:
            raise _context_failed(f"{kind}:{record.index}", exc) from exc
        engine = await self.open_engine(record.device, context, kind, record.index, split=split,
                                        lend_back=True)
        if impls is not None:
            await engine.load_primitive_impls(impls)
        return engine

    async def open_engine(
        self, device: cl.Device, context: cl.Context, kind: str, index: int, *, allocator=None,
        split: bool | None = None, lend_back: bool = False,
    ) -> Engine:
        """An engine ``kind:index`` on ``device`` in ``context`` (``engine`` makes the context;
        ``ocl_interop.make_engine`` passes the caller's, with its ``allocator``): its device
        actor started and its host stream open. ``split``: the device's float16 call answer, when
        a cache blob gave it (else probed for CPU devices). ``lend_back``: the context is
        triodnn's own, offered to the context pool once the runtime has stopped (a caller's
        context stays the caller's)."""
        self._check_open()
        self.check_thread(f"engine {kind}:{index}", "opened")
        facts = describe_device(device)
        if split is None:
            split = False
            if facts["type"] == "cpu":  # CPU-shaped kernels pass float16 vectors to built-ins
                split = await trio.to_thread.run_sync(float16_calls_split, device)
        info = DeviceInfo(**facts, splits_float16_calls=split)
        strategy = choose_out_of_order_strategy(
            vendor=info.vendor,
            platform=info.platform,
            override=os.environ.get("TRIODNN_OOO_STRATEGY"),
            compute_units=info.max_compute_units,
        )
        actor = DeviceActor(device, context, resource_capacity=_resource_capacity, allocator=allocator)
        await self._actors.start(actor, self._actors.engines)
        if lend_back:
            self._actors.lent_contexts.append(actor)
        engine = Engine(kind, index, info, actor=actor, runtime=self, out_of_order_strategy=strategy)
        engine.attach_host_stream(await self.open_stream(engine, StreamFlags.in_order))
        return engine

    async def open_stream(
        self, engine: Engine, flags: StreamFlags, queue: cl.CommandQueue | None = None
    ) -> Stream:
        """A new stream of ``engine`` (``Engine.stream``), submitting into the caller's ``queue``
        when given (``Engine.stream_on_queue``): its stream actor started."""
        self._check_open()
        self.check_thread(f"a stream of {engine}", "opened")
        flags = check_flags(flags)
        if queue is None and INSTRUMENTS.needs_profiling():
            # The one place that decides whether a stream profiles: its flags, plus any installed
            # instrument that reads device times (a trace, TRIODNN_VERBOSE=2). A caller's queue
            # profiles or not by itself, and ocl_interop.make_stream's flags say which.
            flags |= StreamFlags.profiling
        out_of_order = StreamFlags.out_of_order in flags
        strategy = engine.out_of_order_strategy
        lanes = strategy.lanes if out_of_order and strategy.kind == "lanes" else 1
        actor = StreamActor(
            engine.cl_context, engine.cl_device, out_of_order=out_of_order,
            profiling=StreamFlags.profiling in flags, lanes=lanes, queue=queue,
            completion=self._completion, instruments=INSTRUMENTS, spread=strategy.spread,
            health=engine.health,
        )
        await self._actors.start(actor, self._actors.streams)
        return Stream(
            engine, flags, actor, strategy=actor.mode, watchers=INSTRUMENTS.completion_watchers(),
            nursery=self._actors.nursery,
        )

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError("the runtime is closed")

    def check_thread(self, label: str, doing: str) -> None:
        """``WrongThreadError`` naming ``label`` and what was ``doing`` unless the caller runs in
        this runtime's trio run (on its thread), where its actors serve engines, streams and
        events; entry points that reach the actors call it first. A blocking portal's runtime
        is reached from any thread through the portal."""
        self._completion.check_thread(label, doing)

    def keep_until_shutdown(self, owner) -> None:
        """``Engine.keep_until_shutdown``: ``owner.release_scratch()`` at shutdown (held weakly)."""
        self._actors.scratch_owners.add(owner)

    def statistics(self):
        return self._completion.statistics()


def _context_failed(spec: str, exc: cl.Error) -> Exception:
    """The typed error of a context the driver would not create. Measured on an H200 (NVIDIA
    580): each context holds ~88 MiB of host memory, one process got 100 before
    ``OUT_OF_HOST_MEMORY``, and processes share the limit (4 at once got 18-50 each): a
    test run with many workers, each opening engines, reaches it."""
    if exc.code in (cl.status_code.OUT_OF_HOST_MEMORY, cl.status_code.OUT_OF_RESOURCES):
        return OutOfMemoryError(
            f"the driver could not open another OpenCL context on {spec}: {exc}. Each engine is a "
            "context, and drivers limit them (NVIDIA's: about 100 per GPU across all processes, "
            "~88 MiB of host memory each); close runtimes you no longer use, or open fewer engines"
        )
    return ExecutionError(f"opening an OpenCL context on {spec} failed: {exc}")


@contextlib.asynccontextmanager
async def open_runtime() -> AsyncIterator[Runtime]:
    """Start triodnn's actors for the duration of the block.

    On exit, every stream finishes the work already submitted to it, builds in flight complete,
    and the actors stop; then the block returns. An exception raised by the block comes out as
    itself, not wrapped in the actors' nursery's exception group.
    """
    # TRIODNN_VERBOSE's instrument (a no-op when installed already): it reads the variable where
    # primitives are created and streams open, so setting it between runtimes or inside one works.
    add_instrument(VERBOSE)
    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            completion = CompletionActor()
            completion_scope = trio.CancelScope()

            async def run_completion(task_status=trio.TASK_STATUS_IGNORED):
                with completion_scope:
                    await completion.serve(task_status=task_status)

            await nursery.start(run_completion)
            actors = _RuntimeActors(nursery, completion_scope)
            primitive_cache = CacheActor(global_primitive_cache())
            # A compile mostly waits for primitive builds, which the primitive cache's actor limits.
            partition_cache = CacheActor(global_compiled_partition_cache(), concurrent_builds=math.inf)
            await actors.start(primitive_cache, actors.caches)
            await actors.start(partition_cache, actors.partition_caches)
            runtime = Runtime(actors, completion, primitive_cache, partition_cache)
            token = _current.set(runtime)
            try:
                yield runtime
            except BaseException as exc:
                body_error = exc
                raise
            finally:
                _current.reset(token)
                with trio.CancelScope(shield=True):
                    runtime.closed = True  # first: nothing opens while the actors stop
                    await actors.stop(runtime)
    except BaseExceptionGroup as group:
        if body_error is not None and len(group.exceptions) == 1 and group.exceptions[0] is body_error:
            raise body_error from None
        raise
