"""What an actor's memory channel still holds when its serve loop has ended."""

from __future__ import annotations

import trio


def take_queued(channel: trio.MemoryReceiveChannel) -> list:
    """Everything still queued in ``channel``, taken without waiting, and the channel closed.

    A cancellation aborts an actor's receive at once, but a requester that is running reaches
    its own checkpoint later, so a request it sends in between is never received: the actor must
    answer these itself, or their senders wait forever; once closed, later sends fail at once."""
    items = []
    while True:
        try:
            items.append(channel.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            break
    channel.close()
    return items
