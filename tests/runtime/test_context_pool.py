"""The context pool: a closed runtime's CPU contexts serve the process's next engines.

What it saves is PoCL's first build in a fresh context (0.9-1.0 s against 0.3 s, measured in
actors/_context_pool.py); these tests hold what it must not change: engines open at the same
time never share a context, a lost or foreign context is never lent again, nothing a closed
runtime compiled is found through a reused context, and fork children do not use the parent's.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

import triodnn
from triodnn import EltwiseDesc, MemoryDesc, ocl_interop
from triodnn.actors import ContextPool, context_pool
from triodnn.actors._context_pool import idle_per_device_from_env
from triodnn.graph import Graph, LogicalTensor, Op, Tensor

pytestmark = pytest.mark.cpu


def relu_partition(n: int):
    g = Graph("cpu")
    g.add_op(Op(0, "ReLU", [LogicalTensor(0, "f32", [n], layout_type="strided")],
                [LogicalTensor(1, "f32", [n], layout_type="strided")]))
    (partition,) = g.get_partitions()
    return partition


async def relu_through(engine, n: int) -> None:
    """Create, run and check a ReLU primitive on ``engine``."""
    prim = await engine.create_primitive(EltwiseDesc("relu", MemoryDesc((n,))))
    x = np.linspace(-1, 1, n, dtype=np.float32)
    src = await engine.from_numpy(x)
    dst = engine.memory(src.desc)
    await (await engine.stream()).execute(prim, {"src": src, "dst": dst})
    np.testing.assert_array_equal(await dst.to_numpy(), np.maximum(x, 0))


async def test_the_next_runtime_takes_the_closed_runtimes_context():
    async with triodnn.open_runtime() as rt:
        first = await rt.engine("cpu", 0)
        await relu_through(first, 301)
        used = first.cl_context.int_ptr
    before = context_pool().statistics()
    async with triodnn.open_runtime() as rt:
        second = await rt.engine("cpu", 0)
        assert second.cl_context.int_ptr == used
        await relu_through(second, 302)
    after = context_pool().statistics()
    assert (after.reused - before.reused, after.created - before.created) == (1, 0)


async def test_engines_open_at_once_never_share_a_context():
    async with triodnn.open_runtime() as rt:
        engines = [await rt.engine("cpu", 0) for _ in range(3)]
        assert len({e.cl_context.int_ptr for e in engines}) == 3
        for n, engine in enumerate(engines):
            await relu_through(engine, 310 + n)
    # The device keeps two of the three idle.
    assert context_pool().idle_count(engines[0].cl_device) == 2


async def test_a_context_found_lost_is_not_lent_again():
    async with triodnn.open_runtime() as rt:
        engine = await rt.engine("cpu", 0)
        lost = engine.cl_context.int_ptr
        engine.health.mark_lost("the test says this context is lost")
    async with triodnn.open_runtime() as rt:
        engines = [await rt.engine("cpu", 0) for _ in range(3)]  # more than the pool holds
        assert lost not in {e.cl_context.int_ptr for e in engines}


async def test_a_callers_context_stays_the_callers():
    device = next(r.device for r in triodnn.available_engines() if r.kind == "cpu")
    context = cl.Context([device])
    async with triodnn.open_runtime() as rt:
        engine = await ocl_interop.make_engine(device, context, runtime=rt)
        await relu_through(engine, 320)
    async with triodnn.open_runtime() as rt:
        engines = [await rt.engine("cpu", 0) for _ in range(3)]
        assert context.int_ptr not in {e.cl_context.int_ptr for e in engines}


async def test_a_reused_context_finds_nothing_the_closed_runtime_compiled():
    """A compiled partition's cache key names its engine's context: a runtime given the context
    must not find the entries of the runtime that closed (they are bound to its engines)."""
    partition = relu_partition(330)
    x = np.linspace(-1, 1, 330, dtype=np.float32)
    async with triodnn.open_runtime() as rt:
        engine = await rt.engine("cpu", 0)
        await partition.compile(engine)
        used = engine.cl_context.int_ptr
    s0 = triodnn.compiled_partition_cache_statistics()
    async with triodnn.open_runtime() as rt:
        engine = await rt.engine("cpu", 0)
        assert engine.cl_context.int_ptr == used
        compiled = await partition.compile(engine)
        s1 = triodnn.compiled_partition_cache_statistics()
        assert (s1.hits - s0.hits, s1.misses - s0.misses) == (0, 1)
        (src,) = [await Tensor.from_numpy(lt, engine, x) for lt in compiled.inputs]
        (dst,) = [Tensor(lt, engine) for lt in compiled.outputs]
        await compiled.execute(await engine.stream(), [src], [dst])
        np.testing.assert_array_equal(await dst.to_numpy(), np.maximum(x, 0))


def test_gpu_contexts_are_not_kept():
    class Gpu:
        type = cl.device_type.GPU
        int_ptr = 1

    assert not ContextPool().keep(Gpu(), object())


def test_each_device_keeps_at_most_its_idle_count():
    device = next(r.device for r in triodnn.available_engines() if r.kind == "cpu")
    pool = ContextPool(idle_per_device=1)
    a, b = cl.Context([device]), cl.Context([device])
    assert pool.keep(device, a) and not pool.keep(device, b) and not pool.keep(device, a)
    assert pool.open_context(device) is a
    assert pool.statistics() == type(pool.statistics())(idle=0, reused=1, created=0)
    assert pool.keep(device, a) and pool.release_idle() == 1 and pool.statistics().idle == 0


def test_a_fork_child_does_not_use_the_parents_contexts(monkeypatch):
    device = next(r.device for r in triodnn.available_engines() if r.kind == "cpu")
    pool = ContextPool()
    parents = cl.Context([device])
    pool.keep(device, parents)
    monkeypatch.setattr("os.getpid", lambda: -1)  # what a forked child sees: another pid
    child = pool.open_context(device)
    assert child.int_ptr != parents.int_ptr
    assert (pool.statistics().reused, pool.statistics().created) == (0, 1)


@pytest.mark.parametrize(("value", "count"), [(None, 2), ("0", 0), ("5", 5), ("-1", 2), ("many", 2)])
def test_idle_count_from_env(value, count):
    assert idle_per_device_from_env({} if value is None else {"TRIODNN_IDLE_CONTEXTS": value}) == count
