"""Engine pools (triodnn.graph.compile_graph_pool / EnginePool.map): one request stream over
several engines, results in input order and equal to one engine's, each engine used within its
capacity, a failing engine's requests failing with its error while the others go on, tensors
pinning a request to their engine, and bad arguments refused with typed errors.

The second engine is the default engine's device in a context of its own
(``ocl_interop.make_engine``): a separate engine with its own queues and caches, as a second
GPU would be, on any machine."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest
import trio

import triodnn
from triodnn import (
    ArgumentMismatchError,
    EngineMismatchError,
    ExecutionError,
    InvalidArgumentError,
    ocl_interop,
)
from triodnn.graph import (
    EnginePool,
    Graph,
    LogicalTensor,
    Op,
    PoolResult,
    Tensor,
    compile_graph,
    compile_graph_pool,
)


def f32(i, shape):
    return LogicalTensor(i, "f32", shape, layout_type="strided")


def mlp_graph() -> Graph:
    """x (4 x 16) @ w (16 x 8) + b -> ReLU: one fused partition; w and b constant."""
    g = Graph("cpu")
    g.add_op(Op(0, "MatMul", [f32(0, [4, 16]), LogicalTensor(1, "f32", [16, 8], property_type="constant")],
                [f32(2, [4, 8])]))
    g.add_op(Op(1, "Add", [f32(2, [4, 8]), LogicalTensor(3, "f32", [1, 8], property_type="constant")],
                [f32(4, [4, 8])]))
    g.add_op(Op(2, "ReLU", [f32(4, [4, 8])], [f32(5, [4, 8])]))
    return g


def wildcard_graph() -> Graph:
    """x -> Wildcard -> ReLU: a handler between the device steps."""
    g = Graph("cpu")
    g.add_op(Op(0, "Wildcard", [f32(0, [4, 8])], [f32(1, [4, 8])]))
    g.add_op(Op(1, "ReLU", [f32(1, [4, 8])], [f32(2, [4, 8])]))
    return g


W = (np.arange(16 * 8, dtype=np.float32).reshape(16, 8) % 7 - 3) / np.float32(4)
B = np.arange(8, dtype=np.float32).reshape(1, 8) / np.float32(8) - np.float32(0.5)


def request(i: int) -> np.ndarray:
    return (np.arange(64, dtype=np.float32).reshape(4, 16) % 5 - 2 + i) / np.float32(4)


def reference(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W + B, 0)


@pytest.fixture
async def second_engine(engine):
    """Another engine on the default engine's device, in a context of its own."""
    return await ocl_interop.make_engine(engine.cl_device, cl.Context([engine.cl_device]))


async def test_requests_spread_over_the_engines_in_input_order(engine, second_engine):
    pool = await compile_graph_pool(mlp_graph(), [engine, second_engine], constants={1: W, 3: B}, capacity=2)
    assert pool.engines == (engine, second_engine)
    n = 24
    got = []
    async with pool.map({0: request(i)} for i in range(n)) as results:
        async for result in results:
            assert isinstance(result, PoolResult) and result.ok
            got.append(result)
            await trio.sleep(0)
    assert [r.index for r in got] == list(range(n))
    for i, result in enumerate(got):
        np.testing.assert_allclose(result.unwrap()[5], reference(request(i)), rtol=1e-5, atol=1e-5)
    stats = pool.statistics()
    assert stats.routed == stats.finished == n and stats.failed == 0
    for engine_stats in stats.engines:
        assert engine_stats.routed > 0 and engine_stats.running == 0
        assert engine_stats.peak_running <= engine_stats.capacity == 2 and engine_stats.in_rotation
    assert {r.engine for r in got} == {engine, second_engine}
    # Each engine compiled the graph for itself: its own runner, its partitions on its engine.
    assert [r.engine for r in pool.runners] == [engine, second_engine]
    assert all(r.statistics().live_buffers == 0 for r in pool.runners)


async def test_the_engine_with_most_room_takes_the_next_request(engine, second_engine):
    """Capacities 1 and 3, every request held in its handler until all four have started: the
    second engine (room 3, then 2) takes requests 0 and 1, the tie at room 1 goes to the engine
    that has taken fewer (the first), and the last to the second."""
    gate = trio.Event()

    async def held(a):
        await gate.wait()
        return a

    runners = [await compile_graph(wildcard_graph(), e, policy="debug", handlers={"Wildcard": held})
               for e in (engine, second_engine)]
    pool = EnginePool(runners, [await engine.stream(), await second_engine.stream()], capacity=[1, 3])
    async with pool.map([{0: request(i)[:, :8]} for i in range(4)]) as results:
        while pool.statistics().routed < 4:
            await trio.sleep(0)
        running = [s.running for s in pool.statistics().engines]
        gate.set()
        got = [r async for r in results]
    assert running == [1, 3]
    assert [r.engine for r in got] == [second_engine, second_engine, engine, second_engine]
    stats = pool.statistics().engines
    assert (stats[0].peak_running, stats[1].peak_running) == (1, 3)
    assert (stats[0].finished, stats[1].finished) == (1, 3)


async def test_a_failing_engine_leaves_the_rotation_and_the_others_go_on(engine, second_engine):
    """The second engine's handler fails as a lost device would (ExecutionError): its requests
    come back holding that error, later ones all go to the first engine, every good result is
    right, and nothing stays allocated."""
    def lost_device(a):
        raise ExecutionError("device lost")

    good = await compile_graph(wildcard_graph(), engine, policy="debug", handlers={"Wildcard": lambda a: a * 2})
    bad = await compile_graph(wildcard_graph(), second_engine, policy="debug", handlers={"Wildcard": lost_device})
    pool = EnginePool([good, bad], [await engine.stream(), await second_engine.stream()], capacity=2)
    n = 12
    async with pool.map({0: request(i)[:, :8]} for i in range(n)) as results:
        got = [r async for r in results]
    assert [r.index for r in got] == list(range(n))
    failed = [r for r in got if not r.ok]
    assert failed and all(r.engine is second_engine and isinstance(r.error, ExecutionError) for r in failed)
    with pytest.raises(ExecutionError, match="device lost"):
        failed[0].unwrap()
    for r in got:
        if r.ok:
            assert r.engine is engine
            np.testing.assert_array_equal(r.outputs[2], np.maximum(request(r.index)[:, :8] * 2, 0))
    stats = pool.statistics().engines
    assert stats[1].failure == "ExecutionError: device lost" and not stats[1].in_rotation
    assert stats[0].in_rotation and stats[0].finished == n - len(failed)
    assert stats[1].failed == len(failed) <= 2  # only those routed before the first failure came back
    assert good.statistics().live_buffers == 0 and bad.statistics().live_buffers == 0


async def test_recorded_requests_that_fail_to_submit_are_results_and_the_engine_leaves(engine, second_engine,
                                                                                      monkeypatch):
    """Requests that go as one recorded command are submitted by the pool's map without a task:
    one its engine refuses at submission (here as a lost device would, ExecutionError) comes
    back as that request's result, the engine leaves the rotation, and the rest run right."""
    pool = await compile_graph_pool(mlp_graph(), [engine, second_engine], constants={1: W, 3: B}, capacity=2)
    refusing = pool.streams[1]
    submit_sequence = triodnn.Stream.submit_sequence

    def refuse(stream, *args, **kwargs):
        if stream is refusing:
            raise ExecutionError("device lost")
        return submit_sequence(stream, *args, **kwargs)

    monkeypatch.setattr(triodnn.Stream, "submit_sequence", refuse)
    n = 12
    async with pool.map({0: request(i)} for i in range(n)) as results:
        got = [r async for r in results]
    assert [r.index for r in got] == list(range(n))
    failed = [r for r in got if not r.ok]
    # Those routed to it before its first refusal came back (its capacity: 2) fail, no others.
    assert 1 <= len(failed) <= 2 and all(r.engine is second_engine for r in failed)
    with pytest.raises(ExecutionError, match="device lost"):
        failed[0].unwrap()
    for r in got:
        if r.ok:
            assert r.engine is engine
            np.testing.assert_allclose(r.outputs[5], reference(request(r.index)), rtol=1e-5, atol=1e-5)
    stats = pool.statistics().engines
    assert stats[1].failure == "ExecutionError: device lost" and stats[1].failed == len(failed)
    assert stats[0].finished == n - len(failed) and all(s.running == 0 for s in stats)
    first = pool.runners[0].statistics()
    assert first.runs_finished == n - len(failed) and first.buffers_allocated == 0 and first.request_buffer_sets >= 1


async def test_a_request_error_fails_that_request_only(engine, second_engine):
    """A handler's own exception (not an engine failure) fails its request; both engines stay."""
    def picky(a):
        if a[0, 0] > 1:
            raise KeyError("this input")
        return a

    runners = [await compile_graph(wildcard_graph(), e, policy="debug", handlers={"Wildcard": picky})
               for e in (engine, second_engine)]
    pool = EnginePool(runners, [await engine.stream(), await second_engine.stream()])
    async with pool.map({0: request(i)[:, :8]} for i in range(10)) as results:
        got = [r async for r in results]
    bad = [r.index for r in got if not r.ok]
    assert bad == [i for i in range(10) if request(i)[0, 0] > 1]
    assert all(isinstance(got[i].error, KeyError) for i in bad)
    assert all(s.in_rotation for s in pool.statistics().engines)


async def test_when_every_engine_has_failed_the_map_ends_with_their_errors(engine, second_engine):
    def lost_device(a):
        raise ExecutionError("device lost")

    runners = [await compile_graph(wildcard_graph(), e, policy="debug", handlers={"Wildcard": lost_device})
               for e in (engine, second_engine)]
    pool = EnginePool(runners, [await engine.stream(), await second_engine.stream()], capacity=1)
    got = []
    with pytest.raises(ExecutionError, match="every engine of the pool has failed") as info:
        async with pool.map({0: request(i)[:, :8]} for i in range(10)) as results:
            async for r in results:
                got.append(r)
    assert got and all(not r.ok for r in got)
    assert str(second_engine) in str(info.value)
    assert all(not s.in_rotation for s in pool.statistics().engines)


async def test_tensors_pin_a_request_to_their_engine(engine, second_engine):
    pool = await compile_graph_pool(mlp_graph(), [engine, second_engine], constants={1: W, 3: B})
    lt = pool.runners[1].inputs[0]
    pinned = [await Tensor.from_numpy(lt, second_engine, request(i)) for i in range(4)]
    async with pool.map({0: t} for t in pinned) as results:
        got = [r async for r in results]
    assert all(r.engine is second_engine for r in got)
    for i, r in enumerate(got):
        np.testing.assert_allclose(r.unwrap()[5], reference(request(i)), rtol=1e-5, atol=1e-5)
    other = await ocl_interop.make_engine(engine.cl_device, cl.Context([engine.cl_device]))
    stranger = await Tensor.from_numpy(lt, other, request(0))
    with pytest.raises(EngineMismatchError, match="not one of the pool's engines"):
        async with pool.map([{0: stranger}]) as results:
            async for _ in results:
                pass
    for t in (*pinned, stranger):
        t.memory.release()


async def test_bad_inputs_end_the_map_at_their_place(engine, second_engine):
    pool = await compile_graph_pool(mlp_graph(), [engine, second_engine], constants={1: W, 3: B})
    inputs = [{0: request(0)}, {0: np.zeros((2, 2), np.float32)}, {0: request(2)}]
    got = []
    with pytest.raises(ArgumentMismatchError, match=r"inputs\[0\] has shape \(2, 2\)"):
        async with pool.map(inputs) as results:
            async for r in results:
                got.append(r)
    assert len(got) == 1 and got[0].ok


async def test_pool_arguments_are_checked(engine, second_engine):
    runner = await compile_graph(mlp_graph(), engine, constants={1: W, 3: B})
    stream = await engine.stream()
    with pytest.raises(InvalidArgumentError, match="at least one runner"):
        EnginePool([], [])
    with pytest.raises(InvalidArgumentError, match="appears twice"):
        EnginePool([runner, runner], [stream, stream])
    with pytest.raises(InvalidArgumentError, match="capacity 0"):
        EnginePool([runner], [stream], capacity=0)
    with pytest.raises(EngineMismatchError, match="not a stream of the runner's engine"):
        EnginePool([runner], [await second_engine.stream()])
    with pytest.raises(InvalidArgumentError, match="one stream per runner"):
        EnginePool([runner], [])
    with pytest.raises(InvalidArgumentError, match="appears twice"):
        await compile_graph_pool(mlp_graph(), [engine, engine])
    with pytest.raises(InvalidArgumentError, match="non-empty list of engines"):
        await compile_graph_pool(mlp_graph(), [])


def test_a_pool_through_the_blocking_portal():
    """portal.run(compile_graph_pool, ...) gives a wrapped pool: map is a plain iterator of
    results in order, run blocks and returns the outputs."""
    with triodnn.start_blocking() as portal:
        engine = portal.engine()
        pool = portal.run(compile_graph_pool, mlp_graph(), [engine], constants={1: W, 3: B})
        got = [result.unwrap()[5] for result in pool.map({0: request(i)} for i in range(5))]
        for i, out in enumerate(got):
            np.testing.assert_allclose(out, reference(request(i)), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(pool.run({0: request(7)})[5], reference(request(7)), rtol=1e-5, atol=1e-5)
        assert pool.statistics().routed == 6
