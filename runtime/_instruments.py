"""Instruments: hooks into triodnn's work, after ``trio.abc.Instrument``.

    class Count(Instrument):
        def command_submitted(self, stream, command, started_ns):
            ...
    add_instrument(Count())      # process-wide; remove_instrument(...) to stop

Two are built in: the trace recorder (``triodnn.trace.record()`` installs its ``Trace`` for the
block) and ``TRIODNN_VERBOSE`` (``_verbose.VERBOSE``, installed by every ``open_runtime()``). The
runtime, engines and streams call the registry's hooks, never an instrument by name.

Hooks run synchronously on the thread of the runtime doing the work and must neither block nor
await. The registry is process-wide, like the primitive cache the hooks report on: one
instrument sees every runtime of the process, whichever thread it runs in.

Cost: as trio does, the registry keeps per hook the instruments whose class overrides it, and
calls only those. On the command path that is one attribute test per command while no instrument
watches commands: ``INSTRUMENTS.submit_hooks`` where a stream submits, ``enqueue_hooks`` where its
actor enqueues. ``needs_profiling`` and ``watches_completions`` are asked once, when a stream
opens, so a stream keeps what it was opened with (profiling, completion watching).

An exception in a hook is logged (logger ``triodnn.instruments``) and removes the instrument, as
trio does: a faulty instrument must not fail the command it watches, nor crash a stream actor.
"""

from __future__ import annotations

import logging
import threading

from ._values._errors import InvalidArgumentError

__all__ = ["INSTRUMENTS", "Instrument", "Instruments", "add_instrument", "remove_instrument"]

_log = logging.getLogger("triodnn.instruments")


class Instrument:
    """The hook interface: every method is a no-op; override the ones you need.

    ``engine``, ``primitive``, ``stream`` and ``event`` are triodnn's own objects; ``command``
    is the frozen record the stream hands its actor (``triodnn.actors.KernelLaunch``,
    ``WriteBuffer``, ``ReadBuffer``, ``Marker``, ``Barrier``): ``command.op`` names its kind,
    ``command.submission`` holds its label, lane and pyopencl event once enqueued,
    ``command.deps`` the submissions and pyopencl events it waits for.
    """

    __slots__ = ()

    @property
    def needs_profiling(self) -> bool:
        """Asked when a stream opens: True gives it ``StreamFlags.profiling`` (device times), but
        for a stream on a caller's queue (``ocl_interop.make_stream``), whose queue decides."""
        return False

    @property
    def watches_completions(self) -> bool:
        """Asked when a stream opens, of instruments that override ``command_completed``: True
        has it called for every command of that stream."""
        return False

    def primitive_created(self, engine, primitive, how: str, started: float, seconds: float) -> None:
        """``engine.create_primitive`` (or a reorder) returned ``primitive``; ``how`` is
        ``cache_hit``, ``cache_miss`` or ``cache_coalesced``; it began at ``started``
        (``time.perf_counter()``) and took ``seconds``."""

    def build_finished(self, engine, desc, seconds: float) -> None:
        """A cache miss's build of ``desc`` for ``engine`` finished (seen on the trio side) after
        ``seconds`` of the worker thread's own measure."""

    def command_submitted(self, stream, command, started_ns: int) -> None:
        """``stream`` handed ``command`` to its actor. ``started_ns`` (``time.perf_counter_ns()``)
        is when the ``execute`` call began; 0 for the other submissions (they begin here)."""

    def command_enqueued(self, command) -> None:
        """The stream actor enqueued ``command``, just now (``command.submission.native`` and
        ``.lane`` are set); called on the actor's task."""

    def command_completed(self, stream, command, event, error: BaseException | None) -> None:
        """``command`` of a watched ``stream`` completed (``error``: what ``await event``
        raised, or None); called from a task of the runtime's nursery."""


HOOKS = ("primitive_created", "build_finished", "command_submitted", "command_enqueued", "command_completed")


def _overrides(instrument: Instrument, hook: str) -> bool:
    return getattr(type(instrument), hook) is not getattr(Instrument, hook)


class Instruments:
    """The installed instruments, and per hook those that override it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.installed: tuple[Instrument, ...] = ()
        self._hooks: dict[str, tuple[Instrument, ...]] = dict.fromkeys(HOOKS, ())
        # The command path's checks: one attribute each. Tuples are replaced, never mutated, so
        # readers on other threads see one consistent state without the lock.
        self.submit_hooks: tuple[Instrument, ...] = ()
        self.enqueue_hooks: tuple[Instrument, ...] = ()

    def add(self, instrument: Instrument) -> None:
        """Install ``instrument``; nothing happens when it is installed already."""
        if not isinstance(instrument, Instrument):
            raise InvalidArgumentError(
                f"instrument is {type(instrument).__name__}, expected a triodnn Instrument"
            )
        with self._lock:
            if instrument not in self.installed:
                self._install(self.installed + (instrument,))

    def remove(self, instrument: Instrument) -> None:
        """Uninstall ``instrument``; ``KeyError`` when it is not installed (as in trio)."""
        with self._lock:
            if instrument not in self.installed:
                raise KeyError(f"instrument {instrument!r} is not installed")
            self._install(tuple(i for i in self.installed if i is not instrument))

    def _install(self, installed: tuple[Instrument, ...]) -> None:
        hooks = {hook: tuple(i for i in installed if _overrides(i, hook)) for hook in HOOKS}
        self.installed, self._hooks = installed, hooks
        self.submit_hooks, self.enqueue_hooks = hooks["command_submitted"], hooks["command_enqueued"]

    def _failed(self, instrument: Instrument, hook: str) -> None:
        _log.exception("instrument %r raised in %s; it has been removed", instrument, hook)
        try:
            self.remove(instrument)
        except KeyError:
            pass  # removed meanwhile

    # -- asked when a stream opens ---------------------------------------------------------------

    def needs_profiling(self) -> bool:
        """Whether any installed instrument needs device times."""
        for instrument in self.installed:
            try:
                if instrument.needs_profiling:
                    return True
            except Exception:
                self._failed(instrument, "needs_profiling")
        return False

    def completion_watchers(self) -> tuple[Instrument, ...]:
        """The instruments to tell of each completion on a stream opening now."""
        watchers = []
        for instrument in self._hooks["command_completed"]:
            try:
                if instrument.watches_completions:
                    watchers.append(instrument)
            except Exception:
                self._failed(instrument, "watches_completions")
        return tuple(watchers)

    # -- the hooks ---------------------------------------------------------------------------------

    def _call(self, hook: str, instruments: tuple[Instrument, ...], args: tuple) -> None:
        for instrument in instruments:
            try:
                getattr(instrument, hook)(*args)
            except Exception:
                self._failed(instrument, hook)

    def primitive_created(self, engine, primitive, how: str, started: float, seconds: float) -> None:
        self._call("primitive_created", self._hooks["primitive_created"],
                   (engine, primitive, how, started, seconds))

    def build_finished(self, engine, desc, seconds: float) -> None:
        self._call("build_finished", self._hooks["build_finished"], (engine, desc, seconds))

    def command_submitted(self, stream, command, started_ns: int) -> None:
        self._call("command_submitted", self.submit_hooks, (stream, command, started_ns))

    def command_enqueued(self, command) -> None:
        self._call("command_enqueued", self.enqueue_hooks, (command,))

    async def watch_completion(self, watchers: tuple[Instrument, ...], stream, command, event) -> None:
        """Tell ``watchers`` once ``event`` (of ``command`` on ``stream``) completes: a task of the
        runtime's nursery, started by the stream for streams opened with watchers."""
        error = None
        try:
            await event.wait()
        except Exception as exc:  # the command failed: the watchers are told how
            error = exc
        # Instruments removed since the stream opened are no longer told.
        self._call("command_completed", tuple(w for w in watchers if w in self.installed),
                   (stream, command, event, error))


INSTRUMENTS = Instruments()


def add_instrument(instrument: Instrument) -> None:
    """Install ``instrument`` process-wide (nothing happens when it is installed already)."""
    INSTRUMENTS.add(instrument)


def remove_instrument(instrument: Instrument) -> None:
    """Uninstall ``instrument``; ``KeyError`` when it is not installed."""
    INSTRUMENTS.remove(instrument)
