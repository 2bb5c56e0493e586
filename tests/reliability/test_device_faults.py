"""Device faults, injected where triodnn meets OpenCL: an enqueue the driver refuses, an
allocation it cannot satisfy, a context that stops working mid-run (a kernel fault on NVIDIA
breaks its context for good). Each gives a typed error at the call or at the await; a lost
device refuses everything afterwards with ``DeviceLostError``, while another engine and the
runtime go on; nothing hangs, no buffer is left counted.

The fakes stand in for pyopencl's entry points (``enqueue_nd_range_kernel``, the allocator's
``new_buffer``) and for the health probe (``probe_context``), so the same tests run on every
device: a real fault would kill a CPU runtime's process (a wild write in PoCL is a segfault).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl
import pytest
import trio

import triodnn
from triodnn import DeviceLostError, ExecutionError, MemoryDesc, OutOfMemoryError, StreamFlags
from triodnn.actors import _allocator, _health
from triodnn.graph import Graph, LogicalTensor, Op, compile_graph

OUT_OF_RESOURCES = cl.status_code.OUT_OF_RESOURCES


def cl_error(kind: type[cl.Error], code: int, routine: str) -> cl.Error:
    return kind(cl._cl._ErrorRecord(msg="injected", code=code, routine=routine))


def relu_desc(shape=(64,)):
    desc = MemoryDesc(shape, "f32")
    return triodnn.EltwiseDesc("relu", desc)


def refuse_enqueues(monkeypatch, context: cl.Context, *, times: float = float("inf")) -> list:
    """Kernel enqueues on ``context``'s queues raise OUT_OF_RESOURCES (the first ``times``
    of them); the list collects each refusal."""
    real = cl.enqueue_nd_range_kernel
    refused: list = []

    def enqueue(queue, kernel, global_size, local_size, *args, **kwargs):
        if queue.context.int_ptr == context.int_ptr and len(refused) < times:
            refused.append(kernel.function_name)
            raise cl_error(cl.RuntimeError, OUT_OF_RESOURCES, "clEnqueueNDRangeKernel")
        return real(queue, kernel, global_size, local_size, *args, **kwargs)

    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", enqueue)
    return refused


def lose_context(monkeypatch, context: cl.Context) -> list:
    """The health probe fails for ``context`` (as on a context a kernel fault broke) and works
    for every other; the list collects the probed contexts."""
    real = _health.probe_context
    probed: list = []

    def probe(ctx, device):
        probed.append(ctx.int_ptr)
        if ctx.int_ptr == context.int_ptr:
            return "RuntimeError: clEnqueueWriteBuffer failed: OUT_OF_RESOURCES (injected)"
        return real(ctx, device)

    monkeypatch.setattr(_health, "probe_context", probe)
    return probed


async def relu_on(engine, stream, x):
    primitive = await engine.create_primitive(relu_desc(x.shape))
    src = await engine.from_numpy(x)
    dst = engine.memory(MemoryDesc(x.shape, "f32"))
    await stream.execute(primitive, {"src": src, "dst": dst})
    out = await dst.to_numpy()
    src.release()
    dst.release()
    return out


async def test_a_refused_enqueue_fails_that_command_alone(engine, rng, monkeypatch):
    """OUT_OF_RESOURCES at one enqueue (a launch the device cannot take, on a working device):
    that command's event raises ``ExecutionError`` naming the command and the code, one probe
    finds the device working, and the next command on the same stream runs right."""
    stream = await engine.stream()
    x = rng.standard_normal(64).astype(np.float32)
    primitive = await engine.create_primitive(relu_desc())
    src, dst = await engine.from_numpy(x), engine.memory(MemoryDesc((64,), "f32"))
    live = engine.statistics().live_buffers
    refused = refuse_enqueues(monkeypatch, engine.cl_context, times=1)
    event = stream.execute(primitive, {"src": src, "dst": dst})
    with pytest.raises(ExecutionError, match="OUT_OF_RESOURCES") as info:
        await event                              # after the probe the failure started
    assert primitive.label in str(info.value) and not isinstance(info.value, DeviceLostError)
    assert engine.lost is None and engine.health.probes == 1 and len(refused) == 1
    await stream.execute(primitive, {"src": src, "dst": dst})
    np.testing.assert_array_equal(await dst.to_numpy(), np.maximum(x, 0))
    src.release()
    dst.release()
    assert engine.statistics().live_buffers == live - 2


async def test_a_lost_device_refuses_everything_and_other_engines_go_on(rt, engine, rng, monkeypatch):
    """A context whose enqueues fail and whose probe fails is lost: the failing command raises
    ``ExecutionError``, then every submission, allocation, stream and primitive creation on
    that engine raises ``DeviceLostError`` naming the first failure. A second engine on the same
    device (its own context) keeps computing right, buffers of the lost engine still release,
    and the runtime closes (the fixture's exit) without hanging."""
    other = await rt.engine()
    stream = await engine.stream(StreamFlags.out_of_order)
    x = rng.standard_normal(64).astype(np.float32)
    primitive = await engine.create_primitive(relu_desc())
    src, dst = await engine.from_numpy(x), engine.memory(MemoryDesc((64,), "f32"))
    live = engine.statistics().live_buffers
    refuse_enqueues(monkeypatch, engine.cl_context)
    probed = lose_context(monkeypatch, engine.cl_context)

    event = stream.execute(primitive, {"src": src, "dst": dst})
    with pytest.raises(DeviceLostError, match="OUT_OF_RESOURCES") as lost:
        await event                              # the failure's probe found the device lost
    assert engine.lost is not None and probed == [engine.cl_context.int_ptr]
    assert engine.health.name in str(lost.value) and primitive.label in str(lost.value)
    with pytest.raises(DeviceLostError, match="OUT_OF_RESOURCES"):
        await engine.check_device()              # no second probe: lost is for good
    assert probed == [engine.cl_context.int_ptr]

    with pytest.raises(DeviceLostError):
        stream.execute(primitive, {"src": src, "dst": dst})
    with pytest.raises(DeviceLostError):
        stream.write(src, x)
    with pytest.raises(DeviceLostError):
        stream.marker()
    with pytest.raises(DeviceLostError):
        engine.memory(MemoryDesc((64,), "f32"))
    with pytest.raises(DeviceLostError):
        await engine.create_primitive(triodnn.EltwiseDesc("abs", MemoryDesc((64,), "f32")))
    late = await engine.stream()                 # a stream opened after the loss refuses too
    with pytest.raises(DeviceLostError):
        late.execute(primitive, {"src": src, "dst": dst})
    assert stream.closed and late.closed
    src.release()
    dst.release()
    assert engine.statistics().live_buffers == live - 2

    np.testing.assert_array_equal(await relu_on(other, await other.stream(), x), np.maximum(x, 0))
    assert other.lost is None
    await other.check_device()
    assert probed == [engine.cl_context.int_ptr, other.cl_context.int_ptr]


def four_partition_graph() -> Graph:
    def f32(i, shape):
        return LogicalTensor(i, "f32", shape, layout_type="strided")

    g = Graph("cpu")
    g.add_op(Op(0, "ReLU", [f32(0, [4, 8])], [f32(1, [4, 8])]))
    g.add_op(Op(1, "Tanh", [f32(1, [4, 8])], [f32(2, [4, 8])]))
    g.add_op(Op(2, "Abs", [f32(0, [4, 8])], [f32(3, [4, 8])]))
    g.add_op(Op(3, "Add", [f32(2, [4, 8]), f32(3, [4, 8])], [f32(4, [4, 8])]))
    return g


@pytest.mark.parametrize("path", ["one command", "partition by partition", "general"])
async def test_a_device_lost_mid_run_fails_the_run_and_frees_its_buffers(engine, rng, monkeypatch, path):
    """A graph run during which the context breaks: the run raises ``DeviceLostError`` (the
    probe its failed enqueue started has found the device lost), the runner holds no buffer of
    a run afterwards (those it keeps between requests go with ``release_request_buffers``) and
    counts the run neither finished nor cancelled, and the next run is refused with
    ``DeviceLostError`` too. Paths: the recorded request, the straight line a trace sees, and
    the general one (Tensor outputs)."""
    runner = await compile_graph(four_partition_graph(), engine, policy="debug")   # four partitions
    x = rng.standard_normal((4, 8)).astype(np.float32)
    before = engine.statistics().live_buffers
    with contextlib.ExitStack() as watched:
        if path == "partition by partition":
            watched.enter_context(triodnn.trace.record())
        stream = await engine.stream(StreamFlags.out_of_order)
        await runner.run(stream, {0: x})
        refuse_enqueues(monkeypatch, engine.cl_context)
        lose_context(monkeypatch, engine.cl_context)
        with pytest.raises(DeviceLostError):
            await runner.run(stream, {0: x}, as_tensors=path == "general")
    assert engine.lost is not None
    with pytest.raises(DeviceLostError):
        await runner.run(stream, {0: x})
    stats = runner.statistics()
    assert stats.request_buffers == (0 if path == "partition by partition" else 5)  # the first run's set
    assert stats.live_buffers == 0 and engine.statistics().live_buffers == before + stats.request_buffers
    runner.release_request_buffers()
    assert engine.statistics().live_buffers == before
    assert (stats.runs_started, stats.runs_finished, stats.runs_cancelled) == (stats.runs_started, 1, 0)


async def test_an_allocation_the_device_refuses_is_typed_and_leaves_nothing(engine, rng, monkeypatch):
    """``MEM_OBJECT_ALLOCATION_FAILURE`` from the driver: ``engine.memory`` raises
    ``OutOfMemoryError`` (a ``MemoryError`` too) naming the size and counts nothing; a graph
    run whose third allocation fails raises it and gives back the two it made; the device is
    probed, found working, and the next run is right."""
    runner = await compile_graph(four_partition_graph(), engine, policy="debug")
    stream = await engine.stream()
    x = rng.standard_normal((4, 8)).astype(np.float32)
    expected = await runner.run(stream, {0: x})
    runner.release_request_buffers()      # the next run makes its buffer set anew
    before = engine.statistics().live_buffers
    real = _allocator.new_buffer
    calls = []

    def refuse_third(context, nbytes):
        calls.append(nbytes)
        if len(calls) == 3:
            raise cl_error(cl.MemoryError, cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE, "clCreateBuffer")
        return real(context, nbytes)

    monkeypatch.setattr(_allocator, "new_buffer", refuse_third)
    with pytest.raises(OutOfMemoryError, match="128 bytes") as info:
        await runner.run(stream, {0: x})
    assert isinstance(info.value, MemoryError) and len(calls) == 3
    await stream.wait()
    assert engine.statistics().live_buffers == before and runner.statistics().request_buffers == 0

    calls[:] = [0, 0]                            # the next allocation is the third: refused
    with pytest.raises(OutOfMemoryError, match="4096 bytes"):
        engine.memory(MemoryDesc((1024,), "f32"))
    assert engine.statistics().live_buffers == before
    await engine.check_device()
    assert engine.lost is None
    again = await runner.run(stream, {0: x})
    np.testing.assert_array_equal(again[4], expected[4])


async def test_a_user_allocator_out_of_memory_is_typed(rt, rng):
    """A caller's allocator raising ``MemoryError`` gives ``OutOfMemoryError`` naming the call;
    nothing is counted and the engine goes on."""
    from_allocator = []

    def allocate(nbytes, alignment, device, context):
        if from_allocator:
            raise MemoryError("pool exhausted")
        from_allocator.append(nbytes)
        return cl.Buffer(context, cl.mem_flags.READ_WRITE, nbytes)

    def free(buffer, device, context, event):
        pass

    base = await rt.engine()
    engine = await triodnn.ocl_interop.make_engine(
        base.cl_device, base.cl_context, allocator=triodnn.ocl_interop.Allocator(allocate, free))
    first = engine.memory(MemoryDesc((16,), "f32"))
    with pytest.raises(OutOfMemoryError, match="pool exhausted"):
        engine.memory(MemoryDesc((16,), "f32"))
    assert engine.statistics().live_buffers == 1
    first.release()
    assert engine.statistics().live_buffers == 0


async def test_a_command_the_device_fails_starts_a_probe(engine, rng, monkeypatch, gate):
    """A command that ends with a negative execution status (here: its dependency, a user event,
    failed) starts a probe; when that probe fails, the await raises ``DeviceLostError``. Intel's
    CPU runtime runs such a command anyway (it then fails as a ``DependencyError`` from
    triodnn's own check, with no device failure to probe)."""
    stream = await engine.stream()
    x = rng.standard_normal(64).astype(np.float32)
    primitive = await engine.create_primitive(relu_desc())
    src, dst = await engine.from_numpy(x), engine.memory(MemoryDesc((64,), "f32"))
    probed = lose_context(monkeypatch, engine.cl_context)
    with gate(engine.cl_context) as shut:
        event = stream.execute(primitive, {"src": src, "dst": dst}, deps=[shut])
        shut.set_status(-1)
    status = await trio.to_thread.run_sync(_final_status, event.cl_event)
    if status < 0:                               # PoCL, NVIDIA: the driver failed the command
        with pytest.raises(DeviceLostError, match="execution status"):
            await event
        assert probed == [engine.cl_context.int_ptr] and engine.lost is not None
    else:                                        # Intel's CPU runtime ran it
        with pytest.raises(triodnn.DependencyError):
            await event
        assert probed == [] and engine.lost is None


def _final_status(cl_event: cl.Event) -> int:
    try:
        cl.wait_for_events([cl_event])
    except cl.Error:
        pass  # a failed command: its status says so
    return cl_event.command_execution_status


@pytest.mark.gpu
def test_a_real_kernel_fault_loses_that_engine_only():
    """On an NVIDIA GPU, a kernel that writes 4 TiB past its buffer (in a child process) breaks
    its engine's context: triodnn's next command there fails, the probe fails, the engine is
    lost and refuses allocations, a second engine on the same GPU answers with a typed error
    or a right result (never a crash), and the runtime closes."""
    child = Path(__file__).with_name("gpu_fault_child.py")
    done = subprocess.run([sys.executable, str(child), "gpu:0"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["before"] and report["wild"] != "finished", report
    assert (report["after"], report["lost"], report["memory"]) == ("DeviceLostError", True, "DeviceLostError"), report
    # Measured on an H200 (driver 580): the fault breaks every context of the GPU in the
    # process, so a second engine there fails too, typed; the runtime still closes.
    assert report["other"] == "right" or report["other"].split(":")[0] in {
        "BuildError", "ExecutionError", "DeviceLostError"}, report
    assert report["closed"], report
