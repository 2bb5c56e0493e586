"""The reply slot of a stream submission: the state a stream actor fills in for one command."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import pyopencl as cl
import trio

from .._values._errors import ClosedError, DependencyError, ExecutionError

if TYPE_CHECKING:
    from ._stream_actor import StreamActor  # _stream_actor imports this module: annotations only

_COMPLETE = cl.command_execution_status.COMPLETE


def execution_status(cl_event: cl.Event) -> int:
    """``cl_event``'s execution status, or the (negative) error code when the driver cannot even
    say: after a kernel fault NVIDIA fails ``clGetEventInfo`` itself with -9999, which pyopencl
    raises; read raw, it crashed the runtime's trio run."""
    try:
        return cl_event.command_execution_status
    except cl.Error as exc:
        return failed_status(exc)


def failed_status(exc: cl.Error) -> int:
    """The execution status a ``cl.Error`` from a status read stands for: its code when that is
    negative, else -1 (a failure all the same)."""
    code = exc.code
    return code if isinstance(code, int) and code < 0 else -1


@attrs.define(eq=False, slots=True)
class Submission:
    """One command's state: waiting for the actor, enqueued (with its cl event), or failed.

    The stream actor moves it forward; waiters record the final status (``settle``). The public
    ``triodnn.Event`` wraps one and adds awaiting and profiling; actors only ever see this.
    """

    actor: StreamActor  # the actor of the stream that owns the command
    label: str
    native: cl.Event | None = None  # the OpenCL event, once enqueued
    lane: int = 0  # index of the stream actor's queue that holds the command
    seq: int = 0  # the command's submission number in its stream
    failure: BaseException | None = None
    completed: bool = False
    _on_submit: trio.Event | None = None
    # What the command waited for (submissions, foreign pyopencl events), kept until it settles.
    # OpenCL leaves to the driver whether a command whose wait-list event failed runs: PoCL and
    # NVIDIA fail it, Intel's CPU runtime runs it and reports it complete. ``settle`` fails it
    # then, so a failed dependency fails its dependents on every driver.
    waited_on: tuple = ()

    def set_submitted(self, cl_event: cl.Event, lane: int, seq: int) -> None:
        self.native = cl_event
        self.lane = lane
        self.seq = seq
        if self._on_submit is not None:
            self._on_submit.set()

    def set_failed(self, failure: BaseException) -> None:
        self.failure = failure
        self.completed = True
        self.waited_on = ()
        if self._on_submit is not None:
            self._on_submit.set()

    def settle(self, status: int) -> None:
        """Record the final execution ``status`` of the enqueued command (read from OpenCL)."""
        if status <= _COMPLETE and self.native is not None:
            # A finished host copy lets its array go: the stream actor forgets it, and pyopencl's
            # event (a NannyEvent keeps its array until waited on; status polls and
            # wait_for_events do not count) is waited on, which returns at once. Both held the
            # array past its last user's reference (a constant-cache test saw a dropped W
            # array stay cached under load).
            self.actor.copy_settled(self.native)
            if isinstance(self.native, cl.NannyEvent):
                try:
                    self.native.wait()
                except cl.Error:
                    pass  # a failed copy: the status below says so
        if status > _COMPLETE:
            # Only reachable after the runtime closed under cancellation, queues unfinished.
            self.set_failed(ClosedError("the runtime closed before the command completed"))
            return
        if status < 0:
            self.actor.health.suspect(f"{self.label} ended with execution status {status}")
            # PoCL reports a failed dependency as -1 (which is also CL_DEVICE_NOT_FOUND's number),
            # so the raw execution status is the honest thing to show.
            self.set_failed(ExecutionError(
                f"the command ended with execution status {status} (its device failed it, "
                "or a command it waited for failed)"
            ))
            return
        if self.waited_on:
            failed = self._failed_dependency()
            if failed is not None:
                self.set_failed(DependencyError(
                    f"{failed} failed; the driver ran this command anyway, its results are not valid"
                ))
                return
        self.completed = True

    def _failed_dependency(self) -> str | None:
        """The first of ``waited_on`` that failed, named, or None. Dependencies nobody awaited
        are settled here first, deepest first and without recursion: a chain of thousands of
        queued commands awaited only at its end is the common case."""
        _settle_unsettled(self)
        waited_on, self.waited_on = self.waited_on, ()
        for dep in waited_on:
            if isinstance(dep, Submission):
                if dep.failure is not None:
                    return f"dependency {dep.label!r}"
            else:
                status = execution_status(dep)
                if status < 0:
                    return f"a pyopencl event it waited for (execution status {status})"
        return None

    @property
    def pending_submit(self) -> bool:
        return self.native is None and self.failure is None

    @property
    def state(self) -> str:
        """One word for reprs: waiting (for its stream actor), enqueued, completed or failed."""
        if self.failure is not None:
            return "failed"
        if self.completed:
            return "completed"
        return "waiting" if self.native is None else "enqueued"

    async def wait_submitted(self) -> None:
        """Wait until the actor has enqueued the command or given up on it."""
        if self.pending_submit:
            if self._on_submit is None:
                self._on_submit = trio.Event()
            await self._on_submit.wait()


def _settle_unsettled(root: Submission) -> None:
    """Settle, dependencies first, every enqueued and finished submission ``root`` depends on
    through ``waited_on`` that nobody has settled yet (an explicit stack: no recursion limit)."""
    seen = {id(root)}
    stack = [(root, iter(root.waited_on))]
    while stack:
        submission, deps = stack[-1]
        for dep in deps:
            if isinstance(dep, Submission) and not dep.completed and dep.native is not None and id(dep) not in seen:
                seen.add(id(dep))
                stack.append((dep, iter(dep.waited_on)))
                break
        else:
            stack.pop()
            if submission is not root and submission.native is not None:
                status = execution_status(submission.native)
                if status <= _COMPLETE:
                    submission.settle(status)
