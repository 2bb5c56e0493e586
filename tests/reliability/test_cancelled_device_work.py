"""Device work under cancellation: what a cancel scope stops and what it cannot.

Every command triodnn submits is enqueued by the submitting call itself (``enqueued_directly``
equals ``submitted``), and OpenCL cannot take back an enqueued command. So cancelling an await
stops the waiting, not the command: it completes, and the buffers it uses stay alive (a
caller's allocator gets each back only with an event after its last use). What a cancellation
does drop is the work not yet handed to OpenCL: in a graph run, every step waiting for a host
step (a handler) is never submitted, nor is anything after it.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import trio
import trio.testing

import triodnn
from triodnn import MemoryDesc, StreamFlags
from triodnn.graph import Graph, LogicalTensor, Op, compile_graph
from triodnn.ocl_interop import Allocator, make_engine

COMPLETE = cl.command_execution_status.COMPLETE


def f32(i, shape=(4, 8)):
    return LogicalTensor(i, "f32", list(shape), layout_type="strided")


def host_step_graph() -> Graph:
    """x -> ReLU -> Wildcard (a host step) -> Tanh, and that + x -> Add."""
    g = Graph("cpu")
    g.add_op(Op(0, "ReLU", [f32(0)], [f32(1)]))
    g.add_op(Op(1, "Wildcard", [f32(1)], [f32(2)]))
    g.add_op(Op(2, "Tanh", [f32(2)], [f32(3)]))
    g.add_op(Op(3, "Add", [f32(3), f32(0)], [f32(4)]))
    return g


async def test_a_cancelled_run_submits_nothing_behind_its_host_step(engine, rng):
    """A run cancelled while its host step waits: the ReLU before it was submitted (and
    completes), the Tanh and the Add after it never are; the run counts as cancelled, gives back
    every buffer once the device is done, and the next run is right."""
    entered, hold = trio.Event(), trio.Event()

    async def host_step(a):
        entered.set()
        await hold.wait()
        return a * np.float32(2)

    runner = await compile_graph(host_step_graph(), engine, policy="debug", handlers={"Wildcard": host_step})
    stream = await engine.stream(StreamFlags.out_of_order)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    baseline = engine.statistics().live_buffers
    submitted = stream.statistics().submitted
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def run():
            with scope:
                await runner.run(stream, {0: x})

        nursery.start_soon(run)
        await entered.wait()
        scope.cancel()
    assert scope.cancelled_caught
    stats = runner.statistics()
    # The upload, the ReLU and the read of its output for the host step; nothing after (and
    # ``handler_calls`` counts calls that returned).
    assert (stats.partitions_submitted, stats.handler_calls) == (1, 0)
    assert stream.statistics().submitted - submitted == 3
    assert stream.statistics().enqueued_directly == stream.statistics().submitted
    assert (stats.runs_started, stats.runs_finished, stats.runs_cancelled) == (1, 0, 1)
    await stream.wait()
    assert runner.statistics().live_buffers == 0 and engine.statistics().live_buffers == baseline

    hold.set()
    out = await runner.run(stream, {0: x})
    np.testing.assert_allclose(out[4], np.tanh(np.maximum(x, 0) * 2) + x, rtol=1e-6, atol=1e-6)
    assert runner.statistics().partitions_submitted == 4   # 1 + the whole second run's 3


async def test_an_enqueued_command_outlives_its_cancelled_awaiter(rt, rng, gate):
    """A kernel held behind a gate, its awaiter cancelled and its input released by the caller:
    the command still runs when the gate opens and computes from the input as it was; the
    caller's allocator gets the input back with an event that completes only after the kernel
    (not while it waits), and a later await of the same event returns."""
    base = await rt.engine()
    freed: list = []

    def allocate(nbytes, alignment, device, context):
        return cl.Buffer(context, cl.mem_flags.READ_WRITE, nbytes)

    def free(buffer, device, context, event):
        freed.append((buffer.int_ptr, event))

    engine = await make_engine(base.cl_device, base.cl_context, allocator=Allocator(allocate, free))
    stream = await engine.stream()
    x = rng.standard_normal(256).astype(np.float32)
    relu = await engine.create_primitive(triodnn.EltwiseDesc("relu", MemoryDesc((256,), "f32")))
    src = await engine.from_numpy(x)
    dst = engine.memory(MemoryDesc((256,), "f32"))
    src_ptr = src.cl_buffer.int_ptr
    with gate(engine.cl_context) as shut:
        event = stream.execute(relu, {"src": src, "dst": dst}, deps=[shut])
        with trio.CancelScope() as scope:
            scope.cancel()
            await event
        assert scope.cancelled_caught and not event.done
        src.release()
        await trio.testing.wait_all_tasks_blocked()
        (after,) = [event for ptr, event in freed if ptr == src_ptr]
        assert after is not None
        assert after.command_execution_status > COMPLETE     # freed "after the kernel", not now
        shut.set_status(COMPLETE)
    await event
    np.testing.assert_array_equal(await dst.to_numpy(), np.maximum(x, 0))
    await trio.to_thread.run_sync(after.wait)
    dst.release()
    assert engine.statistics().live_buffers == 0
