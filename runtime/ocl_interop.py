"""Interoperability with pyopencl objects the caller already has.

``make_engine`` wraps an existing device and context, ``make_stream`` an existing queue; the
stream's commands then share that queue with the caller's own, and ``event.cl_event`` gives the
pyopencl event of any submission for use in the caller's wait lists.
"""

from __future__ import annotations

import pyopencl as cl

from ._engine import Engine
from ._errors import EngineMismatchError, InvalidArgumentError
from ._runtime import Runtime, current_runtime
from ._stream import Stream, StreamFlags
from .actors import device_kind, list_devices

__all__ = ["make_engine", "make_stream"]


async def make_engine(device: cl.Device, context: cl.Context, *, runtime: Runtime | None = None) -> Engine:
    """An engine on ``device`` that uses the caller's ``context`` (not a new one)."""
    if not isinstance(device, cl.Device):
        raise InvalidArgumentError(f"device is {type(device).__name__}, expected pyopencl.Device")
    if not isinstance(context, cl.Context):
        raise InvalidArgumentError(f"context is {type(context).__name__}, expected pyopencl.Context")
    if device not in context.devices:
        raise EngineMismatchError(
            f"device {device.name.strip()!r} is not one of context's devices "
            f"({', '.join(d.name.strip() for d in context.devices)})"
        )
    runtime = runtime or current_runtime()
    kind = device_kind(device)
    same_kind = [r for r in list_devices() if r.kind == kind]
    index = next((r.index for r in same_kind if r.device == device), len(same_kind))
    return await runtime._open_engine(device, context, kind, index)


async def make_stream(engine: Engine, queue: cl.CommandQueue) -> Stream:
    """A stream that submits into the caller's ``queue``; flags follow the queue's properties."""
    if not isinstance(engine, Engine):
        raise InvalidArgumentError(f"engine is {type(engine).__name__}, expected triodnn.Engine")
    if not isinstance(queue, cl.CommandQueue):
        raise InvalidArgumentError(f"queue is {type(queue).__name__}, expected pyopencl.CommandQueue")
    if queue.context.int_ptr != engine.cl_context.int_ptr:
        raise EngineMismatchError(f"queue belongs to another OpenCL context than engine {engine}")
    if queue.device.int_ptr != engine.cl_device.int_ptr:
        raise EngineMismatchError(
            f"queue is on device {queue.device.name.strip()!r}, engine {engine} is not"
        )
    props = queue.properties
    flags = (
        StreamFlags.out_of_order
        if props & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
        else StreamFlags.in_order
    )
    if props & cl.command_queue_properties.PROFILING_ENABLE:
        flags |= StreamFlags.profiling
    return await engine._runtime._open_stream(engine, flags, queue=queue)
