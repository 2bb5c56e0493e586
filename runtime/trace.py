"""Traces of triodnn's work that Perfetto (ui.perfetto.dev) and chrome://tracing load.

    with triodnn.trace.record() as trace:
        ...
    trace.save("out.json")

See ``triodnn._trace`` for what is recorded and how device clocks are mapped.
"""

from ._trace import Trace, TraceError, record, record_to, span

__all__ = ["Trace", "TraceError", "record", "record_to", "span"]
