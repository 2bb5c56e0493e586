"""Ops that are not computations: Wildcard (an op of the user's, opaque to the graph), End (marks
a tensor as an output) and oneDNN ops triodnn recognises but does not run.

A graph holding one still loads and partitions: the op lands in an unsupported partition (oneDNN's
behaviour for ops a backend lacks), instead of failing as an unknown kind."""

from __future__ import annotations

from .._op_registry import GraphOp, register
from .._op_schema import UNBOUNDED, OpSchema

# oneDNN op kinds triodnn recognises and does not run (none now: BiasAddBackward, the last,
# runs); each would load into an unsupported partition.
RECOGNISED_NOT_RUN: tuple[str, ...] = ()


register(
    GraphOp(OpSchema("Wildcard", (0, UNBOUNDED), (0, UNBOUNDED), {}, "special", None, ("src",), any_attrs=True),
            not_run="a Wildcard op's semantics are the user's"),
    GraphOp(OpSchema("End", (1, 1), (0, 0), {}, "special", None, ("src",), ()),
            shapes=lambda kind, a, shapes, n: [], reference=lambda kind, a, inputs, n: []),
    *(GraphOp(OpSchema(kind, (0, UNBOUNDED), (0, UNBOUNDED), {}, "unsupported", None, ("src",), any_attrs=True))
      for kind in RECOGNISED_NOT_RUN),
)
