"""Events: what every stream submission returns, awaitable from any trio task."""

from __future__ import annotations

import attrs
import pyopencl as cl
import trio

from ._values._errors import DeviceLostError, ExecutionError, NotSubmittedError, ProfilingError, TriodnnError
from .actors import Submission, execution_status

_COMPLETE = cl.command_execution_status.COMPLETE


@attrs.frozen
class ProfilingTimes:
    """Device timestamps of one command, in nanoseconds, as OpenCL reports them."""

    queued: int
    submit: int
    start: int
    end: int

    @property
    def duration_ns(self) -> int:
        return self.end - self.start


class Event:
    """Completion of one submitted command.

    ``await event`` returns when the command has completed and raises ``ExecutionError`` when it
    failed (``DependencyError`` when a dependency failed first, ``DeviceLostError`` when the
    probe that a failure starts found the device no longer working). Pass events as ``deps`` to later
    submissions on any stream; ``cl_event`` gives the pyopencl event once the stream actor has
    enqueued the command.

    An event is awaited in the trio run of its runtime: awaited from another thread (another
    thread's ``trio.run``) while the runtime is open, ``wait`` and ``wait_submitted`` raise
    ``WrongThreadError``, whether the command has completed or not, so the outcome never depends
    on timing. ``done``, ``label`` and ``cl_event`` may be read from any thread. Through a
    blocking portal an event's ``wait()`` blocks any thread.

    An Event wraps the actors' ``Submission`` of the command (streams make both, and hand actors
    only the submission): awaiting and profiling are the public side, the submission is the state
    the stream actor fills in. Equal only to itself.
    """

    # A plain slotted class: streams make one per command, and the submit path is hot.
    __slots__ = ("_submission", "__weakref__")

    def __init__(self, submission: Submission) -> None:
        self._submission = submission

    def __repr__(self) -> str:
        return f"<triodnn.Event {self._submission.label} {self._submission.state}>"

    @property
    def submission(self) -> Submission:
        """The actors' record of the command: what a stream hands its actor for this event in
        ``deps``, and where interop reads whether it was enqueued."""
        return self._submission

    @property
    def label(self) -> str:
        """What the command is: the primitive's label, ``write:<desc>``, ``marker`` …"""
        return self._submission.label

    def __await__(self):
        return self.wait().__await__()

    async def wait(self) -> None:
        submission = self._submission
        if not submission.actor.on_run_thread():
            submission.actor.check_thread(submission.label, "awaited")
        if submission.pending_submit:
            await submission.wait_submitted()
        if not submission.completed:
            actor, native = submission.actor, submission.native
            assert native is not None, "submitted and not failed: the actor has enqueued it"
            status = await actor.completion.wait(native, actor.waiters[submission.lane], submission.seq)
            submission.settle(status)
        else:
            await trio.lowlevel.checkpoint()
        if submission.failure is not None:
            failure = submission.failure
            health = submission.actor.health
            if health.probing:  # the failure started a probe: say whether the device is lost
                await health.settled()
            if health.lost is not None and not isinstance(failure, DeviceLostError):
                raise DeviceLostError(f"{submission.label}: {failure}; {health.lost}") from failure
            # A fresh exception per waiter, of the failure's own type, chained to it.
            kind = type(failure) if isinstance(failure, TriodnnError) else ExecutionError
            raise kind(f"{submission.label}: {failure}") from failure

    async def wait_submitted(self) -> None:
        """Wait until the stream actor has enqueued the command (``cl_event`` exists then) or given
        up on it (a failed dependency, a closed stream); never raises for that."""
        submission = self._submission
        if not submission.actor.on_run_thread():
            submission.actor.check_thread(submission.label, "awaited")
        await submission.wait_submitted()

    @property
    def done(self) -> bool:
        """True once the command is known to have completed or failed (polls OpenCL, never blocks).
        Any thread may ask; only the runtime's trio thread records the outcome."""
        submission = self._submission
        if not submission.completed and submission.native is not None:
            status = execution_status(submission.native)
            if status <= _COMPLETE:
                if not submission.actor.on_run_thread():
                    # Settling updates the stream actor's host-copy list, which its trio thread
                    # may be changing at this moment.
                    return True
                submission.settle(status)
        return submission.completed

    @property
    def cl_event(self) -> cl.Event:
        """The pyopencl event of the command, for interop; ``NotSubmittedError`` before enqueue.

        Its queue is flushed first: another queue may wait for the event only then (OpenCL's
        rule), and triodnn otherwise flushes at the end of the scheduler pass."""
        submission = self._submission
        native = submission.native
        if native is not None:
            if submission.actor.on_run_thread():
                submission.actor.flush()
            else:
                # The actor's own flush updates its bookkeeping, which only its trio thread may
                # touch; flushing the event's queue (thread-safe in OpenCL) is all it takes.
                native.command_queue.flush()
        if native is None:
            if submission.failure is not None:
                raise NotSubmittedError(f"{submission.label} was never enqueued: {submission.failure}")
            raise NotSubmittedError(
                f"{submission.label} is not enqueued yet; await event.wait_submitted() first"
            )
        return native

    @property
    def profiling(self) -> ProfilingTimes:
        """Queued, submit, start and end times; the stream needs the ``profiling`` flag."""
        submission = self._submission
        if not submission.actor.profiling:
            raise ProfilingError(f"{submission.label}: its stream was created without StreamFlags.profiling")
        if not self.done:
            raise ProfilingError(f"{submission.label}: profiling times exist once the command completed")
        if submission.failure is not None:
            raise ProfilingError(f"{submission.label}: the command failed: {submission.failure}")
        native = submission.native
        assert native is not None, "completed and not failed: the actor had enqueued it"
        status = execution_status(native)
        if status < 0:  # failed, and read on a thread that left it unsettled
            raise ProfilingError(f"{submission.label}: the command failed with execution status {status}")
        p = native.profile
        return ProfilingTimes(p.queued, p.submit, p.start, p.end)
