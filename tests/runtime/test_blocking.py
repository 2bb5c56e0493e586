"""The blocking portal: the runtime in a background thread, driven from plain (sync) code and
from several OS threads at once."""

from __future__ import annotations

import gc
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import trio
from conftest import in_a_thread, threads_since

import triodnn
from triodnn import EltwiseDesc, MemoryDesc
from triodnn.graph import Partition, PipelineStatistics, Tensor, compile_graph, load

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "graphs"


def test_primitives_from_sync_code():
    x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(8, 8)
    with triodnn.start_blocking() as portal:
        engine = portal.engine()
        desc = MemoryDesc((8, 8))
        relu = engine.create_primitive(EltwiseDesc("relu", desc))
        src, dst = engine.from_numpy(x), engine.memory(desc)
        stream = engine.stream(triodnn.StreamFlags.out_of_order)
        event = stream.execute(relu, {"src": src, "dst": dst})
        event.wait()
        assert event.done
        np.testing.assert_array_equal(dst.to_numpy(), np.maximum(x, 0))
        assert isinstance(engine.identity, triodnn.EngineIdentity)  # values come back unwrapped


def test_many_threads_share_one_portal():
    results, errors = {}, []
    with triodnn.start_blocking() as portal:
        engine = portal.engine()
        stream = engine.stream(triodnn.StreamFlags.out_of_order)

        def worker(i: int) -> None:
            try:
                x = np.full((256,), i - 4, dtype=np.float32)
                desc = MemoryDesc((256,))
                prim = engine.create_primitive(EltwiseDesc("linear", desc, alpha=2.0, beta=float(i)))
                src, dst = engine.from_numpy(x), engine.memory(desc)
                for _ in range(5):
                    stream.execute(prim, {"src": src, "dst": dst}).wait()
                results[i] = dst.to_numpy()
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    for i in range(8):
        np.testing.assert_array_equal(results[i], np.full((256,), 2.0 * (i - 4) + i, np.float32))


def test_graph_through_the_portal():
    rng = np.random.default_rng(3)
    graph = load(EXAMPLES / "mlp.json")
    (partition,) = graph.get_partitions()
    with triodnn.start_blocking() as portal:
        engine = portal.engine()
        compiled = portal.run(partition.compile, engine)
        arrays = {lt.id: rng.integers(-2, 3, lt.shape).astype(np.float32) for lt in compiled.inputs}
        ins = [portal.run(Tensor.from_numpy, lt, engine, arrays[lt.id]) for lt in compiled.inputs]
        out = portal.run_sync(Tensor, compiled.outputs[0], engine)
        compiled.execute(engine.stream(), ins, [out]).wait()
        got = out.to_numpy()
    h = np.maximum(arrays[0] @ arrays[1] + arrays[2], 0)
    np.testing.assert_array_equal(got, h @ arrays[3] + arrays[4])


def test_closing_finishes_work_and_refuses_new_calls():
    portal = triodnn.start_blocking()
    engine = portal.engine()
    desc = MemoryDesc((1 << 16,))
    prim = engine.create_primitive(EltwiseDesc("exp", desc))
    src, dst = engine.from_numpy(np.zeros(1 << 16, np.float32)), engine.memory(desc)
    stream = engine.stream()
    for _ in range(20):
        stream.execute(prim, {"src": src, "dst": dst})
    portal.close()
    portal.close()  # idempotent
    with pytest.raises(triodnn.ClosedError, match="portal is closed"):
        portal.engine()


def test_errors_cross_the_portal_with_their_type():
    with triodnn.start_blocking() as portal:
        with pytest.raises(triodnn.EngineNotFoundError):
            portal.engine("gpu", 99)
        engine = portal.engine()
        with pytest.raises(triodnn.InvalidArgumentError, match="alg 'nope'"):
            engine.create_primitive(EltwiseDesc("nope", MemoryDesc((4,))))


# -- the Graph API through the portal --------------------------------------------------------------


@pytest.fixture
def no_unawaited_coroutines():
    """Fails the test if a coroutine was dropped without being awaited anywhere (the portal used
    to hand back ``runner.run(...)``'s coroutine). Python reports those from the finalizer, as
    a RuntimeWarning nobody can catch by raising, so they are recorded and counted."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
        gc.collect()
    never_awaited = [str(w.message) for w in caught if "was never awaited" in str(w.message)]
    assert never_awaited == []


def mlp_arrays(lts, seed: int = 3) -> dict[int, np.ndarray]:
    # Small integers: every f32 sum of the MLP is exact, so results compare equal to numpy's.
    rng = np.random.default_rng(seed)
    return {lt.id: rng.integers(-2, 3, lt.shape).astype(np.float32) for lt in lts}


def mlp_reference(a: dict[int, np.ndarray]) -> np.ndarray:
    return np.maximum(a[0] @ a[1] + a[2], 0) @ a[3] + a[4]


def test_graph_walk_through_without_await(no_unawaited_coroutines):
    graph = load(EXAMPLES / "mlp.json")
    with triodnn.start_blocking() as portal:
        engine = portal.engine()
        stream = engine.stream()
        # Partitions made outside the portal are wrapped: compile blocks, takes a wrapped engine.
        (partition,) = portal.wrap(graph.get_partitions())
        assert isinstance(partition, triodnn.Blocking) and partition.op_kinds[0] == "MatMul"
        compiled = partition.compile(engine)
        assert isinstance(compiled, triodnn.Blocking)
        assert compiled.partition == partition  # wrappers of one object compare equal
        # So is the Tensor class: its constructor and from_numpy go through the portal.
        wrapped_tensor = portal.wrap(Tensor)
        arrays = mlp_arrays(compiled.inputs)
        ins = [wrapped_tensor.from_numpy(lt, engine, arrays[lt.id]) for lt in compiled.inputs]
        out = wrapped_tensor(compiled.outputs[0], engine)
        assert isinstance(out.memory, triodnn.Blocking)
        event = compiled.execute(stream, ins, [out])
        assert isinstance(event, triodnn.Blocking)  # an Event comes back to wait on, not awaited
        event.wait()
        assert event.done
        np.testing.assert_array_equal(out.to_numpy(), mlp_reference(arrays))
        # run_sync awaits what a plain call returns: nothing is left as a coroutine.
        again = portal.run_sync(Partition.compile, partition, engine)
        assert isinstance(again, triodnn.Blocking)


def test_graph_entry_points_given_a_portal_engine_run_on_the_portal(no_unawaited_coroutines):
    """No portal.wrap first: partition.compile, compile_graph and Tensor.from_numpy see the
    portal's engine and block there, instead of returning a coroutine nobody can await."""
    graph = load(EXAMPLES / "mlp.json")
    with triodnn.start_blocking() as portal:
        engine = portal.engine()
        stream = engine.stream()
        (partition,) = graph.get_partitions()  # a plain Partition
        compiled = partition.compile(engine)
        assert isinstance(compiled, triodnn.Blocking)
        arrays = mlp_arrays(compiled.inputs)
        ins = [Tensor.from_numpy(lt, engine, arrays[lt.id]) for lt in compiled.inputs]
        assert all(isinstance(t, triodnn.Blocking) for t in ins)
        out = portal.wrap(Tensor)(compiled.outputs[0], engine)
        compiled.execute(stream, ins, [out]).wait()
        np.testing.assert_array_equal(out.to_numpy(), mlp_reference(arrays))
        runner = compile_graph(graph, engine)
        assert isinstance(runner, triodnn.Blocking)
        outputs = runner.run(stream, arrays)
        np.testing.assert_array_equal(outputs[runner.outputs[0].id], mlp_reference(arrays))


def test_compile_graph_and_run_without_await(no_unawaited_coroutines):
    graph = load(EXAMPLES / "mlp.json")
    with triodnn.start_blocking() as portal:
        engine = portal.engine()
        stream = engine.stream(triodnn.StreamFlags.out_of_order)
        runner = portal.run(compile_graph, graph, engine)
        assert isinstance(runner, triodnn.Blocking)
        arrays = mlp_arrays(runner.inputs)
        (out_lt,) = runner.outputs
        outputs = runner.run(stream, arrays)
        assert list(outputs) == [out_lt.id]
        np.testing.assert_array_equal(outputs[out_lt.id], mlp_reference(arrays))
        # Weights once, then runs with a wrapped Tensor input and Tensor outputs.
        runner.set_constants({i: arrays[i] for i in (1, 2, 3, 4)})
        x = portal.wrap(Tensor).from_numpy(runner.inputs[0], engine, arrays[0] + 1)
        got = runner.run(stream, {0: x}, as_tensors=True)
        assert isinstance(got[out_lt.id], triodnn.Blocking)
        np.testing.assert_array_equal(got[out_lt.id].to_numpy(), mlp_reference({**arrays, 0: arrays[0] + 1}))
        got[out_lt.id].memory.release()
        stats = runner.statistics()
        assert (stats.runs_started, stats.runs_finished, stats.live_buffers) == (2, 2, 0)
        assert isinstance(runner.partitions[0], triodnn.Blocking)
        with pytest.raises(triodnn.InvalidArgumentError, match="lack graph input ids"):
            runner.run(stream, {})


def test_runner_map_iterates_synchronously(no_unawaited_coroutines):
    graph = load(EXAMPLES / "mlp.json")
    with triodnn.start_blocking() as portal:
        engine = portal.engine()
        stream = engine.stream()
        runner = portal.run(compile_graph, graph, engine)
        arrays = mlp_arrays(runner.inputs)
        (out_id,) = (lt.id for lt in runner.outputs)
        requests = [{**arrays, 0: arrays[0] + i} for i in range(6)]

        # Inside a with block: every result, in input order.
        with runner.map(requests, stream=stream, max_in_flight=2) as results:
            got = [outputs[out_id] for outputs in results]
        assert len(got) == 6
        for i, value in enumerate(got):
            np.testing.assert_array_equal(value, mlp_reference({**arrays, 0: arrays[0] + i}))
        assert results.statistics() == PipelineStatistics(started=6, delivered=6, peak_in_flight=2)
        assert list(results) == []  # closed: iterating again ends at once

        # A bare loop over portal.map (a generator of inputs): break closes the pipeline, the
        # requests in flight are cancelled and their buffers released before the loop goes on.
        before = runner.statistics()
        pipeline = portal.map(runner, (r for r in requests), stream=stream, max_in_flight=3)
        for i, outputs in enumerate(pipeline):
            np.testing.assert_array_equal(outputs[out_id], mlp_reference({**arrays, 0: arrays[0] + i}))
            if i == 1:
                break
        after = runner.statistics()
        assert pipeline.statistics().delivered == 2
        assert pipeline.statistics().started <= 2 + 3
        assert after.runs_started - before.runs_started == pipeline.statistics().started
        assert after.live_buffers == 0
        with pytest.raises(triodnn.InvalidArgumentError, match="entered or iterated already"):
            pipeline.__enter__()


def test_runner_map_raises_a_request_error_at_its_place():
    graph = load(EXAMPLES / "mlp.json")
    with triodnn.start_blocking() as portal:
        engine = portal.engine()
        runner = portal.run(compile_graph, graph, engine)
        arrays = mlp_arrays(runner.inputs)
        requests = [arrays, {**arrays, 0: arrays[0][:8]}, arrays]
        delivered = []
        with pytest.raises(triodnn.ArgumentMismatchError, match=r"inputs\[0\] has shape \(8, 256\)"):
            for outputs in runner.map(requests, stream=engine.stream(), max_in_flight=1):
                delivered.append(outputs)
        assert len(delivered) == 1
        assert runner.statistics().live_buffers == 0
        # A wrong stream is refused at the call, naming it.
        with pytest.raises(triodnn.InvalidArgumentError, match="stream is int"):
            runner.map(requests, stream=3)


def test_closing_the_portal_closes_an_open_pipeline():
    graph = load(EXAMPLES / "mlp.json")
    portal = triodnn.start_blocking()
    engine = portal.engine()
    runner = portal.run(compile_graph, graph, engine)
    arrays = mlp_arrays(runner.inputs)
    results = iter(runner.map([arrays] * 8, stream=engine.stream(), max_in_flight=4))
    assert next(results)[runner.outputs[0].id].shape == (64, 128)
    portal.close()  # cancels the requests in flight; returns once they have ended
    with pytest.raises(triodnn.ClosedError, match="portal is closed"):
        next(results)
    # The runner itself (its counters are plain Python; the portal refuses calls now).
    stats = runner._target.statistics()
    # One delivered, then max_in_flight=4 more started (in flight: started, not delivered).
    assert (stats.runs_started, stats.live_buffers) == (5, 0)


def test_graph_runs_from_many_threads():
    graph = load(EXAMPLES / "mlp.json")
    errors, done = [], {}
    with triodnn.start_blocking() as portal:
        engine = portal.engine()
        runner = portal.run(compile_graph, graph, engine)
        stream = engine.stream(triodnn.StreamFlags.out_of_order)
        arrays = mlp_arrays(runner.inputs)

        def worker(i: int) -> None:
            try:
                request = {**arrays, 0: arrays[0] + i}
                for outputs in runner.map([request] * 3, stream=stream, max_in_flight=2):
                    np.testing.assert_array_equal(outputs[runner.outputs[0].id], mlp_reference(request))
                    done[i] = done.get(i, 0) + 1
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = runner.statistics()
    assert errors == []
    assert done == {i: 3 for i in range(4)}
    assert (stats.runs_finished, stats.live_buffers) == (12, 0)


# -- inside a trio run ------------------------------------------------------------------------------


async def test_opening_a_portal_inside_trio_is_refused_before_its_thread_starts():
    """It used to open (stalling the run while its runtime started), and then could not be
    closed there: trio's untyped 'this is a blocking function', and the thread lived on."""
    threads = set(threading.enumerate())
    with pytest.raises(triodnn.WrongThreadError, match=r"opened inside a trio run.*use the async API directly"):
        with triodnn.start_blocking():
            pass
    with pytest.raises(triodnn.WrongThreadError, match="opened inside a trio run"):
        triodnn.BlockingPortal()
    assert threads_since(threads) == set()


def test_a_portal_used_entered_or_closed_inside_trio_is_refused_and_closes_outside():
    threads = set(threading.enumerate())
    portal = triodnn.start_blocking()
    engine = portal.engine()

    async def inside():
        with pytest.raises(triodnn.WrongThreadError, match="called inside a trio run"):
            portal.engine()
        with pytest.raises(triodnn.WrongThreadError, match="called inside a trio run"):
            engine.stream()
        with pytest.raises(triodnn.WrongThreadError, match="entered inside a trio run"):
            with portal:
                pass
        with pytest.raises(triodnn.WrongThreadError, match="closed inside a trio run"):
            portal.close()
        # A plain thread is outside trio: the portal serves it while this run waits for it.
        how, stream = in_a_thread(engine.stream)
        assert how == "returned", stream
        return stream

    stream = trio.run(inside)
    stream.marker().wait()  # the portal is open and serving
    # Its own runtime thread runs trio too, and would wait on itself.
    with pytest.raises(triodnn.WrongThreadError, match="called from a function it runs itself"):
        portal.run_sync(portal.engine)
    portal.close()
    with pytest.raises(triodnn.ClosedError, match="portal is closed"):
        portal.engine()
    assert threads_since(threads) == set()
