"""The completion actor's bookkeeping: deliveries reach the waiter they were meant for."""

from __future__ import annotations

import threading

import numpy as np
import pyopencl as cl
import trio
import trio.testing
from conftest import in_a_thread, in_another_trio_run, threads_since

import triodnn
from triodnn.actors._completion import _Pending

COMPLETE = cl.command_execution_status.COMPLETE


async def test_a_late_delivery_for_a_freed_event_spares_the_event_at_its_address(rt, engine):
    """A freed event's address can be reused while a delivery for it is still on its way (a
    waiter thread's or callback's run_sync_soon); it must not wake the new event's waiter."""
    completion = rt._completion
    gate = cl.UserEvent(engine.cl_context)
    stream = await engine.stream()
    marker = stream.marker(deps=[gate])
    await marker.wait_submitted()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(marker.wait)
            await trio.testing.wait_all_tasks_blocked()
            key = marker.cl_event.int_ptr
            live = completion._pending[key]
            stale = _Pending(key, marker.cl_event)  # meant for an earlier event at this address
            completion._complete_by_waiter(stale)
            completion._complete_by_callback(stale)
            assert completion._pending.get(key) is live
            assert not live.done.is_set()
            gate.set_status(COMPLETE)
    finally:
        if gate.command_execution_status != COMPLETE:
            gate.set_status(COMPLETE)  # never leave the runtime's shutdown waiting on the gate
    assert marker.done


# -- events awaited outside their runtime's trio run ---------------------------------------------------


async def test_a_pending_event_awaited_from_another_trio_run_is_refused_and_the_runtime_lives_on(rt, engine, gate):
    """It used to hang the other run's task, and the delivery meant for it, made on this run,
    ended this run with a TrioInternalError. Now the await raises before it touches anything."""
    stream = await engine.stream()
    with gate(engine.cl_context) as held:
        marker = stream.marker(deps=[held])
        await marker.wait_submitted()  # enqueued, pending behind the gate
        threads = set(threading.enumerate())
        for wait in (marker.wait, marker.wait_submitted):
            how, error = in_another_trio_run(wait)
            assert how == "raised" and isinstance(error, triodnn.WrongThreadError), (how, error)
            assert "marker: awaited from thread 'triodnn-test-other-thread'" in str(error)
            assert "start_blocking()" in str(error)
        assert threads_since(threads) == set()  # no waiter started for it
        assert rt.statistics().pending == 0
        assert not marker.done
    # The gate has opened: this run's own await completes, and the runtime takes new work.
    await marker
    x = np.arange(7, dtype=np.float32)
    memory = await engine.from_numpy(x)
    np.testing.assert_array_equal(await memory.to_numpy(), x)


async def test_a_completed_event_awaited_from_another_trio_run_is_refused_too(engine):
    """The outcome does not depend on whether the command has completed yet."""
    marker = (await engine.stream()).marker()
    await marker
    how, error = in_another_trio_run(marker.wait)
    assert how == "raised" and isinstance(error, triodnn.WrongThreadError), (how, error)


async def test_done_and_cl_event_answer_any_thread(engine, gate):
    stream = await engine.stream()
    with gate(engine.cl_context) as held:
        marker = stream.marker(deps=[held])
        await marker.wait_submitted()
        assert in_a_thread(lambda: marker.done) == ("returned", False)
        assert in_a_thread(lambda: marker.cl_event) == ("returned", marker.cl_event)
    await marker
    assert in_a_thread(lambda: marker.done) == ("returned", True)


def test_events_of_a_closed_runtime_are_awaited_anywhere():
    """Once the runtime has closed, every command's state is final: nothing is left to wake."""

    async def main():
        async with triodnn.open_runtime() as rt:
            stream = await (await rt.engine()).stream()
            return stream.marker()

    marker = trio.run(main)
    assert in_another_trio_run(marker.wait) == ("returned", None)
    assert marker.done
