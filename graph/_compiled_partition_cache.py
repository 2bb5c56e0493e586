"""The process-global compiled-partition cache: oneDNN Graph's capacity API, statistics, and the
look-up ``Partition.compile`` goes through.

It is the primitive cache's machinery (``PrimitiveCache`` and each runtime's ``CacheActor``) on a
second cache: concurrent compiles of one key, from any task or trio run, share one compile; a
failed compile reaches every waiter and leaves nothing cached; a cancelled requester does not
cancel the compile, which runs in the runtime's actor nursery. Entries are engine-bound, so they
leave the cache when their runtime shuts down.

The cache itself (an LRU of shared builds) and each runtime's actor live below the graph layer,
in ``triodnn.actors``, since the runtime owns the actor; what is about partitions lives here:
the key (``CompiledPartitionKey``), the capacity API and the look-up.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs

from .._engine import Engine
from .._values._errors import InvalidArgumentError
from ..actors import CompiledPartitionCacheStatistics, global_compiled_partition_cache
from ._compiled_partition import CompiledPartition
from ._compiled_partition_key import CompiledPartitionKey
from ._logical_tensor import LogicalTensor

if TYPE_CHECKING:
    # Annotations only: ``Partition.compile`` calls into this module.
    from ._partition import Partition

__all__ = [
    "CompiledPartitionCacheStatistics",
    "compiled_partition_cache_statistics",
    "get_compiled_partition_cache_capacity",
    "set_compiled_partition_cache_capacity",
]


def get_compiled_partition_cache_capacity() -> int:
    """Compiled partitions the cache keeps: ``set_compiled_partition_cache_capacity``'s value,
    else the first of ``TRIODNN_COMPILED_PARTITION_CACHE_CAPACITY``,
    ``ONEDNN_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY``,
    ``DNNL_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY`` read at first use, else 1024."""
    return global_compiled_partition_cache().capacity


def set_compiled_partition_cache_capacity(capacity: int) -> None:
    """Lowering evicts least recently used entries; 0 empties the cache and disables it.
    A negative or non-integer capacity raises ``InvalidArgumentError``."""
    global_compiled_partition_cache().set_capacity(capacity)


def compiled_partition_cache_statistics() -> CompiledPartitionCacheStatistics:
    """Size, capacity, hits, misses, evictions, coalesced waits, compiles in flight, failed ones."""
    return global_compiled_partition_cache().statistics()


async def compile_cached(partition: Partition, engine: Engine, inputs: list[LogicalTensor],
                         outputs: list[LogicalTensor], shapes: dict,
                         compile_partition: Callable[..., Awaitable[CompiledPartition]]) -> CompiledPartition:
    """``compile_partition(partition, engine, inputs, outputs, shapes)`` through the cache.

    A hit returns the cached ``CompiledPartition`` itself when ``partition`` compiled it, and a
    copy sharing its plan and primitives, whose ``partition`` is the caller's, when an equivalent
    partition (another graph's, equal key) did.
    """
    if not isinstance(engine, Engine):
        raise InvalidArgumentError(f"engine is {type(engine).__name__}, expected triodnn.Engine")
    engine.check_thread(f"partition {partition.id}", f"compiled for engine {engine}")
    key = CompiledPartitionKey.of(partition, engine, inputs, outputs)
    actor = engine.partition_cache
    build = functools.partial(
        _compile, compile_partition, partition, engine, list(inputs), list(outputs), shapes
    )
    compiled: CompiledPartition  # the cache's entries (typed Any below the graph layer)
    while True:
        compiled, _how = await actor.get(key, build)
        if not compiled.engine.closed:
            break
        # Compiled on an engine of this context that has closed since: compile again here.
        actor.cache.discard(key, compiled)
    if compiled.partition is not partition:
        compiled = attrs.evolve(compiled, partition=partition)
    return compiled


async def _compile(compile_partition, *args) -> CompiledPartition:
    """``compile_partition(*args)``; a failure of one of its concurrent primitive creations comes
    out of trio's nursery as a group of one: raise that one, so waiters get its typed error."""
    try:
        return await compile_partition(*args)
    except Exception as exc:
        error: BaseException = exc
        while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
            error = error.exceptions[0]
        if error is exc or not isinstance(error, Exception):
            raise
    raise error
