"""Dynamic batching: concurrent requests to one graph gathered into one run along dim 0.

A ``GraphRunner`` compiled for one request (say an MLP of 32 rows) serves each ``run`` with a
full round of host work: uploads, submissions, reads, wake-ups. On a CPU device that host work
is most of a small request (bench_pipeline on PoCL: 200-291 µs a request through ``map`` against
58 µs of numpy). ``DynamicBatcher`` gathers the requests that are waiting when the device has
room, concatenates their inputs along dim 0, runs the graph once for all of them and hands each
caller its own rows, as NVIDIA Triton's dynamic batcher does. Batching changes no result: it
requires, and checks where shapes can tell, that every output row depends on the same input row
only (see ``DynamicBatcher``).

Batches are padded to a few sizes (powers of two up to ``max_batch`` requests), each compiled
once when the batcher opens: a new row count is a new compilation (0.2-3 s on PoCL per
partition), which must never land on a request.
"""

from __future__ import annotations

import collections.abc
import math
from typing import Any

import attrs
import numpy as np
import trio

from .._stream import Stream
from .._values._errors import (
    ArgumentMismatchError,
    ClosedError,
    InvalidArgumentError,
    MissingArgumentError,
    UnsupportedError,
)
from ._compile_graph import compile_graph
from ._engine_pool import EnginePool
from ._execution import GraphRunner, check_stream

__all__ = ["BatcherStatistics", "DynamicBatcher"]

# Graph dtypes a float array may not be given for: the run would refuse it (the input policy),
# failing every request of its batch; a request is refused alone instead.
_INTEGER_DTYPES = frozenset({"s8", "u8", "s32", "s64", "s4", "u4", "boolean"})


@attrs.frozen
class BatcherStatistics:
    """Requests served (``requests``: answered with rows or an error), the graph runs that
    served them (``batches``), request slots of padding those runs computed for nobody
    (``padded``), the most requests one run served, requests that failed and requests whose
    caller stopped waiting, and the batch sizes compiled (requests per run)."""

    requests: int
    batches: int
    padded: int
    largest_batch: int
    failed: int
    cancelled: int
    batch_sizes: tuple[int, ...]


class _Request:
    __slots__ = ("inputs", "done", "result", "error", "abandoned")

    def __init__(self, inputs: dict) -> None:
        self.inputs = inputs
        self.done = trio.Event()
        self.result: dict | None = None
        self.error: BaseException | None = None
        self.abandoned = False  # its caller was cancelled: nobody reads its rows


def _shape(lt) -> tuple[int, ...]:
    """The shape of a compiled runner's input or output (compiling settled every one)."""
    assert lt.shape is not None, "a GraphRunner's inputs and outputs have known shapes"
    return tuple(lt.shape)


def _batch_sizes(max_batch: int) -> tuple[int, ...]:
    sizes = [1]
    while sizes[-1] * 2 < max_batch:
        sizes.append(sizes[-1] * 2)
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return tuple(sizes)


class DynamicBatcher:
    """Serve concurrent ``await batcher.run(inputs)`` calls with few graph runs::

        runner = await compile_graph(graph, engine)          # shaped for one request
        async with DynamicBatcher(runner, stream, max_batch=8) as batcher:
            outputs = await batcher.run({0: x})              # from any number of tasks

    Each request gives every graph input the runner has no constant for (``set_constants``,
    ``constants=``), with exactly the shapes the runner was compiled for; it gets back
    ``{output id: array}`` of the runner's output shapes. While a batch runs (at most
    ``max_in_flight`` at once), later requests queue; when a run slot frees, every queued
    request, up to ``max_batch``, goes into the next run (with ``max_delay`` seconds, a run
    that is not full first waits that long for more; the default 0 adds no latency to a
    request that finds the device idle). A batch of ``k`` requests runs the graph compiled for
    ``n`` requests' rows, ``n`` the smallest batch size >= ``k`` (powers of two up to
    ``max_batch``), the ``n - k`` missing requests' rows zero.

    Batching assumes what every dynamic batcher assumes: the graph treats dim 0 as independent
    rows (a MatMul's M, an element-wise op, a softmax or norm over the last axis). Opening the
    batcher compiles every batch size and refuses a graph whose inputs or outputs do not scale
    along dim 0 (a reduction over it, a reshape that moves it: ``UnsupportedError`` naming the
    tensor); an op that mixes rows without changing shapes (a softmax or a BatchNorm over dim
    0) cannot be seen from shapes, and such a graph must not be batched.

    An ``EnginePool`` (``compile_graph_pool``) may stand for the runner, with no stream: every
    batch size is compiled on each of its engines, and each batch runs on the engine with the
    most room (``EnginePool.run``), at most the engines' capacities in all at once by default.
    Batching divides the host's work per request (bench_pipeline on an H200: 34.9 µs a request
    in batches of 8, 105 µs one at a time), and that work is what binds a pool fed from one
    process (BENCHMARKS.md §17); a batching pool's own figures are not measured yet.

    Errors stay per request where they can: a request with missing ids, other shapes or
    unconvertible data raises at its own ``run`` call, before it is queued. A run that fails
    fails the requests it served, each with its own exception of the same type. A caller that
    is cancelled stops waiting; a request cancelled before its batch formed is left out of it,
    and nobody else notices either way. Leaving the ``async with`` block serves what is queued,
    then closes; ``run`` afterwards raises ``ClosedError``.
    """

    def __init__(self, runner: GraphRunner | EnginePool, stream: Stream | None = None, *, max_batch: int = 8,
                 max_delay: float = 0.0, max_in_flight: int | None = None) -> None:
        pool = runner if isinstance(runner, EnginePool) else None
        if pool is not None:
            if stream is not None:
                raise InvalidArgumentError("an EnginePool brings a stream per engine; give no stream")
            runner = pool.runners[0]
            if not all(isinstance(r, GraphRunner) for r in pool.runners):
                raise InvalidArgumentError("every runner of the pool must be a GraphRunner compiled for one request")
        if not isinstance(runner, GraphRunner):
            raise InvalidArgumentError(
                f"runner is {type(runner).__name__}; expected a GraphRunner compiled for one request's "
                "shapes (for a graph with unknown dims: compile_graph(graph, engine, inputs=...)) or an "
                "EnginePool of them"
            )
        if pool is None:
            check_stream(stream, runner.engine)
        if max_in_flight is None:
            # Two runs in flight keep one device busy; a pool, each engine's capacity.
            max_in_flight = 2 if pool is None else sum(e.capacity for e in pool.statistics().engines)
        for name, value in (("max_batch", max_batch), ("max_in_flight", max_in_flight)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(max_delay, bool) or not isinstance(max_delay, (int, float)) or not 0 <= max_delay < math.inf:
            raise InvalidArgumentError(f"max_delay must be a number of seconds >= 0, got {max_delay!r}")
        self.runner = runner
        self.stream = stream
        self.pool = pool
        # A pool's runners by batch size: the pool of the engines' runners compiled for n requests.
        self._pools: dict[int, EnginePool] = {} if pool is None else {1: pool}
        self.max_batch = max_batch
        self.max_delay = float(max_delay)
        self.max_in_flight = max_in_flight
        self.batch_sizes = _batch_sizes(max_batch)
        constants = runner.constants
        self._request_inputs = tuple(lt for lt in runner.inputs if lt.id not in constants)
        self._runners: dict[int, GraphRunner] = {1: runner}
        self._counts = dict.fromkeys(("requests", "batches", "padded", "largest_batch", "failed", "cancelled"), 0)
        self._send, self._receive = trio.open_memory_channel(math.inf)
        self._nursery_manager: Any = None
        self._entered = False
        self._closed = False

    def statistics(self) -> BatcherStatistics:
        return BatcherStatistics(**self._counts, batch_sizes=tuple(sorted(self._runners)))

    # -- opening and closing -------------------------------------------------------------------

    async def __aenter__(self) -> DynamicBatcher:
        if self._entered:
            raise InvalidArgumentError("this DynamicBatcher was entered already; make a new one")
        self._entered = True
        await self._compile_batch_sizes()
        self._nursery_manager = trio.open_nursery()
        nursery = await self._nursery_manager.__aenter__()
        nursery.start_soon(self._serve, nursery)
        return self

    async def __aexit__(self, *exc_info) -> bool | None:
        self._closed = True
        self._send.close()  # the server serves what is queued, then its loop ends
        return await self._nursery_manager.__aexit__(*exc_info)

    async def _compile_batch_sizes(self) -> None:
        """Every batch size's runner, compiled concurrently, each checked to scale along dim 0."""
        runner = self.runner
        base_inputs = {lt.id: lt for lt in runner.inputs}
        for lt in self._request_inputs:
            if lt.ndims < 1 or _shape(lt)[0] < 1:
                raise UnsupportedError(
                    f"graph input {lt.id} has shape {lt.shape}: batching concatenates requests along "
                    "dim 0, which needs every request input to have one"
                )

        async def compile_size(n: int) -> None:
            shaped = dict(base_inputs)
            for lt in self._request_inputs:
                rows, *rest = _shape(lt)
                shaped[lt.id] = lt.evolve(shape=[rows * n, *rest])
            pool = self.pool
            compiled = []
            for one_runner in (pool.runners if pool is not None else (runner,)):
                compiled.append(await compile_graph(one_runner.graph, one_runner.engine, policy=one_runner.policy,
                                                    handlers=one_runner.handlers, inputs=list(shaped.values()),
                                                    constants=one_runner.constants or None))
            batched = compiled[0]
            if pool is not None:
                capacities = [e.capacity for e in pool.statistics().engines]
                self._pools[n] = EnginePool(compiled, pool.streams, capacity=capacities)
            for one, many in zip(runner.outputs, batched.outputs):
                if one.ndims < 1 or _shape(many) != (_shape(one)[0] * n, *_shape(one)[1:]):
                    raise UnsupportedError(
                        f"graph output {one.id} has shape {one.shape} for one request and {many.shape} for "
                        f"{n}: its dim 0 does not follow the requests' rows (a reduction over dim 0, a "
                        "reshape that moves it, or a host step, whose outputs keep the shapes the graph "
                        "declares), so requests cannot be batched"
                    )
            self._runners[n] = batched

        failures: list[Exception] = []

        async def guarded(n: int, nursery: trio.Nursery) -> None:
            try:
                await compile_size(n)
            except Exception as exc:  # the first failure, as itself: not a group of every size's
                failures.append(exc)
                nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            for n in self.batch_sizes[1:]:
                nursery.start_soon(guarded, n, nursery)
        if failures:
            raise failures[0]

    # -- requests ------------------------------------------------------------------------------

    async def run(self, inputs) -> dict:
        """This request's outputs, ``{output id: array}``, once the batch it joined has run."""
        if self._closed or not self._entered:
            raise ClosedError("the DynamicBatcher is not open: use it inside its async with block")
        request = _Request(self._checked(inputs))
        self._send.send_nowait(request)
        try:
            await request.done.wait()
        except trio.Cancelled:
            if not request.done.is_set():
                request.abandoned = True
                self._counts["cancelled"] += 1
            raise
        if request.error is not None:
            error = request.error
            raise type(error)(str(error)) from error  # a fresh exception for each caller
        assert request.result is not None, "a request is done with a result or an error"
        return request.result

    def _checked(self, inputs) -> dict:
        """``inputs`` as contiguous arrays of the runner's shapes and dtypes, or a typed error
        naming the culprit (raised to this request's caller alone)."""
        if not isinstance(inputs, collections.abc.Mapping):
            raise InvalidArgumentError(
                f"inputs is {type(inputs).__name__}; expected a dict of graph input id -> array"
            )
        expected = {lt.id for lt in self._request_inputs}
        extra = sorted(set(inputs) - expected, key=repr)
        if extra:
            raise InvalidArgumentError(
                f"inputs has ids {extra} that are not batched graph inputs (those are {sorted(expected)}; "
                "constants are the runner's)"
            )
        checked = {}
        for lt in self._request_inputs:
            if lt.id not in inputs:
                raise MissingArgumentError(f"inputs lack graph input id {lt.id} (a request gives {sorted(expected)})")
            array = np.asarray(inputs[lt.id])
            if tuple(array.shape) != _shape(lt):
                raise ArgumentMismatchError(
                    f"input {lt.id} has shape {tuple(array.shape)}; every request of this batcher gives "
                    f"{_shape(lt)}"
                )
            if array.dtype.kind in "OUSVcmM" or (array.dtype.kind == "f" and lt.dtype in _INTEGER_DTYPES):
                raise ArgumentMismatchError(f"input {lt.id} is a {array.dtype} array; the graph takes {lt.dtype}")
            checked[lt.id] = array
        return checked

    # -- serving -------------------------------------------------------------------------------

    async def _serve(self, nursery: trio.Nursery) -> None:
        slots = trio.Semaphore(self.max_in_flight)
        receive = self._receive
        async for first in receive:
            await slots.acquire()  # requests keep queueing while every run slot is busy
            batch = [first] if not first.abandoned else []
            ended = self._drain(batch)
            if self.max_delay and not ended and len(batch) < self.max_batch:
                with trio.move_on_after(self.max_delay):
                    while len(batch) < self.max_batch:
                        try:
                            request = await receive.receive()
                        except trio.EndOfChannel:
                            break
                        if not request.abandoned:
                            batch.append(request)
            if not batch:
                slots.release()
                continue
            nursery.start_soon(self._execute, batch, slots)

    def _drain(self, batch: list) -> bool:
        """Move queued requests into ``batch`` up to ``max_batch``; whether the channel ended."""
        while len(batch) < self.max_batch:
            try:
                request = self._receive.receive_nowait()
            except trio.WouldBlock:
                return False
            except trio.EndOfChannel:
                return True
            if not request.abandoned:
                batch.append(request)
        return False

    async def _execute(self, batch: list[_Request], slots: trio.Semaphore) -> None:
        k = len(batch)
        n = next(size for size in self.batch_sizes if size >= k)
        runner = self._runners[n]
        try:
            arrays = {}
            for lt in self._request_inputs:
                parts = [request.inputs[lt.id] for request in batch]
                if n > k:
                    rows, *rest = _shape(lt)
                    parts.append(np.zeros(((n - k) * rows, *rest), parts[0].dtype))
                arrays[lt.id] = np.concatenate(parts) if n > 1 else parts[0]
            if self.pool is not None:
                outputs = await self._pools[n].run(arrays)  # on the engine with the most room
            else:
                assert self.stream is not None, "a batcher without a pool has a stream"
                outputs = await runner.run(self.stream, arrays)
            for i, request in enumerate(batch):
                request.result = {}
                for one in self.runner.outputs:
                    rows = _shape(one)[0]
                    request.result[one.id] = outputs[one.id][i * rows:(i + 1) * rows]
        except Exception as exc:
            for request in batch:
                request.error = exc
            self._counts["failed"] += k
        finally:
            counts = self._counts
            counts["requests"] += k
            counts["batches"] += 1
            counts["padded"] += n - k
            counts["largest_batch"] = max(counts["largest_batch"], k)
            for request in batch:
                request.done.set()
            slots.release()
