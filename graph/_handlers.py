"""Handlers: Python implementations of the partitions triodnn does not run.

``compile_graph(graph, engine, handlers={...})`` binds every unsupported partition (Wildcard ops,
kinds triodnn does not lower) to a ``Handler``: a function taking the partition's input arrays
and returning its output arrays. This module finds the handler of a partition, checks the
``handlers`` mapping, calls a handler and checks what it returns; the execution runs it as one
step of the DAG.
"""

from __future__ import annotations

import collections.abc
import inspect
from collections.abc import Callable

import attrs
import numpy as np
import trio

from .._values._errors import ArgumentMismatchError, InvalidArgumentError, UnsupportedError
from ._logical_tensor import LogicalTensor, known_shape
from ._partition import Partition

__all__ = ["Handler", "MissingHandlerError", "check_results", "find_handler", "normalise_handlers"]


class MissingHandlerError(UnsupportedError):
    """A graph has an unsupported partition and ``handlers`` has nothing to run it with."""


@attrs.frozen
class Handler:
    """How an unsupported partition runs: ``fn(*input_arrays)`` returns its output array(s).

    ``fn`` gets one numpy array per input of the partition's op (``op.inputs`` order, a tensor
    read twice given twice; ``partition.input_ports`` for a partition of several ops) and
    returns one array, or a sequence with one per output (``partition.output_ports``), each of
    its output's shape (values are converted to its data type). With ``with_partition``, ``fn(partition, *arrays)``: the op's
    attributes are in ``partition.ops``. A coroutine function is awaited on the trio thread;
    other functions run in a worker thread (``trio.to_thread``) unless ``thread`` is False,
    for the cheap ones. A plain callable in ``handlers`` means ``Handler(fn)``.
    """

    fn: Callable = attrs.field()
    thread: bool = True
    with_partition: bool = False

    @fn.validator
    def _check_fn(self, attribute, value) -> None:
        if not callable(value):
            raise InvalidArgumentError(f"handler {value!r} is not callable")

    async def __call__(self, partition: Partition, arrays: list[np.ndarray]):
        args = (partition, *arrays) if self.with_partition else tuple(arrays)
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(*args)
        if self.thread:
            # Not abandoned on cancellation: a cancelled run waits for the thread, so nothing
            # it touches outlives the run.
            result = await trio.to_thread.run_sync(self.fn, *args)
        else:
            result = self.fn(*args)
        if inspect.isawaitable(result):
            result = await result
        return result


def _ops_key(partition: Partition) -> tuple:
    # Partitions from separate get_partitions() calls are distinct objects: match by their ops.
    return ("ops", frozenset(op.id for op in partition.ops))


def find_handler(partition: Partition, handlers: dict) -> Handler | None:
    """The handler for ``partition``: keyed by a Partition with its ops, its id, or the
    '+'-joined kinds of its ops (its op kind: unsupported partitions hold one op); the first
    of those present wins."""
    for key in (_ops_key(partition), partition.id, "+".join(partition.op_kinds)):
        found = handlers.get(key)
        if found is not None:
            return found
    return None


def normalise_handlers(handlers, partitions: list[Partition]) -> dict:
    """``handlers`` checked against the graph's ``partitions``, every value a ``Handler``, and
    Partition keys turned into keys of their ops (what ``find_handler`` looks up)."""
    if handlers is None:
        return {}
    if not isinstance(handlers, collections.abc.Mapping):
        raise InvalidArgumentError(
            f"handlers is {type(handlers).__name__}; expected a dict keyed by op kind, partition id "
            "or Partition"
        )
    ids = {p.id for p in partitions}
    op_sets = {_ops_key(p) for p in partitions}
    out = {}
    for key, value in handlers.items():
        if isinstance(key, bool) or not isinstance(key, (str, int, Partition)):
            raise InvalidArgumentError(
                f"handlers key {key!r} is a {type(key).__name__}; keys are op kinds (str), "
                "partition ids (int) or Partitions"
            )
        if isinstance(key, int) and key not in ids:
            raise InvalidArgumentError(
                f"handlers key {key} is no partition id of this graph (ids {sorted(ids)})"
            )
        if isinstance(key, Partition):
            key = _ops_key(key)
            if key not in op_sets:
                raise InvalidArgumentError(
                    f"handlers key {key[1]!r} (op ids): no partition of this graph under this "
                    "policy has exactly those ops"
                )
        out[key] = value if isinstance(value, Handler) else Handler(value)
    return out


def check_results(what: str, outputs: tuple[LogicalTensor, ...], results) -> list[np.ndarray]:
    """The return value of the handler of ``what`` (a partition, described) as one array per
    output port, of the port's shape and storage layout (a fresh copy: the stream reads it when
    the write runs)."""
    n = len(outputs)
    if isinstance(results, (list, tuple)):
        results = list(results)
    elif n == 1:
        results = [results]
    else:
        raise ArgumentMismatchError(
            f"the handler of {what} returned {type(results).__name__}; it has {n} "
            "outputs, so it must return a sequence of that many arrays"
        )
    if len(results) != n:
        raise ArgumentMismatchError(
            f"the handler of {what} returned {len(results)} arrays for {n} outputs "
            f"{[lt.id for lt in outputs]}"
        )
    arrays = []
    for lt, result in zip(outputs, results):
        array = np.array(result, copy=True)
        shape = known_shape(lt)  # a handler's outputs have declared shapes (compile_graph)
        if array.shape != shape:
            raise ArgumentMismatchError(
                f"the handler of {what} returned shape {array.shape} for output "
                f"{lt.id}, which is {shape}"
            )
        arrays.append(array.reshape(lt.memory_desc().dims))
    return arrays
