"""The process-global compiled-partition cache: hits and misses of ``Partition.compile``, one
compile for concurrent requests, the capacity API and env vars, LRU eviction, failures and
cancellation, capacity 0, entries leaving with their runtime, and the key as a value.

The cache outlives tests and trio runs, so every test starts from an emptied cache (the
``fresh`` fixture) and asserts on deltas of ``triodnn.compiled_partition_cache_statistics()``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import attrs
import numpy as np
import pytest
import trio
import trio.testing

import triodnn
from triodnn.actors import COMPILED_PARTITION_CAPACITY_ENV_VARS, CacheStatistics, capacity_from_env
from triodnn.graph import Graph, LogicalTensor, Op, Tensor, _compiled_partition
from triodnn.graph._compiled_partition_key import CompiledPartitionKey, normalise_attr

ENV_VARS = (
    "TRIODNN_COMPILED_PARTITION_CACHE_CAPACITY",
    "ONEDNN_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY",
    "DNNL_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY",
)
PRIMITIVE_ENV_VARS = (
    "TRIODNN_PRIMITIVE_CACHE_CAPACITY",
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY",
    "DNNL_PRIMITIVE_CACHE_CAPACITY",
)
COUNTERS = ("hits", "misses", "evictions", "coalesced_waits", "failed_builds")
REQUESTS = ("hits", "misses", "coalesced_waits")


def stats() -> triodnn.CompiledPartitionCacheStatistics:
    return triodnn.compiled_partition_cache_statistics()


def delta(before, after, names=COUNTERS) -> dict[str, int]:
    return {name: getattr(after, name) - getattr(before, name) for name in names}


def moved(**changes) -> dict[str, int]:
    return {name: changes.get(name, 0) for name in COUNTERS}


def requests(before, after) -> int:
    """Primitive-cache requests between two primitive statistics snapshots."""
    return sum(delta(before, after, REQUESTS).values())


def f32(i, shape, **kw):
    return LogicalTensor(i, "f32", shape, layout_type=kw.pop("layout_type", "strided"), **kw)


def mlp_partition(fpmath_mode: str = "strict"):
    x, w, b = f32(0, [8, 16]), f32(1, [16, 12], property_type="constant"), f32(2, [12])
    g = Graph("cpu", fpmath_mode)
    g.add_op(Op(0, "MatMul", [x, w], [f32(3, [8, 12])]))
    g.add_op(Op(1, "BiasAdd", [f32(3, [8, 12]), b], [f32(4, [8, 12])]))
    g.add_op(Op(2, "ReLU", [f32(4, [8, 12])], [f32(5, [8, 12])]))
    (p,) = g.get_partitions()
    return p


def relu_partition(n: int = 4):
    g = Graph("cpu")
    g.add_op(Op(0, "ReLU", [f32(0, [n])], [f32(1, [n])]))
    (p,) = g.get_partitions()
    return p


def ints(rng, shape):
    return rng.integers(-4, 5, shape).astype(np.float32)


async def run_mlp(cp, engine, rng) -> None:
    x, w, b = ints(rng, (8, 16)), ints(rng, (16, 12)), ints(rng, (12,))
    ins = [await Tensor.from_numpy(lt, engine, a) for lt, a in zip(cp.inputs, (x, w, b))]
    out = Tensor(cp.outputs[0], engine)
    await cp.execute(await engine.stream(), ins, [out])
    np.testing.assert_array_equal(await out.to_numpy(), np.maximum(x @ w + b, 0))


@pytest.fixture
def fresh():
    """``fresh(capacity=1024)``: empty the compiled-partition cache, then set ``capacity``; returns
    the statistics right after. The recorded capacity comes back afterwards, via 0."""
    recorded = triodnn.get_compiled_partition_cache_capacity()

    def reset(capacity: int = 1024) -> triodnn.CompiledPartitionCacheStatistics:
        triodnn.set_compiled_partition_cache_capacity(0)
        triodnn.set_compiled_partition_cache_capacity(capacity)
        snapshot = stats()
        assert (snapshot.size, snapshot.capacity, snapshot.in_flight_builds) == (0, capacity, 0)
        return snapshot

    yield reset
    triodnn.set_compiled_partition_cache_capacity(0)
    triodnn.set_compiled_partition_cache_capacity(recorded)


@pytest.fixture
def fresh_primitives():
    """Empty the primitive cache for the test; its capacity comes back afterwards."""
    recorded = triodnn.get_primitive_cache_capacity()
    triodnn.set_primitive_cache_capacity(0)
    triodnn.set_primitive_cache_capacity(recorded)
    yield triodnn.primitive_cache_statistics()
    triodnn.set_primitive_cache_capacity(recorded)


@pytest.fixture
def compiles(monkeypatch):
    """Counts the real compiles (``compile_partition`` calls); ``compiles.gate``, when set to a
    ``trio.Event``, holds every compile until it is set; ``compiles.error`` makes them raise."""

    class Counter:
        calls = 0
        gate: trio.Event | None = None
        error: BaseException | None = None

    counter = Counter()
    real = _compiled_partition.compile_partition

    async def counting(*args):
        counter.calls += 1
        if counter.gate is not None:
            await counter.gate.wait()
        if counter.error is not None:
            raise counter.error
        return await real(*args)

    monkeypatch.setattr(_compiled_partition, "compile_partition", counting)
    return counter


# -- hits ----------------------------------------------------------------------------------------


async def test_second_compile_of_a_partition_returns_the_same_object(fresh, engine, rng):
    s0 = fresh()
    p = mlp_partition()
    cp1 = await p.compile(engine)
    s1 = stats()
    assert delta(s0, s1) == moved(misses=1) and s1.size == 1
    prims = triodnn.primitive_cache_statistics()
    cp2 = await p.compile(engine)
    assert cp2 is cp1  # the cached CompiledPartition itself: executions allocate their own temporaries
    assert delta(s1, stats()) == moved(hits=1)
    assert requests(prims, triodnn.primitive_cache_statistics()) == 0  # no primitive asked for
    await run_mlp(cp2, engine, rng)
    await run_mlp(cp1, engine, rng)


async def test_explicit_ports_equal_to_the_declared_ones_hit(fresh, engine):
    s0 = fresh()
    p = mlp_partition()
    cp = await p.compile(engine)
    again = await p.compile(engine, list(p.input_ports), list(p.output_ports))
    assert again is cp
    assert delta(s0, stats()) == moved(misses=1, hits=1)


async def test_equivalent_partition_of_a_rebuilt_graph_hits_with_its_own_partition(fresh, engine, rng):
    s0 = fresh()
    p1, p2 = mlp_partition(), mlp_partition()
    cp1 = await p1.compile(engine)
    cp2 = await p2.compile(engine)
    assert delta(s0, stats()) == moved(misses=1, hits=1)
    # a shallow copy: the caller's partition, the cached plan and primitives
    assert cp2 is not cp1 and cp2.partition is p2 and cp1.partition is p1
    assert cp2.engine is cp1.engine and (cp2.inputs, cp2.outputs) == (cp1.inputs, cp1.outputs)
    assert all(a is b for a, b in zip(cp2.primitives, cp1.primitives, strict=True))
    await run_mlp(cp2, engine, rng)


# -- misses ----------------------------------------------------------------------------------------


async def test_different_input_shapes_miss_and_equal_ones_hit(fresh, engine, rng):
    s0 = fresh()
    p = mlp_partition()
    cp = await p.compile(engine)
    small = [f32(0, [3, 16]), f32(1, [16, 5], property_type="constant"), f32(2, [5])]
    cp_small = await p.compile(engine, small, None)
    assert cp_small is not cp and cp_small.outputs[0].shape == (3, 5)
    assert delta(s0, stats()) == moved(misses=2)
    again = await p.compile(engine, [attrs.evolve(lt) for lt in small], None)  # equal, not identical
    assert again is cp_small
    strided = [f32(0, [3, 16], strides=[1, 3]), *small[1:]]  # same shape, another layout
    assert await p.compile(engine, strided, None) is not cp_small
    assert delta(s0, stats()) == moved(misses=3, hits=1) and stats().size == 3


async def test_another_engine_misses_and_reuses_the_primitive_builds(fresh, rt, rng):
    s0 = fresh()
    e1, e2 = await rt.engine(), await rt.engine()
    assert e1.identity != e2.identity  # one device, two contexts
    p = mlp_partition()
    cp1 = await p.compile(e1)
    prims = triodnn.primitive_cache_statistics()
    cp2 = await p.compile(e2)
    assert cp2 is not cp1 and cp2.engine is e2 and cp1.engine is e1
    assert delta(s0, stats()) == moved(misses=2) and stats().size == 2
    # primitive implementations are context-independent: the second compile only hits
    p_delta = delta(prims, triodnn.primitive_cache_statistics(), REQUESTS)
    assert p_delta["misses"] == 0 and p_delta["hits"] == len(cp2.primitives)
    assert await p.compile(e1) is cp1 and await p.compile(e2) is cp2
    await run_mlp(cp2, e2, rng)


async def test_another_fpmath_mode_misses(fresh, engine):
    s0 = fresh()
    strict, bf16 = mlp_partition("strict"), mlp_partition("bf16")
    cp_strict, cp_bf16 = await strict.compile(engine), await bf16.compile(engine)
    assert cp_bf16 is not cp_strict and cp_bf16.partition is bf16
    assert delta(s0, stats()) == moved(misses=2) and stats().size == 2
    assert await mlp_partition("bf16").compile(engine) is not cp_strict
    assert delta(s0, stats()) == moved(misses=2, hits=1)


# -- one compile for concurrent requests -------------------------------------------------------------


async def test_fifty_concurrent_compiles_share_one(fresh, fresh_primitives, engine, compiles, rng):
    s0 = fresh()
    p0 = fresh_primitives
    p = mlp_partition()
    results = []

    async def one():
        results.append(await p.compile(engine))

    async with trio.open_nursery() as nursery:
        for _ in range(50):
            nursery.start_soon(one)

    assert len(results) == 50 and all(cp is results[0] for cp in results)
    assert compiles.calls == 1
    s1 = stats()
    # every request looked up before the compile could finish: one miss, 49 joins
    assert delta(s0, s1) == moved(misses=1, coalesced_waits=49)
    assert (s1.size, s1.in_flight_builds) == (1, 0)
    # one compile's worth of primitive requests, each a miss of the emptied primitive cache
    cp = results[0]
    p1 = triodnn.primitive_cache_statistics()
    assert requests(p0, p1) == len(cp.primitives) >= 1
    distinct = len({prim.desc for prim in cp.primitives})
    assert p1.misses - p0.misses == distinct
    await run_mlp(cp, engine, rng)


# -- capacity API and env vars ------------------------------------------------------------------------


def test_statistics_are_a_frozen_record(fresh):
    s = fresh(7)
    assert isinstance(s, triodnn.CompiledPartitionCacheStatistics) and isinstance(s, CacheStatistics)
    assert not isinstance(s, triodnn.PrimitiveCacheStatistics)
    assert [f.name for f in attrs.fields(type(s))] == [
        "size", "capacity", "hits", "misses", "evictions", "coalesced_waits", "in_flight_builds",
        "failed_builds", "builds"]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        s.hits = 3


def test_capacity_round_trips_and_is_independent_of_the_primitive_cache(fresh):
    fresh()
    primitive_capacity = triodnn.get_primitive_cache_capacity()
    for capacity in (0, 1, 17, 1024, 2**40):
        triodnn.set_compiled_partition_cache_capacity(capacity)
        assert triodnn.get_compiled_partition_cache_capacity() == capacity == stats().capacity
        assert triodnn.get_primitive_cache_capacity() == primitive_capacity


@pytest.mark.parametrize("bad", [-1, 1.5, "8", True, None])
def test_bad_capacity_is_refused_and_changes_nothing(fresh, bad):
    fresh(5)
    before = stats()
    with pytest.raises(triodnn.InvalidArgumentError, match=f"capacity {re.escape(repr(bad))} must"):
        triodnn.set_compiled_partition_cache_capacity(bad)
    assert stats() == before


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, 1024),
        ({"TRIODNN_COMPILED_PARTITION_CACHE_CAPACITY": "7"}, 7),
        ({"ONEDNN_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY": "9"}, 9),
        ({"DNNL_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY": "11"}, 11),
        ({"DNNL_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY": "0"}, 0),
        ({"TRIODNN_COMPILED_PARTITION_CACHE_CAPACITY": "7", "ONEDNN_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY": "9",
          "DNNL_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY": "11"}, 7),
        ({"DNNL_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY": "11",
          "ONEDNN_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY": "9"}, 9),
        ({"TRIODNN_COMPILED_PARTITION_CACHE_CAPACITY": "-1",
          "DNNL_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY": "11"}, 11),
        ({"TRIODNN_COMPILED_PARTITION_CACHE_CAPACITY": "lots"}, 1024),
        # the primitive cache's variables are not this cache's
        ({"TRIODNN_PRIMITIVE_CACHE_CAPACITY": "5", "DNNL_PRIMITIVE_CACHE_CAPACITY": "6",
          "DNNL_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY_": "8"}, 1024),
    ],
)
def test_capacity_from_env(environ, expected):
    assert capacity_from_env(environ, names=COMPILED_PARTITION_CAPACITY_ENV_VARS) == expected
    assert COMPILED_PARTITION_CAPACITY_ENV_VARS == ENV_VARS


def test_capacity_from_env_reads_os_environ_by_default(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    assert capacity_from_env(names=ENV_VARS) == 1024
    monkeypatch.setenv("DNNL_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY", "12")
    assert capacity_from_env(names=ENV_VARS) == 12
    monkeypatch.setenv("TRIODNN_COMPILED_PARTITION_CACHE_CAPACITY", "13")
    assert capacity_from_env(names=ENV_VARS) == 13


_CHILD = textwrap.dedent(
    """
    import json, os, sys
    import triodnn
    if len(sys.argv) > 1:
        triodnn.set_compiled_partition_cache_capacity(int(sys.argv[1]))
    first = triodnn.get_compiled_partition_cache_capacity()
    # read once, at first use: a later change of the variables does nothing
    os.environ["TRIODNN_COMPILED_PARTITION_CACHE_CAPACITY"] = "99"
    later = triodnn.get_compiled_partition_cache_capacity()
    s = triodnn.compiled_partition_cache_statistics()
    print(json.dumps([first, later, s.capacity, s.size, triodnn.get_primitive_cache_capacity()]))
    """
)


def child_capacity(env: dict[str, str], *args: str) -> list[int]:
    environ = {k: v for k, v in os.environ.items() if k not in ENV_VARS + PRIMITIVE_ENV_VARS}
    environ.update(env)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *args], env=environ, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_global_cache_takes_its_capacity_from_env_at_first_use():
    assert child_capacity({}) == [1024, 1024, 1024, 0, 1024]
    assert child_capacity({"DNNL_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY": "11",
                           "ONEDNN_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY": "9",
                           "DNNL_PRIMITIVE_CACHE_CAPACITY": "5"}) == [9, 9, 9, 0, 5]
    # the capacity API wins over the variables
    assert child_capacity({name: "7" for name in ENV_VARS}, "3") == [3, 3, 3, 0, 1024]


# -- LRU eviction ---------------------------------------------------------------------------------------


async def test_least_recently_used_is_evicted_first(fresh, engine):
    s0 = fresh(2)
    p = relu_partition()

    async def compile_n(n):
        return await p.compile(engine, [f32(0, [n])], None)

    a, b = await compile_n(4), await compile_n(5)
    assert await compile_n(4) is a  # a is now the most recently used
    c = await compile_n(6)  # evicts b
    s1 = stats()
    assert delta(s0, s1) == moved(misses=3, hits=1, evictions=1) and s1.size == 2
    assert await compile_n(4) is a and await compile_n(6) is c
    assert delta(s1, stats()) == moved(hits=2)
    b2 = await compile_n(5)  # b was gone: compiled again, evicting a (c was used after a)
    assert b2 is not b
    assert delta(s1, stats()) == moved(hits=2, misses=1, evictions=1)
    assert await compile_n(6) is c and await compile_n(5) is b2
    # lowering the capacity keeps the most recently used
    triodnn.set_compiled_partition_cache_capacity(1)
    s2 = stats()
    assert (s2.size, s2.evictions - s1.evictions) == (1, 2)
    assert await compile_n(5) is b2


# -- failures -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error, raised",
    [
        (triodnn.UnsupportedError("nope"), triodnn.UnsupportedError),
        (RuntimeError("nope"), triodnn.BuildError),
        # a primitive creation failing inside compile's nursery: the group of one is unwrapped
        (ExceptionGroup("x", [triodnn.InvalidArgumentError("nope")]), triodnn.InvalidArgumentError),
    ],
)
async def test_failed_compile_reaches_every_waiter_and_leaves_nothing(fresh, engine, compiles, error, raised):
    s0 = fresh()
    p = mlp_partition()
    compiles.gate, compiles.error = trio.Event(), error
    errors = []

    async def waiter():
        with pytest.raises(raised, match="compiling the partition failed: (RuntimeError: )?nope") as info:
            await p.compile(engine)
        errors.append(info.value)

    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert stats().in_flight_builds == 1
        compiles.gate.set()

    assert compiles.calls == 1 and len(errors) == 6
    assert len({id(e) for e in errors}) == 6  # a fresh exception for each waiter
    assert len({id(e.__cause__) for e in errors}) == 1  # all chained to the one failure
    s1 = stats()
    assert delta(s0, s1) == moved(misses=1, coalesced_waits=5, failed_builds=1)
    assert (s1.size, s1.in_flight_builds) == (0, 0)
    # the failure was not cached: the next compile compiles, and succeeds
    compiles.gate = compiles.error = None
    cp = await p.compile(engine)
    assert compiles.calls == 2 and await p.compile(engine) is cp
    assert delta(s1, stats()) == moved(misses=1, hits=1)
    # ``builds``: compilations run, one per call of compile_partition (the failed one too).
    assert stats().builds - s0.builds == compiles.calls == 2


async def test_unsupported_partition_compile_fails_every_time(fresh, engine):
    """A vector product into a strided output: lowering refuses it (UnsupportedError)."""
    s0 = fresh()
    g = Graph("cpu")
    g.add_op(Op(0, "MatMul", [f32(0, [2, 4]), f32(1, [4])], [f32(2, [2], strides=[2])]))
    (p,) = g.get_partitions()
    for attempt in (1, 2):
        with pytest.raises(triodnn.UnsupportedError, match="compiling the partition failed: .*vector product"):
            await p.compile(engine)
        s = stats()
        assert delta(s0, s) == moved(misses=attempt, failed_builds=attempt) and s.size == 0


# -- cancellation ---------------------------------------------------------------------------------------


async def test_cancelled_requesters_do_not_cancel_the_compile(fresh, engine, compiles, rng):
    s0 = fresh()
    p = mlp_partition()
    compiles.gate = trio.Event()
    scopes = [trio.CancelScope() for _ in range(5)]

    async def waiter(scope):
        with scope:
            await p.compile(engine)
        assert scope.cancelled_caught

    async with trio.open_nursery() as nursery:
        for scope in scopes:
            nursery.start_soon(waiter, scope)
        await trio.testing.wait_all_tasks_blocked()
        for scope in scopes:
            scope.cancel()
    assert stats().in_flight_builds == 1  # every requester gone, the compile still waits
    compiles.gate.set()
    with trio.fail_after(60):
        while stats().in_flight_builds:
            await trio.sleep(0.01)
    s1 = stats()
    assert delta(s0, s1) == moved(misses=1, coalesced_waits=4) and s1.size == 1
    cp = await p.compile(engine)
    assert compiles.calls == 1 and delta(s1, stats()) == moved(hits=1)
    await run_mlp(cp, engine, rng)


# -- capacity 0 -------------------------------------------------------------------------------------------


async def test_capacity_zero_disables_the_cache(fresh, engine, compiles):
    s0 = fresh(0)
    p = mlp_partition()
    first, second = await p.compile(engine), await p.compile(engine)
    assert first is not second and compiles.calls == 2
    results = []

    async def one():
        results.append(await p.compile(engine))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(one)
    assert compiles.calls == 5 and len({id(cp) for cp in results}) == 3  # no sharing either
    s1 = stats()
    assert delta(s0, s1) == moved(misses=5) and (s1.size, s1.capacity) == (0, 0)


# -- entries leave with their runtime -------------------------------------------------------------------


def test_runtime_shutdown_drops_the_entries_of_its_engines(fresh):
    s0 = fresh()

    async def main():
        async with triodnn.open_runtime() as rt:
            engine = await rt.engine()
            cp = await mlp_partition().compile(engine)
            assert await mlp_partition().compile(engine) is not cp  # a copy for another partition
            assert stats().size == 1
        assert engine.closed

    trio.run(main)
    s1 = stats()
    assert s1.size == 0 and delta(s0, s1) == moved(misses=1, hits=1)  # dropped, not evicted


# -- the key ----------------------------------------------------------------------------------------------


def test_attribute_normalisation_is_exact_and_hashable():
    assert normalise_attr([1, 2]) == normalise_attr((1, 2))
    assert normalise_attr(True) != normalise_attr(1) != normalise_attr(1.0)
    assert normalise_attr(0.0) != normalise_attr(-0.0)
    assert normalise_attr(float("nan")) == normalise_attr(float("nan"))
    assert normalise_attr([0.5, [1, "a"]]) == ("seq", (("float", (0.5).hex()), ("seq", (("int", 1), ("str", "a")))))
    hash(normalise_attr([1.5, [2, 3], "x", None]))


def op_key(*ops, fpmath_mode="strict"):
    class FakeEngine:
        identity = "engine"

    class FakePartition:
        pass

    p = FakePartition()
    p.ops, p.fpmath_mode = ops, fpmath_mode
    return CompiledPartitionKey.of(p, FakeEngine(), [f32(0, [4])], [f32(1, [4])])


def test_key_is_a_value_of_ops_ports_engine_and_fpmath_mode():
    def elu(alpha, name="", op_id=0):
        return Op(op_id, "Elu", [f32(0, [4])], [f32(1, [4])], {"alpha": alpha}, name)

    key = op_key(elu(1.0))
    assert key == op_key(elu(1.0, name="renamed")) and hash(key) == hash(op_key(elu(1.0)))
    assert key != op_key(elu(-1.0)) and key != op_key(elu(1.0, op_id=3))
    assert op_key(elu(0.0)) != op_key(elu(-0.0))
    assert key != op_key(elu(1.0), fpmath_mode="bf16")
    assert key != op_key(Op(0, "Elu", [f32(0, [4])], [f32(1, [5])], {"alpha": 1.0}))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        key.fpmath_mode = "any"
