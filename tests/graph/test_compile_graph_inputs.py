"""``compile_graph(inputs=)`` takes logical tensors as a list or keyed by id, and names bad ones."""

from __future__ import annotations

import numpy as np
import pytest

import triodnn
from triodnn.graph import Graph, LogicalTensor, Op, compile_graph


def lt(i, shape):
    return LogicalTensor(i, "f32", shape, layout_type="strided")


def relu_graph():
    g = Graph("cpu")
    g.add_op(Op(0, "ReLU", [lt(0, [-1, 8])], [lt(1, [-1, 8])]))
    return g


@pytest.mark.parametrize("form", ["list", "dict"])
async def test_inputs_as_a_list_or_keyed_by_id(engine, rng, form):
    stream = await engine.stream()
    shaped = lt(0, [3, 8])
    inputs = [shaped] if form == "list" else {0: shaped}
    runner = await compile_graph(relu_graph(), engine, inputs=inputs)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    out = await runner.run(stream, {0: x})
    np.testing.assert_array_equal(out[1], np.maximum(x, 0))


async def test_bad_inputs_name_the_culprit(engine):
    with pytest.raises(triodnn.InvalidArgumentError, match=r"inputs\[5\] is logical tensor 0"):
        await compile_graph(relu_graph(), engine, inputs={5: lt(0, [3, 8])})
    with pytest.raises(triodnn.InvalidArgumentError, match=r"inputs\[0\] is ndarray"):
        await compile_graph(relu_graph(), engine, inputs={0: np.zeros(3)})
    with pytest.raises(triodnn.InvalidArgumentError, match="inputs is int"):
        await compile_graph(relu_graph(), engine, inputs=3)
    # No inputs= for the unknown batch: a runner that compiles per shape (test_dynamic_shapes.py).
    assert isinstance(await compile_graph(relu_graph(), engine), triodnn.graph.DynamicGraphRunner)
