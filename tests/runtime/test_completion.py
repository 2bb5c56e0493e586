"""The completion actor's bookkeeping: deliveries reach the waiter they were meant for."""

from __future__ import annotations

import pyopencl as cl
import trio
import trio.testing

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
