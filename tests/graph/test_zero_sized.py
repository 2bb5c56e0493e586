"""Zero-sized tensors: graphs whose shapes have a 0 dim compile and run, launch no kernel on
empty work (OpenCL refuses a global size of 0) and allocate no 0-byte buffer; ops that make
elements out of nothing give oneDNN's values (MatMul over K = 0: zeros plus bias; a reduction
over an empty axis: its identity; Concat: the other inputs)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from triodnn import StreamFlags, UnsupportedError
from triodnn.graph import Graph, LogicalTensor, Op, Tensor, compile_graph


def lt(i, shape, dtype="f32"):
    return LogicalTensor(i, dtype, shape, layout_type="strided")


def graph_of(*ops):
    graph = Graph("cpu")
    for op in ops:
        graph.add_op(op)
    graph.finalize()
    return graph


async def run(engine, graph, arrays, policy="fusion"):
    runner = await compile_graph(graph, engine, policy=policy)
    stream = await engine.stream(StreamFlags.in_order)
    return runner, await runner.run(stream, arrays)


def empty(*shape):
    return np.zeros(shape, np.float32)


@pytest.mark.parametrize("policy", ["fusion", "debug"])
async def test_empty_work_gives_empty_outputs_and_launches_nothing(engine, policy):
    graph = graph_of(
        Op(0, "MatMul", [lt(0, (0, 5)), lt(1, (5, 4))], [lt(2, (0, 4))]),
        Op(1, "Add", [lt(2, (0, 4)), lt(3, (1, 4))], [lt(4, (0, 4))]),
        Op(2, "ReLU", [lt(4, (0, 4))], [lt(5, (0, 4))]),
        Op(3, "SoftMax", [lt(5, (0, 4))], [lt(6, (0, 4))], {"axis": 1}),
        Op(4, "TypeCast", [lt(6, (0, 4))], [lt(7, (0, 4), "f16")]),
    )
    runner, out = await run(engine, graph, {0: empty(0, 5), 1: np.ones((5, 4), np.float32),
                                            3: np.ones((1, 4), np.float32)}, policy)
    assert out[7].shape == (0, 4) and out[7].dtype == np.float16
    assert all(not step.compiled.primitives for step in runner._steps)


async def test_reorder_of_an_empty_tensor(engine):
    strided = LogicalTensor(1, "f32", (0, 16), (1, 1), layout_type="strided")
    graph = graph_of(Op(0, "Reorder", [lt(0, (0, 16))], [strided]))
    _, out = await run(engine, graph, {0: empty(0, 16)})
    assert out[1].shape == (0, 16)


async def test_matmul_over_k_zero_gives_zeros_plus_bias(engine):
    bias = np.arange(4, dtype=np.float32)
    graph = graph_of(
        Op(0, "MatMul", [lt(0, (3, 0)), lt(1, (0, 4)), lt(2, (4,))], [lt(3, (3, 4))]),
        Op(1, "Abs", [lt(3, (3, 4))], [lt(4, (3, 4))]),
    )
    _, out = await run(engine, graph, {0: empty(3, 0), 1: empty(0, 4), 2: -bias})
    np.testing.assert_array_equal(out[4], np.broadcast_to(bias, (3, 4)))
    plain = graph_of(Op(0, "MatMul", [lt(0, (2, 0)), lt(1, (0, 3))], [lt(2, (2, 3))]))
    _, out = await run(engine, plain, {0: empty(2, 0), 1: empty(0, 3)})
    np.testing.assert_array_equal(out[2], np.zeros((2, 3)))


@pytest.mark.parametrize(("kind", "want"), [("ReduceSum", 0.0), ("ReduceProd", 1.0), ("ReduceMax", -math.inf),
                                            ("ReduceMin", math.inf), ("ReduceL2", 0.0), ("ReduceMean", math.nan)])
async def test_a_reduction_over_an_empty_axis_gives_its_identity(engine, kind, want):
    graph = graph_of(Op(0, kind, [lt(0, (2, 0, 3))], [lt(1, (2, 1, 3))], {"axes": [1], "keep_dims": True}))
    _, out = await run(engine, graph, {0: empty(2, 0, 3)})
    np.testing.assert_array_equal(out[1], np.full((2, 1, 3), want, np.float32))


async def test_concat_skips_its_empty_inputs(engine):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = -np.arange(4, dtype=np.float32).reshape(2, 2)
    graph = graph_of(Op(0, "Concat", [lt(0, (2, 0)), lt(1, (2, 3)), lt(2, (2, 0)), lt(3, (2, 2))],
                        [lt(4, (2, 5))], {"axis": 1}))
    _, out = await run(engine, graph, {0: empty(2, 0), 1: a, 2: empty(2, 0), 3: b})
    np.testing.assert_array_equal(out[4], np.concatenate([a, b], axis=1))
    one = graph_of(Op(0, "Concat", [lt(0, (0, 3)), lt(1, (2, 3))], [lt(2, (2, 3))], {"axis": 0}))
    _, out = await run(engine, one, {0: empty(0, 3), 1: a})
    np.testing.assert_array_equal(out[2], a)


async def test_empty_tensors_hold_a_placeholder_buffer_not_zero_bytes(engine):
    t = lt(0, (0, 16))
    assert t.nbytes == 0 and t.is_empty
    assert t.memory_desc().dims == (1, 1)
    tensor = await Tensor.from_numpy(t, engine, empty(0, 16))
    assert tensor.memory.cl_buffer.size >= 4
    assert (await tensor.to_numpy()).shape == (0, 16)


async def test_compiled_partition_takes_empty_tensors(engine):
    graph = graph_of(Op(0, "Abs", [lt(0, (4, 0))], [lt(1, (4, 0))]))
    (partition,) = graph.get_partitions()
    compiled = await partition.compile(engine)
    stream = await engine.stream(StreamFlags.in_order)
    src = await Tensor.from_numpy(compiled.inputs[0], engine, empty(4, 0))
    dst = Tensor(compiled.outputs[0], engine)
    await compiled.execute(stream, [src], [dst])
    assert compiled.primitives == []
    assert (await dst.to_numpy()).shape == (4, 0)


async def test_an_op_making_elements_from_empty_inputs_otherwise_is_unsupported(engine):
    graph = graph_of(Op(0, "Add", [lt(0, (1, 4)), lt(1, (0, 4))], [lt(2, (0, 4))]),
                     Op(1, "ReduceSum", [lt(2, (0, 4))], [lt(3, (1, 4))], {"axes": [0], "keep_dims": True}),
                     Op(2, "SoftMax", [lt(3, (1, 4))], [lt(4, (1, 4))], {"axis": 1}))
    _, out = await run(engine, graph, {0: np.ones((1, 4), np.float32), 1: empty(0, 4)})
    np.testing.assert_array_equal(out[4], np.full((1, 4), 0.25, np.float32))
    conv = graph_of(Op(0, "Convolution", [lt(0, (1, 0, 3, 3)), lt(1, (2, 0, 1, 1))], [lt(2, (1, 2, 3, 3))],
                       {"strides": [1, 1], "pads_begin": [0, 0], "pads_end": [0, 0], "dilations": [1, 1],
                        "data_format": "NCX", "weights_format": "OIX", "groups": 1}))
    with pytest.raises(UnsupportedError, match="op 0 \\(Convolution\\) makes elements of output 2"):
        await compile_graph(conv, engine)
