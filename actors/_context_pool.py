"""Idle OpenCL contexts of CPU devices, kept for the process's next engine on the same device.

PoCL gives every context an LLVM context of its own and loads its built-in library into it at
the context's first build. Measured on this project's 2-vCPU VM (PoCL 3.0-rc2, a one-line
kernel, PoCL's kernel cache empty): the first build in a fresh context takes 0.91-1.0 s, each
later build in the same context 0.31 s; a second and a third idle context added 1 MiB of RSS.
A process that opens engines one after another (a runtime per notebook cell, Dask task or test;
the float16 probe's context before the first engine) paid the 0.6 s once per context.

So the contexts of engines whose runtime has closed come back here, healthy ones only, and the
next engine on the device takes one instead of creating another. Engines open at the same time
still get a context each: a context is either idle here or lent to exactly one engine.

``TRIODNN_IDLE_CONTEXTS`` (read once, at import) sets how many idle contexts a device keeps:
2 unless set; 0 keeps none, so each runtime's contexts go when it closes.

GPU contexts are not kept: each holds device memory and counts against the driver's limit
(NVIDIA's: about 100 per GPU across processes), and the reuse was measured on CPUs only. A
caller's own context (``ocl_interop.make_engine``) never comes here either.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

import attrs
import pyopencl as cl

IDLE_CONTEXTS_ENV = "TRIODNN_IDLE_CONTEXTS"
DEFAULT_IDLE_PER_DEVICE = 2


def idle_per_device_from_env(environ: Mapping[str, str] = os.environ) -> int:
    """``TRIODNN_IDLE_CONTEXTS`` as a non-negative integer, else 2."""
    try:
        count = int(environ.get(IDLE_CONTEXTS_ENV, DEFAULT_IDLE_PER_DEVICE))
    except ValueError:
        return DEFAULT_IDLE_PER_DEVICE
    return count if count >= 0 else DEFAULT_IDLE_PER_DEVICE


@attrs.frozen
class ContextPoolStatistics:
    """``idle``: contexts waiting for an engine; ``reused``: engines (and probes) that took an
    idle context; ``created``: contexts this pool's ``open_context`` had to create."""

    idle: int
    reused: int
    created: int


class ContextPool:
    """Idle contexts by device, at most ``idle_per_device`` each, for this process only."""

    def __init__(self, idle_per_device: int = DEFAULT_IDLE_PER_DEVICE) -> None:
        self._lock = threading.Lock()
        self._idle_per_device = idle_per_device
        self._idle: dict[int, list[cl.Context]] = {}
        self._pid = os.getpid()
        self._reused = self._created = 0

    def open_context(self, device: cl.Device) -> cl.Context:
        """An idle context of ``device`` if one is kept, else a new one (blocking: creating a
        context can take a driver's whole initialisation; call it from a worker thread)."""
        with self._lock:
            self._forget_after_fork_locked()
            idle = self._idle.get(device.int_ptr)
            if idle:
                self._reused += 1
                return idle.pop()
        context = cl.Context([device])
        with self._lock:
            self._created += 1
        return context

    def keep(self, device: cl.Device, context: cl.Context) -> bool:
        """Offer a context no engine uses any more; False when it is not kept (not a CPU
        device's, or the device already has ``idle_per_device`` idle ones) and simply goes."""
        if not device.type & cl.device_type.CPU:
            return False
        with self._lock:
            self._forget_after_fork_locked()
            idle = self._idle.setdefault(device.int_ptr, [])
            if len(idle) >= self._idle_per_device or any(c.int_ptr == context.int_ptr for c in idle):
                return False
            idle.append(context)
            return True

    def release_idle(self) -> int:
        """Let every idle context go (the driver frees them once nothing else holds them);
        returns how many went."""
        with self._lock:
            count = sum(len(idle) for idle in self._idle.values())
            self._idle.clear()
        return count

    def idle_count(self, device: cl.Device) -> int:
        """How many idle contexts ``device`` has here."""
        with self._lock:
            return len(self._idle.get(device.int_ptr, ()))

    def statistics(self) -> ContextPoolStatistics:
        with self._lock:
            return ContextPoolStatistics(
                sum(len(idle) for idle in self._idle.values()), self._reused, self._created
            )

    def _forget_after_fork_locked(self) -> None:
        # A forked child inherits the parent's handles, which its driver cannot use; releasing
        # them there would call into that driver too. They stay referenced and unused.
        if self._pid != os.getpid():
            _inherited.extend(context for idle in self._idle.values() for context in idle)
            self._idle.clear()
            self._pid = os.getpid()


_inherited: list[cl.Context] = []
_pool = ContextPool(idle_per_device_from_env())


def context_pool() -> ContextPool:
    """The process's pool of idle CPU contexts."""
    return _pool
