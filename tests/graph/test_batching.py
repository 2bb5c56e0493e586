"""Dynamic batching (triodnn.graph.DynamicBatcher): concurrent requests gathered into one graph
run along dim 0, each caller getting exactly its own rows; errors and cancellations stay per
request; graphs whose outputs do not follow the rows are refused when the batcher opens."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest
import trio
import trio.testing

from triodnn import (
    ArgumentMismatchError,
    ClosedError,
    InvalidArgumentError,
    MissingArgumentError,
    StreamFlags,
    UnsupportedError,
    ocl_interop,
)
from triodnn.graph import DynamicBatcher, Graph, LogicalTensor, Op, compile_graph, compile_graph_pool

COMPLETE = cl.command_execution_status.COMPLETE

ROWS, K, N = 4, 16, 8


def lt(i, shape, dtype="f32"):
    return LogicalTensor(i, dtype, list(shape), layout_type="strided")


def mlp_graph() -> Graph:
    """x [4,16] @ W [16,8] + b, ReLU: one fused partition."""
    g = Graph("cpu")
    g.add_op(Op(0, "MatMul", [lt(0, [ROWS, K]), lt(1, [K, N])], [lt(3, [ROWS, N])]))
    g.add_op(Op(1, "BiasAdd", [lt(3, [ROWS, N]), lt(2, [N])], [lt(4, [ROWS, N])]))
    g.add_op(Op(2, "ReLU", [lt(4, [ROWS, N])], [lt(5, [ROWS, N])]))
    return g


def host_step_graph() -> Graph:
    """x -> ReLU -> Wildcard (a host step) -> Tanh."""
    g = Graph("cpu")
    g.add_op(Op(0, "ReLU", [lt(0, [ROWS, N])], [lt(1, [ROWS, N])]))
    g.add_op(Op(1, "Wildcard", [lt(1, [ROWS, N])], [lt(2, [ROWS, N])]))
    g.add_op(Op(2, "Tanh", [lt(2, [ROWS, N])], [lt(3, [ROWS, N])]))
    return g


async def mlp_runner(engine, rng):
    w = rng.standard_normal((K, N)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    runner = await compile_graph(mlp_graph(), engine, constants={1: w, 2: b})
    return runner, w.astype(np.float64), b.astype(np.float64)


async def test_concurrent_requests_get_their_own_rows(engine, rng):
    """20 tasks at once, max_batch 8, one run in flight: each gets the float64 reference of its
    own rows; the runs served several requests each, never more than 8, the sizes compiled
    being 1, 2, 4, 8."""
    runner, w, b = await mlp_runner(engine, rng)
    stream = await engine.stream(StreamFlags.out_of_order)
    xs = [rng.standard_normal((ROWS, K)).astype(np.float32) for _ in range(20)]
    got: dict[int, dict] = {}
    async with DynamicBatcher(runner, stream, max_batch=8, max_in_flight=1) as batcher:
        async with trio.open_nursery() as nursery:
            for i, x in enumerate(xs):
                async def call(i=i, x=x):
                    got[i] = await batcher.run({0: x})
                nursery.start_soon(call)
    for i, x in enumerate(xs):
        np.testing.assert_allclose(got[i][5], np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)
        assert got[i][5].shape == (ROWS, N)
    stats = batcher.statistics()
    assert stats.batch_sizes == (1, 2, 4, 8)
    assert (stats.requests, stats.failed, stats.cancelled, stats.largest_batch) == (20, 0, 0, 8)
    # The first run may start with the first request alone; every later one takes what queued.
    assert 3 <= stats.batches <= 4


async def test_a_batch_forms_while_a_run_waits_and_pads_to_a_compiled_size(engine, rng, gate):
    """Request A's run waits on the device (an in-order stream held by a gated barrier); B, C
    and D queue meanwhile, and when A's run ends they go as one run, padded to 4 requests (the
    compiled size): 2 runs, 1 pad, every result the reference."""
    runner, w, b = await mlp_runner(engine, rng)
    stream = await engine.stream(StreamFlags.in_order)
    xs = [rng.standard_normal((ROWS, K)).astype(np.float32) for _ in range(4)]
    got: dict[int, dict] = {}
    with gate(engine.cl_context) as shut:
        async with DynamicBatcher(runner, stream, max_batch=4, max_in_flight=1) as batcher:
            stream.barrier(deps=[shut])          # everything after it on the stream waits
            async with trio.open_nursery() as nursery:
                async def call(i):
                    got[i] = await batcher.run({0: xs[i]})

                nursery.start_soon(call, 0)
                await trio.testing.wait_all_tasks_blocked()
                assert batcher.statistics().batches == 0      # A's run is in flight
                for i in (1, 2, 3):
                    nursery.start_soon(call, i)
                await trio.testing.wait_all_tasks_blocked()
                shut.set_status(COMPLETE)
    for i, x in enumerate(xs):
        np.testing.assert_allclose(got[i][5], np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)
    stats = batcher.statistics()
    assert (stats.requests, stats.batches, stats.padded, stats.largest_batch) == (4, 2, 1, 3)


async def test_a_bad_request_fails_alone(engine, rng):
    """A request of another shape, without its input, with extra ids or of strings raises its
    typed error at its own call; the good requests around it are served."""
    runner, w, b = await mlp_runner(engine, rng)
    stream = await engine.stream()
    x = rng.standard_normal((ROWS, K)).astype(np.float32)
    async with DynamicBatcher(runner, stream, max_batch=4) as batcher:
        with pytest.raises(ArgumentMismatchError, match=r"input 0 has shape \(5, 16\)"):
            await batcher.run({0: np.zeros((5, K), np.float32)})
        with pytest.raises(MissingArgumentError, match="lack graph input id 0"):
            await batcher.run({})
        with pytest.raises(InvalidArgumentError, match=r"ids \[1\]"):
            await batcher.run({0: x, 1: np.zeros((K, N), np.float32)})
        with pytest.raises(ArgumentMismatchError, match="<U1"):
            await batcher.run({0: np.full((ROWS, K), "a")})
        out = await batcher.run({0: x})
    np.testing.assert_allclose(out[5], np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)
    stats = batcher.statistics()
    assert (stats.requests, stats.batches, stats.failed) == (1, 1, 0)
    with pytest.raises(ClosedError):
        await batcher.run({0: x})


async def test_a_failing_run_fails_the_requests_it_served_only(engine, rng):
    """A host step that raises for one request's values: with max_batch 1 that request alone
    gets the error (its own exception, of the handler's type); the others are right."""
    class Refused(Exception):
        pass

    def host_step(a):
        if a.max() > 100:
            raise Refused("too large")
        return a

    runner = await compile_graph(host_step_graph(), engine, handlers={"Wildcard": host_step})
    stream = await engine.stream()
    xs = [np.full((ROWS, N), v, np.float32) for v in (1.0, 500.0, 2.0)]
    outcomes: dict[int, object] = {}
    async with DynamicBatcher(runner, stream, max_batch=1) as batcher:
        async with trio.open_nursery() as nursery:
            async def call(i):
                try:
                    outcomes[i] = (await batcher.run({0: xs[i]}))[3]
                except Refused as exc:
                    outcomes[i] = exc
            for i in range(3):
                nursery.start_soon(call, i)
    assert isinstance(outcomes[1], Refused)
    np.testing.assert_allclose(outcomes[0], np.tanh(xs[0]), rtol=1e-6)
    np.testing.assert_allclose(outcomes[2], np.tanh(xs[2]), rtol=1e-6)
    assert batcher.statistics().failed == 1


async def test_a_cancelled_request_leaves_the_others_alone(engine, rng, gate):
    """A request whose caller is cancelled while it is queued is left out of the next run; the
    other requests are served and right."""
    runner, w, b = await mlp_runner(engine, rng)
    stream = await engine.stream(StreamFlags.in_order)
    xs = [rng.standard_normal((ROWS, K)).astype(np.float32) for _ in range(3)]
    got: dict[int, np.ndarray] = {}
    with gate(engine.cl_context) as shut:
        async with DynamicBatcher(runner, stream, max_batch=4, max_in_flight=1) as batcher:
            stream.barrier(deps=[shut])
            async with trio.open_nursery() as nursery:
                async def call(i, scope=None):
                    with scope or trio.CancelScope():
                        got[i] = (await batcher.run({0: xs[i]}))[5]

                nursery.start_soon(call, 0)
                await trio.testing.wait_all_tasks_blocked()
                doomed = trio.CancelScope()
                nursery.start_soon(call, 1, doomed)
                nursery.start_soon(call, 2)
                await trio.testing.wait_all_tasks_blocked()
                doomed.cancel()
                await trio.testing.wait_all_tasks_blocked()
                shut.set_status(COMPLETE)
    assert sorted(got) == [0, 2]
    for i in (0, 2):
        np.testing.assert_allclose(got[i], np.maximum(xs[i] @ w + b, 0), rtol=1e-5, atol=1e-5)
    stats = batcher.statistics()
    assert (stats.requests, stats.batches, stats.cancelled, stats.largest_batch) == (2, 2, 1, 1)


async def test_a_graph_with_a_host_step_batches_only_one_request_per_run(engine):
    """A host step's outputs keep the shapes the graph declares, so they cannot follow the rows:
    ``max_batch`` above 1 is refused when the batcher opens, naming the output."""
    runner = await compile_graph(host_step_graph(), engine, handlers={"Wildcard": lambda a: a})
    stream = await engine.stream()
    with pytest.raises(UnsupportedError, match="output 3 .* host step"):
        async with DynamicBatcher(runner, stream, max_batch=2):
            pass


async def test_a_graph_whose_outputs_do_not_follow_the_rows_is_refused(engine):
    """A ReduceSum over dim 0 gives one row whatever the batch: opening the batcher says so."""
    g = Graph("cpu")
    g.add_op(Op(0, "ReduceSum", [lt(0, [ROWS, N])], [lt(1, [1, N])], {"axes": [0], "keep_dims": True}))
    runner = await compile_graph(g, engine)
    stream = await engine.stream()
    with pytest.raises(UnsupportedError, match="output 1 .* dim 0 does not follow"):
        async with DynamicBatcher(runner, stream, max_batch=2):
            pass


async def test_arguments_are_checked(engine, rng):
    runner, _, _ = await mlp_runner(engine, rng)
    stream = await engine.stream()
    with pytest.raises(InvalidArgumentError, match="max_batch"):
        DynamicBatcher(runner, stream, max_batch=0)
    with pytest.raises(InvalidArgumentError, match="max_delay"):
        DynamicBatcher(runner, stream, max_delay=-1)
    with pytest.raises(InvalidArgumentError, match="GraphRunner"):
        DynamicBatcher(object(), stream)
    batcher = DynamicBatcher(runner, stream)
    with pytest.raises(ClosedError):
        await batcher.run({0: np.zeros((ROWS, K), np.float32)})


async def test_an_engine_pool_batches_on_its_engines(engine, rng):
    # Two engines (the default device twice, in contexts of their own), capacity 1 each: up to
    # two batches run at once, each on the engine with room; every caller gets its rows.
    second = await ocl_interop.make_engine(engine.cl_device, cl.Context([engine.cl_device]))
    w = rng.standard_normal((K, N), dtype=np.float32)
    b = rng.standard_normal(N, dtype=np.float32)
    pool = await compile_graph_pool(mlp_graph(), [engine, second], capacity=1, constants={1: w, 2: b})
    xs = [rng.standard_normal((ROWS, K), dtype=np.float32) for _ in range(6)]
    got: list = [None] * len(xs)
    async with DynamicBatcher(pool, max_batch=4) as batcher:
        assert batcher.max_in_flight == 2 and batcher.statistics().batch_sizes == (1, 2, 4)

        async def request(i):
            got[i] = await batcher.run({0: xs[i]})

        async with trio.open_nursery() as nursery:
            for i in range(len(xs)):
                nursery.start_soon(request, i)
    for x, out in zip(xs, got, strict=True):
        np.testing.assert_allclose(out[5], np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)
    stats = batcher.statistics()
    assert stats.requests == 6 and stats.failed == 0 and stats.batches < 6 and batcher.pool is pool
    with pytest.raises(InvalidArgumentError, match="brings a stream per engine"):
        DynamicBatcher(pool, await engine.stream())
