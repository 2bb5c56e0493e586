"""A trace drawn as a Gantt chart: one row per device lane (and host thread, if asked), a bar per
span coloured by its kind, dependency arrows from a command's end to the start of the one that
waited for it.

What Perfetto shows interactively, as a picture a notebook or a report can hold; it reads the
Chrome events ``Trace.to_chrome`` writes (or a file ``Trace.save`` wrote), so a trace recorded
elsewhere draws the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from ._values._errors import UnsupportedError

_pyplot: ModuleType | None
try:
    import matplotlib.pyplot as _pyplot
except ImportError:  # matplotlib is optional: only drawing needs it
    _pyplot = None

# Span categories (``cat``) by what the rows show: the device's work, the host's submissions,
# and the spans of ``create_primitive``, builds and ``triodnn.trace.span``.
CATEGORIES = {"device": ("device",), "host": ("submit",), "tasks": ("create", "build", "task")}


def load_events(source) -> dict:
    """Chrome events from a ``Trace`` (``to_chrome()``), a dict of them, or a saved file's path."""
    if hasattr(source, "to_chrome"):
        return source.to_chrome()
    if isinstance(source, dict):
        return source
    return json.loads(Path(source).read_text())


def _kind(name: str) -> str:
    # "eltwise:relu …" and "matmul 64x1024" are both matmul/eltwise: the colour follows the
    # primitive kind, the text before the first ':' or space.
    return name.replace(":", " ").split(" ", 1)[0] or name


def plot(source, path=None, *, show: Iterable[str] = ("device",), arrows: bool = True, ax=None,
         title: str | None = None):
    """Draw ``source`` (a ``Trace``, its Chrome events, or a saved trace's path) and return the
    matplotlib Figure; with ``path``, also save it there (PNG, SVG, PDF by the suffix).

    ``show``: which rows, of ``CATEGORIES`` ("device" lanes by default; "host" submission
    threads; "tasks" for creations, builds and user spans). ``arrows``: the dependencies between
    the spans drawn. ``ax``: an existing matplotlib Axes to draw into. Times are milliseconds
    from the first span drawn. UnsupportedError without matplotlib, or when no span of ``show``
    was recorded (a device lane needs a stream opened while the trace recorded)."""
    if _pyplot is None:
        raise UnsupportedError("drawing a trace needs matplotlib: pip install matplotlib")
    show = tuple(show)
    unknown = [name for name in show if name not in CATEGORIES]
    if unknown:
        raise UnsupportedError(f"show {unknown}: the rows are {', '.join(CATEGORIES)}")
    events = load_events(source)["traceEvents"]
    categories = {cat for name in show for cat in CATEGORIES[name]}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    spans = [e for e in events if e["ph"] == "X" and e.get("cat") in categories]
    if not spans:
        raise UnsupportedError(f"the trace has no {' or '.join(show)} spans to draw")
    rows = sorted({(e["pid"], e["tid"]) for e in spans})
    row_of = {key: i for i, key in enumerate(rows)}
    t0 = min(e["ts"] for e in spans)
    kinds = sorted({_kind(e["name"]) for e in spans})
    palette = _pyplot.get_cmap("tab10")
    colour = {kind: palette(i % 10) for i, kind in enumerate(kinds)}
    if ax is None:
        fig, ax = _pyplot.subplots(figsize=(10, 1.2 + 0.35 * len(rows)))
    else:
        fig = ax.figure
    for e in spans:
        ax.barh(row_of[(e["pid"], e["tid"])], e["dur"] / 1e3, left=(e["ts"] - t0) / 1e3, height=0.7,
                color=colour[_kind(e["name"])], edgecolor="white", linewidth=0.5)
    if arrows:
        _arrows(ax, events, spans, row_of, t0)
    engines = {pid for pid, _ in rows}
    ax.set_yticks(range(len(rows)), [threads.get(key, str(key[1])) if len(engines) == 1
                                     else f"{processes.get(key[0], key[0])}: {threads.get(key, key[1])}"
                                     for key in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms from the first span")
    # Beside the axes, not over the bars.
    ax.legend(handles=[_pyplot.Rectangle((0, 0), 1, 1, color=colour[k]) for k in kinds], labels=kinds,
              fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    end = max(e["ts"] + e["dur"] for e in spans) - t0
    ax.set_title(title or f"{len(spans)} spans on {len(rows)} row(s), {end / 1e3:.3f} ms", fontsize=9)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def _arrows(ax, events: list[dict], spans: list[dict], row_of: dict, t0: float) -> None:
    """A dependency's flow events (``s`` at its source span's start, ``f`` at its target's) as an
    arrow from the source's end to the target's start, where both spans are drawn."""
    at = {(e["pid"], e["tid"], e["ts"]): e for e in spans}
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    for finish in (e for e in events if e["ph"] == "f"):
        start = starts.get(finish["id"])
        if start is None:
            continue
        source = at.get((start["pid"], start["tid"], start["ts"]))
        target = at.get((finish["pid"], finish["tid"], finish["ts"]))
        if source is None or target is None:
            continue
        ax.annotate("", xy=((target["ts"] - t0) / 1e3, row_of[(target["pid"], target["tid"])]),
                    xytext=((source["ts"] + source["dur"] - t0) / 1e3, row_of[(source["pid"], source["tid"])]),
                    arrowprops={"arrowstyle": "->", "lw": 0.6, "color": "0.35", "shrinkA": 0, "shrinkB": 0})
