"""Graphs with unknown input dims: one compilation per set of input shapes, at its first run."""

from __future__ import annotations

import numpy as np
import pytest
import trio

import triodnn
from triodnn.graph import DynamicGraphRunner, Graph, GraphRunner, LogicalTensor, Op, compile_graph


def lt(i, shape, prop="variable"):
    return LogicalTensor(i, "f32", shape, layout_type="strided", property_type=prop)


def dense_graph(batch=-1, features=16, out=8):
    """y = relu(x @ W + b) with a batch of unknown size."""
    g = Graph("cpu")
    g.add_op(Op(0, "MatMul", [lt(0, [batch, features]), lt(1, [features, out], "constant")], [lt(3, [batch, out])]))
    g.add_op(Op(1, "BiasAdd", [lt(3, [batch, out]), lt(2, [out], "constant")], [lt(4, [batch, out])]))
    g.add_op(Op(2, "ReLU", [lt(4, [batch, out])], [lt(5, [batch, out])]))
    return g


def reference(x, w, b):
    return np.maximum(x.astype(np.float64) @ w + b, 0)


@pytest.fixture
def weights(rng):
    return {1: rng.standard_normal((16, 8)).astype(np.float32), 2: rng.standard_normal(8).astype(np.float32)}


async def test_each_new_batch_compiles_once(engine, rng, weights):
    runner = await compile_graph(dense_graph(), engine, constants=weights)
    assert isinstance(runner, DynamicGraphRunner)
    stream = await engine.stream()
    for batch in (3, 5, 3, 5, 7):
        x = rng.standard_normal((batch, 16)).astype(np.float32)
        out = await runner.run(stream, {0: x})
        np.testing.assert_allclose(out[5], reference(x, weights[1], weights[2]), rtol=1e-5, atol=1e-5)
    assert sorted(runner.runners) == [((3, 16), (16, 8), (8,)), ((5, 16), (16, 8), (8,)), ((7, 16), (16, 8), (8,))]
    assert all(isinstance(r, GraphRunner) for r in runner.runners.values())
    stats = runner.statistics()
    assert (stats.compiled_shapes, stats.runs_started, stats.runs_finished) == (3, 5, 5)
    assert stats.live_buffers == 0


async def test_concurrent_first_runs_share_one_compilation(engine, rng, weights):
    runner = await compile_graph(dense_graph(), engine, constants=weights)
    stream = await engine.stream()
    x = rng.standard_normal((4, 16)).astype(np.float32)
    results = []

    async def one():
        results.append(await runner.run(stream, {0: x}))

    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(one)
    assert len(results) == 6 and runner.statistics().compiled_shapes == 1
    for out in results:
        np.testing.assert_allclose(out[5], reference(x, weights[1], weights[2]), rtol=1e-5, atol=1e-5)


async def test_map_over_mixed_batches_keeps_input_order(engine, rng, weights):
    runner = await compile_graph(dense_graph(), engine, constants=weights)
    stream = await engine.stream(triodnn.StreamFlags.out_of_order)
    xs = [rng.standard_normal((b, 16)).astype(np.float32) for b in (2, 6, 2, 9, 6)]
    async with runner.map(({0: x} for x in xs), stream=stream, max_in_flight=3) as results:
        got = [out async for out in results]
    for x, out in zip(xs, got):
        np.testing.assert_allclose(out[5], reference(x, weights[1], weights[2]), rtol=1e-5, atol=1e-5)
    assert runner.statistics().compiled_shapes == 3


async def test_known_shapes_still_give_a_plain_runner(engine, weights):
    runner = await compile_graph(dense_graph(batch=4), engine, constants=weights)
    assert isinstance(runner, GraphRunner) and runner.statistics().compiled_shapes == 1


async def test_errors_name_the_input(engine, rng, weights):
    runner = await compile_graph(dense_graph(), engine, constants=weights)
    stream = await engine.stream()
    with pytest.raises(triodnn.MissingArgumentError, match="graph input id 0"):
        await runner.run(stream, {})
    with pytest.raises(triodnn.InvalidArgumentError):  # 15 features where the graph has 16
        await runner.run(stream, {0: rng.standard_normal((3, 15)).astype(np.float32)})
    assert runner.statistics().compiled_shapes == 0  # a failed compilation is not kept
    x = rng.standard_normal((3, 16)).astype(np.float32)
    out = await runner.run(stream, {0: x})
    np.testing.assert_allclose(out[5], reference(x, weights[1], weights[2]), rtol=1e-5, atol=1e-5)


def test_through_the_blocking_portal(rng, weights):
    with triodnn.start_blocking() as portal:
        engine = portal.engine()
        stream = engine.stream()
        runner = portal.run(compile_graph, dense_graph(), engine, constants=weights)
        for batch in (2, 5):
            x = rng.standard_normal((batch, 16)).astype(np.float32)
            out = runner.run(stream, {0: x})
            np.testing.assert_allclose(out[5], reference(x, weights[1], weights[2]), rtol=1e-5, atol=1e-5)
        xs = [rng.standard_normal((b, 16)).astype(np.float32) for b in (5, 1)]
        got = list(runner.map([{0: x} for x in xs], stream=stream))
        for x, out in zip(xs, got):
            np.testing.assert_allclose(out[5], reference(x, weights[1], weights[2]), rtol=1e-5, atol=1e-5)
        assert runner.statistics().compiled_shapes == 3
