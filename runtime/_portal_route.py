"""Async entry points that also take a blocking portal's objects.

A notebook that made partitions with ``graph.get_partitions()`` (no portal involved) and then
calls ``partition.compile(portal_engine)`` would get a coroutine it cannot await, and a
"never awaited" warning instead of a result. The entry points that take an engine or a stream
look for a portal-wrapped one with ``portal_of`` and then run on that portal, returning what
the portal would: the result, wrapped. This module sits below ``triodnn._blocking`` (which
imports the graph API), so it recognises a wrapper by its ``__triodnn_portal__`` attribute.
"""

from __future__ import annotations


def portal_of(*values):
    """The blocking portal that wrapped the first of ``values`` it wrapped, or None."""
    for value in values:
        portal = getattr(type(value), "__triodnn_portal__", None)
        if portal is not None:
            return value.__triodnn_portal__
    return None
