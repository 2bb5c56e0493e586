"""ocl_interop: engines on the caller's context, streams on the caller's queue, shared events."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest
import trio
import trio.testing
from conftest import default_record

import triodnn
from triodnn import EltwiseDesc, MemoryDesc, StreamFlags
from triodnn.kernels import eltwise, tolerance
from triodnn.ocl_interop import make_engine, make_stream

DESC = MemoryDesc((19, 23))
Q = cl.command_queue_properties
COMPLETE = cl.command_execution_status.COMPLETE


@pytest.fixture
def device():
    return default_record().device


@pytest.fixture
def context(device):
    return cl.Context([device])


async def test_make_engine_uses_the_callers_context(rt, device, context):
    engine = await make_engine(device, context, runtime=rt)
    assert engine.cl_context is context
    assert engine.cl_context.int_ptr == context.int_ptr
    assert engine.cl_device == device
    record = default_record()
    assert (engine.kind, engine.index) == (record.kind, record.index)
    assert engine.identity.context == context.int_ptr
    # Memory lives in the caller's context: pyopencl can use the buffer directly.
    memory = engine.memory(DESC)
    assert memory.cl_buffer.context.int_ptr == context.int_ptr
    # Without runtime=, the runtime of the enclosing open_runtime() block is used.
    assert triodnn.current_runtime() is rt
    assert (await make_engine(device, context)).cl_context is context


async def test_make_engine_finds_the_current_runtime(device, context):
    async with triodnn.open_runtime() as rt:
        engine = await make_engine(device, context)
        stream = await engine.stream()
        assert not rt.closed
    assert stream.closed and engine.closed


async def test_two_engines_on_one_context_share_objects(rt, device, context, rng):
    """Objects are checked by context, not by engine object: two wrappers of one context mix."""
    a = await make_engine(device, context, runtime=rt)
    b = await make_engine(device, context, runtime=rt)
    x = rng.uniform(-2, 2, DESC.dims).astype(np.float32)
    prim = await a.create_primitive(EltwiseDesc("tanh", DESC))
    src, dst = await a.from_numpy(x), b.memory(DESC)
    await (await b.stream()).execute(prim, {"src": src, "dst": dst})
    tolerance.check(await dst.to_numpy(), eltwise.reference("tanh", x), tolerance.eltwise("tanh"))


@pytest.mark.parametrize(
    "props, flags, strategy",
    [
        (0, StreamFlags.in_order, "in_order"),
        (Q.PROFILING_ENABLE, StreamFlags.in_order | StreamFlags.profiling, "in_order"),
        (Q.OUT_OF_ORDER_EXEC_MODE_ENABLE, StreamFlags.out_of_order, "native"),
        (Q.OUT_OF_ORDER_EXEC_MODE_ENABLE | Q.PROFILING_ENABLE,
         StreamFlags.out_of_order | StreamFlags.profiling, "native"),
    ],
    ids=["in_order", "profiling", "out_of_order", "out_of_order+profiling"],
)
async def test_make_stream_derives_flags_from_the_queue(rt, device, context, props, flags, strategy,
                                                        monkeypatch):
    monkeypatch.setenv("TRIODNN_OOO_STRATEGY", "lanes:4")  # the caller's queue wins over any strategy
    engine = await make_engine(device, context, runtime=rt)
    queue = cl.CommandQueue(context, device, props)
    stream = await make_stream(engine, queue)
    assert stream.flags == flags
    assert stream.strategy == strategy
    assert stream.cl_queues == (queue,)
    memory = engine.memory(DESC)
    event = stream.write(memory, np.ones(DESC.dims, np.float32))
    await event
    assert event.cl_event.command_queue == queue
    if props & Q.PROFILING_ENABLE:
        assert event.profiling.end >= event.profiling.start
    else:
        with pytest.raises(triodnn.ProfilingError):
            event.profiling


@pytest.mark.parametrize("props", [0, Q.OUT_OF_ORDER_EXEC_MODE_ENABLE], ids=["in_order", "out_of_order"])
async def test_commands_interleave_with_the_callers_own(rt, device, context, props, rng):
    """Caller copy -> triodnn kernel (dep: the caller's event) -> caller read (wait: triodnn's event)."""
    engine = await make_engine(device, context, runtime=rt)
    queue = cl.CommandQueue(context, device, props)
    stream = await make_stream(engine, queue)
    prim = await engine.create_primitive(EltwiseDesc("exp", DESC))
    x = rng.uniform(-2, 2, DESC.dims).astype(np.float32)
    src, dst = engine.memory(DESC), engine.memory(DESC)
    await src.write(np.zeros(DESC.dims, np.float32))  # what the kernel would see if it ran early
    staging = cl.Buffer(context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
    gate = cl.UserEvent(context)
    try:
        copied = cl.enqueue_copy(queue, src.cl_buffer, staging, wait_for=[gate])
        ran = stream.execute(prim, {"src": src, "dst": dst}, deps=[copied])
        await ran.wait_submitted()
        out = np.empty(DESC.dims, np.float32)
        read = cl.enqueue_copy(queue, out, dst.cl_buffer, wait_for=[ran.cl_event], is_blocking=False)
        await trio.testing.wait_all_tasks_blocked()
        assert not ran.done
        assert read.command_execution_status > COMPLETE
    finally:
        gate.set_status(COMPLETE)
    await ran
    await trio.to_thread.run_sync(read.wait)
    tolerance.check(out, eltwise.reference("exp", x), tolerance.eltwise("exp"))


async def test_callers_commands_after_a_triodnn_one_see_its_result(rt, device, context, rng):
    """On an in-order caller queue no event is needed: the caller's later commands run after ours."""
    engine = await make_engine(device, context, runtime=rt)
    queue = cl.CommandQueue(context, device)
    stream = await make_stream(engine, queue)
    prim = await engine.create_primitive(EltwiseDesc("square", DESC))
    x = rng.uniform(-2, 2, DESC.dims).astype(np.float32)
    src, dst = await engine.from_numpy(x), engine.memory(DESC)
    ran = stream.execute(prim, {"src": src, "dst": dst})
    await ran.wait_submitted()
    out = np.empty(DESC.dims, np.float32)
    read = cl.enqueue_copy(queue, out, dst.cl_buffer, is_blocking=False)
    await trio.to_thread.run_sync(read.wait)
    assert ran.done
    tolerance.check(out, eltwise.reference("square", x), tolerance.eltwise("square"))
