"""Cross-engine reorder: memory of one OpenCL context converted into memory of another.

This machine has one device (PoCL's CPU), so the two engines are two contexts on it: the runtime's
own and one wrapped by ``ocl_interop.make_engine`` over a context the test creates. Between two
CPU engines the source executes; the destination-side path (what a CPU -> GPU reorder takes) is
exercised by presenting the destination engine as a GPU (``as_gpu``), and for real by the test
marked ``gpu``. Results must equal ``kernels.reorder.reference`` exactly.
"""

from __future__ import annotations

import attrs
import numpy as np
import pyopencl as cl
import pytest
import trio
import trio.testing

import triodnn
from triodnn import MemoryDesc, ReorderDesc, StreamFlags
from triodnn._cross_engine_reorder import CrossEngineReorder
from triodnn._values._errors import (
    ArgumentMismatchError,
    CacheBlobError,
    DependencyError,
    EngineMismatchError,
    ExecutionError,
    InvalidArgumentError,
    MissingArgumentError,
)
from triodnn._values._reorder_desc import CrossEngineReorderDesc
from triodnn.kernels import reorder
from triodnn.ocl_interop import make_engine

COMPLETE = cl.command_execution_status.COMPLETE
SHAPE = (3, 5, 7)
F32 = MemoryDesc(SHAPE, "f32")
BF16 = MemoryDesc(SHAPE, "bf16")
# Permuted and padded: dim 0 innermost, then dim 2, dim 1 outermost with a gap of 3 elements
# (117 addressed positions for 105 elements).
PADDED = MemoryDesc(SHAPE, "f32", (1, 24, 3))
DENSE_PERMUTED = MemoryDesc(SHAPE, "f32", "cab")
SPECIAL = [0.5, 1.5, 2.5, -0.5, -2.5, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 3 * 2**-8), 3.38e38, 1e-30,
           0.0, -0.0, np.inf, -np.inf, np.nan, 65280.0, 3e9]


def presented_as(engine: triodnn.Engine, device_type: str) -> triodnn.Engine:
    """``engine`` presented as a ``device_type`` device to the executing-engine rule (its device
    and kernel configuration are not changed)."""
    engine.info = attrs.evolve(engine.info, type=device_type)
    return engine


def destination_executes(src_engine: triodnn.Engine, dst_engine: triodnn.Engine) -> None:
    """A GPU destination with a non-GPU source: the rule picks the destination. Both sides are
    set, so the case holds with TRIODNN_ENGINE=gpu:0 too, where both engines are GPUs."""
    presented_as(src_engine, "cpu")
    presented_as(dst_engine, "gpu")


@pytest.fixture
async def pair(rt):
    """Two engines on one device, two OpenCL contexts: the runtime's and one made by the test."""
    a = await rt.engine()
    b = await make_engine(a.cl_device, cl.Context([a.cl_device]), runtime=rt)
    assert a.cl_context.int_ptr != b.cl_context.int_ptr
    return a, b


def values(rng) -> np.ndarray:
    x = (rng.standard_normal(int(np.prod(SHAPE))) * 100).astype(np.float32)
    x[: len(SPECIAL)] = SPECIAL
    return x.reshape(SHAPE)


def assert_exact(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


async def gated_reorder(src_engine, dst_engine, src_desc, dst_desc, x, gate, *, flags=StreamFlags.out_of_order):
    """Reorder ``x`` across engines, its source written by a user command held back by ``gate``.

    The reorder must not complete while the gate is shut; once opened, the returned event
    completes only after dst holds the result (read back with no dependency at all).
    """
    prim = await src_engine.create_reorder(src_desc, dst_desc, dst_engine=dst_engine)
    assert isinstance(prim, CrossEngineReorder)
    assert (prim.src_engine, prim.dst_engine) == (src_engine, dst_engine)
    writer = await src_engine.stream()
    src = src_engine.memory(src_desc)
    dst = await dst_engine.from_numpy(np.full(SHAPE, 7.0, np.float32), dst_desc)  # not the result
    stream = await prim.engine.stream(flags)
    with gate(src_engine.cl_context) as g:
        written = writer.write(src, x, deps=[g])
        done = stream.execute(prim, {"src": src, "dst": dst}, deps=[written])
        await trio.sleep(0.05)
        assert not done.done and not written.done
        g.set_status(COMPLETE)
        with trio.fail_after(20):
            await done
    # The event is the executing stream's: its queue orders what comes after the whole reorder.
    assert done.cl_event.command_queue in stream.cl_queues
    return prim, await dst.to_numpy()


@pytest.mark.parametrize("direction", ["a->b", "b->a"])
async def test_f32_to_bf16_across_contexts(pair, direction, rng, gate):
    a, b = pair
    src_engine, dst_engine = (a, b) if direction == "a->b" else (b, a)
    x = values(rng)
    prim, got = await gated_reorder(src_engine, dst_engine, F32, BF16, x, gate)
    assert prim.engine is src_engine  # two engines of one kind: the source executes
    assert prim.impl == "ocl:cross_engine:convert:" + prim.spec.impl.split(":")[-1]
    assert_exact(got, reorder.reference(x, "f32", "bf16"))


@pytest.mark.parametrize("direction", ["a->b", "b->a"])
@pytest.mark.parametrize("flags", [StreamFlags.in_order, StreamFlags.out_of_order], ids=["in", "ooo"])
async def test_strided_to_dense_across_contexts(pair, direction, flags, rng, gate):
    a, b = pair
    src_engine, dst_engine = (a, b) if direction == "a->b" else (b, a)
    x = values(rng)
    _, got = await gated_reorder(src_engine, dst_engine, PADDED, F32, x, gate, flags=flags)
    assert_exact(got, x)
    _, got = await gated_reorder(src_engine, dst_engine, DENSE_PERMUTED, BF16, x, gate, flags=flags)
    assert_exact(got, reorder.reference(x, "f32", "bf16"))


@pytest.mark.parametrize("executes", ["source", "destination"])
async def test_padded_destination_keeps_its_gaps(pair, executes, rng):
    """Only the elements change, as in a reorder within one engine: the gaps keep their bytes."""
    a, b = pair
    if executes == "destination":
        destination_executes(a, b)
    prim = await a.create_reorder(F32, MemoryDesc(SHAPE, "s8", (1, 24, 3)), dst_engine=b)
    assert prim.engine is (a if executes == "source" else b)
    x = np.clip(values(rng), -300, 300)
    x[np.isnan(x)] = 0.0
    src = await a.from_numpy(x)
    dst = b.memory(prim.desc.dst)
    sentinel = np.full(prim.desc.dst.nbytes, 0x5A, np.uint8)
    queue = cl.CommandQueue(b.cl_context)
    await trio.to_thread.run_sync(lambda: cl.enqueue_copy(queue, dst.cl_buffer, sentinel).wait())
    stream = await prim.engine.stream()
    await stream.execute(prim, {"src": src, "dst": dst})
    raw = np.empty_like(sentinel)
    await trio.to_thread.run_sync(lambda: cl.enqueue_copy(queue, raw, dst.cl_buffer).wait())
    view = np.lib.stride_tricks.as_strided(raw.view(np.int8), SHAPE, prim.desc.dst.strides)
    assert_exact(np.ascontiguousarray(view), reorder.reference(x, "f32", "s8"))
    gaps = np.ones(raw.shape, bool)
    gaps[np.indices(SHAPE).reshape(3, -1).T @ np.array(prim.desc.dst.strides)] = False  # s8: 1 byte
    assert gaps.sum() == raw.size - x.size > 0
    assert np.all(raw[gaps] == 0x5A)


@pytest.mark.parametrize("direction", ["a->b", "b->a"])
async def test_destination_side_execution(pair, direction, rng, gate):
    """A GPU destination executes (oneDNN's rule): the source side reads, the destination writes a
    temporary and converts it into dst."""
    a, b = pair
    src_engine, dst_engine = (a, b) if direction == "a->b" else (b, a)
    destination_executes(src_engine, dst_engine)
    x = values(rng)
    prim, got = await gated_reorder(src_engine, dst_engine, PADDED, BF16, x, gate)
    assert prim.engine is dst_engine
    assert_exact(got, reorder.reference(x, "f32", "bf16"))
    _, got = await gated_reorder(src_engine, dst_engine, F32, F32, x, gate, flags=StreamFlags.in_order)
    assert_exact(got, x)


@pytest.mark.parametrize("executes", ["source", "destination"])
async def test_failed_dependency_fails_the_reorder(pair, executes, rng):
    a, b = pair
    if executes == "destination":
        destination_executes(a, b)
    prim = await a.create_reorder(F32, BF16, dst_engine=b)
    stream = await prim.engine.stream()
    src, dst = await a.from_numpy(values(rng)), b.memory(BF16)
    gate = cl.UserEvent(a.cl_context)
    try:
        done = stream.execute(prim, {"src": src, "dst": dst}, deps=[gate])
        await trio.testing.wait_all_tasks_blocked()
        assert not done.done
    finally:
        gate.set_status(-5)
    with trio.fail_after(20):
        with pytest.raises(ExecutionError):
            await done
        # Known failed before submission: refused without reaching OpenCL.
        with pytest.raises(DependencyError):
            await stream.execute(prim, {"src": src, "dst": dst}, deps=[done])
        # The engines and streams keep working.
        x = values(rng)
        await src.write(x)
        await stream.execute(prim, {"src": src, "dst": dst})
    assert_exact(await dst.to_numpy(), reorder.reference(x, "f32", "bf16"))


async def test_cache_key_holds_both_engines(pair):
    a, b = pair
    before = triodnn.primitive_cache_statistics()
    ab = await a.create_reorder(F32, BF16, dst_engine=b)
    key = ab._entry.key
    assert isinstance(key.desc, CrossEngineReorderDesc)
    assert (key.desc.src_engine, key.desc.dst_engine) == (a.identity, b.identity)
    assert key.desc.reorder == ReorderDesc(F32, BF16)
    again = await b.create_reorder(F32, BF16, src_engine=a)  # from either engine: one primitive
    ba = await a.create_reorder(F32, BF16, src_engine=b)
    plain = await a.create_primitive(ReorderDesc(F32, BF16))
    after = triodnn.primitive_cache_statistics()
    assert again._entry is ab._entry
    assert len({id(ab._entry), id(ba._entry), id(plain._entry)}) == 3
    assert ba._entry.key.desc.src_engine == b.identity
    assert after.hits - before.hits >= 1
    assert not isinstance(plain, CrossEngineReorder) and plain.impl.startswith("ocl:convert")
    # Contexts do not outlive the process: cross-engine entries stay out of blobs.
    with pytest.raises(CacheBlobError, match="cross-engine"):
        ab.cache_blob()
    blob_keys = [impl.key for impl in triodnn._values._cache_blob.load(a.primitive_cache_blob(),
                                                               a._device_identity, triodnn.__version__)]
    assert plain._entry.key in blob_keys
    assert not any(k.desc == key.desc for k in blob_keys)


async def test_one_context_gives_a_plain_reorder(pair, rt):
    a, _ = pair
    twin = await make_engine(a.cl_device, a.cl_context, runtime=rt)
    for prim in (await a.create_reorder(F32, BF16), await a.create_reorder(F32, BF16, dst_engine=twin)):
        assert type(prim) is triodnn.Primitive and prim.engine is a
        assert prim.desc == ReorderDesc(F32, BF16)


async def test_mismatched_dims_leave_nothing_cached(pair):
    a, b = pair
    before = triodnn.primitive_cache_statistics()
    resources = (a.statistics().resources, b.statistics().resources)
    with pytest.raises(ArgumentMismatchError, match="dst dims"):
        await a.create_reorder(F32, MemoryDesc((3, 5, 6), "bf16"), dst_engine=b)
    with pytest.raises(InvalidArgumentError, match="src is ndarray"):
        await a.create_reorder(np.zeros(SHAPE), BF16, dst_engine=b)
    with pytest.raises(InvalidArgumentError, match="dst_engine is str"):
        await a.create_reorder(F32, BF16, dst_engine="gpu:0")
    with pytest.raises(EngineMismatchError, match="neither src_engine"):
        await a.create_reorder(F32, BF16, src_engine=b, dst_engine=b)
    after = triodnn.primitive_cache_statistics()
    assert (after.size, after.misses, after.hits) == (before.size, before.misses, before.hits)
    assert (a.statistics().resources, b.statistics().resources) == resources
    assert a._transfer_stream is None and b._transfer_stream is None


async def test_execution_argument_errors(pair):
    a, b = pair
    prim = await a.create_reorder(F32, BF16, dst_engine=b)
    stream = await a.stream()
    src, dst = a.memory(F32), b.memory(BF16)
    with pytest.raises(EngineMismatchError, match="argument 'dst' lives on"):
        stream.execute(prim, {"src": src, "dst": a.memory(BF16)})
    with pytest.raises(EngineMismatchError, match="argument 'src' lives on"):
        stream.execute(prim, {"src": b.memory(F32), "dst": dst})
    with pytest.raises(EngineMismatchError, match="created on"):
        (await b.stream()).execute(prim, {"src": src, "dst": dst})
    with pytest.raises(MissingArgumentError, match="'dst'"):
        stream.execute(prim, {"src": src})
    with pytest.raises(ArgumentMismatchError, match="argument 'src' has memory"):
        stream.execute(prim, {"src": a.memory(BF16), "dst": dst})
    with pytest.raises(ArgumentMismatchError, match="no argument 'bias'"):
        stream.execute(prim, {"src": src, "dst": dst, "bias": src})
    assert stream.statistics().submitted == 0


@pytest.mark.gpu
@pytest.mark.cpu
@pytest.mark.parametrize("direction", ["cpu->gpu", "gpu->cpu"])
async def test_cpu_gpu(rt, direction, rng, gate):
    cpu, gpu = await rt.engine("cpu", 0), await rt.engine("gpu", 0)
    src_engine, dst_engine = (cpu, gpu) if direction == "cpu->gpu" else (gpu, cpu)
    x = values(rng)
    prim, got = await gated_reorder(src_engine, dst_engine, F32, BF16, x, gate)
    assert prim.engine is gpu  # the GPU side executes, whichever way the data goes
    assert_exact(got, reorder.reference(x, "f32", "bf16"))
    _, got = await gated_reorder(src_engine, dst_engine, PADDED, F32, x, gate)
    assert_exact(got, x)
