"""The process-global primitive cache: capacity API and env vars, LRU eviction, one build per key
across engines, tasks and OS threads, failures and cancellation, a stress run, verbose lines.

These restate oneDNN's own primitive cache tests. The cache outlives tests and trio runs, so every
test starts from an emptied cache (the ``fresh_cache`` fixture) and asserts on deltas of
``triodnn.primitive_cache_statistics()``.
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import os
import random
import re
import subprocess
import sys
import textwrap
import threading

import attrs
import numpy as np
import pytest
import trio
import trio.testing
from _faulty_kinds import BrokenDesc, RaisingDesc

import triodnn
from triodnn import EltwiseDesc, MemoryDesc
from triodnn.actors import CacheActor, Compiler, PrimitiveCache, ReplySlot, capacity_from_env
from triodnn.kernels import KernelSpec, c_float, eltwise, tolerance

ENV_VARS = (
    "TRIODNN_PRIMITIVE_CACHE_CAPACITY",
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY",
    "DNNL_PRIMITIVE_CACHE_CAPACITY",
)
COUNTERS = ("hits", "misses", "evictions", "coalesced_waits", "failed_builds")
GATE_TIMEOUT = 30.0  # a gated build thread gives up after this, so a broken test cannot hang


def stats() -> triodnn.PrimitiveCacheStatistics:
    return triodnn.primitive_cache_statistics()


def delta(before, after) -> dict[str, int]:
    """How the cumulative counters moved between two snapshots."""
    return {name: getattr(after, name) - getattr(before, name) for name in COUNTERS}


def moved(**changes) -> dict[str, int]:
    """The expected ``delta``: every counter not named stays put."""
    return {name: changes.get(name, 0) for name in COUNTERS}


def relu(n: int, alpha: float = 0.0) -> EltwiseDesc:
    """A cheap distinct key per ``(n, alpha)``.

    Tests that need many keys take them from n = 301 up: every test empties the primitive cache and
    opens its own engine, so none sees another's entries, while a cold PoCL disk cache builds each
    source once for the file instead of once per test."""
    return EltwiseDesc("relu", MemoryDesc((n,)), alpha=alpha)


def built(engine) -> tuple[int, int]:
    s = engine.statistics()
    return s.programs_built, s.programs_loaded


@pytest.fixture
def fresh_cache():
    """``fresh_cache(capacity=1024)``: empty the global cache (capacity 0), then set ``capacity``;
    returns the statistics right after. The recorded capacity comes back afterwards, via 0, so
    no entry of this test reaches the next one."""
    recorded = triodnn.get_primitive_cache_capacity()

    def reset(capacity: int = 1024) -> triodnn.PrimitiveCacheStatistics:
        triodnn.set_primitive_cache_capacity(0)
        triodnn.set_primitive_cache_capacity(capacity)
        snapshot = stats()
        assert (snapshot.size, snapshot.capacity, snapshot.in_flight_builds) == (0, capacity, 0)
        return snapshot

    yield reset
    triodnn.set_primitive_cache_capacity(0)
    triodnn.set_primitive_cache_capacity(recorded)


async def run_relu(engine, primitive, x: np.ndarray) -> np.ndarray:
    stream = await engine.stream()
    src = await engine.from_numpy(x)
    dst = engine.memory(src.desc)
    await stream.execute(primitive, {"src": src, "dst": dst})
    return await dst.to_numpy()


# -- test descriptors ----------------------------------------------------------------------------


@attrs.frozen
class GatedDesc:
    """relu(alpha=0.5) over ``n`` elements whose source generation, which runs in the engine's
    build thread for builds and binary loads alike, waits for ``gate``; ``started`` says it began."""

    n: int
    gate: threading.Event = attrs.field(eq=False, repr=False)
    started: threading.Event = attrs.field(eq=False, repr=False)

    kind = "test_gated"

    @property
    def inner(self) -> EltwiseDesc:
        return relu(self.n, alpha=0.5)

    @property
    def label(self) -> str:
        return f"test_gated:{self.n}"

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        return self.inner.arg_descs

    def generate(self, config) -> KernelSpec:
        self.started.set()
        if not self.gate.wait(GATE_TIMEOUT):
            raise RuntimeError("the test never opened the gate")
        return triodnn.kernels.generate(self.inner, config)


# A test kind, declared in the op registry like any other (its generate is the method).
triodnn.kernels.register(GatedDesc, generate=GatedDesc.generate)


def gated(n: int) -> tuple[GatedDesc, threading.Event, threading.Event]:
    gate, started = threading.Event(), threading.Event()
    return GatedDesc(n, gate, started), gate, started




# -- 1. capacity from the environment ------------------------------------------------------------


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, 1024),
        ({"TRIODNN_PRIMITIVE_CACHE_CAPACITY": "7"}, 7),
        ({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "9"}, 9),
        ({"DNNL_PRIMITIVE_CACHE_CAPACITY": "11"}, 11),
        ({"TRIODNN_PRIMITIVE_CACHE_CAPACITY": "0"}, 0),
        ({"DNNL_PRIMITIVE_CACHE_CAPACITY": "1000000"}, 1000000),
        # first set one wins, in the order TRIODNN_, ONEDNN_, DNNL_
        ({"TRIODNN_PRIMITIVE_CACHE_CAPACITY": "7", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "9",
          "DNNL_PRIMITIVE_CACHE_CAPACITY": "11"}, 7),
        ({"DNNL_PRIMITIVE_CACHE_CAPACITY": "11", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "9"}, 9),
        ({"DNNL_PRIMITIVE_CACHE_CAPACITY": "11", "TRIODNN_PRIMITIVE_CACHE_CAPACITY": "7"}, 7),
        ({"TRIODNN_PRIMITIVE_CACHE_CAPACITY": "0", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "9"}, 0),
        # invalid values are skipped: the next variable decides, else the default
        ({"TRIODNN_PRIMITIVE_CACHE_CAPACITY": "lots", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "9"}, 9),
        ({"TRIODNN_PRIMITIVE_CACHE_CAPACITY": "-1", "DNNL_PRIMITIVE_CACHE_CAPACITY": "11"}, 11),
        ({"TRIODNN_PRIMITIVE_CACHE_CAPACITY": "", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1.5",
          "DNNL_PRIMITIVE_CACHE_CAPACITY": "3"}, 3),
        ({"TRIODNN_PRIMITIVE_CACHE_CAPACITY": "0x10"}, 1024),
        ({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1e3"}, 1024),
        ({"DNNL_PRIMITIVE_CACHE_CAPACITY": "-5"}, 1024),
        ({"TRIODNN_PRIMITIVE_CACHE_CAPACITY": "abc", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "-2",
          "DNNL_PRIMITIVE_CACHE_CAPACITY": "seven"}, 1024),
        # names are exact: look-alikes are not read
        ({"TRIODNN_PRIMITIVE_CACHE_CAP": "5", "primitive_cache_capacity": "6",
          "DNNL_PRIMITIVE_CACHE_CAPACITY_": "8"}, 1024),
    ],
)
def test_capacity_from_env(environ, expected):
    assert capacity_from_env(environ) == expected


def test_capacity_from_env_reads_os_environ_by_default(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    assert capacity_from_env() == 1024
    monkeypatch.setenv("DNNL_PRIMITIVE_CACHE_CAPACITY", "12")
    assert capacity_from_env() == 12
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "13")
    assert capacity_from_env() == 13


_CHILD = textwrap.dedent(
    """
    import json, os, sys
    import triodnn
    if len(sys.argv) > 1:
        triodnn.set_primitive_cache_capacity(int(sys.argv[1]))
    first = triodnn.get_primitive_cache_capacity()
    # read once, at first use: a later change of the variables does nothing
    os.environ["TRIODNN_PRIMITIVE_CACHE_CAPACITY"] = "99"
    later = triodnn.get_primitive_cache_capacity()
    s = triodnn.primitive_cache_statistics()
    print(json.dumps([first, later, s.capacity, s.size]))
    """
)


def child_capacity(env: dict[str, str], *args: str) -> list[int]:
    environ = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    environ.update(env)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *args], env=environ, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, 1024),
        ({"DNNL_PRIMITIVE_CACHE_CAPACITY": "11"}, 11),
        ({"TRIODNN_PRIMITIVE_CACHE_CAPACITY": "7", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "9",
          "DNNL_PRIMITIVE_CACHE_CAPACITY": "11"}, 7),
        ({"TRIODNN_PRIMITIVE_CACHE_CAPACITY": "none", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "9"}, 9),
        ({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"}, 0),
    ],
)
def test_global_cache_takes_its_capacity_from_env_at_first_use(env, expected):
    assert child_capacity(env) == [expected, expected, expected, 0]


def test_capacity_api_wins_over_env_vars():
    env = {name: "7" for name in ENV_VARS}
    assert child_capacity(env, "3") == [3, 3, 3, 0]
    assert child_capacity({}, "0") == [0, 0, 0, 0]


# -- 2. bad capacities -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 1.5, "8", True, False, None, 8.0])
def test_bad_capacity_is_refused_and_changes_nothing(fresh_cache, bad):
    fresh_cache(5)
    before = stats()
    with pytest.raises(triodnn.InvalidArgumentError, match=f"capacity {re.escape(repr(bad))} must"):
        triodnn.set_primitive_cache_capacity(bad)
    assert triodnn.get_primitive_cache_capacity() == 5
    assert stats() == before


def test_capacity_round_trips(fresh_cache):
    fresh_cache()
    for capacity in (0, 1, 17, 1024, 2**40):
        triodnn.set_primitive_cache_capacity(capacity)
        assert triodnn.get_primitive_cache_capacity() == capacity == stats().capacity


# -- 3. capacity changes and sizes -----------------------------------------------------------------


async def test_capacity_bounds_the_size_and_lowering_it_evicts(fresh_cache, engine, build):
    s0 = fresh_cache(8)
    b0 = built(engine)
    await build({n: relu(n) for n in range(301, 309)})
    s1 = stats()
    assert (s1.size, s1.in_flight_builds) == (8, 0)
    assert delta(s0, s1) == moved(misses=8)
    assert built(engine) == (b0[0] + 8, b0[1])

    triodnn.set_primitive_cache_capacity(0)  # empties the cache
    s2 = stats()
    assert (s2.size, s2.capacity) == (0, 0)
    assert delta(s1, s2) == moved(evictions=8)

    triodnn.set_primitive_cache_capacity(10)
    # 17 distinct, keys other tests of this file build too (301-325): each n is a program of its
    # own, built once per file with a cold PoCL cache.
    await build({n: relu(n) for n in range(309, 326)})
    s3 = stats()
    assert (s3.size, s3.capacity, s3.in_flight_builds) == (10, 10, 0)
    assert delta(s2, s3) == moved(misses=17, evictions=7)
    assert built(engine) == (b0[0] + 25, b0[1])


async def test_raising_capacity_keeps_entries_lowering_evicts_the_least_recently_used(
    fresh_cache, engine, build
):
    s0 = fresh_cache(15)
    descs = [relu(n) for n in range(301, 313)]  # 12
    await build(dict(enumerate(descs)))
    for desc in descs:  # hits, in list order: descs[0] is now the least recently used
        await engine.create_primitive(desc)
    s1 = stats()
    assert s1.size == 12
    assert delta(s0, s1) == moved(misses=12, hits=12)

    triodnn.set_primitive_cache_capacity(13)
    assert stats().size == 12 and delta(s1, stats()) == moved()
    triodnn.set_primitive_cache_capacity(10)
    s2 = stats()
    assert (s2.size, s2.capacity) == (10, 10)
    assert delta(s1, s2) == moved(evictions=2)

    b1 = built(engine)
    for desc in descs[2:]:  # the ten most recently used stayed
        await engine.create_primitive(desc)
    assert delta(s2, stats()) == moved(hits=10)
    await engine.create_primitive(descs[1])  # evicted: built again
    assert delta(s2, stats()) == moved(hits=10, misses=1, evictions=1)
    assert built(engine) == (b1[0] + 1, b1[1])


async def test_capacity_zero_disables_the_cache(fresh_cache, engine):
    s0 = fresh_cache(0)
    b0 = built(engine)
    desc = relu(371)
    first = await engine.create_primitive(desc)
    second = await engine.create_primitive(desc)
    s1 = stats()
    assert (s1.size, s1.in_flight_builds) == (0, 0)
    assert delta(s0, s1) == moved(misses=2)
    assert built(engine) == (b0[0] + 2, b0[1])
    assert first.impl == second.impl


# -- 4. LRU order ----------------------------------------------------------------------------------


async def test_least_recently_used_is_evicted_first(fresh_cache, engine):
    s0 = fresh_cache(2)
    b0 = built(engine)
    a, b, c = relu(401), relu(402), relu(403)
    await engine.create_primitive(a)
    await engine.create_primitive(b)
    await engine.create_primitive(a)  # hit: b is now the least recently used
    assert delta(s0, stats()) == moved(misses=2, hits=1)
    await engine.create_primitive(c)  # evicts b
    assert delta(s0, stats()) == moved(misses=3, hits=1, evictions=1)
    await engine.create_primitive(a)  # still there
    assert delta(s0, stats()) == moved(misses=3, hits=2, evictions=1)
    await engine.create_primitive(b)  # gone: built again (and c, now the oldest, goes)
    s1 = stats()
    assert delta(s0, s1) == moved(misses=4, hits=2, evictions=2)
    assert s1.size == 2
    assert built(engine) == (b0[0] + 4, b0[1])
    await engine.create_primitive(a)
    await engine.create_primitive(b)
    assert delta(s1, stats()) == moved(hits=2)


# -- 5. one build for two engines of one device ------------------------------------------------------


async def test_two_engines_of_one_device_share_one_build(fresh_cache, rt, rng):
    s0 = fresh_cache()
    first, second = await rt.engine(), await rt.engine()
    assert first.cl_context.int_ptr != second.cl_context.int_ptr
    desc = relu(1037, alpha=0.125)

    p1 = await first.create_primitive(desc)
    assert built(first) == (1, 0)
    assert delta(s0, stats()) == moved(misses=1)

    p2 = await second.create_primitive(desc)
    assert built(second) == (0, 1)  # loaded from the cached binary, not compiled
    assert delta(s0, stats()) == moved(misses=1, hits=1)
    assert second.statistics().resources == 1

    p3 = await second.create_primitive(desc)
    assert built(second) == (0, 1)  # resources kept: nothing more to load
    assert built(first) == (1, 0)
    assert delta(s0, stats()) == moved(misses=1, hits=2)
    assert stats().size == 1
    assert p1.impl == p2.impl == p3.impl

    x = rng.uniform(-5, 5, 1037).astype(np.float32)
    ref = eltwise.reference("relu", x, alpha=0.125)
    for engine, primitive in ((first, p1), (second, p2), (second, p3)):
        tolerance.check(await run_relu(engine, primitive, x), ref, tolerance.eltwise("relu"))



async def test_tasks_loading_one_cached_binary_on_a_new_engine_share_the_load(fresh_cache, rt, rng):
    """Regression: concurrent hits on an engine without the resources wait on one load; every
    waiter used to need its own reply slot (the second one got outcome.AlreadyUsedError)."""
    first, second = await rt.engine(), await rt.engine()
    desc = relu(1039, alpha=0.25)
    await first.create_primitive(desc)
    primitives = []

    async def create() -> None:
        primitives.append(await second.create_primitive(desc))

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(create)
    assert len(primitives) == 8 and built(second) == (0, 1)
    x = rng.uniform(-5, 5, 1039).astype(np.float32)
    tolerance.check(await run_relu(second, primitives[-1], x), eltwise.reference("relu", x, alpha=0.25),
                    tolerance.eltwise("relu"))

# -- 6. OS threads, each with its own trio run -------------------------------------------------------


def in_threads(count: int, make_desc) -> list:
    """``count`` OS threads, each a trio run with its own runtime and engine, all creating
    ``make_desc(i)`` at once; returns each engine's statistics after its creation.

    The barrier has no timeout: opening an engine is a new OpenCL context, which NVIDIA's driver
    creates one at a time (12 at once took 2.4 s on an idle H200, 11-15 s beside 3 other
    processes doing the same), so under a parallel test run any timeout there was a timed
    assertion. A thread that fails aborts the barrier; the joins below guard against a hang."""
    barrier = threading.Barrier(count)
    results: list = [None] * count
    errors: list[BaseException] = []

    async def one(i: int) -> None:
        with trio.fail_after(60):
            async with triodnn.open_runtime() as rt:
                engine = await rt.engine()
                await trio.to_thread.run_sync(barrier.wait)
                primitive = await engine.create_primitive(make_desc(i))
                results[i] = (primitive.impl, engine.statistics())

    def main(i: int) -> None:
        try:
            trio.run(one, i)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=main, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    if errors:
        raise errors[0]
    return results


def test_threads_creating_distinct_primitives(fresh_cache):
    s0 = fresh_cache()
    results = in_threads(12, lambda i: relu(301 + i))
    s1 = stats()
    assert (s1.size, s1.in_flight_builds) == (12, 0)
    assert delta(s0, s1) == moved(misses=12)
    assert [(r.programs_built, r.programs_loaded) for _, r in results] == [(1, 0)] * 12


def test_threads_creating_one_primitive_build_it_once(fresh_cache):
    s0 = fresh_cache()
    results = in_threads(12, lambda i: relu(521, alpha=0.25))
    s1 = stats()
    d = delta(s0, s1)
    assert (s1.size, s1.in_flight_builds) == (1, 0)
    assert d["misses"] == 1 and d["coalesced_waits"] + d["hits"] == 11
    assert (d["evictions"], d["failed_builds"]) == (0, 0)
    assert sum(r.programs_built for _, r in results) == 1
    assert sum(r.programs_loaded for _, r in results) == 11  # every other context loads the binary
    assert len({impl for impl, _ in results}) == 1


# -- 7. many tasks, few keys ----------------------------------------------------------------------------


async def test_hundred_tasks_ten_keys_ten_builds(fresh_cache, engine):
    s0 = fresh_cache()
    b0 = built(engine)
    descs = [relu(301 + i) for i in range(10)]
    shuffle = random.Random(7)
    orders = [shuffle.sample(descs, len(descs)) for _ in range(100)]
    created: list = []

    async def task(order):
        for desc in order:
            created.append((desc, await engine.create_primitive(desc)))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for order in orders:
                nursery.start_soon(task, order)
    s1 = stats()
    d = delta(s0, s1)
    assert len(created) == 1000 and all(p.desc == desc for desc, p in created)
    assert (s1.size, s1.in_flight_builds) == (10, 0)
    assert d["misses"] == 10 and d["coalesced_waits"] + d["hits"] == 990
    assert (d["evictions"], d["failed_builds"]) == (0, 0)
    assert s1.builds - s0.builds == 10          # what cost time: one build per key
    assert built(engine) == (b0[0] + 10, b0[1])


async def test_builds_count_builds_started_which_a_miss_may_not_start():
    """``builds`` counts the builds cache actors ran; a miss whose runtime closed before its
    build could start is a miss and no build (misses were once read as builds)."""
    cache: PrimitiveCache = PrimitiveCache(8)
    actor: CacheActor = CacheActor(cache)

    async def build():
        return "value"

    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        assert await actor.get("k", build) == ("value", "cache_miss")
        assert await actor.get("k", build) == ("value", "cache_hit")
        actor.close()
    with pytest.raises(triodnn.ClosedError, match="the runtime is closed"):
        await actor.get("other", build)
    s = cache.statistics()
    assert (s.hits, s.misses, s.builds, s.failed_builds, s.in_flight_builds) == (1, 2, 1, 0, 0)


async def test_a_request_queued_as_the_actor_is_cancelled_is_abandoned_not_left_in_flight():
    """A cancellation reaches the actor's receive at once, but a requester that is running
    reaches its own checkpoint later: a request it queues in between was never received. It must
    not stay a build in flight that every later requester of the key, from any run, joins and
    waits on forever (seen on an H200: a timed-out thread left ``in_flight_builds`` at 1)."""
    cache: PrimitiveCache = PrimitiveCache(8)
    actor: CacheActor = CacheActor(cache)
    outcomes: list[str] = []

    async def build():
        return "value"

    async def requester():
        try:
            await actor.get("k", build)
        except triodnn.ClosedError:
            outcomes.append("closed")
        else:
            outcomes.append("built")

    async with trio.open_nursery() as outer:
        with trio.CancelScope() as serving:
            async with trio.open_nursery() as nursery:
                await nursery.start(actor.serve)
                serving.cancel()         # the actor's receive is aborted here, synchronously
                outer.start_soon(requester)
                # The requester queues "k" before the actor task runs again and exits.
    assert outcomes == ["closed"]
    s = cache.statistics()
    assert (s.in_flight_builds, s.size, s.failed_builds) == (0, 0, 0)
    # Another run's requester of the key is not left waiting on the abandoned request.
    other = CacheActor(cache)
    async with trio.open_nursery() as nursery:
        await nursery.start(other.serve)
        assert await other.get("k", build) == ("value", "cache_miss")
        other.close()


async def test_a_build_request_queued_as_the_compiler_is_cancelled_gets_closed_error(engine):
    """The compiler's channel has the same window: a request queued after a cancellation
    stopped the receive gets ``ClosedError``, not a reply slot no one will fill."""
    compiler = Compiler(engine.cl_device, engine.cl_context, None)
    reply = ReplySlot()
    with trio.CancelScope() as serving:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(compiler.serve, nursery)
            await trio.testing.wait_all_tasks_blocked()
            serving.cancel()
            compiler.submit(None, reply)  # queued; the compiler never receives it
    assert reply.filled
    with pytest.raises(triodnn.ClosedError, match="closed before the build started"):
        await reply.get()
    with pytest.raises(triodnn.ClosedError, match="the engine is closed"):
        compiler.submit(None, ReplySlot())


# -- 8. a failed build --------------------------------------------------------------------------------


async def test_failed_build_reaches_every_waiter_and_leaves_nothing(fresh_cache, engine):
    s0 = fresh_cache()
    b0 = built(engine)
    desc = BrokenDesc(701)
    waiters = 6
    errors: list[BaseException] = []

    async def waiter():
        with pytest.raises(triodnn.BuildError, match="creating the primitive failed") as info:
            await engine.create_primitive(desc)
        errors.append(info.value)

    async with trio.open_nursery() as nursery:
        for _ in range(waiters):
            nursery.start_soon(waiter)

    assert len(errors) == waiters
    assert len({id(e) for e in errors}) == waiters  # a fresh exception for each waiter
    causes = {id(e.__cause__) for e in errors}
    assert len(causes) == 1
    cause = errors[0].__cause__
    assert type(cause) is triodnn.BuildError and cause not in errors
    assert "OpenCL build of kernel 'broken' (test_broken:701) failed" in str(cause)
    assert all(str(cause) in str(e) for e in errors)
    s1 = stats()
    assert (s1.size, s1.in_flight_builds) == (0, 0)
    # all six asked in one scheduling batch, before the build could finish: one build, five joins
    assert delta(s0, s1) == moved(misses=1, coalesced_waits=waiters - 1, failed_builds=1)
    assert built(engine) == b0 and engine.statistics().builds_in_flight == 0

    with pytest.raises(triodnn.BuildError, match="creating the primitive failed") as again:
        await engine.create_primitive(desc)  # the failure was not cached: a new build
    assert again.value.__cause__ is not cause
    s2 = stats()
    assert delta(s1, s2) == moved(misses=1, failed_builds=1)
    assert (s2.size, s2.in_flight_builds) == (0, 0)


@pytest.mark.parametrize(
    "error, raised",
    [(RuntimeError, triodnn.BuildError), (ValueError, triodnn.BuildError),
     (triodnn.UnsupportedError, triodnn.UnsupportedError)],
)
async def test_generator_error_reaches_waiters_as_its_triodnn_type(fresh_cache, engine, error, raised):
    s0 = fresh_cache()
    desc = RaisingDesc(711, error)
    errors: list[BaseException] = []

    async def waiter():
        with pytest.raises(raised, match="test_raising:711 gave up") as info:
            await engine.create_primitive(desc)
        errors.append(info.value)

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(waiter)
    assert len({id(e) for e in errors}) == 3
    assert len({id(e.__cause__) for e in errors}) == 1
    assert type(errors[0].__cause__) is error
    s1 = stats()
    assert (s1.size, s1.in_flight_builds) == (0, 0)
    assert delta(s0, s1) == moved(misses=1, coalesced_waits=2, failed_builds=1)


# -- 9. cancelled waiters ---------------------------------------------------------------------------


async def test_cancelling_some_waiters_mid_build_spares_the_others(fresh_cache, engine, rng):
    s0 = fresh_cache()
    b0 = built(engine)
    desc, gate, started = gated(801)
    scopes = [trio.CancelScope() for _ in range(10)]
    results: dict[int, triodnn.Primitive] = {}

    async def waiter(i):
        with scopes[i]:
            results[i] = await engine.create_primitive(desc)

    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter, 0)  # the one whose request starts the build
                assert await trio.to_thread.run_sync(started.wait, GATE_TIMEOUT)
                for i in range(1, 10):
                    nursery.start_soon(waiter, i)
                await trio.testing.wait_all_tasks_blocked()
                s1 = stats()
                assert s1.in_flight_builds == 1 and s1.size == 0
                assert delta(s0, s1) == moved(misses=1, coalesced_waits=9)

                for scope in scopes[:5]:  # the builder's requester among them
                    scope.cancel()
                await trio.testing.wait_all_tasks_blocked()
                assert all(scope.cancelled_caught for scope in scopes[:5])
                assert stats().in_flight_builds == 1  # the build goes on
                gate.set()
    finally:
        gate.set()

    assert sorted(results) == [5, 6, 7, 8, 9]
    s2 = stats()
    assert (s2.size, s2.in_flight_builds) == (1, 0)
    assert delta(s0, s2) == moved(misses=1, coalesced_waits=9)
    assert built(engine) == (b0[0] + 1, b0[1])
    x = rng.uniform(-5, 5, 801).astype(np.float32)
    tolerance.check(await run_relu(engine, results[7], x), eltwise.reference("relu", x, alpha=0.5),
                    tolerance.eltwise("relu"))


async def test_cancelling_every_waiter_mid_build_still_caches_the_result(fresh_cache, engine):
    s0 = fresh_cache()
    desc, gate, started = gated(811)
    try:
        with trio.fail_after(60):
            async with triodnn.open_runtime() as other_rt:
                try:
                    other = await other_rt.engine()
                    async with trio.open_nursery() as nursery:
                        for _ in range(5):
                            nursery.start_soon(other.create_primitive, desc)
                        assert await trio.to_thread.run_sync(started.wait, GATE_TIMEOUT)
                        await trio.testing.wait_all_tasks_blocked()
                        assert delta(s0, stats()) == moved(misses=1, coalesced_waits=4)
                        nursery.cancel_scope.cancel()  # every waiter, builder's requester too
                    assert nursery.cancel_scope.cancelled_caught
                    assert stats().in_flight_builds == 1
                finally:
                    gate.set()
            # the runtime's exit waits for the builds its cache actor runs
            assert built(other) == (1, 0)
    finally:
        gate.set()

    s1 = stats()
    assert (s1.size, s1.in_flight_builds) == (1, 0)
    assert delta(s0, s1) == moved(misses=1, coalesced_waits=4)
    b0 = built(engine)
    await engine.create_primitive(desc)  # a hit: loaded from the binary, no new build
    assert delta(s1, stats()) == moved(hits=1)
    assert built(engine) == (b0[0], b0[1] + 1)


async def test_cancelling_the_loader_of_a_cached_binary_spares_other_waiters(fresh_cache, rt):
    s0 = fresh_cache()
    desc, gate, started = gated(821)
    gate.set()
    first, second = await rt.engine(), await rt.engine()
    await first.create_primitive(desc)  # cached; second must load the binary
    gate.clear()
    started.clear()
    loader_scope, other_scope = trio.CancelScope(), trio.CancelScope()
    outcomes: dict[str, object] = {}

    async def request(name, scope):
        with scope:
            try:
                outcomes[name] = await second.create_primitive(desc)
            except BaseException as exc:  # kept, so whatever arrives is visible to the assertions
                outcomes[name] = exc

    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(request, "loader", loader_scope)
                assert await trio.to_thread.run_sync(started.wait, GATE_TIMEOUT)  # load in flight
                nursery.start_soon(request, "other", other_scope)
                await trio.testing.wait_all_tasks_blocked()
                assert delta(s0, stats()) == moved(misses=1, hits=2)
                loader_scope.cancel()
                await trio.testing.wait_all_tasks_blocked()
                gate.set()
    finally:
        gate.set()
    assert isinstance(outcomes["loader"], trio.Cancelled)
    assert isinstance(outcomes["other"], triodnn.Primitive), f"the other waiter got {outcomes['other']!r}"


async def test_cancelled_runtime_does_not_fail_waiters_of_another_runtime(fresh_cache, engine):
    s0 = fresh_cache()
    desc, gate, started = gated(831)
    a_scope = trio.CancelScope()
    outcome: dict[str, object] = {}

    async def runtime_a(task_status=trio.TASK_STATUS_IGNORED):
        with a_scope:
            async with triodnn.open_runtime() as rt_a:
                engine_a = await rt_a.engine()
                task_status.started()
                await engine_a.create_primitive(desc)  # starts the build, in rt_a's cache actor

    async def waiter_b():
        try:
            outcome["b"] = await engine.create_primitive(desc)  # the test's runtime: stays open
        except triodnn.TriodnnError as exc:
            outcome["b"] = exc

    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                await nursery.start(runtime_a)
                assert await trio.to_thread.run_sync(started.wait, GATE_TIMEOUT)
                nursery.start_soon(waiter_b)
                await trio.testing.wait_all_tasks_blocked()
                assert delta(s0, stats()) == moved(misses=1, coalesced_waits=1)
                a_scope.cancel()  # a timeout around another runtime, say
                await trio.testing.wait_all_tasks_blocked()
                gate.set()
    finally:
        gate.set()
    assert isinstance(outcome["b"], triodnn.Primitive), f"the open runtime's waiter got {outcome['b']!r}"
    assert stats().failed_builds == s0.failed_builds
    # Runtime A's build thread runs on under the cancellation (worker threads are not
    # abandoned); whether its flight still completes or is abandoned and B builds again, every
    # miss here started a build: builds and misses move together.
    s1 = stats()
    assert s1.builds - s0.builds == s1.misses - s0.misses >= 1


# -- 10. stress ---------------------------------------------------------------------------------------


async def hammer(cache: PrimitiveCache, plans: list[list[int]], build, seen: collections.Counter) -> None:
    """One trio run's share: a CacheActor on ``cache`` and a task per plan, each requesting its
    keys in order; ``seen`` counts how each request was served."""
    async with trio.open_nursery() as nursery:
        actor = CacheActor(cache)
        await nursery.start(actor.serve)
        try:
            async with trio.open_nursery() as tasks:
                for plan in plans:
                    tasks.start_soon(requester, actor, plan, build, seen)
        finally:
            actor.close()


async def requester(actor: CacheActor, plan: list[int], build, seen: collections.Counter) -> None:
    for key in plan:
        value, how = await actor.get(key, functools.partial(build, key))
        assert value[0] == key, f"request for {key} got the value of {value[0]}"
        seen[how] += 1


async def test_stress_tasks_and_threads_on_one_cache():
    cache = PrimitiveCache(16)  # private: the global cache is not involved
    keys, total = 100, 10_000
    lock = threading.Lock()
    calls: collections.Counter = collections.Counter()
    serial = itertools.count()

    async def build(key):
        with lock:
            calls[key] += 1
            number = next(serial)
        await trio.to_thread.run_sync(lambda: None)
        return (key, number)

    draw = random.Random(2024)

    def plans(tasks: int, each: int) -> list[list[int]]:
        return [[draw.randrange(keys) for _ in range(each)] for _ in range(tasks)]

    main_plans = plans(60, 100)  # 6,000 requests from this run's tasks
    thread_plans = [plans(10, 100) for _ in range(4)]  # 1,000 from each of 4 OS threads
    barrier = threading.Barrier(5)
    errors: list[BaseException] = []
    seen: list[collections.Counter] = [collections.Counter() for _ in range(5)]

    async def thread_run(i):
        with trio.fail_after(60):
            await trio.to_thread.run_sync(barrier.wait, 30)
            await hammer(cache, thread_plans[i], build, seen[i + 1])

    def thread_main(i):
        try:
            trio.run(thread_run, i)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=thread_main, args=(i,), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        with trio.fail_after(60):
            await trio.to_thread.run_sync(barrier.wait, 30)
            await hammer(cache, main_plans, build, seen[0])
    finally:
        for thread in threads:
            await trio.to_thread.run_sync(thread.join, 90)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    if errors:
        raise errors[0]

    s = cache.statistics()
    how = sum(seen, collections.Counter())
    assert sum(how.values()) == total
    assert sum(calls.values()) == s.misses == how["cache_miss"]
    assert s.hits == how["cache_hit"] and s.coalesced_waits == how["cache_coalesced"]
    assert s.hits + s.misses + s.coalesced_waits == total
    assert (s.size, s.capacity, s.in_flight_builds, s.failed_builds) == (16, 16, 0, 0)
    assert s.evictions == s.misses - 16
    assert set(calls) <= set(range(keys))


async def test_stress_real_primitives(fresh_cache, engine):
    s0 = fresh_cache(4)
    b0 = built(engine)
    descs = [relu(301 + i) for i in range(12)]
    draw = random.Random(11)
    plans = [[draw.choice(descs) for _ in range(6)] for _ in range(50)]  # 300 requests
    served = collections.Counter()

    async def task(plan):
        for desc in plan:
            primitive = await engine.create_primitive(desc)
            assert primitive.desc == desc
            served[desc] += 1

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for plan in plans:
                nursery.start_soon(task, plan)
    s1 = stats()
    d = delta(s0, s1)
    assert sum(served.values()) == 300
    assert d["hits"] + d["misses"] + d["coalesced_waits"] == 300
    assert (s1.size, s1.in_flight_builds) == (4, 0)
    assert d["evictions"] == d["misses"] - 4 and d["failed_builds"] == 0
    assert built(engine) == (b0[0] + d["misses"], b0[1])


# -- 11. verbose lines ------------------------------------------------------------------------------


async def test_verbose_line_per_creation_says_how_it_was_found(fresh_cache, engine, monkeypatch, capsys):
    fresh_cache()
    monkeypatch.setenv("TRIODNN_VERBOSE", "1")
    capsys.readouterr()
    desc = relu(37, alpha=0.25)
    first = await engine.create_primitive(desc)
    await engine.create_primitive(desc)
    other = relu(38)
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(engine.create_primitive, other)
    monkeypatch.setenv("TRIODNN_VERBOSE", "0")
    await engine.create_primitive(desc)  # level 0: no line

    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("triodnn_verbose,")]
    assert len(lines) == 4
    assert lines[0].startswith("triodnn_verbose,primitive,create:cache_miss,")
    assert lines[1].startswith("triodnn_verbose,primitive,create:cache_hit,")
    assert sorted(line.split(",")[2] for line in lines[2:]) == ["create:cache_coalesced", "create:cache_miss"]
    for line in lines:
        fields = line.split(",")
        assert len(fields) == 9
        assert fields[3] == f"{engine.kind}:{engine.index}"
        assert fields[4:6] == ["eltwise", first.impl]
        assert float(fields[8]) >= 0.0
    assert lines[0].split(",")[6:8] == ["src:f32:37:s1 dst:f32:37:s1", "alg:relu alpha:0.25 beta:0"]


# -- 12. bad input leaves nothing behind --------------------------------------------------------------


async def test_unsupported_descriptor_leaves_the_cache_alone(fresh_cache, engine):
    fresh_cache()
    await engine.create_primitive(relu(41))
    before, b0 = stats(), built(engine)
    desc = EltwiseDesc("relu", MemoryDesc((41,)), post_ops=(("binary", "add", MemoryDesc((41,), "f16")),))
    with pytest.raises(triodnn.UnsupportedError, match="dtype 'f16'; post-op operands are f32 only"):
        await engine.create_primitive(desc)
    assert stats() == before
    assert built(engine) == b0


async def test_not_a_descriptor_leaves_the_cache_alone(fresh_cache, engine):
    before = fresh_cache()
    with pytest.raises(triodnn.InvalidArgumentError, match="desc is MemoryDesc, not a triodnn primitive"):
        await engine.create_primitive(MemoryDesc((8,)))
    assert stats() == before


# -- cache keys ---------------------------------------------------------------------------------------


async def test_signed_zero_alpha_is_a_different_primitive(fresh_cache, engine):
    s0 = fresh_cache()
    positive, negative = relu(57, alpha=0.0), relu(57, alpha=-0.0)
    await engine.create_primitive(positive)
    primitive = await engine.create_primitive(negative)
    x = np.full(57, -3.0, np.float32)
    got = await run_relu(engine, primitive, x)
    ref = eltwise.reference("relu", x, alpha=-0.0)
    assert not np.signbit(ref).any()
    assert c_float(-0.0) in primitive.spec.source
    assert np.array_equal(np.signbit(got), np.signbit(ref))
    assert delta(s0, stats()) == moved(misses=2)


# -- per-engine resources ------------------------------------------------------------------------


async def test_engine_resources_follow_the_cache_capacity_with_a_floor(fresh_cache, engine):
    """Engines keep per-context kernels LRU-bounded by the cache capacity (at least 16), so
    evicted entries do not pile up kernels in long-lived engines."""
    fresh_cache(20)
    prims = [await engine.create_primitive(relu(301 + n)) for n in range(25)]
    assert engine.statistics().resources == 20
    assert stats().size == 20
    # A primitive keeps its own kernel after the engine forgot it: it still runs correctly.
    x = np.linspace(-2, 2, 301, dtype=np.float32)
    got = await run_relu(engine, prims[0], x)
    tolerance.check(got, eltwise.reference("relu", x), tolerance.eltwise("relu"))

    fresh_cache(2)
    for n in range(18):  # keys built above and by other tests (a cold PoCL cache builds each once)
        await engine.create_primitive(relu(301 + n))
    assert engine.statistics().resources == 16
    assert stats().size == 2
