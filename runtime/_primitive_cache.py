"""The public face of the process-global primitive cache (oneDNN's capacity API, plus statistics)."""

from __future__ import annotations

from .actors import PrimitiveCacheStatistics, global_primitive_cache

__all__ = [
    "PrimitiveCacheStatistics",
    "get_primitive_cache_capacity",
    "primitive_cache_statistics",
    "set_primitive_cache_capacity",
]


def get_primitive_cache_capacity() -> int:
    """Entries the cache keeps: ``set_primitive_cache_capacity``'s value, else the first of
    ``TRIODNN_PRIMITIVE_CACHE_CAPACITY``, ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``,
    ``DNNL_PRIMITIVE_CACHE_CAPACITY`` read at first use, else 1024."""
    return global_primitive_cache().capacity


def set_primitive_cache_capacity(capacity: int) -> None:
    """Lowering evicts least recently used entries; 0 empties the cache and disables it.
    A negative or non-integer capacity raises ``InvalidArgumentError``."""
    global_primitive_cache().set_capacity(capacity)


def primitive_cache_statistics() -> PrimitiveCacheStatistics:
    """Size, capacity, hits, misses, evictions, coalesced waits, builds in flight, failed builds."""
    return global_primitive_cache().statistics()
