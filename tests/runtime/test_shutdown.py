"""Leaving open_runtime(): work in flight completes, callbacks racing the end of the run are quiet.

The trio tests here call ``trio.run`` themselves (plain test functions): the point is what
happens when a whole trio run ends while OpenCL callback threads still want to reach it.
"""

from __future__ import annotations

import gc
import sys
import threading

import numpy as np
import pyopencl as cl
import pytest
import trio
import trio.testing

import triodnn
from triodnn import EltwiseDesc, MemoryDesc, StreamFlags
from triodnn.kernels import eltwise, tolerance

BIG = MemoryDesc((1 << 18,))  # a few ms per kernel on two cores: still running when the block exits
COMPLETE = cl.command_execution_status.COMPLETE


@pytest.fixture
def reports(monkeypatch):
    """Everything reported through threading.excepthook and sys.unraisablehook."""
    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(("thread", args)))
    monkeypatch.setattr(sys, "unraisablehook", lambda info: seen.append(("unraisable", info)))
    return seen


def read_back(memory) -> np.ndarray:
    """The buffer's contents through plain pyopencl (the runtime is gone by then)."""
    host = np.empty(memory.desc.dims, np.float32)
    queue = cl.CommandQueue(memory.engine.cl_context, memory.engine.cl_device)
    cl.enqueue_copy(queue, host, memory.cl_buffer).wait()
    return host


async def one_run(seed: int, keep: list, callbacks: list) -> None:
    x = np.random.default_rng(seed).uniform(-3, 3, BIG.dims).astype(np.float32)
    async with triodnn.open_runtime() as rt:
        engine, other = await rt.engine(), await rt.engine()
        prim = await engine.create_primitive(EltwiseDesc("gelu_erf", BIG))
        ooo, ino = await engine.stream(StreamFlags.out_of_order), await engine.stream()
        foreign = await other.stream()
        src = await engine.from_numpy(x)
        outs = [engine.memory(BIG) for _ in range(8)]
        gate = cl.UserEvent(engine.cl_context)
        foreign_gate = cl.UserEvent(other.cl_context)
        foreign_marker = foreign.marker(deps=[foreign_gate])
        events = [ooo.execute(prim, {"src": src, "dst": o}) for o in outs[:3]]
        events += [ino.execute(prim, {"src": src, "dst": o}) for o in outs[3:5]]
        events += [ooo.execute(prim, {"src": src, "dst": outs[5]}, deps=[gate]),
                   ino.execute(prim, {"src": src, "dst": outs[6]}, deps=[foreign_marker]),
                   ooo.execute(prim, {"src": src, "dst": outs[7]}, deps=[events[0], gate])]
        await events[0]  # one awaited to the end

        # Waiters that register callbacks, then are cancelled mid-wait.
        async with trio.open_nursery() as nursery:
            for event in events[1:]:
                nursery.start_soon(event.wait)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()

        # Work still held back when the block exits; released from another thread as it does.
        opener = threading.Timer(0.0, lambda: (gate.set_status(COMPLETE), foreign_gate.set_status(COMPLETE)))
        opener.start()
        keep.append((x, outs, events, opener))
        stats = rt.statistics()
        callbacks.append(stats.callbacks_registered + stats.waiter_watches)


def test_run_ending_with_callbacks_in_flight_reports_nothing(reports, capfd):
    runs, callbacks = [], []
    for seed in range(20):
        keep: list = []
        trio.run(one_run, seed, keep, callbacks)
        runs.extend(keep)
    # Callbacks (native out-of-order queues) or queue-waiter threads (in-order queues, all of
    # them on NVIDIA): either way threads that hand completions to trio were armed.
    assert sum(callbacks) > 0, "no completion thread was ever armed: the test tests nothing"
    for _, _, _, opener in runs:
        opener.join()
    gc.collect()
    assert reports == []
    err = capfd.readouterr().err
    assert "Traceback" not in err and "exception" not in err.lower(), err
    # Every command, awaited, cancelled mid-wait or never awaited, completed before the block exited.
    for x, outs, events, _ in runs[:3]:
        assert all(event.done and event._submission.failure is None for event in events)
        for out in outs:
            tolerance.check(read_back(out), eltwise.reference("gelu_erf", x), tolerance.eltwise("gelu_erf"))
    assert all(event.done for _, _, events, _ in runs for event in events)


async def submit_tanh(engine, x, deps=()):
    """A write and a kernel that depends on it, submitted and not awaited.

    Both memories are returned: a Memory dropped before its command is enqueued frees the
    buffer under it (see test_errors.py::test_memory_released_right_after_submission...).
    """
    prim = await engine.create_primitive(EltwiseDesc("tanh", BIG))
    stream = await engine.stream(StreamFlags.out_of_order)
    src, dst = engine.memory(BIG), engine.memory(BIG)
    wrote = stream.write(src, x, deps=deps)
    ran = stream.execute(prim, {"src": src, "dst": dst}, deps=[wrote])
    return (src, dst), (wrote, ran)


X = np.linspace(-4, 4, BIG.nelems, dtype=np.float32)


def test_enqueued_unawaited_work_is_done_after_the_block():
    """Commands the actors enqueued but nobody awaited still run to completion on exit."""

    async def main():
        async with triodnn.open_runtime() as rt:
            engine = await rt.engine()
            gate = cl.UserEvent(engine.cl_context)
            (src, dst), events = await submit_tanh(engine, X, deps=[gate])
            await trio.testing.wait_all_tasks_blocked()  # enqueued by the stream actor
            assert not any(event.done for event in events)
            opener = threading.Timer(0.0, gate.set_status, [COMPLETE])  # opens while the block exits
            opener.start()
        opener.join()
        return rt, dst, events

    rt, dst, events = trio.run(main)
    assert rt.closed
    assert all(event.done and event._submission.failure is None for event in events)
    tolerance.check(read_back(dst), eltwise.reference("tanh", X), tolerance.eltwise("tanh"))


def test_body_exception_comes_out_as_itself_after_a_clean_shutdown():
    state = {}

    async def main():
        async with triodnn.open_runtime() as rt:
            state["rt"] = rt
            (state["src"], state["dst"]), state["events"] = await submit_tanh(await rt.engine(), X)
            await trio.testing.wait_all_tasks_blocked()
            raise KeyError("from the block")

    with pytest.raises(KeyError, match="from the block"):
        trio.run(main)
    assert state["rt"].closed and all(event.done for event in state["events"])
    tolerance.check(read_back(state["dst"]), eltwise.reference("tanh", X), tolerance.eltwise("tanh"))


@pytest.mark.parametrize("exit_by", ["return", "raise"])
def test_work_submitted_just_before_exit_completes_quietly(exit_by):
    """Fire-and-forget: the last submissions are not awaited, not even enqueued, when the block ends."""
    state = {}

    async def main():
        # No checkpoint between the last submission and the exit: the actor has not run yet.
        async with triodnn.open_runtime() as rt:
            (state["src"], state["dst"]), state["events"] = await submit_tanh(await rt.engine(), X)
            if exit_by == "raise":
                raise KeyError("from the block")

    try:
        trio.run(main)
    except KeyError:
        assert exit_by == "raise"
    else:
        assert exit_by != "raise"
    assert all(event.done and event._submission.failure is None for event in state["events"])
    tolerance.check(read_back(state["dst"]), eltwise.reference("tanh", X), tolerance.eltwise("tanh"))


def test_triodnn_error_in_the_body_is_not_wrapped():
    async def main():
        async with triodnn.open_runtime() as rt:
            await rt.engine("tpu")

    with pytest.raises(triodnn.InvalidArgumentError, match="'tpu'"):
        trio.run(main)


def test_cancelled_body_shuts_down_cleanly():
    async def main():
        with trio.CancelScope() as scope:
            async with triodnn.open_runtime() as rt:
                engine = await rt.engine()
                memory = engine.memory(BIG)
                event = (await engine.stream()).write(memory, np.zeros(BIG.dims, np.float32))
                await trio.testing.wait_all_tasks_blocked()
                scope.cancel()
                await trio.sleep_forever()
        return scope.cancelled_caught, rt, event

    caught, rt, event = trio.run(main)
    assert caught and rt.closed and event.done


def test_build_in_flight_completes_when_its_requester_is_cancelled():
    async def main():
        async with triodnn.open_runtime() as rt:
            engine = await rt.engine()
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(engine.create_primitive, EltwiseDesc("sigmoid", MemoryDesc((33,))))
                    await trio.testing.wait_all_tasks_blocked()
                    scope.cancel()
            assert scope.cancelled_caught
        return engine.statistics()

    stats = trio.run(main)
    assert stats.builds_in_flight == 0
    assert stats.programs_built == 1
