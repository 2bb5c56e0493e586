"""The constant tensor cache and runner constants: a constant input given as the same array is
uploaded once per engine (hits and misses counted exactly, views of it included), a new array
is uploaded again, capacity 0 disables, eviction at capacity frees buffers (never under a run
that still has to submit on them), the capacity API and env vars, runner.set_constants with
omitted ids, and typed errors for bad input.

Counts come from ``constant_tensor_cache_statistics(engine)``: each test opens its own engine,
so its cache starts empty. The capacity is process-wide; the ``capacity`` fixture restores it.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import trio

import triodnn
from triodnn import ArgumentMismatchError, InvalidArgumentError, StreamFlags
from triodnn.graph import (
    ConstantTensorCacheStatistics,
    Graph,
    LogicalTensor,
    Op,
    Tensor,
    clear_constant_tensor_cache,
    compile_graph,
    constant_tensor_cache_statistics,
    get_constant_tensor_cache_capacity,
    set_constant_tensor_cache_capacity,
)
from triodnn.graph._constant_cache import CAPACITY_ENV_VARS, SWITCH_ENV_VARS, capacities_from_env

MIB = 1024 * 1024


def f32(i, shape, prop="undef"):
    return LogicalTensor(i, "f32", shape, layout_type="strided", property_type=prop)


def mlp_graph() -> Graph:
    """relu(x @ W + b), W and b constant."""
    g = Graph("cpu")
    g.add_op(Op(0, "MatMul", [f32(0, [8, 16]), f32(1, [16, 12], "constant")], [f32(3, [8, 12])]))
    g.add_op(Op(1, "BiasAdd", [f32(3, [8, 12]), f32(2, [12], "constant")], [f32(4, [8, 12])]))
    g.add_op(Op(2, "ReLU", [f32(4, [8, 12])], [f32(5, [8, 12])]))
    return g


def mlp_reference(x, w, b):
    return np.maximum(x.astype(np.float64) @ w + b, 0)


# 192 x 1024 f32 is 768 KiB: one fits a 1 MiB cache, two do not.
BIG = (192, 1024)


def add_graph(with_handler: bool = False) -> Graph:
    """x + c with c constant (BIG); with a Wildcard before the Add, whose handler the test holds."""
    g = Graph("cpu")
    x = f32(0, list(BIG))
    if with_handler:
        g.add_op(Op(0, "Wildcard", [x], [f32(2, list(BIG))]))
        x = f32(2, list(BIG))
    g.add_op(Op(1, "Add", [x, f32(1, list(BIG), "constant")], [f32(3, list(BIG))]))
    return g


def stats(engine) -> ConstantTensorCacheStatistics:
    return constant_tensor_cache_statistics(engine)


def counts(engine) -> tuple[int, int, int, int, int, int]:
    s = stats(engine)
    return s.hits, s.misses, s.evictions, s.uncached, s.entries, s.bytes


def live(engine) -> int:
    return engine.statistics().live_buffers


def kept(runner) -> int:
    """Device buffers the runner keeps between requests (its recorded requests' buffer sets)."""
    return runner.statistics().request_buffers


@pytest.fixture
def capacity():
    """``capacity(mib)`` sets every engine kind's capacity for the test; the recorded ones come
    back afterwards."""
    recorded = {kind: get_constant_tensor_cache_capacity(kind) for kind in ("cpu", "gpu")}
    yield set_constant_tensor_cache_capacity
    for kind, mib in recorded.items():
        set_constant_tensor_cache_capacity(kind, mib)


@pytest.fixture
async def stream(engine):
    return await engine.stream(StreamFlags.out_of_order)


# -- hits and misses -----------------------------------------------------------------------------


async def test_same_array_is_uploaded_once(engine, stream, capacity, rng):
    capacity(64)
    runner = await compile_graph(mlp_graph(), engine)
    w = rng.standard_normal((16, 12), dtype=np.float32)
    b = rng.standard_normal(12, dtype=np.float32)
    before = live(engine)
    for i in range(4):
        x = rng.standard_normal((8, 16), dtype=np.float32)
        out = await runner.run(stream, {0: x, 1: w, 2: b})
        np.testing.assert_allclose(out[5], mlp_reference(x, w, b), rtol=1e-5, atol=1e-5)
        # The first run misses both constants; every later one hits both.
        assert counts(engine) == (2 * i, 2, 0, 0, 2, w.nbytes + b.nbytes)
    # x every run, w and b once; the cache's two buffers are all that stays.
    assert runner.statistics().uploads == 4 + 2
    assert runner.statistics().live_buffers == 0 and live(engine) == before + 2 + kept(runner)
    assert stats(engine).uploads == 2


async def test_views_of_one_array_hit_and_other_views_miss(engine, stream, capacity, rng):
    capacity(64)
    runner = await compile_graph(mlp_graph(), engine)
    wt = rng.standard_normal((12, 16), dtype=np.float32)      # W is passed transposed: a view
    b2 = rng.standard_normal((2, 12), dtype=np.float32)       # b is a row of a bigger array
    x = rng.standard_normal((8, 16), dtype=np.float32)
    for _ in range(3):
        out = await runner.run(stream, {0: x, 1: wt.T, 2: b2[0]})   # new view objects each run
        np.testing.assert_allclose(out[5], mlp_reference(x, wt.T, b2[0]), rtol=1e-5, atol=1e-5)
    assert counts(engine)[:2] == (4, 2)
    # Another row of the same base: another data pointer, another entry with its own values.
    out = await runner.run(stream, {0: x, 1: wt.T, 2: b2[1]})
    np.testing.assert_allclose(out[5], mlp_reference(x, wt.T, b2[1]), rtol=1e-5, atol=1e-5)
    assert counts(engine)[:2] == (5, 3) and stats(engine).entries == 3


async def test_a_new_array_with_other_values_gives_the_new_result(engine, stream, capacity, rng):
    capacity(64)
    runner = await compile_graph(mlp_graph(), engine)
    x = rng.standard_normal((8, 16), dtype=np.float32)
    b = rng.standard_normal(12, dtype=np.float32)
    # Each W is dropped before the next is made: CPython mostly hands the next one the same id
    # and the same data pointer (it did here, 2026-11-25). The cache must tell them apart.
    for i in range(6):
        w = np.full((16, 12), i + 1, dtype=np.float32)
        out = await runner.run(stream, {0: x, 1: w, 2: b})
        np.testing.assert_allclose(out[5], mlp_reference(x, w, b), rtol=1e-5, atol=1e-5)
        del w
    s = stats(engine)
    assert (s.hits, s.misses) == (5, 7)           # b hit 5 times; each W and b once missed
    # Dead arrays leave the cache: b and nothing else.
    assert (s.entries, s.bytes) == (1, b.nbytes)


async def test_mutating_a_cached_array_in_place_keeps_the_old_values(engine, stream, capacity, rng):
    """The documented broken promise: the cache never looks at the values."""
    capacity(64)
    runner = await compile_graph(mlp_graph(), engine)
    x = rng.standard_normal((8, 16), dtype=np.float32)
    w = rng.standard_normal((16, 12), dtype=np.float32)
    b = np.zeros(12, np.float32)
    first = await runner.run(stream, {0: x, 1: w, 2: b})
    old = w.copy()
    w *= 2
    stale = await runner.run(stream, {0: x, 1: w, 2: b})
    np.testing.assert_array_equal(stale[5], first[5])
    np.testing.assert_allclose(stale[5], mlp_reference(x, old, b), rtol=1e-5, atol=1e-5)
    clear_constant_tensor_cache(engine)
    assert stats(engine).entries == 0
    fresh = await runner.run(stream, {0: x, 1: w, 2: b})
    np.testing.assert_allclose(fresh[5], mlp_reference(x, w, b), rtol=1e-5, atol=1e-5)


async def test_values_that_are_no_array_are_uploaded_every_run(engine, stream, capacity, rng):
    capacity(64)
    runner = await compile_graph(mlp_graph(), engine)
    x = rng.standard_normal((8, 16), dtype=np.float32)
    w = rng.standard_normal((16, 12), dtype=np.float32)
    b = [0.5] * 12
    for _ in range(2):
        out = await runner.run(stream, {0: x, 1: w, 2: b})
        np.testing.assert_allclose(out[5], mlp_reference(x, w, np.float32(0.5)), rtol=1e-5, atol=1e-5)
    assert counts(engine) == (1, 1, 0, 2, 1, w.nbytes)
    assert runner.statistics().uploads == 2 + 1 + 2


async def test_map_copies_variable_inputs_only_and_hits_constants(engine, stream, capacity, rng):
    capacity(64)
    runner = await compile_graph(mlp_graph(), engine)
    w = rng.standard_normal((16, 12), dtype=np.float32)
    b = rng.standard_normal(12, dtype=np.float32)
    xs = [rng.standard_normal((8, 16), dtype=np.float32) for _ in range(10)]

    def requests():
        buffer = np.empty((8, 16), np.float32)
        for x in xs:
            buffer[...] = x            # reused: map must copy x, the variable input
            yield {0: buffer, 1: w, 2: b}

    async with runner.map(requests(), stream=stream, max_in_flight=4) as results:
        outs = [out async for out in results]
    for x, out in zip(xs, outs, strict=True):
        np.testing.assert_allclose(out[5], mlp_reference(x, w, b), rtol=1e-5, atol=1e-5)
    # Concurrent requests share the one entry per constant: 2 misses, 18 hits.
    assert counts(engine)[:4] == (18, 2, 0, 0)
    assert runner.statistics().uploads == 10 + 2


# -- capacity ------------------------------------------------------------------------------------


async def test_capacity_zero_disables(engine, stream, capacity, rng):
    capacity(0)
    assert get_constant_tensor_cache_capacity() == get_constant_tensor_cache_capacity("gpu") == 0
    runner = await compile_graph(mlp_graph(), engine)
    w = rng.standard_normal((16, 12), dtype=np.float32)
    b = rng.standard_normal(12, dtype=np.float32)
    before = live(engine)
    for _ in range(3):
        x = rng.standard_normal((8, 16), dtype=np.float32)
        out = await runner.run(stream, {0: x, 1: w, 2: b})
        np.testing.assert_allclose(out[5], mlp_reference(x, w, b), rtol=1e-5, atol=1e-5)
    assert counts(engine) == (0, 0, 0, 6, 0, 0)
    assert runner.statistics().uploads == 9 and live(engine) == before + kept(runner)


async def test_eviction_at_capacity_frees_the_buffer(engine, stream, capacity, rng):
    capacity(1)
    runner = await compile_graph(add_graph(), engine)
    x = rng.standard_normal(BIG, dtype=np.float32)
    c1, c2 = (rng.standard_normal(BIG, dtype=np.float32) for _ in range(2))
    nbytes = c1.nbytes
    before = live(engine)
    for c in [c1, c2, c1, c2, c2]:
        out = await runner.run(stream, {0: x, 1: c})
        np.testing.assert_array_equal(out[3], x + c)
        # Only one 768 KiB constant fits in 1 MiB: each switch evicts the other.
        assert live(engine) == before + 1 + kept(runner)
    assert counts(engine) == (1, 4, 3, 0, 1, nbytes)
    # Too big for the capacity: uploaded for the run, never cached.
    capacity("cpu", 0)
    capacity("gpu", 0)
    assert stats(engine).entries == 0 and live(engine) == before + kept(runner)
    capacity(1)
    big = rng.standard_normal((2 * BIG[0], BIG[1]), dtype=np.float32)
    g = Graph("cpu")
    g.add_op(Op(0, "ReLU", [f32(1, list(big.shape), "constant")], [f32(2, list(big.shape))]))
    relu = await compile_graph(g, engine)
    np.testing.assert_array_equal((await relu.run(stream, {1: big}))[2], np.maximum(big, 0))
    assert stats(engine).uncached == 1 and stats(engine).entries == 0
    assert live(engine) == before + kept(runner) + kept(relu)


async def test_raising_the_capacity_keeps_entries_and_lowering_evicts(engine, stream, capacity, rng):
    capacity(4)
    runner = await compile_graph(add_graph(), engine)
    x = rng.standard_normal(BIG, dtype=np.float32)
    cs = [rng.standard_normal(BIG, dtype=np.float32) for _ in range(3)]
    for c in cs:
        await runner.run(stream, {0: x, 1: c})
    assert stats(engine).entries == 3
    capacity(8)
    assert stats(engine).entries == 3
    await runner.run(stream, {0: x, 1: cs[0]})          # cs[0] is now the most recently used
    capacity(1)
    assert counts(engine)[1:] == (3, 2, 0, 1, cs[0].nbytes)
    out = await runner.run(stream, {0: x, 1: cs[0]})
    np.testing.assert_array_equal(out[3], x + cs[0])
    assert stats(engine).hits == 2


def gated_handler():
    """(entered, gate, handler): the handler sets ``entered``, then returns its input once
    ``gate`` is set, so a test can act while a run waits in it."""
    entered, gate = trio.Event(), trio.Event()

    async def held(a):
        entered.set()
        await gate.wait()
        return a

    return entered, gate, held


async def test_an_entry_evicted_under_a_running_request_stays_until_it_has_submitted(engine, stream, capacity, rng):
    capacity(1)
    entered, gate, held = gated_handler()

    slow = await compile_graph(add_graph(with_handler=True), engine, handlers={"Wildcard": held})
    fast = await compile_graph(add_graph(), engine)
    x = rng.standard_normal(BIG, dtype=np.float32)
    c1, c2 = (rng.standard_normal(BIG, dtype=np.float32) for _ in range(2))
    before = live(engine)
    result = {}
    async with trio.open_nursery() as nursery:
        async def slow_run():
            result.update(await slow.run(stream, {0: x, 1: c1}))

        nursery.start_soon(slow_run)
        await entered.wait()       # the slow run took c1, read x back (freed) and waits in the handler
        assert counts(engine)[1:] == (1, 0, 0, 1, c1.nbytes)
        # c2 evicts c1 from the cache while the slow run still has to submit its Add on c1.
        np.testing.assert_array_equal((await fast.run(stream, {0: x, 1: c2}))[3], x + c2)
        assert counts(engine)[1:] == (2, 1, 0, 1, c2.nbytes)
        assert live(engine) == before + 2 + kept(fast)     # c1 (pinned, out of the cache) and c2
        gate.set()
    np.testing.assert_array_equal(result[3], x + c1)
    assert live(engine) == before + 1 + kept(fast)     # c1 went once the slow run was done with it


async def test_a_cancelled_run_leaves_no_buffer_behind(engine, stream, capacity, rng):
    capacity(64)
    entered, gate, held = gated_handler()

    runner = await compile_graph(add_graph(with_handler=True), engine, handlers={"Wildcard": held})
    x = rng.standard_normal(BIG, dtype=np.float32)
    c = rng.standard_normal(BIG, dtype=np.float32)
    before = live(engine)
    scope = trio.CancelScope()

    async def doomed():
        with scope:
            await runner.run(stream, {0: x, 1: c})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(doomed)
        await entered.wait()       # submitted, x read back, waiting in the handler
        scope.cancel()
    assert scope.cancelled_caught and runner.statistics().runs_finished == 0
    await stream.wait()
    # The entry stays only where its upload is known to have completed.
    assert live(engine) == before + stats(engine).entries
    gate.set()
    out = await runner.run(stream, {0: x, 1: c})
    np.testing.assert_array_equal(out[3], x + c)
    assert stats(engine).entries == 1 and live(engine) == before + 1


async def test_entries_leave_with_their_runtime(rng, capacity):
    capacity(64)
    async with triodnn.open_runtime() as rt:
        engine = await rt.engine()
        runner = await compile_graph(mlp_graph(), engine)
        w = rng.standard_normal((16, 12), dtype=np.float32)
        b = rng.standard_normal(12, dtype=np.float32)
        x = rng.standard_normal((8, 16), dtype=np.float32)
        await runner.run(await engine.stream(), {0: x, 1: w, 2: b})
        assert stats(engine).entries == 2
    assert stats(engine) == ConstantTensorCacheStatistics(0, 0, 0, 0, 0, 0)


# -- runner constants ----------------------------------------------------------------------------


async def test_set_constants_lets_runs_omit_their_ids(engine, stream, capacity, rng):
    capacity(64)
    w = rng.standard_normal((16, 12), dtype=np.float32)
    b = rng.standard_normal(12, dtype=np.float32)
    before = live(engine)
    runner = await compile_graph(mlp_graph(), engine, constants={1: w, 2: b})
    assert sorted(runner.constants) == [1, 2] and live(engine) == before + 2
    w_given = w.copy()
    w[...] = 0                                   # uploaded and awaited: the caller may reuse it
    xs = [rng.standard_normal((8, 16), dtype=np.float32) for _ in range(5)]
    for x in xs[:2]:
        out = await runner.run(stream, {0: x})
        np.testing.assert_allclose(out[5], mlp_reference(x, w_given, b), rtol=1e-5, atol=1e-5)
    async with runner.map([{0: x} for x in xs], stream=stream, max_in_flight=4) as results:
        outs = [out async for out in results]
    for x, out in zip(xs, outs, strict=True):
        np.testing.assert_allclose(out[5], mlp_reference(x, w_given, b), rtol=1e-5, atol=1e-5)
    # The weights went up once, with set_constants; the cache saw nothing. The runner's
    # statistics say where they live: two inputs it holds, in buffers of its own.
    stats = runner.statistics()
    assert stats.uploads == 2 + 2 + 5
    assert (stats.constants, stats.constant_bytes) == (2, w.nbytes + b.nbytes)
    assert counts(engine) == (0, 0, 0, 0, 0, 0)
    # A run may still give its own value for one of them.
    w2 = rng.standard_normal((16, 12), dtype=np.float32)
    out = await runner.run(stream, {0: xs[0], 1: w2})
    np.testing.assert_allclose(out[5], mlp_reference(xs[0], w2, b), rtol=1e-5, atol=1e-5)
    # Replacing: a Tensor of the caller's; the runner's own upload of W goes.
    w_tensor = await Tensor.from_numpy(runner.inputs[1], engine, w2)
    await runner.set_constants({1: w_tensor})
    assert (runner.statistics().constants, runner.statistics().constant_bytes) == (2, b.nbytes)  # W is the caller's
    gc.collect()
    # b, the caller's tensor, the cache's w2, and the buffers kept between requests
    assert live(engine) == before + 2 + 1 + kept(runner)
    out = await runner.run(stream, {0: xs[1]})
    np.testing.assert_allclose(out[5], mlp_reference(xs[1], w2, b), rtol=1e-5, atol=1e-5)
    # None takes a value back: runs must give it again.
    await runner.set_constants({1: None, 2: None})
    gc.collect()
    assert runner.constants == {} and live(engine) == before + 2 + kept(runner)
    assert (runner.statistics().constants, runner.statistics().constant_bytes) == (0, 0)
    with pytest.raises(InvalidArgumentError, match=r"inputs lack graph input ids \[1, 2\]"):
        await runner.run(stream, {0: xs[0]})


async def test_set_constants_rejects_bad_input_and_changes_nothing(engine, rng):
    runner = await compile_graph(mlp_graph(), engine)
    w = rng.standard_normal((16, 12), dtype=np.float32)
    before = live(engine)
    with pytest.raises(InvalidArgumentError, match="constants is list"):
        await runner.set_constants([w])
    with pytest.raises(InvalidArgumentError, match=r"constants name id 7, which is no graph input \[0, 1, 2\]"):
        await runner.set_constants({1: w, 7: w})
    with pytest.raises(ArgumentMismatchError, match=r"constants\[1\] has shape \(12, 16\)"):
        await runner.set_constants({2: np.zeros(12, np.float32), 1: w.T})
    wrong = Tensor(f32(1, [16, 13], "constant"), engine)
    with pytest.raises(ArgumentMismatchError, match=r"constants\[1\] has memory"):
        await runner.set_constants({1: wrong})
    with pytest.raises(InvalidArgumentError, match="constants is list"):
        await compile_graph(mlp_graph(), engine, constants=[w])
    wrong.memory.release()
    assert runner.constants == {} and live(engine) == before


# -- the capacity API and the environment ---------------------------------------------------------


def test_capacity_api_rejects_bad_values(capacity):
    capacity(5)
    for bad in (-1, 1.5, True, "3", None):
        with pytest.raises(InvalidArgumentError, match="capacity .* must be a non-negative integer"):
            set_constant_tensor_cache_capacity("cpu", bad) if bad is not None else set_constant_tensor_cache_capacity(bad)
    with pytest.raises(InvalidArgumentError, match="engine kind 'tpu' must be one of cpu, gpu"):
        set_constant_tensor_cache_capacity("tpu", 3)
    with pytest.raises(InvalidArgumentError, match="names an engine kind but no capacity"):
        set_constant_tensor_cache_capacity("gpu")
    with pytest.raises(InvalidArgumentError, match="engine kind 'tpu'"):
        get_constant_tensor_cache_capacity("tpu")
    with pytest.raises(InvalidArgumentError, match="engine is str"):
        constant_tensor_cache_statistics("cpu")
    with pytest.raises(InvalidArgumentError, match="engine is int"):
        clear_constant_tensor_cache(3)
    assert get_constant_tensor_cache_capacity("cpu") == get_constant_tensor_cache_capacity("GPU") == 5
    capacity("gpu", 7)
    assert (get_constant_tensor_cache_capacity(), get_constant_tensor_cache_capacity("gpu")) == (5, 7)


@pytest.mark.parametrize(("environ", "want"), [
    ({}, {"cpu": 1024, "gpu": 1024}),
    ({"ONEDNN_GRAPH_CONSTANT_TENSOR_CACHE_CAPACITY": "cpu:100;gpu:2048"}, {"cpu": 100, "gpu": 2048}),
    ({"ONEDNN_GRAPH_CONSTANT_TENSOR_CACHE_CAPACITY": "gpu:0"}, {"cpu": 1024, "gpu": 0}),
    ({"TRIODNN_CONSTANT_TENSOR_CACHE_CAPACITY": "64"}, {"cpu": 64, "gpu": 64}),
    ({"TRIODNN_CONSTANT_TENSOR_CACHE_CAPACITY": "cpu:1", "ONEDNN_GRAPH_CONSTANT_TENSOR_CACHE_CAPACITY": "cpu:2"},
     {"cpu": 1, "gpu": 1024}),
    # A malformed value is ignored, whole: the next variable decides.
    ({"TRIODNN_CONSTANT_TENSOR_CACHE_CAPACITY": "cpu:1;tpu:2", "DNNL_GRAPH_CONSTANT_TENSOR_CACHE_CAPACITY": "3"},
     {"cpu": 3, "gpu": 3}),
    ({"TRIODNN_CONSTANT_TENSOR_CACHE_CAPACITY": "-5"}, {"cpu": 1024, "gpu": 1024}),
    ({"TRIODNN_CONSTANT_TENSOR_CACHE_CAPACITY": "lots"}, {"cpu": 1024, "gpu": 1024}),
    # oneDNN's deprecated switch: 0 disables, a capacity variable still wins for the kinds it names.
    ({"ONEDNN_GRAPH_CONSTANT_TENSOR_CACHE": "0"}, {"cpu": 0, "gpu": 0}),
    ({"DNNL_GRAPH_CONSTANT_TENSOR_CACHE": "1"}, {"cpu": 1024, "gpu": 1024}),
    ({"ONEDNN_GRAPH_CONSTANT_TENSOR_CACHE": "0", "TRIODNN_CONSTANT_TENSOR_CACHE_CAPACITY": "gpu:8"},
     {"cpu": 0, "gpu": 8}),
])
def test_capacities_from_env(environ, want):
    assert capacities_from_env(environ) == want


_CHILD = """
import json, triodnn
first = [triodnn.get_constant_tensor_cache_capacity(k) for k in ("cpu", "gpu")]
triodnn.set_constant_tensor_cache_capacity("gpu", 3)
print(json.dumps(first + [triodnn.get_constant_tensor_cache_capacity("gpu")]))
"""


def test_the_environment_is_read_at_first_use_and_the_api_wins():
    environ = {k: v for k, v in os.environ.items() if k not in CAPACITY_ENV_VARS + SWITCH_ENV_VARS}
    environ["TRIODNN_CONSTANT_TENSOR_CACHE_CAPACITY"] = "cpu:12;gpu:34"
    done = subprocess.run([sys.executable, "-c", _CHILD], env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [12, 34, 3]
