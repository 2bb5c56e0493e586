"""From OpenCL completion to a woken trio task, promptly, even when the trio thread is busy.

An await first *polls* its event for a short while (``SPIN_NS``): most kernels a pipeline
awaits end within microseconds of their flush, sooner than any thread could hand the news over.
Then three paths deliver a completion; whichever sees it first wakes the waiting task:

* **Queue waiters.** Each OpenCL queue gets one daemon thread (started at the first await) that
  blocks in ``clWaitForEvents`` on the oldest awaited event of that queue, then hands the
  completion to trio with ``TrioToken.run_sync_soon``. In an in-order queue completions come in
  submission order, so the oldest is the right one to wait for. Measured on NVIDIA, event
  callbacks fire 18–20 ms after the kernel ends while a blocking wait returns on time, and
  pyopencl starts one OS thread per callback; a waiter thread avoids both. It also delivers
  failures, for which PoCL calls no callback at all.
* **Callbacks**, added where the waiter may be late: out-of-order queues (completion order
  unknown) and an event awaited after a later one of its queue is already being waited for.
* **Polling on the trio thread.** A thread needs the GIL to reach trio, and a CPU-busy trio
  thread that checkpoints often can starve it for seconds. So a trio instrument polls pending
  events before every I/O wait, round-robin, a bounded number per pass: a completion is seen
  within a few scheduler passes even then.

A completion that arrives after the trio run has ended is dropped quietly (``RunFinishedError``).

Everything here belongs to the one trio run the actor serves: a task of another run (another
thread's ``trio.run``) that waited on one of its ``trio.Event``s would never be woken, and waking
it from this run fails trio's own check, which ends this run with ``TrioInternalError``. So
``check_thread`` refuses callers on other threads with a ``WrongThreadError`` before they touch
anything.
"""

from __future__ import annotations

import collections
import functools
import heapq
import os
import threading
import time
from collections.abc import Callable

import attrs
import pyopencl as cl
import trio

from .._values._errors import WrongThreadError
from ._submission import execution_status, failed_status

_COMPLETE = cl.command_execution_status.COMPLETE


@attrs.define(eq=False)
class _Pending:
    """One awaited event. Deliveries name this object, never the event's address: once an event
    is freed, a new one can get its address while a late delivery for the old one is under way."""

    key: int
    cl_event: cl.Event
    done: trio.Event = attrs.field(factory=trio.Event)


@attrs.frozen
class CompletionStatistics:
    """Events being awaited now, and how past completions were delivered."""

    pending: int
    callbacks_registered: int
    waiter_watches: int
    completed_by_waiter: int
    completed_by_callback: int
    completed_by_poll: int
    completed_by_spin: int = 0


class _PollInstrument(trio.abc.Instrument):
    def __init__(self, actor: CompletionActor) -> None:
        self._actor = actor

    def before_io_wait(self, timeout: float) -> None:
        self._actor.flush_and_poll()


class QueueWaiter:
    """One thread waiting on the awaited events of one in-order queue, oldest first."""

    def __init__(self, name: str, *, in_order: bool) -> None:
        self._name = name
        self._in_order = in_order
        self._heap: list[tuple[int, int, cl.Event, Callable[[], None]]] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._waiting_on = -1  # sequence number of the event the thread is blocked on

    def watch(self, seq: int, cl_event: cl.Event, notify: Callable[[], None]) -> bool:
        """Have ``notify()`` called from the thread once ``cl_event`` (number ``seq``) completes.

        Every watched event is delivered, failed ones included (PoCL calls no callback for an
        event that ends in an error). Returns whether delivery will also be prompt: not when the
        queue is out-of-order, nor when the thread is already blocked on a later event; then
        the caller adds a faster path.
        """
        with self._cond:
            if self._closed:
                return False
            timely = self._in_order and seq >= self._waiting_on
            heapq.heappush(self._heap, (seq, id(cl_event), cl_event, notify))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
            return timely

    def close(self) -> None:
        """The thread delivers what it holds (the queue is finished by now) and exits."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._closed:
                    self._cond.wait()
                if not self._heap:
                    return
                seq, _, cl_event, notify = heapq.heappop(self._heap)
                self._waiting_on = seq
            try:
                cl.wait_for_events([cl_event])  # releases the GIL
            except cl.Error:
                pass  # the event failed; the waiter reads its negative status
            notify()
            # Not kept while the thread sleeps for the next one: a host copy's event holds its
            # numpy array (pyopencl's NannyEvent), which would outlive every other reference.
            del cl_event, notify


class CompletionActor:
    """Owns completion delivery for one runtime: waiters' hand-offs, callbacks, the poll."""

    POLL_LIMIT = 16  # events polled per scheduler pass: bounds the cost when many are pending
    # How long an await polls its event before it hands the wait to a thread: a fifth of it
    # without yielding when no other task is runnable, the rest once per scheduler pass.
    # Measured on an H100 (bench_submit roundtrip, one relu on 64 floats): a kernel completes
    # 8-15 µs after its flush, while a waiter thread's hand-off (condition, wait,
    # ``run_sync_soon``, trio's wake-up) took ~50 µs: the roundtrip went from 3.6x raw pyopencl
    # to 2.2x with the polling passes. The passes let every other task run, so spinning costs
    # only CPU that nothing else wanted.
    SPIN_NS = int(float(os.environ.get("TRIODNN_SPIN_US", "50")) * 1000)

    def __init__(self) -> None:
        self._to_flush: list = []  # stream actors with enqueued, unflushed commands
        self._pending: dict[int, _Pending] = {}
        self._poll_order: collections.deque[_Pending] = collections.deque()
        self._token: trio.lowlevel.TrioToken | None = None
        # The thread of the trio run served: a run lives on one thread, and one thread holds
        # one run at a time, so comparing idents tells this run's callers from all others
        # (cheaper than fetching the current run's token on every submit and await).
        self._thread: int | None = None
        self._thread_name = ""
        self._closed = False
        self._callbacks = 0
        self._watches = 0
        self._by_waiter = 0
        self._by_callback = 0
        self._by_poll = 0
        self._by_spin = 0

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._thread = threading.get_ident()
        self._thread_name = threading.current_thread().name
        instrument = _PollInstrument(self)
        trio.lowlevel.add_instrument(instrument)
        try:
            task_status.started(self)
            await trio.sleep_forever()
        finally:
            try:
                trio.lowlevel.remove_instrument(instrument)
            except KeyError:
                pass  # trio removed it already, after it raised (a bug: it must not)
            self._close()

    def _close(self) -> None:
        # Streams have finished their queues before this runs; waking everyone lets each waiter
        # read the final status itself instead of hanging on a delivery that may never come.
        self._closed = True
        for pending in self._pending.values():
            pending.done.set()
        self._pending.clear()
        self._poll_order.clear()

    @property
    def run_thread(self) -> int | None:
        """``threading.get_ident()`` of the thread of the trio run this actor serves (None before
        ``serve`` starts)."""
        return self._thread

    def check_thread(self, label: str, doing: str) -> None:
        """``WrongThreadError`` unless the caller runs on the thread of the trio run this actor
        serves, or the actor has closed (every command's state is final then, and nothing is
        left to wake). ``label`` and ``doing`` name the culprit: ``"relu:...", "awaited"``."""
        if threading.get_ident() == self._thread or self._closed:
            return
        raise WrongThreadError(
            f"{label}: {doing} from thread {threading.current_thread().name!r}, outside the trio "
            f"run of its runtime (thread {self._thread_name!r}), to which a runtime's engines, "
            "streams and events belong; call from a task of that run (from another thread: "
            "trio.from_thread.run with that run's trio token), or open the runtime through a "
            "blocking portal (triodnn.start_blocking()), whose objects work from any thread"
        )

    def flush_soon(self, stream_actor) -> None:
        """Flush ``stream_actor``'s queues at the end of this scheduler pass."""
        self._to_flush.append(stream_actor)

    def flush_and_poll(self) -> None:
        """Once a scheduler pass, before trio waits for I/O (``_PollInstrument``): flush the
        streams' enqueued commands, so the device starts them, and poll the pending events."""
        if self._to_flush:
            self._flush_streams()
        if self._pending:
            self._poll()

    def _flush_streams(self) -> None:
        streams, self._to_flush = self._to_flush, []
        for stream_actor in streams:
            stream_actor.flush()

    def statistics(self) -> CompletionStatistics:
        return CompletionStatistics(
            pending=len(self._pending),
            callbacks_registered=self._callbacks,
            waiter_watches=self._watches,
            completed_by_waiter=self._by_waiter,
            completed_by_callback=self._by_callback,
            completed_by_poll=self._by_poll,
            completed_by_spin=self._by_spin,
        )

    async def wait(self, cl_event: cl.Event, waiter: QueueWaiter | None = None, seq: int = 0) -> int:
        """Wait until ``cl_event`` completes; return its final execution status (negative: failed).

        ``waiter`` is the queue waiter of the event's in-order queue, ``seq`` its submission
        number there; without one, an OpenCL callback delivers the completion.
        """
        try:
            status = cl_event.command_execution_status
            if status <= _COMPLETE or self._closed:
                # After shutdown the queues are finished, so the status read above was final.
                await trio.lowlevel.checkpoint()
                return status
            if self._to_flush:
                self._flush_streams()  # the device starts now, not at the end of this pass
            if self.SPIN_NS > 0:
                now = time.perf_counter_ns()
                deadline = now + self.SPIN_NS
                if not trio.lowlevel.current_statistics().tasks_runnable:
                    # Nothing else can run: poll without a scheduler pass in between (each pass
                    # costs an epoll call, ~5 µs), for at most a fifth of the budget, so that timers
                    # and I/O wait at most that long.
                    until = now + self.SPIN_NS // 5
                    while time.perf_counter_ns() < until:
                        status = cl_event.command_execution_status
                        if status <= _COMPLETE:
                            self._by_spin += 1
                            await trio.lowlevel.checkpoint()
                            return status
                while True:
                    await trio.lowlevel.checkpoint()
                    status = cl_event.command_execution_status
                    if status <= _COMPLETE:
                        self._by_spin += 1
                        return status
                    if self._closed or time.perf_counter_ns() >= deadline:
                        break
                if self._closed:
                    return cl_event.command_execution_status
            key = cl_event.int_ptr
            pending = self._pending.get(key)
            if pending is None:
                pending = self._pending[key] = _Pending(key, cl_event)
                self._poll_order.append(pending)
                notify = functools.partial(self._from_thread, self._complete_by_waiter, pending)
                timely = waiter is not None and waiter.watch(seq, cl_event, notify)
                self._watches += waiter is not None
                if not timely:
                    self._callbacks += 1
                    cl_event.set_callback(_COMPLETE, functools.partial(self._from_callback, pending))
            await pending.done.wait()
            return cl_event.command_execution_status
        except cl.Error as exc:
            # After a kernel fault NVIDIA fails clGetEventInfo itself (-9999): the command failed.
            await trio.lowlevel.checkpoint()
            return failed_status(exc)

    def _from_callback(self, pending: _Pending, status: int) -> None:
        self._from_thread(self._complete_by_callback, pending)

    def _from_thread(self, complete: Callable[[_Pending], None], pending: _Pending) -> None:
        assert self._token is not None, "serve sets the token before any wait can register"
        try:
            self._token.run_sync_soon(complete, pending)
        except trio.RunFinishedError:
            pass  # the run ended; nobody is left to wake

    def _complete_by_waiter(self, pending: _Pending) -> None:
        if self._deliver(pending):
            self._by_waiter += 1

    def _complete_by_callback(self, pending: _Pending) -> None:
        if self._deliver(pending):
            self._by_callback += 1

    def _deliver(self, pending: _Pending) -> bool:
        if self._pending.get(pending.key) is not pending:
            return False  # another path was first
        del self._pending[pending.key]
        pending.done.set()
        if not self._pending:
            self._poll_order.clear()  # only entries already delivered are left in it
        return True

    def _poll(self) -> None:
        # Round-robin over pending events: keys delivered by another path are dropped as met.
        order = self._poll_order
        for _ in range(min(self.POLL_LIMIT, len(order))):
            pending = order.popleft()
            if self._pending.get(pending.key) is not pending:
                continue
            if execution_status(pending.cl_event) <= _COMPLETE:
                self._deliver(pending)
                self._by_poll += 1
                if not order:
                    return
            else:
                order.append(pending)
