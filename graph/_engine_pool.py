"""One request stream over several engines: ``EnginePool.map``.

    pool = await triodnn.graph.compile_graph_pool(graph, [gpu0, gpu1, cpu])
    async with pool.map(requests) as results:
        async for result in results:            # PoolResult, in input order
            outputs = result.unwrap()           # {output id: array}, or the request's error

A pool holds one ``GraphRunner`` (or ``DynamicGraphRunner``) per engine, each compiled for its
own engine (primitive and compiled-partition caches are per device, so each engine compiles the
graph once, and the engines compile at the same time), and one stream per engine. ``map`` is
``GraphRunner.map`` spread over them: each request, when it starts, goes to the engine with the
most room (``capacity`` requests running at most per engine; ties go to the engine that has
taken fewer), results come back in input order, and backpressure is the pipeline's: at most the
sum of the capacities in flight, the next input pulled only when the consumer takes a result.

Failures are the difference from ``GraphRunner.map``: a request that fails does not close the
pipeline, it comes back as a ``PoolResult`` holding its error, so one engine's trouble does not
stop the others. An engine whose request fails with an engine-level error (``ENGINE_FAILURES``:
a failed command, a closed stream or engine, a build failure) leaves the rotation: its running
requests fail with their own errors, and later requests go to the engines left. Other errors
(a handler's exception for one input) fail that request only. When no engine is left, the
pipeline ends with an ``ExecutionError`` naming each engine's failure, at the place of the first
request it could not route. Errors of the inputs themselves (a missing id, a bad shape) are the
caller's and end the pipeline at their place, as ``GraphRunner.map`` does.

A request whose inputs include ``Tensor`` or ``Memory`` objects runs on their engine (all of
them on one engine of the pool); array inputs go anywhere.
"""

from __future__ import annotations

import collections.abc
import itertools
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from .._engine import Engine
from .._memory import Memory
from .._stream import Stream
from .._values._errors import (
    BuildError,
    ClosedError,
    EngineMismatchError,
    ExecutionError,
    InvalidArgumentError,
)
from ._compile_graph import _compile_graph
from ._pipeline import Pipeline
from ._tensor import Tensor

__all__ = ["ENGINE_FAILURES", "EnginePool", "EnginePoolStatistics", "EngineStatistics", "PoolResult"]

# Errors that say the engine, not the request, is in trouble: it leaves the pool's rotation.
ENGINE_FAILURES: tuple[type[BaseException], ...] = (ExecutionError, ClosedError, BuildError)


@attrs.frozen
class PoolResult:
    """One request's outcome: ``index`` (its place in the inputs), the ``engine`` it ran on, and
    its ``outputs`` (as ``GraphRunner.run`` returns them) or the ``error`` it failed with."""

    index: int
    engine: Engine
    outputs: dict | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def unwrap(self) -> dict:
        """The outputs, or the request's error raised."""
        if self.error is not None:
            raise self.error
        assert self.outputs is not None, "a result holds outputs or an error"
        return self.outputs


@attrs.frozen
class EngineStatistics:
    """One engine of a pool: requests routed to it, finished, failed, running now and at most at
    once; ``failure`` says why it left the rotation (None while it is in it)."""

    engine: Engine
    capacity: int
    routed: int
    finished: int
    failed: int
    running: int
    peak_running: int
    failure: str | None

    @property
    def in_rotation(self) -> bool:
        return self.failure is None


@attrs.frozen
class EnginePoolStatistics:
    """Every engine's statistics, in the pool's order."""

    engines: tuple[EngineStatistics, ...]

    @property
    def routed(self) -> int:
        return sum(e.routed for e in self.engines)

    @property
    def finished(self) -> int:
        return sum(e.finished for e in self.engines)

    @property
    def failed(self) -> int:
        return sum(e.failed for e in self.engines)


@attrs.define(eq=False)
class _Lane:
    """An engine's runner, stream and counters."""

    runner: Any
    stream: Stream
    capacity: int
    routed: int = 0
    finished: int = 0
    failed: int = 0
    running: int = 0
    peak_running: int = 0
    failure: BaseException | None = None

    @property
    def engine(self) -> Engine:
        return self.runner.engine

    def statistics(self) -> EngineStatistics:
        failure = None if self.failure is None else f"{type(self.failure).__name__}: {self.failure}"
        return EngineStatistics(self.engine, self.capacity, self.routed, self.finished, self.failed,
                                self.running, self.peak_running, failure)


class _PoolRequest:
    def __init__(self, lane: _Lane, index: int, request) -> None:
        self._lane, self._index, self._request = lane, index, request

    async def run(self) -> PoolResult:
        return await self.outcome(self._request.run())

    def submit(self) -> _SubmittedPoolRequest | None:
        """The runner request submitted now when it goes as one recorded command (``map`` then
        awaits it without a task); None otherwise. A request that fails to submit is still a
        result: its error, as ``run`` would give it."""
        submit = getattr(self._request, "submit", None)  # a DynamicGraphRunner's requests have none
        if submit is None:
            return None
        try:
            submitted = submit()
        except Exception as exc:
            return _SubmittedPoolRequest(self, None, exc)
        return None if submitted is None else _SubmittedPoolRequest(self, submitted, None)

    def abandon(self) -> None:
        self._lane.running -= 1

    async def outcome(self, awaitable) -> PoolResult:
        """The ``PoolResult`` of the request's outputs, awaited; an error is the result's."""
        lane = self._lane
        try:
            outputs = await awaitable
        except Exception as exc:
            lane.failed += 1
            if isinstance(exc, ENGINE_FAILURES) and lane.failure is None:
                lane.failure = exc
            return PoolResult(self._index, lane.engine, error=exc)
        finally:
            lane.running -= 1
        lane.finished += 1
        return PoolResult(self._index, lane.engine, outputs=outputs)


class _SubmittedPoolRequest:
    """A pool request its runner submitted as one command (or failed to submit)."""

    def __init__(self, request: _PoolRequest, submitted, error: BaseException | None) -> None:
        self._request, self._submitted, self._error = request, submitted, error

    async def result(self) -> PoolResult:
        return await self._request.outcome(self._outputs())

    async def _outputs(self) -> dict:
        if self._submitted is None:
            await trio.lowlevel.checkpoint()
            assert self._error is not None, "a request that was not submitted failed to"
            raise self._error
        return await self._submitted.result()

    def abandon(self) -> None:
        if self._submitted is not None:
            self._submitted.abandon()
        self._request.abandon()


class EnginePool:
    """Runners of one graph on several engines, fed by one request stream (``map``).

    Make one with ``await compile_graph_pool(graph, engines, ...)``, or from runners compiled
    already: ``EnginePool(runners, streams, capacity=4)`` (one runner per engine, each stream on
    its runner's engine). ``capacity``: requests running at once per engine, one number or one
    per engine (a slower engine may take fewer)."""

    def __init__(self, runners: Sequence, streams: Sequence[Stream], *, capacity: int | Sequence[int] = 4) -> None:
        runners, streams = list(runners), list(streams)
        if not runners:
            raise InvalidArgumentError("an engine pool needs at least one runner")
        if len(streams) != len(runners):
            raise InvalidArgumentError(f"{len(runners)} runners but {len(streams)} streams; give one stream per runner")
        capacities = [capacity] * len(runners) if isinstance(capacity, int) else list(capacity)
        if len(capacities) != len(runners):
            raise InvalidArgumentError(f"{len(capacities)} capacities for {len(runners)} runners")
        for c in capacities:
            if isinstance(c, bool) or not isinstance(c, int) or c < 1:
                raise InvalidArgumentError(f"capacity {c!r} must be a positive integer")
        seen: dict[int, Engine] = {}
        for runner, stream in zip(runners, streams):
            engine = getattr(runner, "engine", None)
            if not isinstance(engine, Engine) or not hasattr(runner, "make_request"):
                raise InvalidArgumentError(f"{runner!r} is no GraphRunner (compile_graph's result)")
            if not isinstance(stream, Stream) or stream.engine is not engine:
                raise EngineMismatchError(f"stream {stream!r} is not a stream of the runner's engine {engine}")
            if id(engine) in seen:
                raise InvalidArgumentError(f"engine {engine} appears twice; a pool has one runner per engine")
            seen[id(engine)] = engine
        self._lanes = [_Lane(r, s, c) for r, s, c in zip(runners, streams, capacities)]

    @property
    def engines(self) -> tuple[Engine, ...]:
        return tuple(lane.engine for lane in self._lanes)

    @property
    def runners(self) -> tuple:
        return tuple(lane.runner for lane in self._lanes)

    @property
    def streams(self) -> tuple[Stream, ...]:
        return tuple(lane.stream for lane in self._lanes)

    def statistics(self) -> EnginePoolStatistics:
        return EnginePoolStatistics(tuple(lane.statistics() for lane in self._lanes))

    async def set_constants(self, constants) -> None:
        """``GraphRunner.set_constants`` on every engine's runner (arrays are uploaded to each)."""
        for lane in self._lanes:
            await lane.runner.set_constants(constants)

    def map(self, inputs, *, as_tensors: bool | collections.abc.Iterable[int] = False) -> Pipeline:
        """``GraphRunner.map`` over the pool's engines: a ``Pipeline`` of ``PoolResult``s in input
        order, at most the sum of the capacities in flight::

            async with pool.map(inputs) as results:
                async for result in results:
                    outputs = result.unwrap()

        ``as_tensors`` as ``run``'s: Tensors stay on the engine their request ran on
        (``result.engine``), the caller's to release."""
        as_tensors = as_tensors if isinstance(as_tensors, bool) else frozenset(as_tensors)
        counter = itertools.count()
        return Pipeline(inputs, lambda item: self._start(item, next(counter), as_tensors),
                        sum(lane.capacity for lane in self._lanes))

    async def run(self, inputs, *, as_tensors: bool | collections.abc.Iterable[int] = False) -> dict:
        """One request on the engine with the most room: its outputs, or its error raised (an
        engine-level one takes the engine out of the rotation, as in ``map``). Any number of
        tasks may call it at once; each engine's capacity is not enforced here, only used to
        choose."""
        as_tensors = as_tensors if isinstance(as_tensors, bool) else frozenset(as_tensors)
        result: PoolResult = await self._start(inputs, 0, as_tensors).run()
        return result.unwrap()

    def _start(self, item, index: int, as_tensors) -> _PoolRequest:
        lane = self._route(item)
        request = lane.runner.make_request(lane.stream, item, (), as_tensors)
        lane.routed += 1
        lane.running += 1
        lane.peak_running = max(lane.peak_running, lane.running)
        return _PoolRequest(lane, index, request)

    def _route(self, item) -> _Lane:
        pinned = _pinned_engine(item)
        if pinned is not None:
            for lane in self._lanes:
                if lane.engine is pinned:
                    return lane
            raise EngineMismatchError(f"a request's tensors live on {pinned}, which is not one of the pool's "
                                      f"engines {list(self.engines)}")
        open_lanes = [lane for lane in self._lanes if lane.failure is None]
        if not open_lanes:
            failures = "; ".join(f"{lane.engine}: {type(lane.failure).__name__}: {lane.failure}"
                                 for lane in self._lanes)
            raise ExecutionError(f"every engine of the pool has failed ({failures})") from self._lanes[0].failure
        # Most room first; among equals the engine that has taken fewer, then the pool's order.
        return max(open_lanes, key=lambda lane: (lane.capacity - lane.running, -lane.routed))


def _pinned_engine(item) -> Engine | None:
    """The engine of a request's Tensor / Memory inputs (one engine for all), or None."""
    if not isinstance(item, collections.abc.Mapping):
        return None  # the runner's binding raises the typed error
    engines = {id(v.engine): v.engine for v in item.values() if isinstance(v, (Tensor, Memory))}
    if len(engines) > 1:
        raise EngineMismatchError(f"a request's tensors live on several engines {list(engines.values())}; "
                                  "one request runs on one engine")
    return next(iter(engines.values()), None)


async def compile_graph_pool(graph, engines: Sequence[Engine], *, policy: str = "fusion", handlers=None,
                             inputs=None, constants=None, capacity: int | Sequence[int] = 4,
                             streams: Sequence[Stream] | None = None) -> EnginePool:
    """``compile_graph`` for each of ``engines`` at once, and an ``EnginePool`` over the runners.
    Each engine gets a new in-order stream unless ``streams`` gives one per engine; ``capacity``
    as ``EnginePool``'s. The other arguments are ``compile_graph``'s, for every engine."""
    engines = list(engines)
    if not engines or not all(isinstance(e, Engine) for e in engines):
        raise InvalidArgumentError(f"engines is {engines!r}; expected a non-empty list of engines")
    if len({id(e) for e in engines}) != len(engines):  # EnginePool checks too, after the compiles
        raise InvalidArgumentError("an engine appears twice in engines; a pool has one runner per engine")
    streams = None if streams is None else list(streams)
    if streams is not None and len(streams) != len(engines):
        raise InvalidArgumentError(f"{len(streams)} streams for {len(engines)} engines")
    runners: list[Any] = [None] * len(engines)

    async def compile_one(i: int) -> None:
        runners[i] = await _compile_graph(graph, engines[i], policy=policy, handlers=handlers, inputs=inputs,
                                          constants=constants)

    async with trio.open_nursery() as nursery:
        for i in range(len(engines)):
            nursery.start_soon(compile_one, i)
    if streams is None:
        streams = [await engine.stream() for engine in engines]
    return EnginePool(runners, streams, capacity=capacity)
