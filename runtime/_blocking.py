"""The blocking portal: triodnn from code that is not async (scripts, notebook cells, threads).

``triodnn.start_blocking()`` runs ``open_runtime()`` in a background thread with its own trio
loop and returns a ``BlockingPortal``; its calls block the calling thread until the runtime's
thread has done the work. Every triodnn object the portal hands out is wrapped so that its
async methods block and its plain methods run on the runtime's thread too (stream submissions
touch trio channels, which belong to that thread). Any number of threads may use one portal at
once. ``close()`` (or leaving a ``with`` block) shuts the runtime down as ``open_runtime`` does:
streams finish what was submitted, then the thread ends.

    with triodnn.start_blocking() as portal:
        engine = portal.engine()
        relu = engine.create_primitive(triodnn.EltwiseDesc("relu", desc))
        src = engine.from_numpy(x)
        dst = engine.memory(desc)
        engine.stream().execute(relu, {"src": src, "dst": dst}).wait()
        print(dst.to_numpy())
"""

from __future__ import annotations

import functools
import inspect
import threading

import trio

from ._engine import Engine
from ._event import Event
from ._memory import Memory
from ._primitive import Primitive
from ._runtime import Runtime, open_runtime
from ._stream import Stream
from ._values._errors import ClosedError, InvalidArgumentError
from .graph import CompiledPartition, Tensor


class BlockingPortal:
    """A runtime living in a background thread, driven by blocking calls from any thread."""

    def __init__(self, **runtime_options) -> None:
        self._options = runtime_options
        self._token: trio.lowlevel.TrioToken | None = None
        # The runtime and the stop event exist from _serve's start until the thread ends; the
        # constructor returns only once they do.
        self._runtime: Runtime | None = None
        self._stop: trio.Event | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._main, name="triodnn-blocking-portal", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            self._thread.join()
            raise self._startup_error

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # startup failures reach the constructor
            if not self._ready.is_set():
                self._startup_error = exc
                self._ready.set()

    async def _serve(self) -> None:
        async with open_runtime(**self._options) as runtime:
            self._runtime = runtime
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            self._ready.set()
            await self._stop.wait()

    # -- calling in ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the blocking portal is closed")
        if threading.current_thread() is self._thread:
            raise InvalidArgumentError(
                "a blocking portal call from its own runtime thread would wait on itself; "
                "use the async API there"
            )

    def run(self, async_fn, *args, **kwargs):
        """``await async_fn(*args, **kwargs)`` on the runtime's thread; its result, wrapped."""
        self._check_open()
        call = functools.partial(async_fn, *args, **kwargs)
        return self._wrap(trio.from_thread.run(_unwrap_call, call, trio_token=self._token))

    def run_sync(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` on the runtime's thread; its result, wrapped."""
        self._check_open()
        call = functools.partial(fn, *args, **kwargs)
        return self._wrap(trio.from_thread.run_sync(_unwrap_sync, call, trio_token=self._token))

    @property
    def runtime(self):
        """The runtime, wrapped: ``portal.runtime.engine("gpu", 0)`` blocks and returns an engine."""
        return self._wrap(self._runtime)

    def engine(self, kind: str | None = None, index: int = 0):
        """An engine, as ``await runtime.engine(kind, index)`` (the default engine without kind)."""
        runtime = self._runtime
        assert runtime is not None, "the constructor returns once the runtime is open"
        if kind is None:
            return self.run(runtime.engine)
        return self.run(runtime.engine, kind, index)

    # -- wrapping ----------------------------------------------------------------------------------

    def _wrap(self, value):
        if isinstance(value, (list, tuple)) and any(_is_triodnn(v) for v in value):
            return type(value)(self._wrap(v) for v in value)
        if isinstance(value, dict) and any(_is_triodnn(v) for v in value.values()):
            return {k: self._wrap(v) for k, v in value.items()}
        if _is_triodnn(value):
            return Blocking(self, value)
        return value

    # -- closing -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Shut the runtime down (submitted work completes first) and end its thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._thread.is_alive() and self._token is not None and self._stop is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join()

    def __enter__(self) -> BlockingPortal:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:  # a forgotten portal must not keep the process alive
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:
                pass


def _unwrap_args(args, kwargs):
    return ([_unwrap(a) for a in args], {k: _unwrap(v) for k, v in kwargs.items()})


def _unwrap(value):
    if isinstance(value, Blocking):
        return value._target
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_unwrap(v) for v in value)
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    return value


async def _unwrap_call(call: functools.partial):
    args, kwargs = _unwrap_args(call.args, call.keywords)
    result = call.func(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


def _unwrap_sync(call: functools.partial):
    args, kwargs = _unwrap_args(call.args, call.keywords)
    return call.func(*args, **kwargs)


def _is_triodnn(value) -> bool:
    return isinstance(value, _live_classes())


@functools.cache
def _live_classes() -> tuple[type, ...]:
    """Objects tied to the runtime's thread (actors, channels, events). Values (descriptors,
    identities, statistics, logical tensors) and pure-Python graph objects pass unwrapped."""
    return (Runtime, Engine, Stream, Event, Memory, Primitive, CompiledPartition, Tensor)


class Blocking:
    """A triodnn object seen from outside the runtime's thread: its coroutine methods block, its
    other methods run on the runtime's thread, and results come back wrapped the same way.
    ``wait()`` on a wrapped Event blocks until the command completes."""

    __slots__ = ("_portal", "_target")

    def __init__(self, portal: BlockingPortal, target) -> None:
        object.__setattr__(self, "_portal", portal)
        object.__setattr__(self, "_target", target)

    def __getattr__(self, name: str):
        attribute = getattr(type(self._target), name, None)
        if isinstance(attribute, property):
            return self._portal.run_sync(getattr, self._target, name)
        value = getattr(self._target, name)
        if not callable(value):
            return self._portal._wrap(value)
        if inspect.iscoroutinefunction(value):
            return functools.partial(self._portal.run, value)
        return functools.partial(self._portal.run_sync, value)

    def __repr__(self) -> str:
        return f"Blocking({self._target!r})"

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        exit_ = getattr(self._target, "__exit__", None)
        if exit_ is not None:
            self._portal.run_sync(exit_, *exc_info)


def start_blocking(**runtime_options) -> BlockingPortal:
    """A ``BlockingPortal``: ``open_runtime(**runtime_options)`` in a background thread."""
    return BlockingPortal(**runtime_options)
