"""Streams and events: ordering, waiting, profiling, interop events and cross-stream dependencies."""

from __future__ import annotations

import threading
import weakref

import numpy as np
import pyopencl as cl
import pytest
import trio
import trio.testing
from conftest import in_a_thread, in_another_trio_run, threads_since

import triodnn
from triodnn import BinaryDesc, EltwiseDesc, MemoryDesc, StreamFlags
from triodnn.kernels import eltwise, tolerance

SHAPE = (33, 17)
DESC = MemoryDesc(SHAPE)
OOO = StreamFlags.out_of_order
T = tolerance.ELTWISE_TRANSCENDENTAL  # chains of a few ops, each within its own threshold
DIAMOND = {
    "exp": EltwiseDesc("exp", DESC),
    "tanh": EltwiseDesc("tanh", DESC),
    "mul": BinaryDesc("mul", DESC, DESC),
}


def ref(alg, x, **params):
    return eltwise.reference(alg, x, **params)


@pytest.fixture
async def prims(build):
    return await build({
        "exp": EltwiseDesc("exp", DESC),
        "tanh": EltwiseDesc("tanh", DESC),
        "relu": EltwiseDesc("relu", DESC),
        "square": EltwiseDesc("square", DESC),
        "add": BinaryDesc("add", DESC, DESC),
        "mul": BinaryDesc("mul", DESC, DESC),
    })


@pytest.fixture
def x(rng):
    return rng.uniform(-2, 2, SHAPE).astype(np.float32)


async def settle():
    """Let every actor run until all tasks are blocked (commands enqueued, nothing else to do)."""
    await trio.testing.wait_all_tasks_blocked()


# -- ordering ----------------------------------------------------------------------------------


async def test_in_order_chain_without_deps(engine, prims, upload, x):
    """In-order streams order commands by submission alone; only the last event is awaited."""
    stream = await engine.stream()
    src = await upload(x)
    a, b, c = (engine.memory(DESC) for _ in range(3))
    stream.execute(prims["relu"], {"src": src, "dst": a})
    stream.execute(prims["tanh"], {"src": a, "dst": b})
    stream.execute(prims["square"], {"src": b, "dst": c})
    last = stream.execute(prims["add"], {"src0": c, "src1": src, "dst": a})
    await last
    expected = ref("square", ref("tanh", ref("relu", x))) + x
    tolerance.check(await a.to_numpy(), expected, T)
    assert stream.statistics().submitted == 4
    assert stream.statistics().strategy == "in_order"


@pytest.mark.parametrize("strategy", [None, "lanes:4"])
async def test_out_of_order_diamond(rt, strategy, monkeypatch, build_on, x, gate):
    """write -> (exp, tanh) -> mul, ordered only by deps; the stream is fed before anything runs."""
    if strategy:
        monkeypatch.setenv("TRIODNN_OOO_STRATEGY", strategy)
    engine = await rt.engine()
    p = await build_on(engine, DIAMOND)
    stream = await engine.stream(OOO)
    assert stream.strategy == ("lanes" if strategy else engine.out_of_order_strategy.kind)
    src, left, right, out = (engine.memory(DESC) for _ in range(4))
    with gate(engine.cl_context) as g:
        wrote = stream.write(src, x, deps=[g])
        a = stream.execute(p["exp"], {"src": src, "dst": left}, deps=[wrote])
        b = stream.execute(p["tanh"], {"src": src, "dst": right}, deps=[wrote])
        c = stream.execute(p["mul"], {"src0": left, "src1": right, "dst": out}, deps=[a, b])
        await settle()
        assert not any(e.done for e in (wrote, a, b, c))
    await c
    assert all(e.done for e in (wrote, a, b, c))
    tolerance.check(await out.to_numpy(), ref("exp", x) * ref("tanh", x), T)


@pytest.mark.parametrize("flags, strategy", [(StreamFlags.in_order, None), (OOO, None), (OOO, "lanes:3")],
                         ids=["in_order", "out_of_order", "lanes"])
async def test_stream_wait_covers_everything_submitted(rt, flags, strategy, monkeypatch, build_on, x):
    if strategy:
        monkeypatch.setenv("TRIODNN_OOO_STRATEGY", strategy)
    engine = await rt.engine()
    prims = await build_on(engine, {"exp": EltwiseDesc("exp", DESC)})
    stream = await engine.stream(flags)
    src = await engine.from_numpy(x)
    outs = [engine.memory(DESC) for _ in range(6)]
    events = [stream.execute(prims["exp"], {"src": src, "dst": out}) for out in outs]
    events.append(stream.write(src, np.zeros(SHAPE, np.float32), deps=events))
    await stream.wait()
    assert all(e.done for e in events)
    for out in outs:
        tolerance.check(await out.to_numpy(), ref("exp", x), T)
    np.testing.assert_array_equal(await src.to_numpy(), 0)


async def test_lanes_opened_after_a_barrier_wait_for_it(rt, monkeypatch, x, gate):
    monkeypatch.setenv("TRIODNN_OOO_STRATEGY", "lanes:3:spread")
    engine = await rt.engine()
    square = await engine.create_primitive(EltwiseDesc("square", DESC))
    stream = await engine.stream(OOO)
    src = await engine.from_numpy(x)
    mid = engine.memory(DESC)
    outs = [engine.memory(DESC) for _ in range(2)]
    with gate(engine.cl_context) as g:
        first = stream.execute(square, {"src": src, "dst": mid}, deps=[g])
        barrier = stream.barrier()
        assert stream.statistics().queues == 1  # only lane 0 is open at the barrier
        seconds = [stream.execute(square, {"src": mid, "dst": o}) for o in outs]
        assert [e._submission.lane for e in seconds] == [1, 2]  # opened after it
        await settle()
        assert not any(e.done for e in [first, barrier, *seconds])
    for event in seconds:
        await event
    for out in outs:
        tolerance.check(await out.to_numpy(), ref("square", ref("square", x)), tolerance.ELTWISE)


@pytest.mark.parametrize("strategy", [None, "lanes:3", "lanes:3:spread", "native"])
async def test_barrier_orders_later_commands_without_deps(rt, strategy, monkeypatch, x, gate):
    """After barrier(), commands with no deps still see the results of everything before it,
    on lanes opened after the barrier too (``spread``: the firsts go to lanes 0-2; lane 0 is
    the only one open at the barrier when the kernels stay there)."""
    if strategy:
        monkeypatch.setenv("TRIODNN_OOO_STRATEGY", strategy)
    engine = await rt.engine()
    square = await engine.create_primitive(EltwiseDesc("square", DESC))
    stream = await engine.stream(OOO)
    src = await engine.from_numpy(x)
    mids = [engine.memory(DESC) for _ in range(4)]
    outs = [engine.memory(DESC) for _ in range(4)]
    with gate(engine.cl_context) as g:
        firsts = [stream.execute(square, {"src": src, "dst": m}, deps=[g]) for m in mids]
        barrier = stream.barrier()
        seconds = [stream.execute(square, {"src": m, "dst": o}) for m, o in zip(mids, outs)]
        await settle()
        assert not any(e.done for e in firsts + [barrier] + seconds)
    for event in seconds:
        await event
    assert barrier.done and all(e.done for e in firsts)
    for out in outs:
        tolerance.check(await out.to_numpy(), ref("square", ref("square", x)), tolerance.ELTWISE)


async def test_marker_with_deps(engine, prims, upload, x):
    stream = await engine.stream(OOO)
    src = await upload(x)
    out = engine.memory(DESC)
    k = stream.execute(prims["tanh"], {"src": src, "dst": out})
    await stream.marker(deps=[k])
    assert k.done
    tolerance.check(await out.to_numpy(), ref("tanh", x), T)


# -- events ------------------------------------------------------------------------------------


@pytest.mark.parametrize("flags", [StreamFlags.in_order, OOO])
async def test_profiling_times_are_ordered(flags, engine, prims, upload, x):
    stream = await engine.stream(flags | StreamFlags.profiling)
    assert StreamFlags.profiling in stream.flags
    src, dst = await upload(x), engine.memory(DESC)
    events = [stream.execute(prims["exp"], {"src": src, "dst": dst}) for _ in range(3)]
    events.append(stream.write(src, x))
    events.append(stream.read(dst, np.empty(SHAPE, np.float32), deps=events))
    for event in events:
        await event
        p = event.profiling
        assert 0 < p.queued <= p.submit <= p.start <= p.end, p
        assert p.duration_ns == p.end - p.start >= 0


async def test_profiling_needs_the_flag(engine, prims, upload, x):
    stream = await engine.stream()
    src, dst = await upload(x), engine.memory(DESC)  # kept alive until the command is done
    event = stream.execute(prims["exp"], {"src": src, "dst": dst})
    await event
    with pytest.raises(triodnn.ProfilingError, match="without StreamFlags.profiling"):
        event.profiling


async def test_profiling_before_completion(engine, prims, upload, x, gate):
    stream = await engine.stream(StreamFlags.profiling)
    assert stream.flags == StreamFlags.in_order | StreamFlags.profiling
    src = await upload(x)
    with gate(engine.cl_context) as g:
        dst = engine.memory(DESC)
        event = stream.execute(prims["exp"], {"src": src, "dst": dst}, deps=[g])
        await settle()
        with pytest.raises(triodnn.ProfilingError, match="once the command completed"):
            event.profiling
    await event
    assert event.profiling.end >= event.profiling.start


async def test_event_repr_is_label_and_state_only(engine, prims, upload, x, gate):
    """``repr(event)`` says what the command is and where it stands, nothing of the stream
    actor or submission behind it."""
    stream = await engine.stream()
    src = await upload(x)
    with gate(engine.cl_context) as g:
        dst = engine.memory(DESC)
        event = stream.execute(prims["exp"], {"src": src, "dst": dst}, deps=[g])
        await settle()
        assert repr(event) == f"<triodnn.Event {prims['exp'].label} enqueued>"
    await event
    assert repr(event) == f"<triodnn.Event {prims['exp'].label} completed>"
    write = stream.write(dst, x)
    await write
    assert repr(write) == f"<triodnn.Event write:{DESC} completed>"
    for text in (repr(event), str(event)):
        assert "Actor" not in text and "Submission" not in text and len(text) < 80


async def test_cl_event_after_submission(engine, prims, upload, x):
    stream = await engine.stream()
    src, dst = await upload(x), engine.memory(DESC)  # kept alive until the command is done
    event = stream.execute(prims["exp"], {"src": src, "dst": dst})
    # Nothing waits in the stream's channel: the submitting call enqueued the kernel itself.
    assert isinstance(event.cl_event, cl.Event)
    assert stream.statistics().enqueued_directly == stream.statistics().submitted == 1
    await event.wait_submitted()
    assert event.cl_event.command_queue == stream.cl_queues[0]
    await event
    assert event.cl_event.command_execution_status == cl.command_execution_status.COMPLETE


async def test_event_awaited_by_many_tasks_and_twice(engine, prims, upload, x, gate):
    stream = await engine.stream()
    src = await upload(x)
    woke = []
    with gate(engine.cl_context) as g:
        dst = engine.memory(DESC)
        event = stream.execute(prims["exp"], {"src": src, "dst": dst}, deps=[g])
        async with trio.open_nursery() as nursery:
            for i in range(5):
                async def waiter(i=i):
                    await event
                    woke.append(i)
                nursery.start_soon(waiter)
            await settle()
            assert woke == []
            g.set_status(cl.command_execution_status.COMPLETE)
    assert sorted(woke) == list(range(5))
    await event  # again, already complete
    assert event.done


# -- dependencies across streams, contexts and pyopencl ----------------------------------------


@pytest.mark.parametrize("flags_a", [StreamFlags.in_order, OOO], ids=["A-in", "A-ooo"])
@pytest.mark.parametrize("flags_b", [StreamFlags.in_order, OOO], ids=["B-in", "B-ooo"])
async def test_cross_stream_dependency(flags_a, flags_b, engine, prims, upload, x, gate):
    """B's command waits for A's even though A's is held back; then A depends on B's in turn."""
    a_stream, b_stream = await engine.stream(flags_a), await engine.stream(flags_b)
    src = await upload(x)
    y, z, w = (engine.memory(DESC) for _ in range(3))
    with gate(engine.cl_context) as g:
        ea = a_stream.execute(prims["tanh"], {"src": src, "dst": y}, deps=[g])
        eb = b_stream.execute(prims["exp"], {"src": y, "dst": z}, deps=[ea])
        ec = a_stream.execute(prims["add"], {"src0": z, "src1": y, "dst": w}, deps=[eb])
        await settle()
        assert not any(e.done for e in (ea, eb, ec))
    await ec
    t = ref("tanh", x)
    tolerance.check(await z.to_numpy(), ref("exp", t), T)
    tolerance.check(await w.to_numpy(), ref("exp", t) + t, T)


async def test_cross_stream_dependency_with_lanes(rt, monkeypatch, build_on, x, gate):
    monkeypatch.setenv("TRIODNN_OOO_STRATEGY", "lanes:3")
    engine = await rt.engine()
    p = await build_on(engine, DIAMOND)
    a_stream, b_stream = await engine.stream(OOO), await engine.stream(OOO)
    assert a_stream.strategy == b_stream.strategy == "lanes"
    src = await engine.from_numpy(x)
    outs = [engine.memory(DESC) for _ in range(6)]
    with gate(engine.cl_context) as g:
        # Independent commands spread over A's lanes; B waits for each of them.
        firsts = [a_stream.execute(p["tanh"], {"src": src, "dst": o}, deps=[g]) for o in outs[:3]]
        seconds = [b_stream.execute(p["exp"], {"src": i, "dst": o}, deps=[e])
                   for i, o, e in zip(outs[:3], outs[3:], firsts)]
        last = b_stream.execute(p["mul"], {"src0": outs[3], "src1": outs[4], "dst": outs[5]}, deps=seconds)
        await settle()
        assert not any(e.done for e in firsts + seconds + [last])
    await last
    e = ref("exp", ref("tanh", x))
    tolerance.check(await outs[3].to_numpy(), e, T)
    tolerance.check(await outs[5].to_numpy(), e * e, T)


@pytest.mark.parametrize("flags", [StreamFlags.in_order, OOO])
async def test_user_event_dependency(flags, engine, prims, upload, x, gate):
    """A pyopencl UserEvent completed later by the caller holds the command back until then."""
    stream = await engine.stream(flags)
    src, dst = await upload(x), engine.memory(DESC)
    with gate(engine.cl_context) as g:
        event = stream.execute(prims["exp"], {"src": src, "dst": dst}, deps=[g])
        await settle()
        assert not event.done
        # The source changes before the gate opens: the command must see the new values.
        await src.write(-x)
        g.set_status(cl.command_execution_status.COMPLETE)
    await event
    tolerance.check(await dst.to_numpy(), ref("exp", -x), T)


async def test_dependency_from_another_context(rt, x, gate):
    """Events of another engine (another OpenCL context) are bridged: triodnn and pyopencl ones."""
    e1, e2 = await rt.engine(), await rt.engine()
    assert e1.cl_context.int_ptr != e2.cl_context.int_ptr
    p1 = await e1.create_primitive(EltwiseDesc("exp", DESC))
    p2 = await e2.create_primitive(EltwiseDesc("tanh", DESC))
    s1, s2 = await e1.stream(OOO), await e2.stream()
    src1, dst1 = await e1.from_numpy(x), e1.memory(DESC)
    src2, dst2 = await e2.from_numpy(x), e2.memory(DESC)
    with gate(e2.cl_context) as g:
        other = s2.execute(p2, {"src": src2, "dst": dst2}, deps=[g])
        mine = s1.execute(p1, {"src": src1, "dst": dst1}, deps=[other])
        raw = s1.execute(p1, {"src": src1, "dst": src1}, deps=[g, mine])  # foreign pyopencl event
        await settle()
        assert not any(e.done for e in (other, mine, raw))
    with trio.fail_after(10):
        await raw
    assert other.done and mine.done
    tolerance.check(await dst1.to_numpy(), ref("exp", x), T)
    tolerance.check(await src1.to_numpy(), ref("exp", x), T)
    tolerance.check(await dst2.to_numpy(), ref("tanh", x), T)


async def test_dependency_on_an_already_completed_event(engine, prims, upload, x):
    stream = await engine.stream(OOO)
    src, dst = await upload(x), engine.memory(DESC)
    first = stream.execute(prims["tanh"], {"src": src, "dst": dst})
    await first
    second = stream.execute(prims["exp"], {"src": dst, "dst": dst}, deps=[first, first.cl_event])
    await second
    tolerance.check(await dst.to_numpy(), ref("exp", ref("tanh", x)), T)


# -- host copies -------------------------------------------------------------------------------


async def test_read_into_numpy(engine, prims, upload, x):
    stream = await engine.stream(OOO)
    src, dst = await upload(x), engine.memory(DESC)
    k = stream.execute(prims["square"], {"src": src, "dst": dst})
    out = np.full(SHAPE, np.nan, np.float32)
    await stream.read(dst, out, deps=[k])
    tolerance.check(out, ref("square", x), tolerance.ELTWISE)


async def test_to_numpy_after_deps_of_another_stream(engine, prims, upload, x, gate):
    """Memory.to_numpy(deps=...) orders the engine's host copy after commands of any stream."""
    stream = await engine.stream(OOO)
    src, dst = await upload(x), engine.memory(DESC)
    await dst.write(np.zeros(SHAPE, np.float32))
    with gate(engine.cl_context) as g:
        k = stream.execute(prims["square"], {"src": src, "dst": dst}, deps=[g])
        async with trio.open_nursery() as nursery:
            got = {}

            async def read():
                got["value"] = await dst.to_numpy(deps=[k])

            nursery.start_soon(read)
            await settle()
            assert not got
            g.set_status(cl.command_execution_status.COMPLETE)
    tolerance.check(got["value"], ref("square", x), tolerance.ELTWISE)


async def test_write_then_read_on_one_in_order_stream(engine, x):
    stream = await engine.stream()
    mem = engine.memory(DESC)
    out = np.empty(SHAPE, np.float32)
    stream.write(mem, x)
    await stream.read(mem, out)
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("strides", ["ba", (20, 1), (1, 40), (1, 33)])
async def test_to_numpy_of_strided_memory(strides, engine, x):
    mem = await engine.from_numpy(x, MemoryDesc(SHAPE, "f32", strides))
    assert mem.desc.strides != DESC.strides
    got = await mem.to_numpy()
    assert got.shape == SHAPE and got.dtype == np.float32
    np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.int8, np.uint8])
async def test_round_trip_of_other_dtypes(dtype, engine, rng):
    x = rng.integers(0, 100, (3, 7)).astype(dtype)
    mem = await engine.from_numpy(x)
    got = await mem.to_numpy()
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, x)


async def test_bf16_round_trip_rounds_to_nearest_even(engine):
    x = np.array([1.0, -2.5, 3.140625, 1 + 2**-8, 1 + 3 * 2**-9], np.float32)
    mem = await engine.from_numpy(x, MemoryDesc(x.shape, "bf16"))
    got = await mem.to_numpy()
    np.testing.assert_array_equal(got, np.array([1.0, -2.5, 3.140625, 1.0, 1 + 2**-7], np.float32))


async def test_a_completed_write_lets_its_host_array_go(engine):
    """pyopencl's event of a host copy keeps the array until waited on; once the copy is known
    complete the stream lets it go, even while the event lives (the constant tensor cache counts
    on this to see a dropped array leave)."""
    stream = await engine.stream()
    memory = engine.memory(MemoryDesc((1000,)))
    array = np.ones(1000, np.float32)  # f32, contiguous: read in place, not staged
    alive = weakref.ref(array)
    event = stream.write(memory, array)
    await event
    del array
    assert alive() is None and event.done
    np.testing.assert_array_equal(await memory.to_numpy(), np.ones(1000, np.float32))


# -- submissions from outside the runtime's trio run -----------------------------------------------------


async def test_submissions_from_another_thread_or_trio_run_are_refused_and_the_stream_lives_on(engine, build):
    """A stream used to take them unchecked: the submitting call enqueued from the other thread,
    or sent the command through the actor's trio channel, whose wake-up of the actor's task
    from another thread fails trio's own check. Each is refused now, before anything is
    enqueued, and the stream goes on serving its own run."""
    relu = (await build({"relu": EltwiseDesc("relu", DESC)}))["relu"]
    stream = await engine.stream()
    x = np.linspace(-1.0, 1.0, DESC.nelems, dtype=np.float32).reshape(SHAPE)
    src, dst = await engine.from_numpy(x), engine.memory(DESC)
    out = np.empty(SHAPE, np.float32)
    calls = {
        relu.label: lambda: stream.execute(relu, {"src": src, "dst": dst}),
        f"write:{DESC}": lambda: stream.write(dst, x),
        f"read:{DESC}": lambda: stream.read(dst, out),
        "marker": stream.marker,
        "barrier": stream.barrier,
    }

    async def in_trio(call):
        return call()

    submitted = stream.statistics().submitted
    threads = set(threading.enumerate())
    for label, call in calls.items():
        for how, error in (in_a_thread(call), in_another_trio_run(in_trio, call)):
            assert how == "raised" and isinstance(error, triodnn.WrongThreadError), (label, how, error)
            assert str(error).startswith(f"{label}: submitted") and f"submitted to a stream of {engine}" in str(error)
            assert "start_blocking()" in str(error)
    how, error = in_another_trio_run(stream.wait)
    assert how == "raised" and isinstance(error, triodnn.WrongThreadError), (how, error)
    assert stream.statistics().submitted == submitted  # nothing reached OpenCL
    assert threads_since(threads) == set()

    await stream.execute(relu, {"src": src, "dst": dst})
    np.testing.assert_array_equal(await dst.to_numpy(), np.maximum(x, 0))
