"""Traces that Perfetto and chrome://tracing load: ``triodnn.trace.record()``.

    with triodnn.trace.record() as trace:      # in async code too: entering starts nothing
        ...                                    # any triodnn work, any runtime, any trio run
    trace.save("out.json")                     # or trace.to_chrome(), the same as a dict
    trace.plot("gantt.png")                    # a Gantt chart (matplotlib): lanes, arrows

What is recorded, while the block runs:

- every stream submission (``execute``, ``write``, ``read``, ``marker``, ``barrier``) as a host span
  on the ``host: <thread>`` track of its engine: the call from its start to the hand-over to the
  stream actor, with the command id, stream and dependencies in ``args``;
- its device span, from OpenCL profiling, on the ``stream N lane M`` track of its engine. Every
  stream opened while a trace records gets ``StreamFlags.profiling`` (``engine.stream``, and the
  internal host stream of an engine opened then, which ``memory.write`` / ``to_numpy`` use);
  streams opened before the trace started and interop streams whose queue does not profile record
  host spans only;
- dependency edges between recorded commands as flow events (``"s"`` bound to the dependency's
  span, ``"f"`` with ``"bp": "e"`` to the dependent's): device span to device span where both
  commands have one, else host span to host span;
- every ``create_primitive`` as a span on the ``create_primitive`` track (category ``create``)
  whose ``args`` hold ``outcome`` (``cache_hit``: the primitive cache had it; ``cache_miss``: this
  call built it; ``cache_coalesced``: it waited for another call's build of the same key), ``kind``
  and ``impl``, the outcome also as an instant event; and each
  build a miss runs in a worker thread as a span on the ``builds`` track (its length is the build
  thread's own measure; it ends when the trio side sees the build finish);
- spans that callers open with ``span()`` (``triodnn graph`` marks its cases and partition
  compiles).

Processes are engines (``pid`` per engine, named by engine label and device, plus one ``triodnn
host`` process for spans of no engine); threads are tracks. Concurrent spans of one track (two
``create_primitive`` calls in flight, kernels overlapping on a native out-of-order queue) go to
numbered sub-tracks, so complete events nest properly on every ``(pid, tid)``.

Clocks: timestamps are µs since the trace started, on ``time.perf_counter_ns``. Device times are
mapped per engine by an offset: for every profiled command, the host time right after the stream
actor enqueued it minus its ``CL_PROFILING_COMMAND_QUEUED``; the offset is the *minimum* over the
engine's commands. Each sample is the true offset plus the enqueue call's latency (never
negative), so the minimum is the tightest estimate, and it never maps a device time earlier than
it happened: a device span always lies after its host submission (a median would put about half
the commands' spans before their real times, possibly before their submission). PoCL's clock is
``CLOCK_MONOTONIC_RAW``, not perf_counter's ``CLOCK_MONOTONIC``: the two drift by parts per million,
negligible over a trace of seconds.

The recorder is process-global: the primitive and compiled-partition caches it reports on are
process-global, a build started by one runtime serves the others, and ``record()`` can then wrap
code that opens its own runtime (the CLI's graph driver) or runs in other threads (the blocking
portal). One trace records at a time (``TraceError`` otherwise). A recording ``Trace`` is an
instrument (``triodnn._instruments``) that ``record()`` installs for the block: when none records,
tracing costs the registry's one attribute test where a stream submits and where its actor
enqueues.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import weakref
from collections.abc import Iterator

import attrs
import pyopencl as cl

from ._engine import Engine
from ._instruments import Instrument, add_instrument, remove_instrument
from ._stream import Stream, StreamFlags
from ._trace_plot import plot
from ._values._errors import TriodnnError
from .actors import Command, Submission, execution_status

__all__ = ["Trace", "TraceError", "record", "span"]

# The trace recording now, or None (``span()`` and the one-at-a-time rule read it).
recorder: Trace | None = None
_recorder_lock = threading.Lock()

_COMPLETE = cl.command_execution_status.COMPLETE
_HOST_PID = 1
_NULL = contextlib.nullcontext()


class TraceError(TriodnnError):
    """Tracing was misused: a second ``record()`` while one records."""


@attrs.frozen
class _Track:
    """Where a span goes: a process (engine or host) and a named track in it."""

    pid: int
    name: str
    order: int  # sort index of the track in its process


@attrs.define(eq=False, slots=True)
class _Span:
    """A complete event before export; ``tid`` is set when tracks are packed."""

    track: _Track
    name: str
    cat: str
    begin: int  # ns, perf_counter_ns
    end: int
    args: dict
    tid: int = 0


@attrs.define(eq=False, slots=True)
class _Command:
    """One submission while recording; ``submission`` is dropped once its device times are read."""

    id: int
    label: str
    op: str  # the record's kind: kernel, write, read, marker, barrier
    begin: int
    end: int
    thread: str
    deps: tuple  # ids of recorded commands it depends on
    stream_number: int
    pid: int
    profiling: bool
    submission: Submission | None
    enqueued: int = 0  # host time right after the stream actor enqueued it
    lane: int = 0
    device: tuple[int, int, int, int] | None = None  # queued, submit, start, end (device ns)
    status: str = "pending"  # pending, complete, failed, unprofiled


@attrs.frozen
class _StreamInfo:
    number: int
    pid: int
    profiling: bool


class Trace(Instrument):
    """A recording: what ``record()`` yields. Export with ``to_chrome()`` or ``save(path)``.

    While it records it is an installed instrument; its hooks run on the threads doing the work.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.origin_ns = time.perf_counter_ns()
        self.stopped_ns: int | None = None
        self._commands: list[_Command] = []
        # Recorded commands by submission, so that dependents name them. Weak: a dependency is
        # alive when named (the dependent's command holds it); the trace itself holds a
        # submission (and its cl event) only until its device times are read.
        self._by_submission: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._spans: list[_Span] = []
        self._instants: list[tuple[_Span, str, dict]] = []  # (span it ends on, name, args)
        # Weak: a kept trace does not keep engines (their OpenCL contexts) and streams alive.
        self._streams: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._engines: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> pid
        self._engine_names: dict[int, str] = {}
        self._next_command = 0
        self._stream_count = 0

    @property
    def recording(self) -> bool:
        return recorder is self

    # -- instrument hooks (called only while this trace records) ---------------------------------

    @property
    def needs_profiling(self) -> bool:
        return True  # streams opened while recording give device spans

    def _pid(self, engine) -> int:
        if engine is None:
            return _HOST_PID
        pid = self._engines.get(engine)
        if pid is None:
            with self._lock:
                pid = self._engines.get(engine)
                if pid is None:
                    pid = self._engines[engine] = len(self._engine_names) + 2
                    name = f"{engine.kind}:{engine.index} ({engine.info.name.strip()})"
                    if name in self._engine_names.values():
                        name += f" [{pid - 1}]"
                    self._engine_names[pid] = name
        return pid

    def _stream(self, stream: Stream) -> _StreamInfo:
        info = self._streams.get(stream)
        if info is None:
            with self._lock:
                info = self._streams.get(stream)
                if info is None:
                    self._stream_count += 1
                    info = self._streams[stream] = _StreamInfo(
                        self._stream_count, self._pid(stream.engine), StreamFlags.profiling in stream.flags,
                    )
        return info

    def command_submitted(self, stream: Stream, command: Command, started_ns: int) -> None:
        """``command`` is in its stream actor's channel: its host span ends."""
        end = time.perf_counter_ns()
        info = self._stream(stream)
        submission = command.submission
        by_submission = self._by_submission
        deps = tuple(
            recorded.id for dep in command.deps
            if isinstance(dep, Submission) and (recorded := by_submission.get(dep)) is not None
        )
        thread = threading.current_thread().name
        with self._lock:
            self._next_command += 1
            recorded = _Command(
                self._next_command, submission.label, command.op, started_ns or end, end, thread, deps,
                info.number, info.pid, info.profiling, submission,
            )
            self._commands.append(recorded)
            by_submission[submission] = recorded

    def command_enqueued(self, command: Command) -> None:
        """The stream actor enqueued ``command`` just now: a sample of the engine's clock offset."""
        enqueued = time.perf_counter_ns()
        recorded = self._by_submission.get(command.submission)
        if recorded is not None:  # None: submitted before this trace started
            recorded.enqueued = enqueued
            recorded.lane = command.submission.lane

    def add_span(self, engine, track: str, order: int, name: str, cat: str, begin: int, end: int,
                 args: dict | None = None) -> _Span:
        span = _Span(_Track(self._pid(engine), track, order), name, cat, begin, end, args or {})
        with self._lock:
            self._spans.append(span)
        return span

    def primitive_created(self, engine, primitive, how: str, started: float, seconds: float) -> None:
        span = self.add_span(
            engine, "create_primitive", 1, primitive.label, "create",
            int(started * 1e9), time.perf_counter_ns(),
            {"outcome": how, "kind": primitive.kind, "impl": getattr(primitive, "impl", "")},
        )
        with self._lock:
            self._instants.append((span, how, {"primitive": primitive.label}))

    def build_finished(self, engine, desc, seconds: float) -> None:
        end = time.perf_counter_ns()
        self.add_span(
            engine, "builds", 3, f"build {desc.label}", "build", end - int(seconds * 1e9), end,
            {"seconds": seconds},
        )

    # -- export ----------------------------------------------------------------------------------

    def _resolve(self) -> None:
        """Read the device times of the commands that have completed since the last look."""
        for command in self._commands:
            submission = command.submission
            if command.status != "pending" or submission is None:  # None once resolved
                continue
            if submission.failure is not None and submission.native is None:
                command.status, command.submission = "failed", None
                continue
            if submission.native is None:
                continue  # still in its stream actor's channel
            if not command.profiling:
                command.status, command.submission = "unprofiled", None
                continue
            status = execution_status(submission.native)
            if status > _COMPLETE:
                continue
            if status < 0:
                command.status, command.submission = "failed", None
                continue
            p = submission.native.profile
            command.device = (p.queued, p.submit, p.start, p.end)
            command.status, command.submission = "complete", None

    def _offsets(self) -> dict[int, int]:
        """Per engine pid: host ns minus device ns (see the module's notes on clocks)."""
        offsets: dict[int, int] = {}
        for command in self._commands:
            if command.device is None or not command.enqueued:
                continue
            queued = command.device[0] or command.device[1]
            if not queued:
                continue
            pid = command.pid
            sample = command.enqueued - queued
            if pid not in offsets or sample < offsets[pid]:
                offsets[pid] = sample
        return offsets

    def to_chrome(self) -> dict:
        """The trace in Chrome's trace event format: ``{"traceEvents": [...], "displayTimeUnit":
        "ms"}`` with complete (X), metadata (M), instant (i) and flow (s/f) events."""
        with self._lock:
            self._resolve()
            commands = list(self._commands)
            spans = list(self._spans)
            instants = list(self._instants)
        offsets = self._offsets()
        host_of: dict[int, _Span] = {}
        device_of: dict[int, _Span] = {}
        for command in commands:
            pid = command.pid
            args = {"command": command.id, "stream": command.stream_number, "op": command.op,
                    "deps": list(command.deps)}
            if command.status == "failed":
                args["failed"] = True
            host = _Span(_Track(pid, f"host: {command.thread}", 0), command.label, "submit",
                         command.begin, command.end, args)
            spans.append(host)
            host_of[command.id] = host
            if command.device is not None and pid in offsets:
                queued, submit, start, end = command.device
                offset = offsets[pid]
                device = _Span(
                    _Track(pid, f"stream {command.stream_number} lane {command.lane}", 10 + command.stream_number),
                    command.label, "device", start + offset, end + offset,
                    {"command": command.id, "op": command.op, "queued_to_start_us": (start - queued) / 1e3},
                )
                spans.append(device)
                device_of[command.id] = device
        thread_names = _pack(spans)
        events: list[dict] = []
        origin = self.origin_ns
        for pid, name in sorted({_HOST_PID: f"triodnn host (process {os.getpid()})",
                                 **self._engine_names}.items()):
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                           "args": {"sort_index": pid}})
        for (pid, tid), (name, order) in sorted(thread_names.items()):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": order}})
        for span in sorted(spans, key=lambda s: (s.begin, -s.end)):
            events.append({
                "ph": "X", "name": span.name, "cat": span.cat, "pid": span.track.pid, "tid": span.tid,
                "ts": _us(span.begin - origin), "dur": _us(span.end - span.begin),
                "args": span.args,
            })
        for span, name, args in instants:
            events.append({"ph": "i", "name": name, "cat": "cache", "s": "t", "pid": span.track.pid,
                           "tid": span.tid, "ts": _us(span.end - origin), "args": args})
        flow = 0
        for command in commands:
            for dep in command.deps:
                source, target = device_of.get(dep), device_of.get(command.id)
                if source is None or target is None or target.begin < source.begin:
                    source, target = host_of[dep], host_of[command.id]
                flow += 1
                for phase, span in (("s", source), ("f", target)):
                    event = {"ph": phase, "name": "dependency", "cat": "dependency", "id": flow,
                             "pid": span.track.pid, "tid": span.tid, "ts": _us(span.begin - origin)}
                    if phase == "f":
                        event["bp"] = "e"
                    events.append(event)
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def plot(self, path=None, **options):
        """This trace as a Gantt chart, a matplotlib Figure (saved to ``path`` when given): a row
        per device lane, dependency arrows. ``options`` are ``triodnn.trace.plot``'s."""
        return plot(self, path, **options)

    def save(self, path) -> None:
        """Write ``to_chrome()`` as JSON to ``path`` (open it in ui.perfetto.dev or chrome://tracing)."""
        with open(path, "w") as file:
            json.dump(self.to_chrome(), file)

    def finish(self) -> None:
        """End the recording once ``record()`` has uninstalled it (``record()`` calls this): stamp
        ``stopped_ns`` and read the device times of the commands completed by then."""
        self.stopped_ns = time.perf_counter_ns()
        with self._lock:
            self._resolve()


def _us(ns: int) -> float:
    return round(ns / 1e3, 3)


def _pack(spans: list[_Span]) -> dict[tuple[int, int], tuple[str, int]]:
    """Give every span a tid such that complete events nest on each (pid, tid): a track whose
    spans partially overlap gets numbered sub-tracks. Returns (pid, tid) -> (name, sort index)."""
    by_track: dict[_Track, list[_Span]] = {}
    for span in spans:
        by_track.setdefault(span.track, []).append(span)
    names: dict[tuple[int, int], tuple[str, int]] = {}
    next_tid: dict[int, int] = {}
    for track in sorted(by_track, key=lambda t: (t.pid, t.order, t.name)):
        slots: list[list[int]] = []  # per sub-track, the ends of its open spans (a stack)
        tids: list[int] = []
        for span in sorted(by_track[track], key=lambda s: (s.begin, -s.end)):
            # B007 is a false positive here: ``index`` is read after the loop (the slot ``break`` found).
            for index, stack in enumerate(slots):  # noqa: B007
                while stack and stack[-1] <= span.begin:
                    stack.pop()
                if not stack or stack[-1] >= span.end:
                    break
            else:
                index = len(slots)
                slots.append([])
                tid = next_tid[track.pid] = next_tid.get(track.pid, 0) + 1
                tids.append(tid)
                names[(track.pid, tid)] = (track.name if index == 0 else f"{track.name} ({index + 1})",
                                           track.order * 100 + index)
            slots[index].append(span.end)
            span.tid = tids[index]
    return names


@contextlib.contextmanager
def record() -> Iterator[Trace]:
    """Record a trace for the duration of the block (any task, runtime or thread in the process)."""
    global recorder
    trace = Trace()
    with _recorder_lock:
        if recorder is not None:
            raise TraceError("a trace is already recording; one trace records at a time")
        recorder = trace
        add_instrument(trace)
    try:
        yield trace
    finally:
        with _recorder_lock:
            recorder = None
            with contextlib.suppress(KeyError):  # already removed if one of its hooks raised
                remove_instrument(trace)
        trace.finish()


@contextlib.contextmanager
def record_to(path) -> Iterator[Trace | None]:
    """``record()`` saved to ``path`` when the block ends, however it ends; nothing for None."""
    if path is None:
        yield None
        return
    trace = None
    try:
        with record() as trace:
            yield trace
    finally:
        if trace is not None:
            trace.save(path)


@contextlib.contextmanager
def _span(trace: Trace, name: str, engine, track: str, args: dict) -> Iterator[None]:
    begin = time.perf_counter_ns()
    try:
        yield
    finally:
        trace.add_span(engine, track, 2 if engine is not None else 0, name, "task", begin,
                       time.perf_counter_ns(), args)


def span(name: str, *, engine: Engine | None = None, track: str = "tasks", **args):
    """A context manager recording a host span around its block on ``track`` of ``engine``'s
    process (the host process without one); a shared no-op when no trace records."""
    trace = recorder
    if trace is None:
        return _NULL
    return _span(trace, name, engine, track, args)
