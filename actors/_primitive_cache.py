"""The process-global primitive cache and the per-runtime actor that builds its entries.

Entries are context-independent primitive implementations (generated source, compiled binary),
kept in LRU order up to a capacity. The compiled-partition cache is a second ``PrimitiveCache``
on the same machinery (its own capacity variables, statistics record and failure wording), whose
entries are engine-bound ``CompiledPartition`` objects.

A request for a key that is being built joins that build, from any trio task of any trio run in
the process (one per OS thread, say): one build, one miss, every other request a coalesced wait.
The build itself runs in the requesting runtime's cache actor nursery, so a requester that is
cancelled never cancels it for the others. When a build fails, every waiter gets a fresh
exception chained to the builder's, and nothing stays in the cache.

State lives behind one ``threading.Lock`` held for dictionary operations only.
"""

from __future__ import annotations

import collections
import math
import os
import threading
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar, cast, overload

import attrs
import trio

from .._values._errors import BuildError, ClosedError, InvalidArgumentError, TriodnnError
from .._values._keys import PrimitiveImpl
from ._channels import take_queued

DEFAULT_CAPACITY = 1024
CAPACITY_ENV_VARS = (
    "TRIODNN_PRIMITIVE_CACHE_CAPACITY",
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY",
    "DNNL_PRIMITIVE_CACHE_CAPACITY",
)
COMPILED_PARTITION_CAPACITY_ENV_VARS = (
    "TRIODNN_COMPILED_PARTITION_CACHE_CAPACITY",
    "ONEDNN_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY",
    "DNNL_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY",
)
PRIMITIVE_FAILURE = "creating the primitive failed"
COMPILED_PARTITION_FAILURE = "compiling the partition failed"


def capacity_from_env(
    environ: Mapping[str, str] = os.environ, *, names: tuple[str, ...] = CAPACITY_ENV_VARS
) -> int:
    """The first of ``names`` (default: the primitive cache's ``CAPACITY_ENV_VARS``) set to a
    non-negative integer, else 1024."""
    for name in names:
        value = environ.get(name)
        if value is None:
            continue
        try:
            capacity = int(value)
        except ValueError:
            continue
        if capacity >= 0:
            return capacity
    return DEFAULT_CAPACITY


def check_capacity(capacity) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise InvalidArgumentError(f"capacity {capacity!r} must be a non-negative integer")
    return capacity


@attrs.frozen
class CacheStatistics:
    """A snapshot of a cache: entries, capacity and what requests found.

    ``hits``: requests the cache answered; ``misses``: lookups that found neither an entry nor a
    build in flight, so they had to start one; ``coalesced_waits``: requests that joined a build
    in flight. ``builds``: builds a cache actor actually started (a build is what costs time).
    It equals ``misses`` unless a runtime closed between a miss and its build starting (a miss,
    no build), and a build abandoned at shutdown counts even though its waiters look the key up
    again (another miss, another build). ``failed_builds`` and ``in_flight_builds`` are among
    ``builds``; the built entries are ``builds - failed_builds - in_flight_builds`` less the
    abandoned ones.
    """

    size: int
    capacity: int
    hits: int
    misses: int
    evictions: int
    coalesced_waits: int
    in_flight_builds: int
    failed_builds: int
    builds: int


@attrs.frozen
class PrimitiveCacheStatistics(CacheStatistics):
    """A snapshot of the primitive cache: entries, capacity and what requests found."""


@attrs.frozen
class CompiledPartitionCacheStatistics(CacheStatistics):
    """A snapshot of the compiled-partition cache: entries, capacity and what compiles found
    (``in_flight_builds`` and ``failed_builds`` count partition compilations)."""


# What a cache holds (``PrimitiveImpl``s, or the graph's ``CompiledPartition``s) and the statistics
# record it returns.
V = TypeVar("V")
S = TypeVar("S", bound=CacheStatistics)


class _Abandoned(Exception):
    """A build whose runtime shut down before it finished; its waiters look the key up again."""


class Flight(Generic[V]):
    """One build in progress; any trio run in the process may wait for it."""

    def __init__(self, key: Hashable, failure: str = PRIMITIVE_FAILURE) -> None:
        self.key = key
        self._failure = failure
        self._lock = threading.Lock()
        self._finished = False
        self._value: V | None = None
        self._error: BaseException | None = None
        self._waiters: list[tuple[trio.lowlevel.TrioToken, trio.Event]] = []

    def finish(self, value: V | None = None, error: BaseException | None = None) -> None:
        with self._lock:
            if self._finished:
                return
            self._finished = True
            self._value, self._error = value, error
            waiters, self._waiters = self._waiters, []
        here = trio.lowlevel.current_trio_token()
        for token, event in waiters:
            if token is here:
                event.set()
            else:
                try:
                    token.run_sync_soon(event.set)
                except trio.RunFinishedError:
                    pass  # that waiter's run is over

    async def wait(self) -> V:
        """The built value; the build's failure re-raised as a fresh exception chained to it."""
        with self._lock:
            finished = self._finished
            if not finished:
                event = trio.Event()
                self._waiters.append((trio.lowlevel.current_trio_token(), event))
        if finished:
            await trio.lowlevel.checkpoint()
        else:
            await event.wait()
        if isinstance(self._error, _Abandoned):
            raise _Abandoned
        if self._error is not None:
            error = self._error
            if isinstance(error, TriodnnError):
                raise type(error)(f"{self._failure}: {error}") from error
            # Not one of ours (a bug): say what it was, a bare KeyError reads as "19".
            raise BuildError(f"{self._failure}: {type(error).__name__}: {error}") from error
        # Finished without an error: ``finish`` was given the built value (None only on failure).
        return cast(V, self._value)


class PrimitiveCache(Generic[V, S]):
    """LRU of built implementations plus the builds in flight, shared by every runtime.

    ``statistics`` is the record ``statistics()`` returns; ``failure`` starts the message of the
    exception each waiter of a failed build gets. The defaults are the primitive cache's.
    """

    @overload
    def __init__(self: PrimitiveCache[V, PrimitiveCacheStatistics], capacity: int, *,
                 failure: str = PRIMITIVE_FAILURE) -> None: ...
    @overload
    def __init__(self, capacity: int, *, statistics: type[S], failure: str = PRIMITIVE_FAILURE) -> None: ...
    def __init__(self, capacity: int, *, statistics: type[Any] = PrimitiveCacheStatistics,
                 failure: str = PRIMITIVE_FAILURE) -> None:
        self._lock = threading.Lock()
        self._statistics: type[S] = statistics
        self._failure = failure
        self._capacity = capacity
        self._entries: collections.OrderedDict[Hashable, V] = collections.OrderedDict()
        self._flights: dict[Hashable, Flight[V]] = {}
        self._hits = self._misses = self._evictions = self._coalesced = self._failed = 0
        self._builds = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def set_capacity(self, capacity: int) -> None:
        """Lower evicts least recently used entries; 0 empties the cache and disables it."""
        capacity = check_capacity(capacity)
        with self._lock:
            self._capacity = capacity
            self._evict_locked()

    def statistics(self) -> S:
        with self._lock:
            return self._statistics(
                size=len(self._entries),
                capacity=self._capacity,
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                coalesced_waits=self._coalesced,
                in_flight_builds=len(self._flights),
                failed_builds=self._failed,
                builds=self._builds,
            )

    def lookup(self, key: Hashable) -> tuple[str, V | Flight[V]]:
        """``("hit", value)``, ``("join", flight)`` or ``("build", flight)``: the caller builds."""
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
                self._hits += 1
                return "hit", value
            if self._capacity == 0:
                self._misses += 1
                return "build", Flight(key, self._failure)  # disabled: a private build, shared with nobody
            flight = self._flights.get(key)
            if flight is not None:
                self._coalesced += 1
                return "join", flight
            self._misses += 1
            flight = self._flights[key] = Flight(key, self._failure)
            return "build", flight

    def note_build_started(self) -> None:
        """A cache actor started a build that ``lookup`` asked for (``builds``)."""
        with self._lock:
            self._builds += 1

    @overload
    def complete(self, flight: Flight[V], value: V) -> None: ...
    @overload
    def complete(self, flight: Flight[V], *, error: BaseException) -> None: ...
    def complete(self, flight: Flight[V], value: Any = None, error: BaseException | None = None) -> None:
        """Record a finished build (entry on success, none on failure) and wake its waiters."""
        with self._lock:
            if self._flights.get(flight.key) is flight:
                del self._flights[flight.key]
            if isinstance(error, _Abandoned):
                pass  # not a failure: another requester builds it again
            elif error is not None:
                self._failed += 1
            elif self._capacity > 0:
                self._entries[flight.key] = value
                self._entries.move_to_end(flight.key)
                self._evict_locked()
        flight.finish(value, error)

    def insert(self, key: Hashable, value: V) -> bool:
        """Add a ready entry (from a cache blob); False when the key is present or cache disabled."""
        with self._lock:
            if self._capacity == 0 or key in self._entries:
                return False
            self._entries[key] = value
            self._evict_locked()
            return True

    def values(self) -> list[V]:
        with self._lock:
            return list(self._entries.values())

    def discard(self, key: Hashable, value: V) -> bool:
        """Drop ``key``'s entry if it still is ``value`` (a stale entry); not an eviction."""
        with self._lock:
            if self._entries.get(key) is not value:
                return False
            del self._entries[key]
            return True

    def discard_if(self, predicate: Callable[[Hashable, V], bool]) -> int:
        """Drop every entry for which ``predicate(key, value)`` holds (entries bound to engines
        that closed); not evictions. Returns how many went."""
        with self._lock:
            doomed = [key for key, value in self._entries.items() if predicate(key, value)]
            for key in doomed:
                del self._entries[key]
            return len(doomed)

    def _evict_locked(self) -> None:
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
            self._evictions += 1


_global: PrimitiveCache[PrimitiveImpl, PrimitiveCacheStatistics] | None = None
# Its entries are the graph layer's ``CompiledPartition``s, a type this layer does not import.
_global_partitions: PrimitiveCache[Any, CompiledPartitionCacheStatistics] | None = None
_global_lock = threading.Lock()


def global_primitive_cache() -> PrimitiveCache[PrimitiveImpl, PrimitiveCacheStatistics]:
    """The process's primitive cache, created at first use with the capacity the env vars give."""
    global _global
    if _global is None:
        with _global_lock:
            if _global is None:
                _global = PrimitiveCache(capacity_from_env())
    return _global


def global_compiled_partition_cache() -> PrimitiveCache[Any, CompiledPartitionCacheStatistics]:
    """The process's compiled-partition cache, created at first use with the capacity
    ``COMPILED_PARTITION_CAPACITY_ENV_VARS`` give."""
    global _global_partitions
    if _global_partitions is None:
        with _global_lock:
            if _global_partitions is None:
                _global_partitions = PrimitiveCache(
                    capacity_from_env(names=COMPILED_PARTITION_CAPACITY_ENV_VARS),
                    statistics=CompiledPartitionCacheStatistics,
                    failure=COMPILED_PARTITION_FAILURE,
                )
    return _global_partitions


class CacheActor(Generic[V, S]):
    """Runs the builds a runtime's requests start, in its own nursery, behind a limiter
    (``concurrent_builds``: an int, or ``math.inf`` for none)."""

    def __init__(self, cache: PrimitiveCache[V, S], *, concurrent_builds: float = 4) -> None:
        self.cache = cache
        self._send, self._recv = trio.open_memory_channel(math.inf)
        self._limiter = trio.CapacityLimiter(concurrent_builds)
        self.closed = False

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as builds:
                task_status.started(self)
                async for flight, build in self._recv:
                    builds.start_soon(self._build, flight, build)
        finally:
            self._abandon_queued()

    def close(self) -> None:
        self.closed = True
        self._send.close()

    def _abandon_queued(self) -> None:
        """Refuse further requests and abandon the queued ones this actor will never start
        (``take_queued``). Left alone, such a build stays in flight, and every requester of its
        key, from any trio run, joins it and waits forever (a timed-out thread on an H200 left
        one behind). Abandoned, its waiters look the key up again: one of another runtime builds
        it; this runtime's get ``ClosedError``.
        """
        self.close()
        for flight, _build in take_queued(self._recv):
            self.cache.complete(flight, error=_Abandoned())

    async def get(self, key: Hashable, build: Callable[[], Awaitable[V]]) -> tuple[V, str]:
        """The cached value for ``key`` and how it was found: ``cache_hit``, ``cache_miss`` or
        ``cache_coalesced`` (joined a build already in flight).

        A build abandoned because its runtime shut down is not a failure for waiters of other
        runtimes: they look the key up again, and one of them builds it.
        """
        while True:
            outcome, found = self.cache.lookup(key)
            if not isinstance(found, Flight):  # outcome "hit": the cached value itself
                await trio.lowlevel.checkpoint()
                return found, "cache_hit"
            if outcome == "build":
                try:
                    self._send.send_nowait((found, build))
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    self.cache.complete(found, error=_Abandoned())
                    raise ClosedError("the runtime is closed") from None
            try:
                value = await found.wait()
            except _Abandoned:
                continue
            return value, "cache_miss" if outcome == "build" else "cache_coalesced"

    async def _build(self, flight: Flight[V], build: Callable[[], Awaitable[V]]) -> None:
        self.cache.note_build_started()
        try:
            async with self._limiter:
                value = await build()
        except Exception as exc:
            self.cache.complete(flight, error=exc)
        except BaseException:
            self.cache.complete(flight, error=_Abandoned())
            raise
        else:
            self.cache.complete(flight, value)
