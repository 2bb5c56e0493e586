"""ocl_interop.execute (primitives and compiled partitions) and engines with a user allocator."""

from __future__ import annotations

import collections
import gc
import threading

import attrs
import numpy as np
import pyopencl as cl
import pytest
import trio
import trio.testing
from conftest import default_record

import triodnn
from triodnn import EltwiseDesc, MemoryDesc, StreamFlags
from triodnn.graph import Graph, LogicalTensor, Op, Tensor
from triodnn.kernels import eltwise, tolerance
from triodnn.ocl_interop import Allocator, execute, make_engine, make_stream

DESC = MemoryDesc((19, 23))
Q = cl.command_queue_properties
OOO = Q.OUT_OF_ORDER_EXEC_MODE_ENABLE
COMPLETE = cl.command_execution_status.COMPLETE


@pytest.fixture
def device():
    return default_record().device


@pytest.fixture
def context(device):
    return cl.Context([device])


@attrs.define
class Freed:
    buffer: object
    event: cl.Event | None
    status: int | None  # the event's execution status when free was called
    thread: int


@attrs.define
class Recorder:
    """An allocator that makes plain cl.Buffers and records every call (keeping every buffer, so
    no handle is reused and each can be checked afterwards)."""

    allocated: list = attrs.field(factory=list)  # (buffer, size, alignment, thread)
    freed: list[Freed] = attrs.field(factory=list)
    fail_at: int | None = None  # the allocate call (0-based) that raises
    make: object = None  # make(size, context) -> what allocate returns, instead of a cl.Buffer

    def allocate(self, size, alignment, device, context):
        if self.fail_at is not None and len(self.allocated) == self.fail_at:
            self.fail_at = None
            raise MemoryError(f"pool exhausted at {size} bytes")
        buffer = (self.make or (lambda n, ctx: cl.Buffer(ctx, cl.mem_flags.READ_WRITE, n)))(size, context)
        self.allocated.append((buffer, size, alignment, threading.get_ident()))
        return buffer

    def free(self, buffer, device, context, event):
        status = None if event is None else event.command_execution_status
        self.freed.append(Freed(buffer, event, status, threading.get_ident()))

    @property
    def allocator(self) -> Allocator:
        return Allocator(self.allocate, self.free)

    def free_of(self, buffer) -> list[Freed]:
        return [f for f in self.freed if f.buffer is buffer]

    def outstanding(self) -> list:
        freed = {id(f.buffer) for f in self.freed}
        return [b for b, *_ in self.allocated if id(b) not in freed]

    def check_all_freed_once(self) -> None:
        counts = collections.Counter(id(f.buffer) for f in self.freed)
        assert sorted(counts) == sorted(id(b) for b, *_ in self.allocated)
        assert set(counts.values()) == {1}, "a buffer was freed twice"
        for f in self.freed:
            if f.event is not None:
                f.event.wait()  # outside trio: these tests call it after their runtime closed
                assert f.event.command_execution_status == COMPLETE
            # triodnn never released the caller's buffer: its handle is still valid.
            assert f.buffer.get_info(cl.mem_info.REFERENCE_COUNT) >= 1


async def eltwise_on(engine, alg="exp"):
    return await engine.create_primitive(EltwiseDesc(alg, DESC))


def check_exp(got, x):
    tolerance.check(got, eltwise.reference("exp", x), tolerance.eltwise("exp"))


# -- ocl_interop.execute: primitives -------------------------------------------------------------


@pytest.mark.parametrize("own_queue", [False, True], ids=["engine_stream", "make_stream"])
@pytest.mark.parametrize("out_of_order", [False, True], ids=["in_order", "out_of_order"])
async def test_execute_returns_once_enqueued_with_the_callers_deps(rt, device, context, gate, rng,
                                                                    own_queue, out_of_order):
    """Deps: a UserEvent set later and the caller's enqueue_copy gated by it; the returned event
    is enqueued, not complete, until the gate opens; pyopencl waits for it in a thread."""
    engine = await make_engine(device, context, runtime=rt)
    if own_queue:
        queue = cl.CommandQueue(context, device, OOO if out_of_order else 0)
        stream = await make_stream(engine, queue)
    else:
        stream = await engine.stream(StreamFlags.out_of_order if out_of_order else StreamFlags.in_order)
    prim = await eltwise_on(engine)
    x = rng.uniform(-2, 2, DESC.dims).astype(np.float32)
    src, dst = engine.memory(DESC), engine.memory(DESC)
    await src.write(np.zeros(DESC.dims, np.float32))  # what the kernel would see if it ran early
    staging = cl.Buffer(context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
    callers_queue = cl.CommandQueue(context, device)
    with gate(context) as opened_later:
        copied = cl.enqueue_copy(callers_queue, src.cl_buffer, staging, wait_for=[opened_later])
        callers_queue.flush()
        ev = await execute(prim, stream, {"src": src, "dst": dst}, deps=[opened_later, copied])
        assert isinstance(ev, cl.Event)
        assert ev.command_type == cl.command_type.NDRANGE_KERNEL
        assert ev.command_queue.int_ptr in {q.int_ptr for q in stream.cl_queues}
        await trio.testing.wait_all_tasks_blocked()
        assert ev.command_execution_status > COMPLETE  # held back by the caller's deps
    await trio.to_thread.run_sync(ev.wait)
    assert ev.command_execution_status == COMPLETE
    check_exp(await dst.to_numpy(), x)


async def test_execute_with_a_foreign_context_dep_and_a_triodnn_event(rt, device, context, gate, rng):
    engine = await make_engine(device, context, runtime=rt)
    stream = await engine.stream(StreamFlags.out_of_order)
    prim = await eltwise_on(engine)
    x = rng.uniform(-2, 2, DESC.dims).astype(np.float32)
    src, dst = engine.memory(DESC), engine.memory(DESC)
    written = stream.write(src, x)  # a triodnn.Event dep
    foreign = cl.Context([device])
    with gate(foreign) as foreign_gate:
        ev = await execute(prim, stream, {"src": src, "dst": dst}, deps=[written, foreign_gate])
        await trio.testing.wait_all_tasks_blocked()
        assert ev.command_execution_status > COMPLETE
    await trio.to_thread.run_sync(ev.wait)
    check_exp(await dst.to_numpy(), x)


async def test_returned_event_is_the_callers_and_outlives_the_runtime(device, context, rng):
    x = rng.uniform(-2, 2, DESC.dims).astype(np.float32)
    async with triodnn.open_runtime():
        engine = await make_engine(device, context)
        stream = await engine.stream()
        prim = await eltwise_on(engine)
        src, dst = await engine.from_numpy(x), engine.memory(DESC)
        triodnn_event = stream.execute(prim, {"src": src, "dst": dst})
        ev = await execute(prim, stream, {"src": dst, "dst": dst}, deps=[triodnn_event])
        assert ev.int_ptr != triodnn_event.cl_event.int_ptr
        same = await execute(prim, stream, {"src": src, "dst": src})
        # A new pyopencl object with its own reference to the command's event.
        assert same is not ev and ev.reference_count >= 1
    assert ev.command_execution_status == COMPLETE
    queue = cl.CommandQueue(context, device)
    out = np.empty(DESC.dims, np.float32)
    read = cl.enqueue_copy(queue, out, dst.cl_buffer, wait_for=[ev], is_blocking=False)
    read.wait()
    check_exp(out, np.exp(x))


async def test_execute_errors_are_typed(rt, device, context, gate):
    engine = await make_engine(device, context, runtime=rt)
    stream = await engine.stream(StreamFlags.out_of_order)
    prim = await eltwise_on(engine)
    src, dst = engine.memory(DESC), engine.memory(DESC)
    args = {"src": src, "dst": dst}
    with pytest.raises(triodnn.InvalidArgumentError, match="executable is str"):
        await execute("relu", stream, args)
    with pytest.raises(triodnn.InvalidArgumentError, match="stream is Engine"):
        await execute(prim, engine, args)
    with pytest.raises(triodnn.InvalidArgumentError, match="one args dict"):
        await execute(prim, stream, args, args)
    # A gate, so the user event is completed: NVIDIA's driver may keep the context of a
    # never-set one alive and block a later collection (see RELIABILITY.md).
    with gate(context) as not_a_list, pytest.raises(triodnn.InvalidArgumentError, match="deps"):
        await execute(prim, stream, args, deps=not_a_list)
    with gate(context) as failing:
        failed = stream.execute(prim, args, deps=[failing])
        await failed.wait_submitted()
        failing.set_status(-1)
    with pytest.raises(triodnn.ExecutionError):
        await failed
    with pytest.raises(triodnn.DependencyError, match="failed"):
        await execute(prim, stream, args, deps=[failed])


# -- ocl_interop.execute: compiled partitions, with a user allocator ------------------------------


def f32(i, shape):
    return LogicalTensor(i, "f32", shape, layout_type="strided")


def softmax_chain() -> Graph:
    """Four softmaxes: three temporaries in two planned scratch buffers."""
    g = Graph("cpu")
    for i in range(4):
        g.add_op(Op(i, "SoftMax", [f32(i, [8, 32])], [f32(i + 1, [8, 32])], {"axis": -1}))
    return g


def softmax4(x):
    for _ in range(4):
        e = np.exp(x - x.max(-1, keepdims=True))
        x = e / e.sum(-1, keepdims=True)
    return x


@pytest.mark.parametrize("out_of_order", [False, True], ids=["in_order", "out_of_order"])
async def test_partition_via_interop_with_a_user_allocator(device, context, gate, rng, out_of_order):
    rec = Recorder()
    x = rng.uniform(-3, 3, (8, 32)).astype(np.float32)
    async with triodnn.open_runtime():
        engine = await make_engine(device, context, allocator=rec.allocator)
        assert engine.allocator == rec.allocator
        (partition,) = softmax_chain().get_partitions()
        compiled = await partition.compile(engine)
        assert compiled.memory_statistics().scratch_buffers == 2
        stream = await make_stream(engine, cl.CommandQueue(context, device, OOO if out_of_order else 0))
        (inp,) = [await Tensor.from_numpy(lt, engine, x) for lt in compiled.inputs]
        outs = [[Tensor(lt, engine) for lt in compiled.outputs] for _ in range(2)]
        before = len(rec.allocated)
        with gate(context) as held:
            # Two executions in flight at once. The partition keeps its scratch buffers between
            # executions: on an in-order queue the second reuses the first's (the queue orders
            # them); out of order it gets a set of its own.
            events = [await execute(compiled, stream, [inp], out, deps=[held]) for out in outs]
            await trio.testing.wait_all_tasks_blocked()
            temps = [b for b, *_ in rec.allocated[before:]]
            assert len(temps) == (4 if out_of_order else 2)
            for ev in events:
                assert ev.command_execution_status > COMPLETE
            assert all(rec.free_of(buffer) == [] for buffer in temps)  # kept for the next run
        for ev in events:
            await trio.to_thread.run_sync(ev.wait)
        for out in outs:
            np.testing.assert_allclose(await out[0].to_numpy(), softmax4(x), rtol=1e-5, atol=1e-7)
        tensors = [inp, *outs[0], *outs[1]]
        assert {id(b) for b in rec.outstanding()} == {id(t.memory.cl_buffer) for t in tensors} | {id(b) for b in temps}
    # The runtime's shutdown gave the scratch buffers back, after their last use.
    for buffer in temps:
        (freed,) = rec.free_of(buffer)
        assert freed.status == COMPLETE
    del inp, outs, tensors, out
    gc.collect()
    rec.check_all_freed_once()


# -- user allocators ---------------------------------------------------------------------------


async def test_every_buffer_comes_from_the_allocator_and_goes_back_once(device, context, rng):
    rec = Recorder()
    trio_thread = threading.get_ident()
    x = rng.uniform(-2, 2, DESC.dims).astype(np.float32)
    async with triodnn.open_runtime():
        engine = await make_engine(device, context, allocator=rec.allocator)
        prim = await eltwise_on(engine)
        # Building warmed the kernel up with the allocator's buffers, in a worker thread, and
        # freed them with the completed launch's event.
        warm = len(rec.allocated)
        assert warm == 2 and {t for *_, t in rec.allocated} != {trio_thread}
        assert all(f.status == COMPLETE for f in rec.freed) and len(rec.freed) == 2
        assert all(align == device.mem_base_addr_align // 8 for _, _, align, _ in rec.allocated)

        start = engine.statistics()
        unused = engine.memory(DESC)
        src = await engine.from_numpy(x)
        dst = engine.memory(DESC)
        assert [size for _, size, *_ in rec.allocated[warm:]] == [DESC.nbytes] * 3
        assert engine.statistics().live_buffers == start.live_buffers + 3
        unused.release()
        (freed,) = rec.free_of(rec.allocated[warm][0])
        assert freed.event is None and freed.thread == trio_thread  # nothing ever used it
        unused.release()  # idempotent
        assert len(rec.freed) == 3

        done = (await engine.stream()).execute(prim, {"src": src, "dst": dst})
        await done
        check_exp(await dst.to_numpy(), x)
        src_buffer = src.cl_buffer
        del src  # the finalizer path
        gc.collect()
        (freed,) = rec.free_of(src_buffer)
        assert freed.event.int_ptr == done.cl_event.int_ptr and freed.status == COMPLETE
        assert engine.statistics().live_buffers == start.live_buffers + 1
    # A memory kept past its runtime goes back when collected, with its completed last use.
    dst_buffer = dst.cl_buffer
    del dst
    gc.collect()
    (freed,) = rec.free_of(dst_buffer)
    assert freed.status == COMPLETE
    rec.check_all_freed_once()


async def test_free_waits_until_the_last_use_is_enqueued(device, context, gate):
    rec = Recorder()
    async with triodnn.open_runtime():
        engine = await make_engine(device, context, allocator=rec.allocator)
        prim = await eltwise_on(engine)
        a, b = await engine.stream(StreamFlags.out_of_order), await engine.stream()
        src, d1, d2 = (engine.memory(DESC) for _ in range(3))
        with gate(context) as held:
            first = a.execute(prim, {"src": src, "dst": d1}, deps=[held])
            second = b.execute(prim, {"src": src, "dst": d2}, deps=[held])
            buffer = src.cl_buffer
            src.release()
            await trio.testing.wait_all_tasks_blocked()
            (freed,) = rec.free_of(buffer)  # both uses were enqueued by the submitting calls
            # Two commands still running on two queues: a marker after both.
            assert freed.status > COMPLETE
            assert freed.event.int_ptr not in (first.cl_event.int_ptr, second.cl_event.int_ptr)
            one = d1.cl_buffer
            d1.release()
            await trio.testing.wait_all_tasks_blocked()
            (freed_one,) = rec.free_of(one)
            assert freed_one.event.int_ptr == first.cl_event.int_ptr  # its only use
        await trio.to_thread.run_sync(freed.event.wait)
        assert first.cl_event.command_execution_status == COMPLETE
        assert second.cl_event.command_execution_status == COMPLETE
        await first
        await second
    del d2
    gc.collect()
    rec.check_all_freed_once()


async def test_memory_collected_in_another_thread_is_freed_on_the_trio_thread(device, context, gate):
    rec = Recorder()
    async with triodnn.open_runtime():
        engine = await make_engine(device, context, allocator=rec.allocator)
        prim = await eltwise_on(engine)
        held_memories = [engine.memory(DESC), engine.memory(DESC)]
        buffers = [m.cl_buffer for m in held_memories]
        with gate(context) as held:
            ran = (await engine.stream()).execute(
                prim, {"src": held_memories[0], "dst": held_memories[1]}, deps=[held]
            )
            await ran.wait_submitted()
            await trio.to_thread.run_sync(held_memories.clear)  # the last references go there
            await trio.testing.wait_all_tasks_blocked()
            for buffer in buffers:
                (freed,) = rec.free_of(buffer)
                assert freed.thread == threading.get_ident()
                assert freed.event.int_ptr == ran.cl_event.int_ptr and freed.status > COMPLETE
        await ran
    rec.check_all_freed_once()


async def test_engine_with_an_allocator_loads_a_cache_blob(rt, device, context, rng):
    plain = await rt.engine()
    desc = EltwiseDesc("gelu_tanh", MemoryDesc((7, 5)))
    blob = (await plain.create_primitive(desc)).cache_blob()

    rec = Recorder()
    engine = await make_engine(device, context, allocator=rec.allocator, cache_blob=blob, runtime=rt)
    stats = engine.statistics()
    assert (stats.programs_built, stats.programs_loaded) == (0, 1)
    # Loading the binary warmed the kernel up through the allocator, and gave the buffers back.
    assert len(rec.allocated) == 2 and not rec.outstanding()
    assert all(f.status == COMPLETE for f in rec.freed)

    other = await make_engine(device, cl.Context([device]), allocator=Recorder().allocator, runtime=rt)
    assert await other.load_primitive_cache_blob(blob) == 0  # already cached; loaded here all the same
    assert other.statistics().programs_loaded == 1

    prim = await engine.create_primitive(desc)
    assert engine.statistics().programs_built == 0
    x = rng.uniform(-2, 2, (7, 5)).astype(np.float32)
    src, dst = await engine.from_numpy(x, desc.src), engine.memory(desc.src)
    await (await engine.stream()).execute(prim, {"src": src, "dst": dst})
    tolerance.check(await dst.to_numpy(), eltwise.reference("gelu_tanh", x), tolerance.eltwise("gelu_tanh"))


# -- allocator errors ----------------------------------------------------------------------------


async def test_allocator_is_validated(rt, device, context):
    free = lambda *args: None  # noqa: E731
    with pytest.raises(triodnn.InvalidArgumentError, match="allocator.allocate is int"):
        Allocator(1, free)
    with pytest.raises(triodnn.InvalidArgumentError, match="allocator.free is NoneType"):
        Allocator(free, None)
    with pytest.raises(triodnn.InvalidArgumentError, match="allocator is tuple"):
        await make_engine(device, context, allocator=(free, free), runtime=rt)


def _svm(size, context):
    return cl.SVMAllocation(context, size, 0, cl.svm_mem_flags.READ_WRITE)


def has_svm(device) -> bool:
    return bool(getattr(device, "svm_capabilities", 0) & cl.device_svm_capabilities.COARSE_GRAIN_BUFFER)


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda n, ctx: cl.Buffer(ctx, cl.mem_flags.READ_WRITE, n // 2), "too small"),
        (lambda n, ctx: cl.Buffer(cl.Context(ctx.devices), cl.mem_flags.READ_WRITE, n), "another OpenCL context"),
        (lambda n, ctx: cl.Buffer(ctx, cl.mem_flags.READ_ONLY, n), "flags"),
        (lambda n, ctx: np.empty(n, np.uint8), "ndarray, expected a pyopencl.Buffer or an SVM allocation"),
        (lambda n, ctx: _svm(n // 2, ctx), "an SVM allocation of .* bytes, too small"),
    ],
    ids=["too_small", "other_context", "read_only", "not_a_buffer", "svm_too_small"],
)
async def test_an_unusable_allocation_is_a_typed_error_and_goes_back(rt, device, context, make, needle):
    if "SVM" in needle and not has_svm(device):
        pytest.skip("the device has no SVM")
    rec = Recorder(make=make)
    engine = await make_engine(device, context, allocator=rec.allocator, runtime=rt)
    before = engine.statistics()
    with pytest.raises(triodnn.InvalidArgumentError, match=f"allocator.allocate.*{needle}"):
        engine.memory(DESC)
    (allocated, *_), = rec.allocated
    (freed,) = rec.freed
    assert freed.buffer is allocated and freed.event is None
    assert engine.statistics().live_buffers == before.live_buffers


async def test_an_svm_allocation_on_a_device_without_svm_is_refused(rt, device, context, monkeypatch):
    if not has_svm(device):
        pytest.skip("making an SVM allocation needs a device with SVM")
    monkeypatch.setattr(triodnn.actors._allocator, "device_has_svm", lambda device: False)
    rec = Recorder(make=_svm)
    engine = await make_engine(device, context, allocator=rec.allocator, runtime=rt)
    with pytest.raises(triodnn.InvalidArgumentError, match="an SVM allocation, but .* has no SVM"):
        engine.memory(DESC)
    (allocated, *_), = rec.allocated
    assert [f.buffer for f in rec.freed] == [allocated]


@pytest.mark.parametrize("out_of_order", [False, True], ids=["in_order", "out_of_order"])
async def test_svm_allocations_serve_primitives_copies_and_partitions(device, context, rng, out_of_order):
    """An allocator of SVM buffers: every buffer the engine needs is one, kernels take them as
    SVM pointers, host copies go through SVM memcpy, and each goes back to ``free`` once, as the
    caller's own object."""
    if not has_svm(device):
        pytest.skip("the device has no SVM")
    rec = Recorder(make=_svm)
    x = rng.uniform(-3, 3, (8, 32)).astype(np.float32)
    y = rng.uniform(-2, 2, DESC.dims).astype(np.float32)
    flags = StreamFlags.out_of_order if out_of_order else StreamFlags.in_order
    async with triodnn.open_runtime():
        engine = await make_engine(device, context, allocator=rec.allocator)
        stream = await engine.stream(flags)
        prim = await eltwise_on(engine)
        src = await engine.from_numpy(y)
        dst = engine.memory(DESC)
        assert isinstance(src.cl_buffer, cl.SVMPointer)
        assert src.cl_buffer.allocation is rec.allocated[-2][0]
        await stream.execute(prim, {"src": src, "dst": dst})
        check_exp(await dst.to_numpy(), y)
        # A view shares the allocation (SVM has no sub-buffers; views start at offset 0).
        flat = dst.view(MemoryDesc((DESC.nbytes // 4,)))
        check_exp((await flat.to_numpy()).reshape(DESC.dims), y)

        (partition,) = softmax_chain().get_partitions()
        compiled = await partition.compile(engine)
        (inp,) = [await Tensor.from_numpy(lt, engine, x) for lt in compiled.inputs]
        for _ in range(3):  # replays reuse the recorded arguments and kept scratch
            out = [Tensor(lt, engine) for lt in compiled.outputs]
            await compiled.execute(stream, [inp], out)
            np.testing.assert_allclose(await out[0].to_numpy(), softmax4(x), rtol=1e-5, atol=1e-7)

        # ocl_interop.execute hands back the enqueued event, also for SVM arguments.
        event = await execute(prim, stream, {"src": dst, "dst": src})
        await trio.to_thread.run_sync(event.wait)
        check_exp(await src.to_numpy(), eltwise.reference("exp", y).astype(np.float32))
        del src, dst, flat, inp, out
        gc.collect()
    assert all(isinstance(b, cl.SVMAllocation) for b, *_ in rec.allocated)
    counts = collections.Counter(id(f.buffer) for f in rec.freed)
    assert sorted(counts) == sorted(id(b) for b, *_ in rec.allocated)
    assert set(counts.values()) == {1}
    for f in rec.freed:
        if f.event is not None:
            f.event.wait()
            assert f.event.command_execution_status == COMPLETE


async def test_a_buffer_returned_twice_is_refused(rt, device, context):
    pool = cl.Buffer(context, cl.mem_flags.READ_WRITE, DESC.nbytes)
    rec = Recorder(make=lambda n, ctx: pool)
    engine = await make_engine(device, context, allocator=rec.allocator, runtime=rt)
    first = engine.memory(DESC)
    with pytest.raises(triodnn.InvalidArgumentError, match="still holds"):
        engine.memory(DESC)
    assert rec.freed == []  # not freed: it is still the first memory's
    first.release()
    assert [f.buffer for f in rec.freed] == [pool]


async def test_a_raising_allocate_surfaces_typed_and_leaks_nothing(device, context, rng):
    rec = Recorder()
    x = rng.uniform(-3, 3, (8, 32)).astype(np.float32)
    async with triodnn.open_runtime():
        engine = await make_engine(device, context, allocator=rec.allocator)
        (partition,) = softmax_chain().get_partitions()
        compiled = await partition.compile(engine)
        stream = await engine.stream(StreamFlags.out_of_order)
        (inp,) = [await Tensor.from_numpy(lt, engine, x) for lt in compiled.inputs]
        (out,) = [Tensor(lt, engine) for lt in compiled.outputs]
        live = engine.statistics().live_buffers

        rec.fail_at = len(rec.allocated)
        with pytest.raises(triodnn.ExecutionError, match="allocator.allocate.*pool exhausted") as info:
            engine.memory(DESC)
        assert isinstance(info.value.__cause__, MemoryError)

        rec.fail_at = len(rec.allocated) + 1  # the second temporary
        with pytest.raises(triodnn.ExecutionError, match="pool exhausted"):
            await execute(compiled, stream, [inp], [out])
        (first_temp, *_), = rec.allocated[-1:]
        (freed,) = rec.free_of(first_temp)
        assert freed.event is None
        assert engine.statistics().live_buffers == live

        done = await execute(compiled, stream, [inp], [out])  # the allocator works again
        await trio.to_thread.run_sync(done.wait)  # execute awaits the enqueue only
        np.testing.assert_allclose(await out.to_numpy(), softmax4(x), rtol=1e-5, atol=1e-7)
    del inp, out
    gc.collect()
    rec.check_all_freed_once()


async def test_a_raising_allocate_fails_a_build_typed(rt, device, context):
    rec = Recorder(fail_at=0)
    engine = await make_engine(device, context, allocator=rec.allocator, runtime=rt)
    with pytest.raises(triodnn.ExecutionError, match="allocator.allocate.*pool exhausted"):
        await engine.create_primitive(EltwiseDesc("relu", MemoryDesc((3, 41))))
    assert not rec.outstanding()
    await engine.create_primitive(EltwiseDesc("relu", MemoryDesc((3, 41))))  # works again
    assert len(rec.allocated) == 2 and not rec.outstanding()


async def test_a_view_of_a_released_memory_is_released(rt, device, context):
    rec = Recorder()
    engine = await make_engine(device, context, allocator=rec.allocator, runtime=rt)
    base = engine.memory(DESC)
    view = base.view(MemoryDesc((23, 19))).view(MemoryDesc((437,)))
    view.release()  # frees nothing
    assert rec.freed == [] and not base.released
    base.release()
    assert view.released and len(rec.freed) == 1
    with pytest.raises(triodnn.ClosedError):
        view.cl_buffer


async def test_a_raising_free_is_a_warning(device, context):
    def free(buffer, device, context, event):
        raise RuntimeError("pool is gone")

    rec = Recorder()
    async with triodnn.open_runtime():
        engine = await make_engine(device, context, allocator=Allocator(rec.allocate, free))
        memory = engine.memory(DESC)
        with pytest.warns(RuntimeWarning, match="allocator.free raised RuntimeError: pool is gone"):
            memory.release()
