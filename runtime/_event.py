"""Events: what every stream submission returns, awaitable from any trio task."""

from __future__ import annotations

import attrs
import pyopencl as cl
import trio

from ._values._errors import ClosedError, ExecutionError, NotSubmittedError, ProfilingError, TriodnnError
from .actors import Submission

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


@attrs.define(eq=False, slots=True)
class Event(Submission):
    """Completion of one submitted command.

    ``await event`` returns when the command has completed and raises ``ExecutionError`` when it
    failed (``DependencyError`` when a dependency failed first). Pass events as ``deps`` to later
    submissions on any stream; ``cl_event`` gives the pyopencl event once the stream actor has
    enqueued the command.
    """

    _completion: object = None  # the runtime's CompletionActor
    _profiling: bool = False

    def __await__(self):
        return self.wait().__await__()

    async def wait(self) -> None:
        if self.pending_submit:
            await self.wait_submitted()
        if not self.completed:
            waiter = self.actor.waiters[self.lane]
            status = await self._completion.wait(self.native, waiter, self.seq)
            self._settle(status)
        else:
            await trio.lowlevel.checkpoint()
        if self.failure is not None:
            # A fresh exception per waiter, of the failure's own type, chained to it.
            failure = self.failure
            kind = type(failure) if isinstance(failure, TriodnnError) else ExecutionError
            raise kind(f"{self.label}: {failure}") from failure

    def _settle(self, status: int) -> None:
        if status > _COMPLETE:
            # Only reachable after the runtime closed under cancellation, queues unfinished.
            self.set_failed(ClosedError("the runtime closed before the command completed"))
            return
        if status < 0:
            # PoCL reports a failed dependency as -1 (which is also CL_DEVICE_NOT_FOUND's number),
            # so the raw execution status is the honest thing to show.
            self.set_failed(ExecutionError(
                f"the command ended with execution status {status} (its device failed it, "
                "or a command it waited for failed)"
            ))
        self.completed = True

    @property
    def done(self) -> bool:
        """True once the command is known to have completed or failed (polls OpenCL, never blocks)."""
        if not self.completed and self.native is not None:
            status = self.native.command_execution_status
            if status <= _COMPLETE:
                self._settle(status)
        return self.completed

    @property
    def cl_event(self) -> cl.Event:
        """The pyopencl event of the command, for interop; ``NotSubmittedError`` before enqueue."""
        if self.native is None:
            if self.failure is not None:
                raise NotSubmittedError(f"{self.label} was never enqueued: {self.failure}")
            raise NotSubmittedError(
                f"{self.label} is not enqueued yet; await event.wait_submitted() first"
            )
        return self.native

    @property
    def profiling(self) -> ProfilingTimes:
        """Queued, submit, start and end times; the stream needs the ``profiling`` flag."""
        if not self._profiling:
            raise ProfilingError(f"{self.label}: its stream was created without StreamFlags.profiling")
        if not self.done:
            raise ProfilingError(f"{self.label}: profiling times exist once the command completed")
        if self.failure is not None:
            raise ProfilingError(f"{self.label}: the command failed: {self.failure}")
        p = self.native.profile
        return ProfilingTimes(p.queued, p.submit, p.start, p.end)
