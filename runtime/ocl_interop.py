"""Interoperability with pyopencl objects the caller already has.

``make_engine`` wraps an existing device and context (optionally with the caller's allocator),
``make_stream`` an existing queue; the stream's commands then share that queue with the caller's
own, and ``event.cl_event`` gives the pyopencl event of any submission for use in the caller's
wait lists. ``execute`` submits a primitive or a compiled partition and returns its pyopencl
event, as oneDNN's ``ocl_interop::execute`` does.

Events returned by ``execute``
    A new ``pyopencl.Event`` object holding its own OpenCL reference (``clRetainEvent`` on the
    command's event): the caller owns it. It stays valid after the runtime closes, and its
    reference is released (``clReleaseEvent``) when the object is garbage collected; triodnn's
    own reference is separate. ``execute`` returns once the command is enqueued, not completed:
    wait for the event in a worker thread (``await trio.to_thread.run_sync(ev.wait)``), or put it
    in a wait list of the caller's own commands. Cancelling the ``await`` does not cancel the
    command, which still runs.

In-order streams
    oneDNN's C API returns no event for an in-order queue, whose order already puts the caller's
    later commands on that queue after it. triodnn returns one for every stream: OpenCL creates
    the event anyway (no extra command), and the caller needs it for everything the queue order
    does not give: a wait on another queue or context, ``set_callback``, profiling times, or a
    wait for this command alone rather than ``queue.finish()``.

Allocators
    ``make_engine(device, context, allocator=Allocator(allocate, free))``: every buffer the
    runtime allocates for that engine (``engine.memory``, ``from_numpy``, graph ``Tensor``\\ s,
    compiled partitions' temporaries, cross-engine reorder staging, the one-work-group launch
    that warms up each new kernel) comes from ``allocate(size, alignment, device, context)``,
    which returns a ``pyopencl.Buffer`` of the engine's context, of at least ``size`` bytes,
    READ_WRITE with host access (``alignment`` is the device's ``MEM_BASE_ADDR_ALIGN`` in bytes,
    which every ``cl.Buffer`` meets), or, on a device with SVM (coarse-grained buffers at
    least), any ``pyopencl.SVMPointer`` (``cl.SVMAllocation(context, size, alignment,
    cl.svm_mem_flags.READ_WRITE)``, an ``SVMPool``'s allocation) of that context and size.
    Kernels then take it as an SVM pointer and host copies use SVM memcpy; ``memory.cl_buffer``
    is an ``SvmBuffer`` wrapping it (``.allocation`` is yours), and ``free`` gets your object
    back. An SVM pointer carries neither its context nor its flags, so those are not checked.

    ``free(buffer, device, context, event)`` is called exactly once per allocation: when its
    memory object is released (``release()``, a ``with`` block, garbage collection) or, for a
    compiled partition's temporaries, right after the execution is submitted; and only once
    every command submitted on the buffer has been enqueued. ``event`` completes after the last
    of them: that command itself, a compiled partition's final event, or a marker (on a queue of
    triodnn's) waiting for several still running. It may still be running, and may end in an
    error status if such a command failed: the buffer is unused from its end either way. When
    every use has already completed it is the last one (complete); it is None when no command
    was ever enqueued on the buffer. triodnn never calls ``buffer.release()`` on an allocation;
    OpenCL itself keeps a released ``cl.Buffer`` until the commands using it finish, so a
    ``free`` that drops or releases it at once is safe; one that recycles it must wait for
    ``event`` first. Commands the caller enqueues itself on ``memory.cl_buffer`` are not
    tracked: finish them before releasing the memory.

    Both callbacks run on the trio thread, except for a program build's warm-up launch (a worker
    thread), a memory object garbage-collected after its runtime closed (whatever thread
    collects it) and a ``free`` whose marker could not be enqueued (a helper thread waits for
    the uses): keep them quick, non-blocking and thread-safe. An ``allocate`` that raises
    surfaces as ``ExecutionError`` chained to its exception from whatever needed the buffer
    (``engine.memory``, ``Tensor``, ``CompiledPartition.execute``, ``execute``; also
    ``create_primitive`` and cache-blob loads, whose warm-up failed: that build counts as failed,
    for every request coalesced on it), and nothing is left allocated. One that returns something
    unusable raises ``InvalidArgumentError`` naming ``allocator.allocate``, after handing the
    object back to ``free`` (event None). An exception from ``free`` cannot reach anyone: it is
    reported as a ``RuntimeWarning`` and the buffer counts as freed.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pyopencl as cl

from ._engine import Engine
from ._primitive import Primitive
from ._runtime import Runtime, current_runtime
from ._stream import Stream, StreamFlags
from ._values._errors import EngineMismatchError, ExecutionError, InvalidArgumentError, TriodnnError
from .actors import SvmBuffer, device_kind, list_devices
from .graph import CompiledPartition

__all__ = ["Allocator", "SvmBuffer", "execute", "make_engine", "make_stream"]


def _callable(name: str):
    def check(instance, attribute, value) -> None:
        if not callable(value):
            signature = (
                "allocate(size, alignment, device, context) -> pyopencl.Buffer or SVM allocation" if name == "allocate"
                else "free(buffer, device, context, event)"
            )
            raise InvalidArgumentError(
                f"allocator.{name} is {type(value).__name__}, expected a callable ({signature})"
            )

    return check


@attrs.frozen
class Allocator:
    """The caller's device memory allocator for an engine (oneDNN's
    ``dnnl::graph::ocl_interop::make_allocator``): ``allocate(size, alignment, device, context)
    -> pyopencl.Buffer`` and ``free(buffer, device, context, event)``; see the module docstring
    for when each is called."""

    allocate: Callable = attrs.field(validator=_callable("allocate"))
    free: Callable = attrs.field(validator=_callable("free"))


async def make_engine(
    device: cl.Device,
    context: cl.Context,
    *,
    allocator: Allocator | None = None,
    cache_blob: bytes | None = None,
    runtime: Runtime | None = None,
) -> Engine:
    """An engine on ``device`` that uses the caller's ``context`` (not a new one), allocating
    through ``allocator`` when given; ``cache_blob`` (``engine.primitive_cache_blob()``) is
    loaded into it as ``engine.load_primitive_cache_blob`` does."""
    if not isinstance(device, cl.Device):
        raise InvalidArgumentError(f"device is {type(device).__name__}, expected pyopencl.Device")
    if not isinstance(context, cl.Context):
        raise InvalidArgumentError(f"context is {type(context).__name__}, expected pyopencl.Context")
    if allocator is not None and not isinstance(allocator, Allocator):
        raise InvalidArgumentError(
            f"allocator is {type(allocator).__name__}, expected triodnn.ocl_interop.Allocator"
        )
    if cache_blob is not None and not isinstance(cache_blob, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"cache_blob is {type(cache_blob).__name__}, expected bytes")
    if device not in context.devices:
        raise EngineMismatchError(
            f"device {device.name.strip()!r} is not one of context's devices "
            f"({', '.join(d.name.strip() for d in context.devices)})"
        )
    runtime = runtime or current_runtime()
    kind = device_kind(device)
    same_kind = [r for r in list_devices() if r.kind == kind]
    index = next((r.index for r in same_kind if r.device == device), len(same_kind))
    engine = await runtime.open_engine(device, context, kind, index, allocator=allocator)
    if cache_blob is not None:
        await engine.load_primitive_cache_blob(bytes(cache_blob))
    return engine


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
    return await engine.stream_on_queue(queue, flags)


async def execute(executable, stream: Stream, *args, deps=()) -> cl.Event:
    """Submit, wait until enqueued, return the command's pyopencl event (the caller's to own).

    ``await execute(primitive, stream, args, deps=[...])`` runs as ``stream.execute`` does;
    ``await execute(compiled_partition, stream, inputs, outputs, deps=[...])`` as
    ``CompiledPartition.execute`` does (its event is the partition's final one). ``deps`` hold
    ``triodnn.Event``\\ s and ``pyopencl.Event``\\ s, of any context (a foreign one is bridged).
    Only the enqueue is awaited, never completion. A submission that fails before its enqueue
    (a failed dependency, a closed stream) raises its error here (``DependencyError``,
    ``ExecutionError``, ``ClosedError``). See the module docstring for ownership and in-order
    streams.
    """
    if not isinstance(stream, Stream):
        raise InvalidArgumentError(f"stream is {type(stream).__name__}, expected triodnn.Stream")
    if isinstance(executable, CompiledPartition):
        if len(args) != 2:
            raise InvalidArgumentError(
                f"execute(compiled_partition, stream, inputs, outputs, deps=...) takes inputs and "
                f"outputs after stream; got {len(args)} argument(s)"
            )
        event = executable.execute(stream, args[0], args[1], deps=deps)
    elif isinstance(executable, Primitive):
        if len(args) != 1:
            raise InvalidArgumentError(
                f"execute(primitive, stream, args, deps=...) takes one args dict after stream; "
                f"got {len(args)} argument(s)"
            )
        event = stream.execute(executable, args[0], deps=deps)
    else:
        raise InvalidArgumentError(
            f"executable is {type(executable).__name__}, expected triodnn.Primitive or "
            "triodnn.graph.CompiledPartition"
        )
    await event.wait_submitted()
    submission = event.submission
    if submission.native is None:
        failure = submission.failure
        kind = type(failure) if isinstance(failure, TriodnnError) else ExecutionError
        raise kind(f"{event.label}: {failure}") from failure
    # Through Event.cl_event, which flushes the queue that holds it first: the caller's own
    # queues may wait for it at once, and OpenCL requires that flush.
    return cl.Event.from_int_ptr(event.cl_event.int_ptr, retain=True)
