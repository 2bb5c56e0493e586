"""The constant tensor cache: device copies of graph inputs marked ``constant``, uploaded once.

oneDNN Graph's constant tensor cache keeps processed constant tensors (reordered weights, folded
scales) so that later executions skip that work. Here the work a constant costs is its upload:
``GraphRunner.run`` (and ``map``) looks every input whose logical tensor has ``property_type
"constant"`` and that is given as a numpy array up in this cache, and uploads it only on a miss.

Keys. A constant is the same when it is the same numpy array: the same base object (the array
whose memory it views, found by following ``.base``), seen at the same data pointer with the
same shape, dtype and strides, and staged for the same memory descriptor. The cache holds a weak
reference to that base object, never the array: an array that is garbage collected drops its
entry (at the next cache operation), and a new array that happens to get the old one's ``id``
never hits the old entry, since the weak reference no longer points at it.

Unchanged. Like oneDNN, the cache trusts the promise that ``constant`` makes: the values do not
change. It never looks at them. Writing into a cached array in place (``w[...] = new``,
``w += 1``) breaks that promise: later runs keep computing with the values uploaded first (stale
results, no error). Pass a new array instead (a miss: uploaded again), or call
``clear_constant_tensor_cache()``, or give the runner its weights once with
``runner.set_constants({id: array})`` and call it again when they change.

Capacity. As in oneDNN, per engine kind and in megabytes (MiB): ``set_constant_tensor_cache_capacity
(n)`` sets every kind, ``set_constant_tensor_cache_capacity("gpu", n)`` one (oneDNN's order);
``get_constant_tensor_cache_capacity("cpu")``. Each engine (OpenCL context) has its own cache of
that kind's capacity, as oneDNN has one per device. ``TRIODNN_CONSTANT_TENSOR_CACHE_CAPACITY``,
else ``ONEDNN_GRAPH_CONSTANT_TENSOR_CACHE_CAPACITY`` (or ``DNNL_GRAPH_…``), read at first use,
take oneDNN's form ``cpu:1024;gpu:2048`` or a bare number for every kind; the deprecated oneDNN
switch ``ONEDNN_GRAPH_CONSTANT_TENSOR_CACHE=0`` disables the cache. The API call wins over them.
Capacity 0 disables: constants are uploaded every run, as any input is.

Where triodnn differs from oneDNN, and why:

- on by default (1024 MiB per engine kind; oneDNN's default is 0): here the cache holds only the
  caller's own constant arrays, one device copy each, which is what marking them ``constant``
  asks for; oneDNN's holds derived tensors the caller never sees;
- least recently used entries are evicted to make room (oneDNN stops caching new tensors when
  full, and flushes everything when the capacity is set); lowering the capacity evicts down to
  it, raising it keeps every entry;
- a device other than a CPU or GPU (an accelerator, Oclgrind) takes the ``gpu`` capacity;
- ``constant_tensor_cache_statistics()`` (hits, misses, evictions, uploads it did not keep,
  entries, bytes) has no oneDNN counterpart; ``clear_constant_tensor_cache()`` neither.

Buffers leave the cache (eviction, a dead array, a cleared cache, a closed engine) only once no
run that took them still has to submit a command on them, and their memory is freed after the
commands that used them (``Memory.release_after`` with the last one when it is known; the
allocator tracks the uses otherwise).
"""

from __future__ import annotations

import collections
import functools
import os
import threading
import weakref
from collections.abc import Mapping

import attrs
import numpy as np

from .._engine import Engine
from .._event import Event
from .._memory import Memory
from .._stream import Stream
from .._values._errors import InvalidArgumentError
from .._values._memory_desc import MemoryDesc
from ..actors import device_kind

__all__ = [
    "CAPACITY_ENV_VARS",
    "ConstantTensorCacheStatistics",
    "DEFAULT_CAPACITY_MB",
    "ENGINE_KINDS",
    "SWITCH_ENV_VARS",
    "capacities_from_env",
    "clear_constant_tensor_cache",
    "constant_tensor_cache_statistics",
    "get_constant_tensor_cache_capacity",
    "set_constant_tensor_cache_capacity",
]

ENGINE_KINDS = ("cpu", "gpu")
DEFAULT_CAPACITY_MB = 1024
MB = 1024 * 1024
CAPACITY_ENV_VARS = (
    "TRIODNN_CONSTANT_TENSOR_CACHE_CAPACITY",
    "ONEDNN_GRAPH_CONSTANT_TENSOR_CACHE_CAPACITY",
    "DNNL_GRAPH_CONSTANT_TENSOR_CACHE_CAPACITY",
)
# oneDNN's deprecated on/off switch: 0 disables, a positive value leaves the capacities alone.
SWITCH_ENV_VARS = ("ONEDNN_GRAPH_CONSTANT_TENSOR_CACHE", "DNNL_GRAPH_CONSTANT_TENSOR_CACHE")


@attrs.frozen
class ConstantTensorCacheStatistics:
    """What constant inputs found, since the process started (or, for one engine, since its
    cache was made): ``hits`` reused a device copy, ``misses`` uploaded one and kept it,
    ``uncached`` uploaded one for that run only (cache disabled, the array larger than the
    capacity, or a value that is no numpy array); ``evictions`` counts entries dropped to make
    room. ``entries`` and ``bytes`` are what is cached now."""

    hits: int
    misses: int
    evictions: int
    uncached: int
    entries: int
    bytes: int
    # Inputs given once with ``GraphRunner.set_constants`` (``compile_graph(constants=)``) never
    # pass through this cache: ``runner.statistics().constants`` and ``constant_bytes`` count them.

    @property
    def uploads(self) -> int:
        """Constant arrays written to a device: every miss and every uncached use."""
        return self.misses + self.uncached


def _parse_spec(text: str) -> dict[str, int] | None:
    """``"cpu:1024;gpu:2048"``, ``"gpu:0"`` or ``"512"`` as MiB per engine kind; None when any
    part is malformed (the variable is then ignored, as the primitive cache ignores a bad one)."""
    text = text.strip()
    if not text:
        return None
    if ":" not in text:
        try:
            size = int(text)
        except ValueError:
            return None
        return dict.fromkeys(ENGINE_KINDS, size) if size >= 0 else None
    capacities: dict[str, int] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        kind, _, size_text = part.partition(":")
        kind = kind.strip().lower()
        try:
            size = int(size_text)
        except ValueError:
            return None
        if kind not in ENGINE_KINDS or size < 0:
            return None
        capacities[kind] = size
    return capacities or None


def capacities_from_env(environ: Mapping[str, str] = os.environ) -> dict[str, int]:
    """Capacity in MiB per engine kind from the environment: 1024 each, unless a
    ``SWITCH_ENV_VARS`` is 0 (then 0 each), then the first of ``CAPACITY_ENV_VARS`` that parses
    sets the kinds it names."""
    capacities = dict.fromkeys(ENGINE_KINDS, DEFAULT_CAPACITY_MB)
    for name in SWITCH_ENV_VARS:
        value = environ.get(name)
        if value is not None and value.strip() == "0":
            capacities = dict.fromkeys(ENGINE_KINDS, 0)
            break
    for name in CAPACITY_ENV_VARS:
        value = environ.get(name)
        parsed = _parse_spec(value) if value is not None else None
        if parsed is not None:
            capacities.update(parsed)
            break
    return capacities


def _check_kind(kind) -> str:
    if not isinstance(kind, str) or kind.lower() not in ENGINE_KINDS:
        raise InvalidArgumentError(f"engine kind {kind!r} must be one of {', '.join(ENGINE_KINDS)}")
    return kind.lower()


def _check_capacity(capacity) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 0:
        raise InvalidArgumentError(
            f"constant tensor cache capacity {capacity!r} must be a non-negative integer (MiB)"
        )
    return int(capacity)


def _engine_kind(engine: Engine) -> str:
    return "cpu" if device_kind(engine.cl_device) == "cpu" else "gpu"


def array_root(array: np.ndarray) -> np.ndarray:
    """The array whose memory ``array`` views (itself when it owns its data)."""
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root


@attrs.define(eq=False)
class Entry:
    """One cached device copy. ``pins`` counts the runs that took it and have not yet submitted
    every command on it; ``uses`` the events of those commands (pruned as they complete)."""

    cache: _EngineCache
    key: tuple
    memory: Memory
    nbytes: int
    upload: Event | None      # the write that fills it; None once it completed
    pins: int = 0
    uses: list[Event] = attrs.field(factory=list)
    cached: bool = True        # False once it left the cache (freed when the last pin goes)
    freed: bool = False
    # The array's base object, weakly: dead, the entry goes (the callback only queues it).
    ref: weakref.ref = attrs.field(init=False)

    def upload_failed(self) -> bool:
        upload = self.upload
        if upload is None:
            return False
        if not upload.done:
            return False
        if upload.submission.failure is not None:
            return True
        self.upload = None     # completed: later runs need no dependency on it
        return False


@attrs.define(eq=False)
class _EngineCache:
    engine: Engine
    kind: str
    entries: collections.OrderedDict = attrs.field(factory=collections.OrderedDict)
    bytes: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    uncached: int = 0


class _State:
    """Every engine's cache, the capacities, and the process-wide counters, behind one lock held
    for dictionary work only (the upload of a miss is handed to a stream, which never blocks)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.capacities: dict[str, int] | None = None      # MiB; read from the env at first use
        self.caches: dict[Engine, _EngineCache] = {}
        # Entries whose array was garbage collected: weakref callbacks (any thread, possibly
        # inside a locked section that allocated) only append here; the next operation drops them.
        self.dead: collections.deque = collections.deque()
        self.totals = dict.fromkeys(("hits", "misses", "evictions", "uncached"), 0)

    def capacity_bytes(self, kind: str) -> int:
        if self.capacities is None:
            self.capacities = capacities_from_env()
        return self.capacities[kind] * MB


_state = _State()


# -- the public API ---------------------------------------------------------------------------------


def get_constant_tensor_cache_capacity(engine_kind: str = "cpu") -> int:
    """The capacity in MiB of each ``engine_kind`` (``"cpu"`` or ``"gpu"``) engine's cache:
    ``set_constant_tensor_cache_capacity``'s value, else the environment's, else 1024."""
    kind = _check_kind(engine_kind)
    with _state.lock:
        return _state.capacity_bytes(kind) // MB


def set_constant_tensor_cache_capacity(kind_or_capacity, capacity=None) -> None:
    """``set_constant_tensor_cache_capacity(n)`` gives every engine kind ``n`` MiB;
    ``set_constant_tensor_cache_capacity("gpu", n)`` one kind (oneDNN's argument order). Lowering
    evicts least recently used entries down to it; 0 empties the cache and disables it. A bad
    kind or a negative or non-integer capacity raises ``InvalidArgumentError``."""
    kinds: tuple[str, ...]
    if capacity is None:
        if isinstance(kind_or_capacity, str):
            raise InvalidArgumentError(
                f"set_constant_tensor_cache_capacity({kind_or_capacity!r}) names an engine kind "
                "but no capacity; pass (kind, MiB) or (MiB) for every kind"
            )
        kinds, size = ENGINE_KINDS, _check_capacity(kind_or_capacity)
    else:
        kinds, size = (_check_kind(kind_or_capacity),), _check_capacity(capacity)
    with _state.lock:
        _state.capacity_bytes("cpu")          # the kinds not named keep the environment's value
        assert _state.capacities is not None
        for kind in kinds:
            _state.capacities[kind] = size
        _drop_dead()
        for cache in list(_state.caches.values()):
            if cache.kind in kinds:
                _evict_to(cache, size * MB)


def constant_tensor_cache_statistics(engine: Engine | None = None) -> ConstantTensorCacheStatistics:
    """Counts for every engine since the process started (entries and bytes of the engines
    open now), or for ``engine``'s cache alone."""
    with _state.lock:
        _drop_dead()
        _drop_closed()
        if engine is None:
            caches = list(_state.caches.values())
            return ConstantTensorCacheStatistics(
                **_state.totals, entries=sum(len(c.entries) for c in caches),
                bytes=sum(c.bytes for c in caches),
            )
        if not isinstance(engine, Engine):
            raise InvalidArgumentError(f"engine is {type(engine).__name__}, expected triodnn.Engine")
        cache = _state.caches.get(engine)
        if cache is None:
            return ConstantTensorCacheStatistics(0, 0, 0, 0, 0, 0)
        return ConstantTensorCacheStatistics(
            cache.hits, cache.misses, cache.evictions, cache.uncached, len(cache.entries), cache.bytes
        )


def clear_constant_tensor_cache(engine: Engine | None = None) -> None:
    """Drop every entry (of ``engine``'s cache, or of all): the next run uploads its constants
    again. The way to refresh arrays that were changed in place against the promise."""
    if engine is not None and not isinstance(engine, Engine):
        raise InvalidArgumentError(f"engine is {type(engine).__name__}, expected triodnn.Engine")
    with _state.lock:
        _drop_dead()
        for cache in list(_state.caches.values()):
            if engine is None or cache.engine is engine:
                for entry in list(cache.entries.values()):
                    _remove(entry)


# -- what GraphRunner calls -------------------------------------------------------------------------


def note_uncached(engine: Engine) -> None:
    """A constant input uploaded without the cache (it was no numpy array)."""
    with _state.lock:
        cache = _cache_of(engine)
        cache.uncached += 1
        _state.totals["uncached"] += 1


def acquire(engine: Engine, stream: Stream, desc: MemoryDesc, array: np.ndarray,
            root: np.ndarray) -> tuple[Entry, bool] | None:
    """(entry, whether it was a miss): the cached device copy of ``array`` (shape ``desc.dims``,
    viewing ``root``'s memory, ``array_root``) for ``desc``, pinned for the caller; on a miss a
    new one, written on ``stream``. None when the cache does not take it (disabled, or the array
    is larger than the capacity): the caller uploads it itself. The caller's commands depend on
    ``entry.upload`` when it is not None; it hands the pin back with ``release``."""
    with _state.lock:
        if _state.dead:
            _drop_dead()
        cache = _cache_of(engine)
        capacity = _state.capacity_bytes(cache.kind)
        if desc.nbytes > capacity:
            cache.uncached += 1
            _state.totals["uncached"] += 1
            return None
        # Where the array starts in its root's memory: 0 for the root itself, found without
        # ``__array_interface__`` (3.8 µs a call, timeit, this 2-core VM), the common case.
        offset = 0 if array is root else _address(array) - _address(root)
        key = (id(root), offset, array.strides, array.dtype.str, desc)
        entry = cache.entries.get(key)
        if entry is not None:
            if entry.ref() is root and not entry.upload_failed():
                cache.entries.move_to_end(key)
                entry.pins += 1
                cache.hits += 1
                _state.totals["hits"] += 1
                return entry, False
            _remove(entry)     # another array at a recycled id, or a failed upload
        memory = engine.memory(desc)
        try:
            upload = stream.write(memory, array)
        except BaseException:
            memory.release()
            raise
        entry = Entry(cache, key, memory, desc.nbytes, upload, pins=1)
        entry.ref = weakref.ref(root, functools.partial(_died, entry))
        cache.entries[key] = entry
        cache.bytes += entry.nbytes
        cache.misses += 1
        _state.totals["misses"] += 1
        _evict_to(cache, capacity, keep=entry)
        return entry, True


def release(entry: Entry, uses: list[Event], *, failed: bool = False) -> None:
    """Hand back a pin of ``acquire``: ``uses`` are the events of the caller's commands on the
    buffer. ``failed``: the caller's run failed or was cancelled, so the upload it may have
    started is not known to be good; an entry whose upload did not complete is dropped."""
    with _state.lock:
        entry.pins -= 1
        if uses:
            if len(entry.uses) >= 8:
                entry.uses = [e for e in entry.uses if not e.done]
            entry.uses.extend(uses)
        upload = entry.upload
        if failed and entry.cached and upload is not None and (not upload.done or entry.upload_failed()):
            _remove(entry)
        elif not entry.cached:
            _free_if_unpinned(entry)


def settle(entries: list[Entry]) -> None:
    """Forget the upload events of ``entries`` that have completed. An upload's event holds the
    host array it reads (pyopencl keeps it until the copy is done), so an entry that kept it
    would keep its own array alive and never leave the cache when the caller drops it. Called
    at the end of a run, when its commands have completed."""
    with _state.lock:
        for entry in entries:
            entry.upload_failed()


# -- internals (under the lock) ---------------------------------------------------------------------


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def _cache_of(engine: Engine) -> _EngineCache:
    cache = _state.caches.get(engine)
    if cache is None:
        _drop_closed()     # a new engine: a good moment to forget the engines of closed runtimes
        cache = _state.caches[engine] = _EngineCache(engine, _engine_kind(engine))
    return cache


def _evict_to(cache: _EngineCache, capacity: int, keep: Entry | None = None) -> None:
    """Evict least recently used entries until ``cache`` holds at most ``capacity`` bytes."""
    for entry in list(cache.entries.values()):
        if cache.bytes <= capacity:
            return
        if entry is keep:
            continue
        _remove(entry)
        cache.evictions += 1
        _state.totals["evictions"] += 1


def _remove(entry: Entry) -> None:
    """Take ``entry`` out of its cache; its buffer goes once no run holds a pin on it."""
    if not entry.cached:
        return
    cache = entry.cache
    if cache.entries.get(entry.key) is entry:
        del cache.entries[entry.key]
    cache.bytes -= entry.nbytes
    entry.cached = False
    _free_if_unpinned(entry)


def _free_if_unpinned(entry: Entry) -> None:
    if entry.pins > 0 or entry.freed:
        return
    entry.freed = True
    pending = [e for e in entry.uses if not e.done]
    if entry.upload is not None and not entry.upload.done:
        pending.append(entry.upload)
    # One command still running is the last use; with several the allocator works it out.
    entry.memory.release_after(pending[0] if len(pending) == 1 else None)
    entry.uses = []


def _died(entry: Entry, _ref: weakref.ref) -> None:
    """The weakref callback of ``entry``'s array (any thread, maybe inside a locked section that
    allocated): queue it for the next operation, which drops it."""
    _state.dead.append(entry)


def _drop_dead() -> None:
    while _state.dead:
        entry = _state.dead.popleft()
        _remove(entry)


def _drop_closed() -> None:
    for engine, cache in list(_state.caches.items()):
        if engine.closed:
            for entry in list(cache.entries.values()):
                _remove(entry)
            del _state.caches[engine]

