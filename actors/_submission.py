"""The reply slot of a stream submission: the state a stream actor fills in for one command."""

from __future__ import annotations

import attrs
import pyopencl as cl
import trio


@attrs.define(eq=False, slots=True)
class Submission:
    """One command's state: waiting for the actor, enqueued (with its cl event), or failed.

    The stream actor moves it forward; everyone else reads it. The public ``triodnn.Event`` derives
    from this and adds awaiting and profiling.
    """

    actor: object  # the StreamActor that owns the command
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

    @property
    def pending_submit(self) -> bool:
        return self.native is None and self.failure is None

    async def wait_submitted(self) -> None:
        """Wait until the actor has enqueued the command or given up on it."""
        if self.pending_submit:
            if self._on_submit is None:
                self._on_submit = trio.Event()
            await self._on_submit.wait()
