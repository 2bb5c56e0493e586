"""Bad input: every case raises a typed error naming the culprit, nothing hangs, nothing leaks."""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import textwrap

import numpy as np
import pyopencl as cl
import pytest
import trio
import trio.testing

import triodnn
from triodnn import (
    ArgumentMismatchError,
    BinaryDesc,
    ClosedError,
    EltwiseDesc,
    EngineMismatchError,
    ExecutionError,
    InvalidArgumentError,
    MemoryDesc,
    MissingArgumentError,
    StreamFlags,
    UnsupportedError,
)
from triodnn.kernels import eltwise, tolerance

DESC = MemoryDesc((4, 9))


@pytest.fixture
async def relu(engine):
    return await engine.create_primitive(EltwiseDesc("relu", DESC))


@pytest.fixture
async def stream(engine):
    return await engine.stream()


@pytest.fixture
async def mems(engine, rng):
    x = rng.uniform(-1, 1, DESC.dims).astype(np.float32)
    return await engine.from_numpy(x), engine.memory(DESC)


# -- descriptors -------------------------------------------------------------------------------


def test_unknown_eltwise_algorithm():
    with pytest.raises(InvalidArgumentError, match="alg 'softmax' is not an eltwise algorithm"):
        EltwiseDesc("softmax", DESC)


def test_unknown_binary_algorithm():
    with pytest.raises(InvalidArgumentError, match="alg 'pow' is not a binary algorithm"):
        BinaryDesc("pow", DESC, DESC)


@pytest.mark.parametrize("dims0, dims1", [((4, 9), (4, 8)), ((4, 9), (9, 4)), ((3,), (4,)), ((2, 3, 4), (3, 3, 4))])
def test_non_broadcastable_shapes(dims0, dims1):
    with pytest.raises(ArgumentMismatchError, match=rf"src0 dims \({dims0[0]}.*do not broadcast"):
        BinaryDesc("add", MemoryDesc(dims0), MemoryDesc(dims1))


def test_binary_dst_dims_mismatch():
    with pytest.raises(ArgumentMismatchError, match=r"dst dims \(4, 1\) differ .* which is \(4, 9\)"):
        BinaryDesc("add", DESC, MemoryDesc((1, 9)), MemoryDesc((4, 1)))


def test_eltwise_dst_dims_mismatch():
    with pytest.raises(ArgumentMismatchError, match=r"dst dims \(9, 4\) differ from src dims \(4, 9\)"):
        EltwiseDesc("relu", DESC, MemoryDesc((9, 4)))


@pytest.mark.parametrize("field, value", [("alpha", float("nan")), ("alpha", "x"), ("beta", float("inf")), ("beta", None)])
def test_eltwise_parameters_must_be_finite_numbers(field, value):
    with pytest.raises(InvalidArgumentError, match=f"{field} {value!r}"):
        EltwiseDesc("clip", DESC, **{field: value})


def test_clip_alpha_above_beta():
    with pytest.raises(InvalidArgumentError, match="alpha=1.0 beta=-1.0"):
        EltwiseDesc("clip", DESC, alpha=1.0, beta=-1.0)


@pytest.mark.parametrize("name", ["src0", "src1", "dst"])
def test_binary_descriptor_fields_must_be_memory_descs(name):
    kwargs = dict(src0=DESC, src1=DESC, dst=DESC)
    kwargs[name] = (4, 9)
    with pytest.raises(InvalidArgumentError, match=f"{name} is tuple, expected triodnn.MemoryDesc"):
        BinaryDesc("add", **kwargs)


def test_eltwise_src_must_be_memory_desc():
    with pytest.raises(InvalidArgumentError, match="src is ndarray"):
        EltwiseDesc("relu", np.zeros(3))


# -- primitive creation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "desc, culprit",
    [
        # eltwise and binary take any storage type; binary post-op operands stay f32 only
        (EltwiseDesc("relu", DESC, post_ops=(("binary", "add", MemoryDesc((4, 9), "f16")),)),
         r"post_ops\[0\] binary operand post_op_0_src1 has dtype 'f16'"),
        (BinaryDesc("add", DESC, DESC, post_ops=(("binary", "mul", MemoryDesc((9,), "s32")),)),
         r"post_ops\[0\] binary operand post_op_0_src1 has dtype 's32'"),
    ],
)
async def test_non_f32_is_unsupported_and_allocates_nothing(engine, desc, culprit):
    before = engine.statistics()
    with pytest.raises(UnsupportedError, match=culprit):
        await engine.create_primitive(desc)
    after = engine.statistics()
    assert after.live_buffers == before.live_buffers and after.live_bytes == before.live_bytes
    assert after.programs_built == before.programs_built and after.builds_in_flight == 0


async def test_create_primitive_needs_a_descriptor(engine):
    with pytest.raises(InvalidArgumentError, match="desc is MemoryDesc, not a triodnn primitive descriptor"):
        await engine.create_primitive(DESC)


async def test_engine_memory_needs_a_memory_desc(engine):
    with pytest.raises(InvalidArgumentError, match="desc is tuple"):
        engine.memory((4, 9))


async def test_allocation_beyond_device_limit(engine):
    huge = MemoryDesc((engine.cl_device.max_mem_alloc_size // 4 + 1,))
    before = engine.statistics().live_buffers
    with pytest.raises(InvalidArgumentError, match=f"{huge.nbytes} bytes exceeds"):
        engine.memory(huge)
    assert engine.statistics().live_buffers == before


@pytest.mark.parametrize("flags", [3, StreamFlags.in_order | StreamFlags.out_of_order, None])
async def test_bad_stream_flags(engine, flags):
    with pytest.raises(InvalidArgumentError, match="flags"):
        await engine.stream(flags)


# -- execution arguments -----------------------------------------------------------------------


async def test_missing_argument(stream, relu, mems):
    with pytest.raises(MissingArgumentError, match="eltwise:relu needs argument 'dst'"):
        stream.execute(relu, {"src": mems[0]})
    with pytest.raises(MissingArgumentError, match="needs argument 'src'"):
        stream.execute(relu, {"src": None, "dst": mems[1]})


async def test_unknown_argument(stream, relu, mems):
    with pytest.raises(ArgumentMismatchError, match="takes no argument 'weights'; it takes src, dst"):
        stream.execute(relu, {"src": mems[0], "dst": mems[1], "weights": mems[0]})


async def test_argument_of_wrong_type(stream, relu, mems):
    with pytest.raises(InvalidArgumentError, match="argument 'dst' is ndarray"):
        stream.execute(relu, {"src": mems[0], "dst": np.zeros((4, 9), np.float32)})
    with pytest.raises(InvalidArgumentError, match="args must be a dict"):
        stream.execute(relu, [mems[0], mems[1]])


@pytest.mark.parametrize(
    "wrong", [MemoryDesc((4, 9), "f32", "ba"), MemoryDesc((9, 4)), MemoryDesc((4, 9), "f32", (10, 1))]
)
async def test_memory_with_the_wrong_desc(engine, stream, relu, mems, wrong):
    other = engine.memory(wrong)
    with pytest.raises(ArgumentMismatchError, match=f"argument 'dst' has memory {wrong}"):
        stream.execute(relu, {"src": mems[0], "dst": other})


async def test_objects_of_another_engine(rt, engine, stream, relu, mems):
    other = await rt.engine()  # same device, another OpenCL context
    foreign = other.memory(DESC)
    with pytest.raises(EngineMismatchError, match="argument 'src' lives on"):
        stream.execute(relu, {"src": foreign, "dst": mems[1]})
    with pytest.raises(EngineMismatchError, match="memory lives on"):
        stream.write(foreign, np.zeros(DESC.dims, np.float32))
    with pytest.raises(EngineMismatchError, match="memory lives on"):
        stream.read(foreign, np.zeros(DESC.dims, np.float32))
    other_stream = await other.stream()
    with pytest.raises(EngineMismatchError, match="primitive eltwise:relu was created on"):
        other_stream.execute(relu, {"src": foreign, "dst": foreign})
    # Both sides are named apart: same device, same index, different contexts.
    assert str(engine) != str(other)
    with pytest.raises(EngineMismatchError) as caught:
        stream.execute(relu, {"src": foreign, "dst": mems[1]})
    message = str(caught.value)
    assert str(other) in message and str(engine) in message
    assert f"context {other.cl_context.int_ptr:#x}" in message


@pytest.mark.parametrize(
    "deps, message",
    [("event", "got Event"), ("cl_event", "got UserEvent"), (3, "got int"), ("dict", "got dict"),
     ("list-int", r"deps\[1\] is int"), ("list-memory", r"deps\[0\] is Memory"), ("gen", "got generator")],
)
async def test_bad_deps(engine, stream, relu, mems, deps, message):
    event = stream.execute(relu, {"src": mems[0], "dst": mems[1]})
    await event
    user = cl.UserEvent(engine.cl_context)
    user.set_status(cl.command_execution_status.COMPLETE)
    deps = {"event": event, "cl_event": user, "list-int": [event, 3], "list-memory": [mems[0]],
            "gen": (e for e in [event]), "dict": {"a": event}}.get(deps, deps)
    with pytest.raises(InvalidArgumentError, match=message):
        stream.execute(relu, {"src": mems[0], "dst": mems[1]}, deps=deps)
    with pytest.raises(InvalidArgumentError, match=message):
        stream.barrier(deps=deps)


async def test_empty_deps_forms(stream, relu, mems):
    for deps in ((), [], None):
        await stream.execute(relu, {"src": mems[0], "dst": mems[1]}, deps=deps)


async def test_write_with_the_wrong_shape(stream, mems):
    with pytest.raises(ArgumentMismatchError, match=r"array has shape \(9, 4\); memory f32:4x9"):
        stream.write(mems[1], np.zeros((9, 4), np.float32))
    with pytest.raises(ArgumentMismatchError, match=r"array has shape \(36,\)"):
        await mems[1].write(np.zeros(36, np.float32))


@pytest.mark.parametrize(
    "out", [np.zeros((9, 4), np.float32), np.zeros((4, 9), np.float64), np.zeros((9, 4), np.float32).T,
            [[0.0] * 9] * 4]
)
async def test_read_into_the_wrong_array(stream, mems, out):
    with pytest.raises(ArgumentMismatchError, match="out must be a writeable C-contiguous float32 array"):
        stream.read(mems[0], out)


async def test_read_of_strided_memory_points_to_to_numpy(engine, stream):
    strided = engine.memory(MemoryDesc((4, 9), "f32", "ba"))
    with pytest.raises(ArgumentMismatchError, match="use await memory.to_numpy"):
        stream.read(strided, np.zeros((4, 9), np.float32))


# -- failing commands --------------------------------------------------------------------------


@pytest.mark.parametrize("flags", [StreamFlags.in_order, StreamFlags.out_of_order])
async def test_failed_dependency_fails_the_command_and_its_dependents(engine, relu, mems, flags):
    """A UserEvent set to an error status fails its dependents; nothing hangs."""
    stream = await engine.stream(flags)
    src, dst = mems
    out = engine.memory(DESC)
    gate = cl.UserEvent(engine.cl_context)
    try:
        first = stream.execute(relu, {"src": src, "dst": dst}, deps=[gate])
        second = stream.execute(relu, {"src": dst, "dst": out}, deps=[first])  # enqueued before the failure
        await trio.testing.wait_all_tasks_blocked()
        assert not first.done
    finally:
        gate.set_status(-5)
    with trio.fail_after(10):
        # The driver fails it (PoCL, NVIDIA), or runs it and triodnn fails it (Intel's CPU runtime).
        with pytest.raises(ExecutionError, match="eltwise:relu: (the command ended with execution status -"
                                                 "|a pyopencl event it waited for .*failed; the driver ran)"):
            await first
        with pytest.raises(ExecutionError, match="eltwise:relu"):
            await second
        # Submitted after the failure is known: refused before it reaches OpenCL.
        third = stream.execute(relu, {"src": out, "dst": dst}, deps=[second])
        with pytest.raises(triodnn.DependencyError, match="dependency 'eltwise:relu' failed"):
            await third
    assert first.done and second.done and third.done
    with pytest.raises(triodnn.NotSubmittedError, match="never enqueued"):
        third.cl_event
    with pytest.raises(triodnn.ProfilingError):
        first.profiling
    # The stream keeps working.
    await stream.execute(relu, {"src": src, "dst": dst})
    tolerance.check(await dst.to_numpy(), eltwise.reference("relu", await src.to_numpy()), tolerance.ELTWISE)


async def test_failed_event_raises_again_for_every_waiter(engine, stream, relu, mems):
    gate = cl.UserEvent(engine.cl_context)
    event = stream.execute(relu, {"src": mems[0], "dst": mems[1]}, deps=[gate])
    await event.wait_submitted()
    gate.set_status(-5)
    errors = []
    with trio.fail_after(10):
        for _ in range(2):
            try:
                await event
            except ExecutionError as exc:
                errors.append(exc)
    assert len(errors) == 2 and errors[0] is not errors[1]
    # ExecutionError where the driver failed the command; DependencyError (a kind of it) where the
    # driver ran it and triodnn failed it (Intel's CPU runtime).
    assert type(errors[0].__cause__) in (ExecutionError, triodnn.DependencyError)


# -- closed objects ----------------------------------------------------------------------------


async def test_use_after_the_runtime_closed(rng):
    x = rng.uniform(-1, 1, DESC.dims).astype(np.float32)
    async with triodnn.open_runtime() as rt:
        engine = await rt.engine()
        stream = await engine.stream()
        relu = await engine.create_primitive(EltwiseDesc("relu", DESC))
        src, dst = await engine.from_numpy(x), engine.memory(DESC)
        assert triodnn.current_runtime() is rt
    assert rt.closed and engine.closed and stream.closed
    with pytest.raises(ClosedError, match="closed"):
        stream.execute(relu, {"src": src, "dst": dst})
    with pytest.raises(ClosedError, match="closed"):
        stream.write(src, x)
    with pytest.raises(ClosedError, match="closed"):
        stream.marker()
    with pytest.raises(ClosedError, match="closed"):
        engine.memory(DESC)
    with pytest.raises(ClosedError, match="closed"):
        await engine.stream()
    with pytest.raises(ClosedError, match="closed"):
        await engine.create_primitive(EltwiseDesc("tanh", DESC))
    with pytest.raises(ClosedError, match="its runtime has shut down"):
        await src.to_numpy()
    with pytest.raises(ClosedError, match="runtime is closed"):
        await rt.engine()
    with pytest.raises(ClosedError, match="no open triodnn runtime"):
        triodnn.current_runtime()


async def test_released_memory(engine, stream, relu, mems):
    src, dst = mems
    before = engine.statistics()
    dst.release()
    assert dst.released
    assert engine.statistics().live_buffers == before.live_buffers - 1
    assert engine.statistics().live_bytes == before.live_bytes - DESC.nbytes
    with pytest.raises(ClosedError, match="was released"):
        stream.execute(relu, {"src": src, "dst": dst})
    with pytest.raises(ClosedError, match="was released"):
        await dst.to_numpy()
    with pytest.raises(ClosedError, match="was released"):
        stream.write(dst, np.zeros(DESC.dims, np.float32))
    dst.release()  # idempotent
    assert engine.statistics().live_buffers == before.live_buffers - 1


async def test_live_buffers_return_to_start(engine):
    start = engine.statistics()
    a = engine.memory(DESC)
    b = engine.memory(MemoryDesc((100,), "f16"))
    with engine.memory(DESC) as c:
        assert engine.statistics().live_buffers == start.live_buffers + 3
        assert engine.statistics().live_bytes == start.live_bytes + 2 * DESC.nbytes + 200
    assert c.released
    a.release()
    del b
    gc.collect()  # a dropped Memory frees its buffer too
    assert engine.statistics().live_buffers == start.live_buffers
    assert engine.statistics().live_bytes == start.live_bytes


async def test_failed_from_numpy_leaks_nothing(engine):
    start = engine.statistics().live_buffers
    with pytest.raises(ArgumentMismatchError, match="array has shape"):
        await engine.from_numpy(np.zeros((3, 3), np.float32), DESC)
    # float64 converts to f32 now (the input policy); what it refuses leaves nothing behind.
    with pytest.raises(ArgumentMismatchError, match="complex128"):
        await engine.from_numpy(np.zeros(3, np.complex128))
    with pytest.raises(ArgumentMismatchError, match="does not convert exactly to s8"):
        await engine.from_numpy(np.full(3, 0.5), MemoryDesc((3,), "s8"))
    gc.collect()
    assert engine.statistics().live_buffers == start


_RELEASE_BEFORE_ENQUEUE = textwrap.dedent(
    """
    import sys, numpy as np, trio, triodnn

    async def main():
        async with triodnn.open_runtime() as rt:
            engine = await rt.engine()
            desc = triodnn.MemoryDesc((64,))
            prim = await engine.create_primitive(triodnn.EltwiseDesc("exp", desc))
            stream = await engine.stream()
            src = await engine.from_numpy(np.zeros(64, np.float32))
            if sys.argv[1] == "release":
                dst = engine.memory(desc)
                event = stream.execute(prim, {"src": src, "dst": dst})
                dst.release()
            else:  # the only reference to dst is the argument dict
                event = stream.execute(prim, {"src": src, "dst": engine.memory(desc)})
            await event
            # The documented outcome: the command completes (or fails with a typed error).

    try:
        trio.run(main)
    except triodnn.TriodnnError:
        pass
    """
)


@pytest.mark.parametrize("how", ["release", "gc"])
def test_memory_released_right_after_submission_does_not_crash(how):
    """Run in a subprocess: the failure mode is a segfault that would kill the test session."""
    result = subprocess.run(
        [sys.executable, "-c", _RELEASE_BEFORE_ENQUEUE, how], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"exit status {result.returncode}: {result.stderr[-500:]}"


# -- interop mistakes --------------------------------------------------------------------------


async def test_make_stream_with_a_queue_of_another_context(engine):
    context = cl.Context([engine.cl_device])
    queue = cl.CommandQueue(context, engine.cl_device)
    with pytest.raises(EngineMismatchError, match="queue belongs to another OpenCL context"):
        await triodnn.ocl_interop.make_stream(engine, queue)
    with pytest.raises(InvalidArgumentError, match="queue is Context"):
        await triodnn.ocl_interop.make_stream(engine, context)
    with pytest.raises(InvalidArgumentError, match="engine is CommandQueue"):
        await triodnn.ocl_interop.make_stream(queue, queue)


async def test_make_engine_with_a_device_not_in_the_context(rt, engine):
    """A sub-device of the context's device is another device: it must be refused."""
    device = engine.cl_device
    try:
        sub_device = device.create_sub_devices([cl.device_partition_property.EQUALLY, 1])[0]
    except cl.Error:
        pytest.skip("the device cannot be partitioned into sub-devices")
    context = cl.Context([device])
    name = sub_device.name.strip()
    with pytest.raises(EngineMismatchError, match=re.escape(f"device '{name}' is not one of context's devices")):
        await triodnn.ocl_interop.make_engine(sub_device, context, runtime=rt)
    with pytest.raises(InvalidArgumentError, match="device is Context"):
        await triodnn.ocl_interop.make_engine(context, context, runtime=rt)
    with pytest.raises(InvalidArgumentError, match="context is Device"):
        await triodnn.ocl_interop.make_engine(device, device, runtime=rt)



_FOREIGN_FAILURE = textwrap.dedent(
    """
    import os, sys, numpy as np, pyopencl as cl, trio, trio.testing, triodnn

    DESC = triodnn.MemoryDesc((4, 9))

    async def main():
        async with triodnn.open_runtime() as rt:
            mine, other = await rt.engine(), await rt.engine()  # two OpenCL contexts
            relu = await mine.create_primitive(triodnn.EltwiseDesc("relu", DESC))
            other_relu = await other.create_primitive(triodnn.EltwiseDesc("relu", DESC))
            a, b = mine.memory(DESC), other.memory(DESC)
            stream, other_stream = await mine.stream(), await other.stream()
            gate = cl.UserEvent(other.cl_context)
            failing = other_stream.execute(other_relu, {"src": b, "dst": b}, deps=[gate])
            dep = failing if sys.argv[1] == "event" else gate
            dependent = stream.execute(relu, {"src": a, "dst": a}, deps=[dep])
            await trio.testing.wait_all_tasks_blocked()
            gate.set_status(-5)
            try:
                with trio.fail_after(2):
                    await dependent
            except triodnn.ExecutionError:
                pass  # the documented outcome
            except trio.TooSlowError:
                print("dependent never completed; leaving the block would hang", flush=True)
                os._exit(3)

    trio.run(main)
    """
)


@pytest.mark.parametrize("dep", ["event", "cl_event"])
def test_failure_of_a_foreign_context_dependency_reaches_the_dependent(dep):
    """Run in a subprocess: the failure mode is a hang that no cancel scope can end."""
    result = subprocess.run(
        [sys.executable, "-c", _FOREIGN_FAILURE, dep], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"exit status {result.returncode}: {result.stdout}{result.stderr[-500:]}"
