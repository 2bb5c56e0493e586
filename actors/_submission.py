"""The reply slot of a stream submission: the state a stream actor fills in for one command."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import pyopencl as cl
import trio

from .._values._errors import ClosedError, ExecutionError

if TYPE_CHECKING:
    from ._stream_actor import StreamActor  # _stream_actor imports this module: annotations only

_COMPLETE = cl.command_execution_status.COMPLETE


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

    def set_submitted(self, cl_event: cl.Event, lane: int, seq: int) -> None:
        self.native = cl_event
        self.lane = lane
        self.seq = seq
        if self._on_submit is not None:
            self._on_submit.set()

    def set_failed(self, failure: BaseException) -> None:
        self.failure = failure
        self.completed = True
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
            # PoCL reports a failed dependency as -1 (which is also CL_DEVICE_NOT_FOUND's number),
            # so the raw execution status is the honest thing to show.
            self.set_failed(ExecutionError(
                f"the command ended with execution status {status} (its device failed it, "
                "or a command it waited for failed)"
            ))
        self.completed = True

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
