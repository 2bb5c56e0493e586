"""The kernel-cache role of a device actor: per-context resources of cached primitives.

Resources are kept by primitive cache key: a cache hit on this engine is then a dictionary
lookup, a hit from another context one load from binary (shared by concurrent requesters).
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import attrs

from .._values._errors import ClosedError, TriodnnError
from ._compiler import BuildRequest, BuiltKernel, Compiler
from ._reply import ReplySlot


@attrs.define(eq=False)
class _ResourceLoad:
    """Reply slot of a load from binary: ends the cache's load of ``key`` (``loads``) and keeps its
    result with ``remember``, the cache's own."""

    loads: dict[object, ReplySlot]
    remember: Callable[[object, BuiltKernel], None]
    key: object
    slot: ReplySlot

    def set_value(self, built: BuiltKernel) -> None:
        del self.loads[self.key]
        self.remember(self.key, built)
        self.slot.set_value(built)

    def set_error(self, error: BaseException) -> None:
        del self.loads[self.key]
        self.slot.set_error(error)


class KernelCache:
    """This engine's kernels by primitive cache key; loads go through ``compiler``."""

    def __init__(self, compiler: Compiler, capacity: Callable[[], int] = lambda: 1024) -> None:
        self._compiler = compiler
        self._resources: collections.OrderedDict[object, BuiltKernel] = collections.OrderedDict()
        self._loads: dict[object, ReplySlot] = {}
        self._graveyard: list[BuiltKernel] = []
        # LRU-bounded like the primitive cache, whose capacity it follows (a callable, so a
        # change of capacity applies at the next insertion).
        self._capacity = capacity
        compiler.on_build_end(self._bury_if_idle)

    def __len__(self) -> int:
        return len(self._resources)

    async def get(self, key, make_load: Callable[[], BuildRequest]) -> BuiltKernel:
        """This engine's kernel for ``key``: kept, being loaded, or loaded now from ``make_load()``
        (called only then: a hit builds no request).

        Concurrent requests for one key share one load, which runs in the actor's nursery: a
        requester that is cancelled stops waiting, the load goes on for the others.
        """
        built = self._resources.get(key)
        if built is not None:
            self._resources.move_to_end(key)
            return built  # no checkpoint: the caller's cache lookup made one
        slot = self._loads.get(key)
        if slot is None:
            request = make_load()
            slot = self._loads[key] = ReplySlot()
            try:
                self._compiler.submit(request, _ResourceLoad(self._loads, self._remember, key, slot))
            except ClosedError:
                del self._loads[key]
                raise
        try:
            return await slot.get()
        except TriodnnError as exc:
            raise type(exc)(str(exc)) from exc  # a fresh exception for each waiter

    def adopt(self, key, built: BuiltKernel) -> BuiltKernel:
        """Keep ``built`` as this engine's resources for cache key ``key`` (the first one wins);
        returns the one kept."""
        kept = self._resources.get(key)
        if kept is not None:
            self._graveyard.append(built)  # released later, see _bury_if_idle
            self._bury_if_idle()
            return kept
        self._remember(key, built)
        return built

    def _remember(self, key, built: BuiltKernel) -> None:
        self._resources[key] = built
        self._resources.move_to_end(key)
        while len(self._resources) > self._capacity():
            self._graveyard.append(self._resources.popitem(last=False)[1])
        self._bury_if_idle()

    def _bury_if_idle(self) -> None:
        # Releasing a program while PoCL compiles another blocks in clReleaseProgram with the
        # GIL held (75-105 ms measured): drop unused resources only when no build runs here.
        if self._graveyard and not self._compiler.builds_in_flight:
            self._graveyard.clear()
