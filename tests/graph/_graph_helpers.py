"""Small graphs built in tests: strided logical tensors, a finalized graph of some ops, and one
run of it through a runner on an in-order stream."""

from __future__ import annotations

import numpy as np

from triodnn import StreamFlags
from triodnn.graph import Graph, LogicalTensor, Op, compile_graph
from triodnn.graph._compiled_partition import compile_partition


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


# -- int8 fusion tests (matmul and convolution) --------------------------------------------------


def deq(op_id, src, dst, shape, dtype, scales, zps, axis=None):
    """A Dequantize of tensor ``src`` (``dtype``) into f32 ``dst``, per channel along ``axis``."""
    attrs = {"scales": list(scales), "zps": list(zps)}
    if axis is not None:
        attrs.update(qtype="per_channel", axis=axis)
    return Op(op_id, "Dequantize", [lt(src, shape, dtype)], [lt(dst, shape)], attrs)


def int8_inputs(rng, graph):
    """Full-range s8/u8 inputs, f32 ones in [-2, 2)."""
    arrays = {}
    for t in graph.input_tensors():
        if t.dtype == "s8":
            arrays[t.id] = rng.integers(-128, 128, t.shape).astype(np.int8)
        elif t.dtype == "u8":
            arrays[t.id] = rng.integers(0, 256, t.shape).astype(np.uint8)
        else:
            arrays[t.id] = rng.uniform(-2, 2, t.shape).astype(np.float32)
    return arrays


async def primitive_kinds(engine, graph, fuse=True):
    """The primitive kinds the graph's one partition compiles to."""
    (p,) = graph.get_partitions()
    ins, outs = list(p.input_ports), list(p.output_ports)
    compiled = await compile_partition(p, engine, ins, outs, p._infer(ins, outs, declared=True), fuse=fuse)
    return [prim.desc.kind for prim in compiled.primitives]
