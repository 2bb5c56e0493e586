"""Graphs with unknown input dims: compiled for each new set of input shapes at its first run.

``compile_graph`` returns a ``DynamicGraphRunner`` when a graph input has an unknown dim (``-1``
or no shape) and ``inputs=`` does not settle it. Its ``run`` and ``map`` read the shapes of the
arrays, ``Tensor``s or ``Memory`` they are given, compile the graph for those shapes the first
time they are seen (``compile_graph`` with ``inputs=``: its partitions go through the
compiled-partition cache, so shapes that share partitions share their compilation) and run that
runner; later runs of the same shapes find it at once. Concurrent first runs of one set of
shapes share one compilation. ``statistics()`` adds up every shape's runner and says how many
shapes were compiled (``compiled_shapes``).
"""

from __future__ import annotations

import collections.abc
from typing import Any

import attrs
import numpy as np
import trio

from .._engine import Engine
from .._memory import Memory
from .._stream import Stream, check_deps
from .._values._errors import InvalidArgumentError, MissingArgumentError
from ._execution import GraphRunner, GraphRunnerStatistics, check_stream
from ._graph import Graph
from ._logical_tensor import LogicalTensor
from ._pipeline import Pipeline
from ._tensor import Tensor

__all__ = ["DynamicGraphRunner"]


def _shape_of(value) -> tuple[int, ...]:
    if isinstance(value, Tensor):
        return tuple(value.memory.desc.dims)
    if isinstance(value, Memory):
        return tuple(value.desc.dims)
    return tuple(np.shape(value))

# run/map's choice of outputs kept on the device: all (True), none (False) or these ids.
_AsTensors = bool | collections.abc.Iterable[int]


class DynamicGraphRunner:
    """A graph compiled per set of input shapes, on first use (see the module docstring)."""

    def __init__(self, graph: Graph, engine: Engine, policy: str, handlers, inputs: tuple[LogicalTensor, ...],
                 compile_for) -> None:
        self.graph = graph
        self.engine = engine
        self.policy = policy
        self.inputs = inputs
        self.outputs = tuple(graph.output_tensors())
        self._handlers = handlers
        self._compile_for = compile_for  # async (shaped input logical tensors) -> GraphRunner
        self._runners: dict[tuple, GraphRunner] = {}
        self._compiling: dict[tuple, trio.Event] = {}
        self._failures: dict[tuple, BaseException] = {}
        self._constants: dict[int, Any] = {}

    @property
    def runners(self) -> dict[tuple, GraphRunner]:
        """The runner of each set of input shapes compiled so far, keyed by the shapes in
        ``inputs`` order."""
        return dict(self._runners)

    def statistics(self) -> GraphRunnerStatistics:
        fields = [f.name for f in attrs.fields(GraphRunnerStatistics) if f.name != "compiled_shapes"]
        totals = dict.fromkeys(fields, 0)
        for runner in self._runners.values():
            stats = runner.statistics()
            for name in fields:
                totals[name] += getattr(stats, name)
        return GraphRunnerStatistics(**totals, compiled_shapes=len(self._runners))

    def release_request_buffers(self) -> None:
        """``GraphRunner.release_request_buffers`` of every shape compiled so far."""
        for runner in self._runners.values():
            runner.release_request_buffers()

    async def set_constants(self, constants) -> None:
        """``GraphRunner.set_constants`` for every shape compiled so far and every later one
        (arrays are copied now, so the caller may reuse them)."""
        if not isinstance(constants, collections.abc.Mapping):
            raise InvalidArgumentError(
                f"constants is {type(constants).__name__}; expected a dict of graph input id -> array, "
                "Tensor or Memory"
            )
        for runner in self._runners.values():
            await runner.set_constants(constants)
        for lt_id, value in constants.items():
            if value is None:
                self._constants.pop(lt_id, None)
            else:
                self._constants[lt_id] = value if isinstance(value, (Tensor, Memory)) else np.array(value)

    async def run(self, stream: Stream, inputs, *, deps=(), outputs=None, as_tensors: _AsTensors = False) -> dict:
        """``GraphRunner.run`` on the runner of these inputs' shapes (compiled first if new)."""
        runner = await self.runner_for(inputs)
        return await runner.run(stream, inputs, deps=deps, outputs=outputs, as_tensors=as_tensors)

    def map(self, inputs, *, stream: Stream, max_in_flight: int = 4, deps=(), as_tensors: _AsTensors = False) -> Pipeline:
        """``GraphRunner.map``; each request runs on the runner of its inputs' shapes."""
        check_stream(stream, self.engine)
        deps = list(check_deps(deps))
        return Pipeline(inputs, lambda item: self.make_request(stream, item, deps, as_tensors), max_in_flight)

    def make_request(self, stream, item, deps, as_tensors) -> _Request:
        """One ``map`` request (also an engine pool's), run on its shapes' runner."""
        return _Request(self, stream, item, list(deps), as_tensors)

    def _key(self, inputs) -> tuple:
        if not isinstance(inputs, collections.abc.Mapping):
            raise InvalidArgumentError(
                f"inputs is {type(inputs).__name__}; expected a dict of graph input id -> array, "
                "Tensor or Memory"
            )
        shapes = []
        for lt in self.inputs:
            if lt.id in inputs:
                shapes.append(_shape_of(inputs[lt.id]))
            elif lt.id in self._constants:
                shapes.append(_shape_of(self._constants[lt.id]))
            else:
                raise MissingArgumentError(
                    f"inputs lack graph input id {lt.id} (inputs are {[x.id for x in self.inputs]})"
                )
        return tuple(shapes)

    async def runner_for(self, inputs) -> GraphRunner:
        """The runner of ``inputs``' shapes, compiled now if new (tasks asking for the same new
        shapes at once share one compile, and its failure)."""
        key = self._key(inputs)
        runner = self._runners.get(key)
        if runner is not None:
            return runner
        pending = self._compiling.get(key)
        if pending is not None:  # another task compiles these shapes: share its result
            await pending.wait()
            if key in self._runners:
                return self._runners[key]
            raise self._failures[key]
        done = self._compiling[key] = trio.Event()
        try:
            shaped = [lt.evolve(shape=list(shape)) if not lt.is_shape_known else lt
                      for lt, shape in zip(self.inputs, key)]
            runner = await self._compile_for(shaped)
            if self._constants:
                await runner.set_constants(self._constants)
            self._runners[key] = runner
            self._failures.pop(key, None)
            return runner
        except BaseException as exc:
            self._failures[key] = exc
            raise
        finally:
            del self._compiling[key]
            done.set()


class _Request:
    """One ``map`` request of a dynamic runner: its arrays copied when it starts (the iterable
    may reuse them), its runner found or compiled when it runs."""

    def __init__(self, runner: DynamicGraphRunner, stream: Stream, item, deps: list, as_tensors: _AsTensors) -> None:
        if isinstance(item, collections.abc.Mapping):
            item = {k: v if isinstance(v, (Tensor, Memory)) else np.array(v) for k, v in item.items()}
        self._runner, self._stream, self._item = runner, stream, item
        self._deps, self._as_tensors = deps, as_tensors

    async def run(self) -> dict:
        runner = await self._runner.runner_for(self._item)
        return await runner.run(self._stream, self._item, deps=self._deps, as_tensors=self._as_tensors)
