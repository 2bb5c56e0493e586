"""The blocking portal: triodnn from code that is not async (scripts, notebook cells, threads).

``triodnn.start_blocking()`` runs ``open_runtime()`` in a background thread with its own trio
loop and returns a ``BlockingPortal``; its calls block the calling thread until the runtime's
thread has done the work. Every triodnn object the portal hands out (runtime, engines, streams,
events, memory, primitives, and the Graph API's partitions, compiled partitions, runners and
tensors) is wrapped so that its methods run on the runtime's thread (stream submissions touch
trio channels, which belong to that thread), an awaitable a method returns is awaited there
(``partition.compile(engine)``, ``runner.run(...)``, ``tensor.to_numpy()``) unless it is an
object of the API itself (an ``Event``: ``.wait()`` it), and results come back wrapped again.
Wrapped objects given as arguments are unwrapped wherever they sit (positional, keyword, inside
lists, tuples, dicts, generators), so ``runner.run(stream, {0: tensor})`` sees the real objects.
A runner's ``map`` comes back as a ``BlockingPipeline``, a plain iterator. Any number of threads
may use one portal at once. ``close()`` (or leaving a ``with`` block) shuts the runtime down as
``open_runtime`` does: pipelines still open are closed, streams finish what was submitted, then
the thread ends.

The portal is for code outside trio. Inside a trio run (the portal's own thread included) every
blocking step of it, opening, entering, calling, closing, raises ``WrongThreadError`` before it
does anything: it would stall that run's every task while it waited, and trio refuses to hand
the call over from there anyway. Trio code uses the async API (``open_runtime``) directly, or
reaches a portal from a worker thread (``trio.to_thread.run_sync``).

    with triodnn.start_blocking() as portal:
        engine = portal.engine()
        relu = engine.create_primitive(triodnn.EltwiseDesc("relu", desc))
        src = engine.from_numpy(x)
        dst = engine.memory(desc)
        engine.stream().execute(relu, {"src": src, "dst": dst}).wait()
        print(dst.to_numpy())

        runner = portal.run(triodnn.graph.compile_graph, graph, engine)
        outputs = runner.run(engine.stream(), {0: x})                  # {output id: array}
        for outputs in runner.map(requests, stream=engine.stream()):   # in input order
            ...
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import threading
from collections.abc import Iterator

import trio

from ._engine import Engine
from ._event import Event
from ._memory import Memory
from ._primitive import Primitive
from ._runtime import Runtime, open_runtime
from ._stream import Stream
from ._values._errors import ClosedError, InvalidArgumentError, WrongThreadError
from .graph import CompiledPartition, DynamicGraphRunner, EnginePool, GraphRunner, Partition, Pipeline, Tensor


class BlockingPortal:
    """A runtime living in a background thread, driven by blocking calls from any thread."""

    def __init__(self, **runtime_options) -> None:
        _refuse_inside_trio("opened")  # before the thread starts: nothing is left to clean up
        self._options = runtime_options
        self._token: trio.lowlevel.TrioToken | None = None
        # The runtime, the stop event and the nursery that hosts pipelines exist from _serve's
        # start until the thread ends; the constructor returns only once they do.
        self._runtime: Runtime | None = None
        self._stop: trio.Event | None = None
        self._nursery: trio.Nursery | None = None
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
            # Inside the runtime: pipelines left open close (their requests cancelled, buffers
            # released) before the runtime shuts down.
            async with trio.open_nursery() as nursery:
                self._runtime = runtime
                self._nursery = nursery
                self._token = trio.lowlevel.current_trio_token()
                self._stop = trio.Event()
                self._ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

    # -- calling in ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the blocking portal is closed")
        _refuse_inside_trio("called", self._token)  # its own runtime thread included, which would wait on itself

    def run(self, async_fn, *args, **kwargs):
        """``await async_fn(*args, **kwargs)`` on the runtime's thread; its result, wrapped.
        Wrapped objects among the arguments are unwrapped first:
        ``portal.run(compile_graph, graph, engine)`` returns a wrapped ``GraphRunner``."""
        self._check_open()
        call = functools.partial(async_fn, *args, **kwargs)
        return self._wrap(trio.from_thread.run(_unwrap_call, call, trio_token=self._token))

    def run_sync(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` on the runtime's thread; its result, wrapped. A coroutine (or
        other awaitable that is no triodnn object) it returns is awaited there too, so nothing
        is left never awaited: ``portal.run_sync(partition.compile, engine)`` compiles."""
        self._check_open()
        call = functools.partial(fn, *args, **kwargs)
        result = trio.from_thread.run_sync(_unwrap_sync, call, trio_token=self._token)
        if isinstance(result, _Pending):
            result = self._settle(result.awaitable)
        return self._wrap(result)

    def _settle(self, awaitable):
        """Await on the runtime's thread what a plain call returned (a second hop: run_sync
        cannot await, and most plain calls, submissions above all, return no awaitable)."""
        try:
            return trio.from_thread.run(_await, awaitable, trio_token=self._token)
        finally:
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # a no-op once it ran; else no never-awaited warning

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

    def map(self, runner, inputs, *, stream, max_in_flight: int = 4, deps=(),
            as_tensors: bool | collections.abc.Iterable[int] = False) -> BlockingPipeline:
        """``runner.map(...)`` as a plain iterator over the results, in input order::

            for outputs in portal.map(runner, inputs, stream=stream, max_in_flight=4):
                ...

        ``runner`` is a ``GraphRunner``, wrapped or not. See ``BlockingPipeline``."""
        return self.run_sync(_unwrap(runner).map, inputs, stream=stream, max_in_flight=max_in_flight,
                             deps=deps, as_tensors=as_tensors)

    # -- wrapping ----------------------------------------------------------------------------------

    def wrap(self, value):
        """``value`` as the portal hands objects out: triodnn objects made without the portal
        (the partitions of ``graph.get_partitions()``, say) wrapped, inside lists, tuples and
        dict values too; anything else as it is. A triodnn class is wrapped too, so that its
        constructor and async class methods go through the portal:
        ``Tensor = portal.wrap(triodnn.graph.Tensor)``, then ``Tensor(lt, engine)`` and
        ``Tensor.from_numpy(lt, engine, array)``."""
        if isinstance(value, type) and issubclass(value, _live_classes()):
            return Blocking(self, value)
        return self._wrap(value)

    def _wrap(self, value):
        if isinstance(value, (list, tuple)) and any(_is_triodnn(v) for v in value):
            return type(value)(self._wrap(v) for v in value)
        if isinstance(value, dict) and any(_is_triodnn(v) for v in value.values()):
            return {k: self._wrap(v) for k, v in value.items()}
        if isinstance(value, Pipeline):
            return BlockingPipeline(self, value)
        if _is_triodnn(value):
            return Blocking(self, value)
        return value

    async def host(self, async_fn) -> None:
        """``nursery.start(async_fn)`` in the nursery the portal keeps inside its runtime (on the
        runtime's thread): a task that outlives the call, such as an open pipeline's block, which
        must close before the runtime does."""
        nursery = self._nursery
        assert nursery is not None, "the portal's constructor returns once it is serving"
        await nursery.start(async_fn)

    # -- closing -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Shut the runtime down (open pipelines close, submitted work completes) and end its
        thread. Inside a trio run: ``WrongThreadError``, and the portal stays open (close it
        where it was opened, outside trio)."""
        _refuse_inside_trio("closed")
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
        # Refused here rather than at __exit__, where the block's work would already be done
        # and the portal could not be closed.
        _refuse_inside_trio("entered")
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:  # a forgotten portal must not keep the process alive
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:
                pass


def _refuse_inside_trio(doing: str, own_token: trio.lowlevel.TrioToken | None = None) -> None:
    """``WrongThreadError`` when the caller runs inside a trio run (any run: the portal's own,
    whose ``own_token`` is given once it runs, or the caller's)."""
    try:
        token = trio.lowlevel.current_trio_token()
    except RuntimeError:
        return  # outside trio: a blocking call is what the portal is for
    if token is own_token:
        # A wrapped object reached a function the portal runs (a closure, a global): the fix is
        # to hand the object over, which unwraps it.
        raise WrongThreadError(
            f"a blocking portal was {doing} from a function it runs itself (portal.run / run_sync), where the "
            "call would wait on itself: pass the wrapped object as an argument instead, "
            "portal.run(fn, runner, ...) hands fn the object itself to await (async def fn(runner): "
            "return await runner.run(...))"
        )
    raise WrongThreadError(
        f"a blocking portal was {doing} inside a trio run (thread "
        f"{threading.current_thread().name!r}), where its blocking calls would stall the run; "
        "inside trio use the async API directly (async with triodnn.open_runtime() as rt: "
        "engine = await rt.engine() ...), or reach the portal from a worker thread "
        "(await trio.to_thread.run_sync(portal.engine))"
    )


def _unwrap_args(args, kwargs):
    return ([_unwrap(a) for a in args], {k: _unwrap(v) for k, v in kwargs.items()})


def _unwrap(value):
    if isinstance(value, Blocking):
        return value.__triodnn_target__
    if isinstance(value, BlockingPipeline):
        return value.pipeline
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_unwrap(v) for v in value)
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    if inspect.isgenerator(value):
        # runner.map's inputs: each request dict is unwrapped as the pipeline pulls it.
        return _unwrapping(value)
    return value


def _unwrapping(items):
    try:
        for item in items:
            yield _unwrap(item)
    finally:
        items.close()  # the pipeline closes this generator once done; the caller's goes with it


async def _unwrap_call(call: functools.partial):
    args, kwargs = _unwrap_args(call.args, call.keywords)
    result = call.func(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


def _unwrap_sync(call: functools.partial):
    args, kwargs = _unwrap_args(call.args, call.keywords)
    result = call.func(*args, **kwargs)
    if inspect.isawaitable(result) and not _is_triodnn(result):
        return _Pending(result)  # trio refuses a coroutine as run_sync's result
    return result


class _Pending:
    """An awaitable a plain call returned, boxed on its way to ``BlockingPortal._settle``."""

    __slots__ = ("awaitable",)

    def __init__(self, awaitable) -> None:
        self.awaitable = awaitable


async def _await(awaitable):
    return await awaitable


def _is_triodnn(value) -> bool:
    return isinstance(value, _live_classes())


@functools.cache
def _live_classes() -> tuple[type, ...]:
    """Objects tied to the runtime's thread (actors, channels, events) or with async methods
    (a partition compiles). Values (descriptors, identities, statistics, logical tensors) and
    the pure-Python graph (graphs, ops) pass unwrapped."""
    return (Runtime, Engine, Stream, Event, Memory, Primitive, Partition, CompiledPartition,
            GraphRunner, DynamicGraphRunner, EnginePool, Pipeline, Tensor)


class Blocking:
    """A triodnn object seen from outside the runtime's thread: its methods run on the runtime's
    thread and block until done, an awaitable one returns is awaited there (but an ``Event``
    comes back wrapped: ``wait()`` blocks until its command completes), and results come back
    wrapped the same way. Wrapped arguments are unwrapped first."""

    __slots__ = ("_portal", "_target")

    def __init__(self, portal: BlockingPortal, target) -> None:
        object.__setattr__(self, "_portal", portal)
        object.__setattr__(self, "_target", target)

    @property
    def __triodnn_portal__(self) -> BlockingPortal:
        """The portal behind this object: async entry points given it run there (``_portal_route``)."""
        return self._portal

    @property
    def __triodnn_target__(self):
        """The object behind this wrapper: what the portal's calls see where it is passed back.
        A dunder, as ``__triodnn_portal__``: a plain name would hide the target's own."""
        return self._target

    def __getattr__(self, name: str):
        attribute = getattr(type(self._target), name, None)
        if isinstance(attribute, property):
            return self._portal.run_sync(getattr, self._target, name)
        value = getattr(self._target, name)
        if not callable(value):
            return self._portal.wrap(value)
        if inspect.iscoroutinefunction(value):
            return functools.partial(self._portal.run, value)
        return functools.partial(self._portal.run_sync, value)

    def __call__(self, *args, **kwargs):
        """A wrapped class (``portal.wrap(Tensor)``): construct on the runtime's thread."""
        return self._portal.run_sync(self._target, *args, **kwargs)

    def __repr__(self) -> str:
        return f"Blocking({self._target!r})"

    def __dir__(self):  # a notebook's completion lists the target's methods
        return sorted(set(dir(type(self))) | set(dir(self._target)))

    # Two wrappers of one object are equal: the portal wraps anew each time it hands one out.
    def __eq__(self, other) -> bool:
        if isinstance(other, Blocking):
            return self._target == other._target
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._target)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        exit_ = getattr(self._target, "__exit__", None)
        if exit_ is not None:
            self._portal.run_sync(exit_, *exc_info)


class _End:
    """The end of a pipeline's results (a StopAsyncIteration does not cross threads cleanly)."""


_END = _End()


async def _next_result(pipeline: Pipeline):
    try:
        return await pipeline.__anext__()
    except StopAsyncIteration:
        return _END


class BlockingPipeline:
    """``GraphRunner.map``'s ``Pipeline`` through the portal: a plain iterator over the results,
    in input order::

        with runner.map(inputs, stream=stream, max_in_flight=4) as results:
            for outputs in results:
                ...
        for outputs in runner.map(inputs, stream=stream):   # a bare loop closes it on its own
            ...

    The pipeline's ``async with`` block is held open by a task of the portal's nursery from the
    first iteration (or ``with``) until it closes. Inside a ``with`` block the block owns the
    pipeline, as in the async API: leaving it closes it. A loop outside one owns it itself: its
    end, a ``break`` or an exception closes it. Closing cancels the requests in flight and
    releases their buffers before it returns; closing the portal closes pipelines still open.
    Inputs are pulled on the runtime's thread: a generator of inputs must not call the portal.
    """

    def __init__(self, portal: BlockingPortal, pipeline: Pipeline) -> None:
        self._portal = portal
        self._pipeline = pipeline
        self._lock = threading.Lock()
        self._state = "new"               # new, open, closed
        self._entered = False
        self._leave: trio.Event | None = None   # set by close: the host task leaves the block
        self._left: trio.Event | None = None    # set by the host task once the block has exited
        self._error: Exception | None = None    # what leaving the block raised

    @property
    def max_in_flight(self) -> int:
        return self._pipeline.max_in_flight

    @property
    def pipeline(self) -> Pipeline:
        """The ``Pipeline`` it drives on the runtime's thread: what the portal's calls see where
        it is passed back."""
        return self._pipeline

    def statistics(self):
        return self._portal.run_sync(self._pipeline.statistics)

    def _open(self) -> bool:
        with self._lock:
            if self._state == "new":
                self._portal.run(self._start)
                self._state = "open"
            return self._state == "open"

    async def _start(self) -> None:
        self._leave, self._left = trio.Event(), trio.Event()
        await self._portal.host(self._host)

    async def _host(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        assert self._leave is not None and self._left is not None, "_start made them"
        entered = False
        try:
            async with self._pipeline:
                entered = True
                task_status.started()
                await self._leave.wait()
        except Exception as exc:
            if not entered:
                raise  # reaches the caller of _start (nursery.start)
            self._error = exc  # raised by close(); the portal's nursery must not fail
        finally:
            self._left.set()

    async def _exit(self) -> None:
        assert self._leave is not None and self._left is not None, "_start made them"
        self._leave.set()
        await self._left.wait()

    def __iter__(self) -> Iterator:
        if not self._open():
            return iter(())
        return self._results()

    def _results(self) -> Iterator:
        try:
            while True:
                result = self._portal.run(_next_result, self._pipeline)
                if result is _END:
                    return
                yield result
        finally:
            if not self._entered:
                self.close()

    def close(self) -> None:
        """Stop pulling inputs, cancel the requests in flight; returns once their buffers are
        released and the pipeline's block has exited. Idempotent."""
        with self._lock:
            state, self._state = self._state, "closed"
        if state != "open":
            return
        try:
            self._portal.run(self._exit)
        except (ClosedError, trio.RunFinishedError):
            return  # the portal closed: closing it cancelled the host task, which closed this
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def __enter__(self) -> BlockingPipeline:
        with self._lock:
            if self._entered or self._state != "new":
                raise InvalidArgumentError(
                    "this pipeline was entered or iterated already; call runner.map(...) again "
                    "for another"
                )
            self._entered = True
        self._open()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"BlockingPipeline({self._state}, max_in_flight={self.max_in_flight})"


def start_blocking(**runtime_options) -> BlockingPortal:
    """A ``BlockingPortal``: ``open_runtime(**runtime_options)`` in a background thread."""
    return BlockingPortal(**runtime_options)
