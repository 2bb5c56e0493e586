"""The stream actor: owns the command queues of one stream and enqueues everything for it.

A command is enqueued *by the submitting call itself* when nothing can reorder it: the actor's
channel is empty and no dependency is still waiting in another stream's actor. Only then is the
channel needed: a command behind such a dependency, and every command after it, waits there,
in order, for the actor's task. Measured on an H100 before this (bench_submit, one command
submitted and awaited at a time): the hop through the channel to the actor task and back cost
~20 µs per command on top of raw pyopencl's 22.

Flushes are deferred to the end of the scheduler pass (the completion actor's instrument flushes
every dirty stream before trio waits for I/O), or sooner every ``FLUSH_EVERY`` commands, so a
burst of submissions costs one ``clFlush`` per queue, as the actor's batches did.

Out-of-order streams come in two strategies (see ``_ooo_policy``): one native out-of-order queue,
or a pool of in-order *lanes*. With lanes, lane 0 takes every command by default, in order, like
an in-order queue; a command that depends on the last command of a lane goes to that lane (the
queue orders it for free); a kernel that ``may_overlap`` goes round-robin over all lanes; every
other dependency becomes an event wait across lanes (after a flush of the lane it waits for, as
OpenCL requires for events of another queue).
"""

from __future__ import annotations

import collections
import math
import threading
from typing import Protocol

import numpy as np
import pyopencl as cl
import trio

from .._values._errors import ClosedError, DependencyError, DeviceLostError, ExecutionError, TriodnnError
from ._allocator import SvmBuffer
from ._channels import take_queued
from ._commands import Barrier, Command, KernelLaunch, KernelSequence, Marker, ReadBuffer, WriteBuffer
from ._completion import CompletionActor, QueueWaiter
from ._health import DeviceHealth
from ._submission import Submission, execution_status

_COMPLETE = cl.command_execution_status.COMPLETE
_OOO = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
_PROFILING = cl.command_queue_properties.PROFILING_ENABLE


def _copy_function(name: str, to_device: bool):
    """pyopencl's buffer <-> host copy itself, ``(queue, buffer, host, offset, wait_for,
    is_blocking)``: ``cl.enqueue_copy`` first works out which of its dozen copies it was asked
    for in Python, 25 µs of a 40 µs graph request's two copies under cProfile on PoCL."""
    direct = getattr(cl._cl, name, None)  # private: fall back to the public call if it goes
    if direct is not None:
        return direct
    if to_device:
        return lambda queue, buffer, host, offset, wait_for, blocking: cl.enqueue_copy(
            queue, buffer, host, dst_offset=offset, wait_for=wait_for, is_blocking=blocking)
    return lambda queue, buffer, host, offset, wait_for, blocking: cl.enqueue_copy(
        queue, host, buffer, src_offset=offset, wait_for=wait_for, is_blocking=blocking)


_write_buffer = _copy_function("_enqueue_write_buffer", to_device=True)
_read_buffer = _copy_function("_enqueue_read_buffer", to_device=False)


def _svm_copy(queue: cl.CommandQueue, dst: cl.SVMPointer, src: cl.SVMPointer, nbytes: int, wait_for) -> cl.Event:
    """``clEnqueueSVMMemcpy``, non-blocking, for an ``SvmBuffer`` (a caller's SVM allocation)
    on either side; ``cl.SVM`` tags the host array as a plain host pointer."""
    return cl.enqueue_copy(queue, dst, src, byte_count=nbytes, wait_for=wait_for, is_blocking=False)


def _queue(context: cl.Context, device: cl.Device, properties: int) -> cl.CommandQueue:
    """A queue with ``properties``, a bit mask (profiling, out-of-order, or both)."""
    # pyopencl's stub types ``properties`` as one command_queue_properties member, not a mask
    # (unused-ignore: releases without the stub, or with a fixed one, need no ignore).
    return cl.CommandQueue(context, device, properties)  # type: ignore[arg-type, unused-ignore]


class EnqueueHooks(Protocol):
    """What the stream actor uses of the runtime's instrument registry (``triodnn._instruments``)."""

    @property
    def enqueue_hooks(self) -> tuple[object, ...]: ...

    def command_enqueued(self, command: Command) -> None: ...


class _NoInstruments:
    """Stands in for the runtime's instrument registry where none is given: no hooks."""

    __slots__ = ()
    enqueue_hooks = ()

    def command_enqueued(self, command: Command) -> None:
        pass  # never called: no enqueue hooks


class StreamActor:
    """Serves one stream. ``mode`` is ``in_order``, ``native`` (out-of-order queue) or ``lanes``.

    ``completion`` is the runtime's completion actor, which events of this stream wait through;
    ``instruments`` the runtime's instrument registry (``triodnn._instruments.INSTRUMENTS``), whose
    ``command_enqueued`` hears of each command right after its enqueue while ``enqueue_hooks``.
    """

    def __init__(
        self,
        context: cl.Context,
        device: cl.Device,
        *,
        out_of_order: bool,
        profiling: bool,
        lanes: int = 1,
        queue: cl.CommandQueue | None = None,
        completion: CompletionActor,
        instruments: EnqueueHooks | None = None,
        spread: bool = False,
        health: DeviceHealth | None = None,
    ) -> None:
        self.context = context
        self.device = device
        self.profiling = profiling
        self.completion = completion
        self._run_thread = completion.run_thread  # the only thread that may submit or settle
        self._instruments: EnqueueHooks = instruments if instruments is not None else _NoInstruments()
        if queue is not None:
            self.mode = "native" if queue.properties & _OOO else "in_order"
            self.queues = [queue]
            self.profiling = bool(queue.properties & _PROFILING)  # the caller's queue decides
        else:
            props = _PROFILING if profiling else 0
            if not out_of_order:
                self.mode = "in_order"
                self.queues = [_queue(context, device, props)]
            elif lanes <= 1:
                self.mode = "native"
                self.queues = [_queue(context, device, props | _OOO)]
            else:
                # Lane 0 now, the others when a kernel first takes one: measured on an H100, a
                # stream whose commands all went to lane 0 of 8 existing queues still ran eight
                # small kernels 0.88-0.94x as fast as an in-order stream (bench_ooo).
                self.mode = "lanes"
                self.queues = [_queue(context, device, props)]
        self._max_lanes = lanes if self.mode == "lanes" else 1
        self._queue_properties = _PROFILING if self.profiling else 0
        self._context_ptr = context.int_ptr
        self.waiters = [
            QueueWaiter(f"triodnn-queue-waiter-{i}", in_order=not q.properties & _OOO)
            for i, q in enumerate(self.queues)
        ]
        self._lanes = self.mode == "lanes"
        self._spread = spread  # lanes: every independent kernel in turn (``lanes:N:spread``)
        self._tails: list[cl.Event | None] = [None] * len(self.queues)
        self._lane_of_tail: dict[int, int] = {}
        self._next_lane = 0
        self._fence: list[cl.Event] = []
        self._fenced = [True] * len(self.queues)
        self._dirty: set[int] = set()
        # Host-copy events (pyopencl NannyEvents) block in their destructor while pending, with
        # the GIL held; the actor keeps them, with their host side (an SVM copy's event holds no
        # reference to it), until they complete.
        self._inflight_copies: collections.deque[tuple[cl.Event, object]] = collections.deque()
        self._send, self._recv = trio.open_memory_channel(math.inf)
        self._backlog = 0  # commands in the channel, not enqueued yet: later ones queue behind them
        self._unflushed = 0
        self.closed = False
        self.lost: DeviceLostError | None = None  # set with ``closed`` when the device is lost
        # The context's health (the device actor's): told of enqueues and commands that fail.
        self.health = health if health is not None else DeviceHealth(context, device, device.name.strip())
        self.health.watch(self)
        self.submitted = 0
        self.direct = 0  # commands enqueued by the submitting call (statistics)

    # -- requester side ---------------------------------------------------------------------

    FLUSH_EVERY = 16  # commands enqueued between flushes within one scheduler pass

    def on_run_thread(self) -> bool:
        """Whether the caller runs on the thread of this stream's trio run: the actor's state
        (queues' tails, the channel, host copies) is touched from there only."""
        return threading.get_ident() == self._run_thread

    def check_thread(self, label: str, doing: str) -> None:
        """``WrongThreadError`` naming ``label`` and what was ``doing`` unless the caller runs on
        this stream's trio thread (or the runtime has closed). Submitting paths call it before
        anything is recorded: a command sent from another thread would wake the actor's task
        from there, which trio turns into a ``TrioInternalError`` of the runtime's run."""
        if threading.get_ident() != self._run_thread:
            self.completion.check_thread(label, doing)

    def refusal(self, owner: str) -> TriodnnError:
        """The error a submission to this closed stream of ``owner`` (an engine) raises:
        ``DeviceLostError`` when the device was lost, else ``ClosedError``."""
        if self.lost is not None:
            return DeviceLostError(f"stream of {owner}: {self.lost}")
        return ClosedError(f"stream of {owner} is closed (its runtime has shut down)")

    def lose(self, error: DeviceLostError) -> None:
        """The device is lost (``DeviceHealth``): refuse every later submission with ``error``.
        Commands already enqueued end as the driver ends them; the queues are finished at
        shutdown as ever."""
        self.lost = error
        self.closed = True

    def submit(self, command: Command) -> None:
        """Enqueue ``command`` (a record of ``_commands``) now, or queue it for the actor task
        when an earlier command or a dependency is still waiting; never blocks."""
        if self.closed:
            raise self.refusal("this engine")
        if not self._backlog:
            for dep in command.deps:
                if type(dep) is Submission and dep.pending_submit:
                    break
            else:
                self.direct += 1
                self._dispatch(command)
                return
        try:
            self._send.send_nowait(command)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise self.refusal("this engine") from None
        self._backlog += 1

    def close(self) -> None:
        """No further submissions; the actor drains what it has, finishes its queues and exits."""
        self.closed = True
        self._send.close()

    # -- actor side -------------------------------------------------------------------------

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(self)
        try:
            async for command in self._recv:
                while True:
                    # Only a dependency still waiting in another stream's actor needs an await;
                    # everything else is enqueued synchronously, a whole batch per wake-up.
                    for dep in command.deps:
                        if isinstance(dep, Submission) and dep.pending_submit:
                            await dep.wait_submitted()
                    self._backlog -= 1
                    self._dispatch(command)
                    try:
                        command = self._recv.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break  # EndOfChannel: closed and drained; the async for ends next
                self._flush()
        finally:
            with trio.CancelScope(shield=True):
                await self._finish()

    async def _finish(self) -> None:
        self.closed = True
        self._send.close()
        for queue in self.queues:
            try:
                await trio.to_thread.run_sync(queue.finish)
            except cl.Error:
                pass  # a lost device fails its queue's finish: nothing more will run there
        for waiter in self.waiters:
            waiter.close()
        self._inflight_copies.clear()
        # Anything still in the channel after a cancellation never reached OpenCL.
        for command in take_queued(self._recv):
            command.submission.set_failed(ClosedError("the stream closed before this command was enqueued"))

    def _dispatch(self, command: Command) -> None:
        submission = command.submission
        try:
            wait_for = self._wait_list(command.deps) if command.deps else []
            if type(command) is KernelSequence:
                lane, cl_event = self._enqueue_sequence(command, wait_for)
            else:
                lane = 0
                if self._lanes:
                    # Only kernels take lanes in turn: copies and sync points stay where they wait.
                    rotate = type(command) is KernelLaunch and (self._spread or command.primitive.overlaps)
                    if wait_for or rotate or not self._fenced[0]:
                        lane = self._choose_lane(wait_for, rotate)
                cl_event = self._enqueue(command, self.queues[lane], wait_for)
                self._placed(lane, cl_event)
        except DependencyError as exc:
            submission.set_failed(exc)
            return
        except cl.Error as exc:
            submission.set_failed(ExecutionError(f"{submission.label}: enqueue failed: {exc}"))
            self.health.suspect(f"the enqueue of {submission.label} failed with {exc}")
            return
        except (ValueError, TypeError) as exc:
            submission.set_failed(ExecutionError(f"{submission.label}: enqueue failed: {exc}"))
            return
        self.submitted += 1
        if command.deps:
            submission.waited_on = command.deps
        submission.set_submitted(cl_event, lane, self.submitted)
        if self._instruments.enqueue_hooks:  # a trace maps device clocks by this moment
            self._instruments.command_enqueued(command)

    def _placed(self, lane: int, cl_event: cl.Event) -> None:
        """``cl_event`` is the newest command of ``lane``: remember it, flush in good time."""
        if lane:  # side lanes only: a command not routed to a side lane goes to lane 0 anyway
            previous = self._tails[lane]
            if previous is not None:
                del self._lane_of_tail[id(previous)]
            self._lane_of_tail[id(cl_event)] = lane
        self._tails[lane] = cl_event
        if not self._dirty:
            self.completion.flush_soon(self)
        self._dirty.add(lane)
        self._unflushed += 1
        if self._unflushed >= self.FLUSH_EVERY:
            self._flush()

    def _enqueue_sequence(self, command: KernelSequence, wait_for: list[cl.Event]) -> tuple[int, cl.Event]:
        """Enqueue every step of ``command`` (its uploads, kernels and downloads); (lane, event)
        of its completion."""
        plan, buffers, keys, bound = command.plan, command.buffers, command.keys, command.plan.bound
        uploads, downloads = command.uploads, command.downloads
        enqueue = cl.enqueue_nd_range_kernel
        if not command.after or (not self._lanes and self.mode == "in_order"):
            # In line: an in-order stream, or a sequence whose every step waits for the one
            # before (``after`` empty). On lanes it takes one lane, in turn where a step may
            # overlap (requests in flight together then overlap on the device); on one native
            # out-of-order queue each command waits for the one before. Measured on an H200
            # (bench_request_stages, the MLP request, out-of-order ÷ in-order stream in one run):
            # 1.15x with the steps placed one by one across lanes, 1.04x in line.
            lane, native = 0, self.mode == "native"
            first = list(wait_for)
            if self._lanes:
                lane = self._choose_lane(first, plan.overlaps or self._spread)
            queue = self.queues[lane]
            wait = first or None
            cl_event = None
            copies = []
            for buffer, host in uploads:
                cl_event = self._copy(queue, buffer, host, True, wait)
                copies.append((cl_event, host))
                wait = [cl_event] if native else None
            for i, step in enumerate(plan.steps):
                if bound[i] is not keys[i]:
                    step.kernel.set_args(*buffers[i])
                    bound[i] = keys[i]
                cl_event = enqueue(queue, step.kernel, step.global_size, step.local_size, wait_for=wait)
                wait = [cl_event] if native else None
            for buffer, host in downloads:
                cl_event = self._copy(queue, buffer, host, False, wait)
                copies.append((cl_event, host))
                wait = [cl_event] if native else None
            assert cl_event is not None, "a plan has steps"
            if copies:
                # One entry for all: each copy completes before the last command does.
                self._keep_copy(cl_event, copies)
            self._placed(lane, cl_event)
            return lane, cl_event
        # Out of order: each step waits for the steps it reads from or overwrites.
        roots = wait_for
        copies = []
        if uploads:
            roots = [self._copy_on_lane(buffer, host, True, list(wait_for))[1] for buffer, host in uploads]
            copies.extend(zip(roots, (host for _, host in uploads)))
        events: list[cl.Event] = []
        lanes: list[int] = []
        waited: set[int] = set()
        for i, step in enumerate(plan.steps):
            after = command.after[i]
            if after:
                step_wait = [events[j] for j in after]
                waited.update(after)
            else:
                step_wait = list(roots)
            lane = self._choose_lane(step_wait, step.overlaps or self._spread) if self._lanes else 0
            if after and self._lanes:  # a lane orders its own commands: wait only across lanes
                same = {id(events[j]) for j in after if lanes[j] == lane}
                step_wait = [e for e in step_wait if id(e) not in same]
            if bound[i] is not keys[i]:
                step.kernel.set_args(*buffers[i])
                bound[i] = keys[i]
            cl_event = enqueue(self.queues[lane], step.kernel, step.global_size, step.local_size,
                               wait_for=step_wait or None)
            self._placed(lane, cl_event)
            events.append(cl_event)
            lanes.append(lane)
        sinks = [k for k in range(len(events)) if k not in waited]
        if downloads:
            ends = [self._copy_on_lane(buffer, host, False, [events[k] for k in sinks]) for buffer, host in downloads]
            lanes, events, sinks = [lane for lane, _ in ends], [e for _, e in ends], list(range(len(ends)))
            copies.extend(zip(events, (host for _, host in downloads)))
        if len(sinks) == 1:
            lane, cl_event = lanes[sinks[0]], events[sinks[0]]
        else:
            self._flush_lanes({lanes[k] for k in sinks} - {0})
            lane, cl_event = 0, cl.enqueue_marker(self.queues[0], wait_for=[events[k] for k in sinks])
            self._placed(0, cl_event)
        if copies:
            self._keep_copy(cl_event, copies)  # each copy completes before the sequence does
        return lane, cl_event

    def _copy(self, queue: cl.CommandQueue, buffer, host: np.ndarray, to_device: bool, wait) -> cl.Event:
        """A non-blocking copy of all of ``host`` into ``buffer`` (or back). The caller keeps
        the event and the host side until it completes (``_keep_copy``)."""
        if type(buffer) is SvmBuffer:
            pointer = cl.SVM(host)
            if to_device:
                return _svm_copy(queue, buffer, pointer, host.nbytes, wait)
            return _svm_copy(queue, pointer, buffer, host.nbytes, wait)
        return (_write_buffer if to_device else _read_buffer)(queue, buffer, host, 0, wait, False)

    def _copy_on_lane(self, buffer, host: np.ndarray, to_device: bool, wait_for: list[cl.Event]) -> tuple[int, cl.Event]:
        """``_copy`` on an out-of-order stream, after ``wait_for``: on the lane it waits for, else
        lane 0 (copies take no lane of their own)."""
        lane = self._choose_lane(wait_for, False) if self._lanes else 0
        cl_event = self._copy(self.queues[lane], buffer, host, to_device, wait_for or None)
        self._placed(lane, cl_event)
        return lane, cl_event

    def _wait_list(self, deps) -> list[cl.Event]:
        wait_for: list[cl.Event] = []
        for dep in deps:
            if isinstance(dep, Submission):
                if dep.failure is not None:
                    raise DependencyError(f"dependency {dep.label!r} failed: {dep.failure}") from dep.failure
                if dep.completed:
                    continue
                cl_event = dep.native
                assert cl_event is not None, "serve awaits a dependency's enqueue before dispatching"
                same_context = dep.actor is not None and dep.actor.context is self.context
                if dep.actor is not self and dep.actor is not None:
                    dep.actor.flush()  # an event of another queue counts only once flushed
            else:
                cl_event = dep
                same_context = cl_event.context.int_ptr == self._context_ptr
            if not same_context:
                cl_event = self._bridge_foreign(cl_event)
            wait_for.append(cl_event)
        return wait_for

    def _bridge_foreign(self, cl_event: cl.Event) -> cl.UserEvent:
        """An event of this context that completes (or fails) with one of another context.

        A thread waits rather than an event callback: PoCL calls no CL_COMPLETE callback for an
        event that ends in an error, and the dependent would then wait forever.
        """
        user_event = cl.UserEvent(self.context)

        def relay() -> None:
            try:
                cl.wait_for_events([cl_event])
            except cl.Error:
                pass  # failed: its negative status is passed on below
            status = execution_status(cl_event)
            user_event.set_status(_COMPLETE if status >= 0 else status)

        threading.Thread(target=relay, name="triodnn-foreign-dependency", daemon=True).start()
        return user_event

    def _choose_lane(self, wait_for: list[cl.Event], rotate: bool) -> int:
        """The lane of a command waiting for ``wait_for`` (to which the fence of a barrier is
        added where the lane has not waited for it yet): the lane whose last command it waits
        for, else with ``rotate`` (a kernel that may overlap, or any kernel under ``spread``) a
        lane in turn, else lane 0. Lanes holding the events it waits for are flushed (OpenCL
        requires it for events of another queue)."""
        # By object identity: the tails are the very event objects the submissions hold
        # (an address lookup cost two ``int_ptr`` calls per command).
        head = self._tails[0]
        for cl_event in wait_for:
            lane = 0 if cl_event is head else self._lane_of_tail.get(id(cl_event))
            if lane is not None:
                break
        else:
            if rotate:
                lane = self._next_lane
                self._next_lane = (lane + 1) % self._max_lanes
                if lane == len(self.queues):
                    self._add_lane()
            else:
                lane = 0
        if not self._fenced[lane]:
            wait_for.extend(self._fence)
            self._fenced[lane] = True
        if wait_for and self._dirty - {lane}:
            self._flush_lanes(self._dirty - {lane})
        return lane

    def _add_lane(self) -> None:
        lane = len(self.queues)
        self.queues.append(_queue(self.context, self.device, self._queue_properties))
        self.waiters.append(QueueWaiter(f"triodnn-queue-waiter-{lane}", in_order=True))
        self._tails.append(None)
        self._fenced.append(not self._fence)  # a lane born after a barrier waits for it too

    def _enqueue(self, command: Command, queue: cl.CommandQueue, wait_for: list[cl.Event]) -> cl.Event:
        """Enqueue ``command`` on ``queue``: the one place that decodes command records."""
        wait = wait_for or None
        if type(command) is KernelLaunch:  # first: nearly every command is one
            launch = command.primitive.launch  # the BuiltKernel the compiler made for this context
            kernel, spec, buffers = launch.kernel, launch.spec, command.buffers
            keys = tuple([buffer.int_ptr for buffer in buffers])
            if launch.bound[0] != keys:
                kernel.set_args(*buffers)
                launch.bound[0] = keys
            return cl.enqueue_nd_range_kernel(queue, kernel, spec.global_size, spec.local_size, wait_for=wait)
        if type(command) is WriteBuffer or type(command) is ReadBuffer:
            cl_event = self._copy(queue, command.buffer, command.host, type(command) is WriteBuffer, wait)
            self._keep_copy(cl_event, command.host)
            return cl_event
        if type(command) is Marker or type(command) is Barrier:
            return self._enqueue_sync_point(type(command) is Barrier, queue, wait_for)
        raise TypeError(f"unknown stream command {command!r}")

    def _enqueue_sync_point(self, barrier: bool, queue: cl.CommandQueue, wait_for: list[cl.Event]) -> cl.Event:
        if self.mode == "lanes" and len(self.queues) == 1:  # one lane open: an in-order queue
            cl_event = cl.enqueue_marker(queue, wait_for=wait_for or None)
            if barrier:
                self._fence = [cl_event]  # lanes opened later wait for it
            return cl_event
        if self.mode == "lanes":
            index = self.queues.index(queue)
            others = [t for lane, t in enumerate(self._tails) if t is not None and lane != index]
            self._flush_lanes(self._dirty - {index})
            cl_event = cl.enqueue_marker(queue, wait_for=(wait_for + others) or None)
            if barrier:
                self._fence = [cl_event]
                self._fenced = [False] * len(self.queues)
                self._fenced[self.queues.index(queue)] = True
            return cl_event
        if barrier and self.mode == "native":
            return cl.enqueue_barrier(queue, wait_for=wait_for or None)
        return cl.enqueue_marker(queue, wait_for=wait_for or None)

    def _keep_copy(self, cl_event: cl.Event, host: object) -> None:
        copies = self._inflight_copies
        copies.append((cl_event, host))
        while copies and execution_status(copies[0][0]) <= _COMPLETE:
            copies.popleft()

    def copy_settled(self, cl_event: cl.Event) -> None:
        """A command of this stream is known complete (``Submission.settle``): if it is a host
        copy, forget it and its host side now. Pruning only when the next copy is enqueued kept
        a stream's last copied array alive until then (a dropped constant-cache array stayed
        cached when its upload finished after the run's last copy was enqueued)."""
        copies = self._inflight_copies
        if not copies:
            return
        for i, (event, _) in enumerate(copies):
            if event is cl_event:
                del copies[i]
                return

    def _flush(self) -> None:
        for lane in self._dirty:
            self._flush_queue(lane)
        self._dirty.clear()
        self._unflushed = 0

    def _flush_queue(self, lane: int) -> None:
        """``clFlush`` one queue. It runs where nothing may raise (the completion actor's
        instrument, between scheduler passes): a driver that refuses it (a context a kernel
        fault broke) starts a probe instead, and the commands' own statuses report the rest."""
        try:
            self.queues[lane].flush()
        except cl.Error as exc:
            self.health.suspect(f"a flush of a queue failed with {exc}")

    def flush(self) -> None:
        """Flush every queue holding commands not flushed yet (the completion actor calls this
        at the end of the scheduler pass in which they were enqueued)."""
        if self._dirty:
            self._flush()

    def _flush_lanes(self, lanes) -> None:
        for lane in lanes:
            self._flush_queue(lane)
            self._dirty.discard(lane)
