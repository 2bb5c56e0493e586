"""Whether one OpenCL context still works: the device actor's record of a lost device.

OpenCL has no "device lost" event. A kernel that faults on NVIDIA leaves its context broken for
good (CUDA's sticky errors): every later command fails, with ``CL_OUT_OF_RESOURCES`` at enqueue
or a negative execution status. The same codes also come from one bad launch on a healthy
device (a work-group too large for the kernel's registers). So one failure proves nothing: after
any enqueue that raises, and any command that ends with an error, the context is *probed* with a
fresh queue writing four bytes into a fresh buffer. A probe that fails marks the context lost:
its streams, allocations and primitive creations then raise ``DeviceLostError`` at the call,
naming the first failure, and other engines and the runtime go on. A probe that passes leaves
the engine as it was; the failed command has failed alone.

Probes run in a worker thread of the device actor's nursery, at most one at a time, so a
burst of failures (every dependent of a faulted kernel fails too) costs one probe; a driver that
blocks in the probe blocks that thread, never the trio thread.
"""

from __future__ import annotations

import threading
import weakref
from typing import Protocol

import numpy as np
import pyopencl as cl
import trio

from .._values._errors import DeviceLostError


def probe_context(context: cl.Context, device: cl.Device) -> str | None:
    """None when ``context`` can still run a command on ``device``, else what failed.

    A blocking 4-byte write through a new queue into a new buffer: the cheapest command that
    reaches the device itself (a marker may complete in the driver alone). Tests replace this
    function to play a lost device."""
    try:
        queue = cl.CommandQueue(context, device)
        buffer = cl.Buffer(context, cl.mem_flags.READ_WRITE, 4)
        cl.enqueue_copy(queue, buffer, np.zeros(1, np.float32), is_blocking=True)
        queue.finish()
    except cl.Error as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


class Losable(Protocol):
    """What a device's health tells each stream actor of the device when it is lost."""

    def lose(self, error: DeviceLostError) -> None: ...


class DeviceHealth:
    """The health of one context on one device (``name`` says which, for messages)."""

    def __init__(self, context: cl.Context, device: cl.Device, name: str) -> None:
        self._context = context
        self._device = device
        self.name = name
        self.lost: DeviceLostError | None = None
        self.probes = 0  # probes run (statistics: a burst of failures should cost one)
        self._first_failure: str | None = None
        self._probing: trio.Event | None = None
        self._nursery: trio.Nursery | None = None
        self._thread: int | None = None
        self._watchers: weakref.WeakSet = weakref.WeakSet()

    def run_probes_in(self, nursery: trio.Nursery | None) -> None:
        """Probe in ``nursery`` (the device actor's, from its trio thread); None once it has
        closed."""
        self._nursery = nursery
        self._thread = threading.get_ident() if nursery is not None else None

    def watch(self, actor: Losable) -> None:
        """Tell ``actor`` (a stream actor on this context) when the context is lost."""
        self._watchers.add(actor)
        if self.lost is not None:
            actor.lose(self.lost)

    def refuse(self, doing: str) -> None:
        """``DeviceLostError`` naming ``doing`` when the context is lost; otherwise nothing."""
        if self.lost is not None:
            raise DeviceLostError(f"{doing}: {self.lost}")

    def suspect(self, failure: str) -> None:
        """A command failed with ``failure``: probe the context soon (from the trio thread; a
        probe already running or a context already lost makes this a no-op; so does a call from
        another thread, which cannot start a task: the next failure seen on the trio thread, or
        ``check``, probes)."""
        if self.lost is not None or self._probing is not None or self._nursery is None:
            return
        if threading.get_ident() != self._thread:
            return
        self._first_failure = failure
        self._probing = trio.Event()
        try:
            self._nursery.start_soon(self._probe)
        except RuntimeError:  # the device actor's nursery is closing: the runtime is shutting down
            self._probing = None

    @property
    def probing(self) -> bool:
        return self._probing is not None

    async def settled(self) -> None:
        """Return once no probe is running (at once when none is)."""
        if self._probing is not None:
            await self._probing.wait()

    async def check(self) -> None:
        """Probe now (or join the probe under way); ``DeviceLostError`` if the context is lost."""
        if self.lost is None:
            if self._probing is None:
                self._probing = trio.Event()
                await self._probe()
            else:
                await self._probing.wait()
        self.refuse(f"{self.name} was checked")

    async def _probe(self) -> None:
        probing = self._probing
        assert probing is not None, "set by the caller before the probe starts"
        try:
            self.probes += 1
            problem = await trio.to_thread.run_sync(probe_context, self._context, self._device)
            if problem is not None:
                cause = f" after {self._first_failure}" if self._first_failure else ""
                self.mark_lost(f"the device of {self.name} is lost{cause}; a probe failed with {problem}")
        finally:
            self._probing = None
            probing.set()

    def mark_lost(self, reason: str) -> None:
        if self.lost is None:
            self.lost = DeviceLostError(reason)
            for actor in list(self._watchers):
                actor.lose(self.lost)
