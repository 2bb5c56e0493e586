"""The reply slot a request carries back from an actor."""

from __future__ import annotations

import attrs
import outcome
import trio


@attrs.define(eq=False)
class ReplySlot:
    """Filled once by the actor, awaited by the requester (or by several: coalesced requests
    share one slot, so reading it never consumes it).

    A requester that is cancelled simply stops waiting; the actor still fills the slot, so work in
    flight is never torn down by one impatient caller.
    """

    _done: trio.Event = attrs.field(factory=trio.Event)
    _outcome: outcome.Outcome | None = None

    def set_value(self, value) -> None:
        self._outcome = outcome.Value(value)
        self._done.set()

    def set_error(self, error: BaseException) -> None:
        self._outcome = outcome.Error(error)
        self._done.set()

    @property
    def filled(self) -> bool:
        return self._outcome is not None

    async def get(self):
        await self._done.wait()
        # Not outcome.unwrap(), which allows one reader: a second waiter got AlreadyUsedError.
        if isinstance(self._outcome, outcome.Error):
            raise self._outcome.error
        return self._outcome.value
