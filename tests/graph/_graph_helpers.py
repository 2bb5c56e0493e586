"""Small graphs built in tests: strided logical tensors, a finalized graph of some ops, and one
run of it through a runner on an in-order stream."""

from __future__ import annotations

from triodnn import StreamFlags
from triodnn.graph import Graph, LogicalTensor, compile_graph


def lt(i, shape, dtype="f32", strides=None):
    return LogicalTensor(i, dtype, shape, strides, layout_type="strided")


def graph_of(*ops):
    graph = Graph("cpu")
    for op in ops:
        graph.add_op(op)
    graph.finalize()
    return graph


async def run(engine, graph, arrays):
    runner = await compile_graph(graph, engine)
    stream = await engine.stream(StreamFlags.in_order)
    return await runner.run(stream, arrays)
