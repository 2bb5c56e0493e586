"""Traces of triodnn's work that Perfetto (ui.perfetto.dev) and chrome://tracing load.

    with triodnn.trace.record() as trace:
        ...
    trace.save("out.json")

What is recorded while the block runs: every stream submission as a host span, its device span
per engine and stream lane (OpenCL profiling: streams opened while a trace records profile),
dependency arrows between them, ``create_primitive`` calls with their cache outcome (hit, miss,
coalesced), builds, and spans callers open with ``span()``. Device times are mapped onto the
host clock per engine by the smallest offset between a command's enqueue on the host and its
``CL_PROFILING_COMMAND_QUEUED`` time, so a device span never lies before its submission. One
trace records at a time (``TraceError`` otherwise).

A recorded trace draws as a Gantt chart: ``trace.plot("gantt.png")`` (matplotlib), or
``triodnn.trace.plot("out.json")`` for a saved one, or ``triodnn trace out.json -o gantt.png``.
Creation spans carry the primitive cache's outcome in ``args["outcome"]``: ``cache_hit``,
``cache_miss`` (this call built it) or ``cache_coalesced`` (it waited for another call's build).
"""

from ._trace import Trace, TraceError, record, record_to, span
from ._trace_plot import CATEGORIES, plot

__all__ = ["CATEGORIES", "Trace", "TraceError", "plot", "record", "record_to", "span"]
