"""From OpenCL completion to a woken trio task, quickly even when the trio thread is busy.

Two paths deliver a completion, whichever comes first:

* an OpenCL event callback (one OS thread per call in pyopencl) hands it to trio with
  ``TrioToken.run_sync_soon``. This is the path while trio sleeps in its I/O wait.
* a trio instrument polls the oldest pending events before every I/O wait. Measured here, a
  callback thread can starve for seconds on the GIL while a trio task is CPU-busy with frequent
  checkpoints; the poll runs on the trio thread itself, so a completion is seen within one
  scheduler pass.

Callbacks are registered only for events somebody awaits, and a callback that arrives after the
trio run has ended is dropped quietly (``RunFinishedError``).
"""

from __future__ import annotations

import functools
import itertools

import attrs
import pyopencl as cl
import trio

_COMPLETE = cl.command_execution_status.COMPLETE


@attrs.define(eq=False)
class _Pending:
    cl_event: cl.Event
    done: trio.Event = attrs.field(factory=trio.Event)


@attrs.frozen
class CompletionStatistics:
    pending: int
    callbacks_registered: int
    completed_by_callback: int
    completed_by_poll: int


class _PollInstrument(trio.abc.Instrument):
    def __init__(self, actor: CompletionActor) -> None:
        self._actor = actor

    def before_io_wait(self, timeout: float) -> None:
        if self._actor._pending:
            self._actor._poll()


class CompletionActor:
    """Owns the callbacks and the polling instrument; one per runtime."""

    POLL_LIMIT = 16  # events polled per scheduler pass: bounds the cost when many are pending

    def __init__(self) -> None:
        self._pending: dict[int, _Pending] = {}
        self._token: trio.lowlevel.TrioToken | None = None
        self._closed = False
        self._callbacks = 0
        self._by_callback = 0
        self._by_poll = 0

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._token = trio.lowlevel.current_trio_token()
        instrument = _PollInstrument(self)
        trio.lowlevel.add_instrument(instrument)
        try:
            task_status.started(self)
            await trio.sleep_forever()
        finally:
            trio.lowlevel.remove_instrument(instrument)
            self._close()

    def _close(self) -> None:
        # Streams have finished their queues before this runs; waking everyone lets each waiter
        # read the final status itself instead of hanging on a callback that may never be routed.
        self._closed = True
        for pending in self._pending.values():
            pending.done.set()
        self._pending.clear()

    def statistics(self) -> CompletionStatistics:
        return CompletionStatistics(
            pending=len(self._pending),
            callbacks_registered=self._callbacks,
            completed_by_callback=self._by_callback,
            completed_by_poll=self._by_poll,
        )

    async def wait(self, cl_event: cl.Event) -> int:
        """Wait until ``cl_event`` completes; return its final execution status (negative: failed)."""
        status = cl_event.command_execution_status
        if status <= _COMPLETE:
            await trio.lowlevel.checkpoint()
            return status
        if self._closed:
            # After shutdown the queues are finished, so the status above was already final.
            await trio.lowlevel.checkpoint()
            return status
        key = cl_event.int_ptr
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending(cl_event)
            self._callbacks += 1
            cl_event.set_callback(_COMPLETE, functools.partial(self._from_callback_thread, key))
        await pending.done.wait()
        return cl_event.command_execution_status

    def _from_callback_thread(self, key: int, status: int) -> None:
        try:
            self._token.run_sync_soon(self._complete_from_callback, key)
        except trio.RunFinishedError:
            pass  # the run ended; nobody is left to wake

    def _complete_from_callback(self, key: int) -> None:
        pending = self._pending.pop(key, None)
        if pending is not None:
            self._by_callback += 1
            pending.done.set()

    def _poll(self) -> None:
        finished = [
            key
            for key, pending in itertools.islice(self._pending.items(), self.POLL_LIMIT)
            if pending.cl_event.command_execution_status <= _COMPLETE
        ]
        for key in finished:
            self._by_poll += 1
            self._pending.pop(key).done.set()
