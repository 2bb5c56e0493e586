"""The optional outputs of the norm ops: GroupNorm's mean and variance (``keep_stats``, dims
(N, groups)) and RMSNorm's ``rrms`` (1 / sqrt(mean(x^2) + eps) per row, oneDNN's RMSNorm.md
output 1), through the graph API and the primitives, against float64 references."""

from __future__ import annotations

import numpy as np
import pytest

from triodnn import ArgumentMismatchError, MemoryDesc, StreamFlags
from triodnn._values._normalization_desc import GroupNormDesc, RMSNormDesc
from triodnn.graph import Graph, LogicalTensor, Op, compile_graph
from triodnn.graph._lowering import is_supported
from triodnn.kernels import normalization
from triodnn.kernels.normalization import GNORM, RMSNORM, STATS

DIMS = (2, 8, 3, 5)


def lt(i, shape, dtype="f32"):
    return LogicalTensor(i, dtype, shape, layout_type="strided")


def graph_of(op):
    graph = Graph("cpu")
    graph.add_op(op)
    graph.finalize()
    return graph


def close(got, want, rtol):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=rtol)


async def run(engine, graph, arrays, policy="fusion"):
    runner = await compile_graph(graph, engine, policy=policy)
    stream = await engine.stream(StreamFlags.in_order)
    return await runner.run(stream, arrays)


def group_stats(x, groups):
    g = x.astype(np.float64).reshape(x.shape[0], groups, -1)
    return g.mean(axis=2), g.var(axis=2)


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
async def test_group_norm_keeps_its_statistics(engine, rng, data_format):
    x = rng.uniform(-2, 2, DIMS).astype(np.float32)
    gamma, beta = rng.uniform(0.5, 2, 8).astype(np.float32), rng.uniform(-1, 1, 8).astype(np.float32)
    src = x if data_format == "NCX" else np.moveaxis(x, 1, -1).copy()
    op = Op(0, "GroupNorm", [lt(0, src.shape), lt(1, (8,)), lt(2, (8,))],
            [lt(3, src.shape), lt(4, (2, 4)), lt(5, (2, 4))],
            {"groups": 4, "keep_stats": True, "use_affine": True, "epsilon": 1e-5, "data_format": data_format})
    assert is_supported(op)
    out = await run(engine, graph_of(op), {0: src, 1: gamma, 2: beta})
    mean, var = group_stats(x, 4)
    close(out[4], mean, STATS)
    close(out[5], var, STATS)
    want = normalization.group_reference(x, 4, epsilon=1e-5, scale=gamma, shift=beta)
    got = out[3] if data_format == "NCX" else np.moveaxis(out[3], -1, 1)
    close(got, want, GNORM)


@pytest.mark.parametrize("begin_norm_axis", [-1, 2])
async def test_rms_norm_writes_rrms(engine, rng, begin_norm_axis):
    x = rng.uniform(-2, 2, DIMS).astype(np.float32)
    rows = DIMS[:begin_norm_axis % 4]
    normalized = DIMS[begin_norm_axis % 4:]
    gamma = rng.uniform(0.5, 2, normalized).astype(np.float32)
    op = Op(0, "RMSNorm", [lt(0, DIMS), lt(1, normalized)], [lt(2, DIMS), lt(3, rows)],
            {"begin_norm_axis": begin_norm_axis, "epsilon": 1e-5})
    assert is_supported(op)
    out = await run(engine, graph_of(op), {0: x, 1: gamma})
    axes = tuple(range(begin_norm_axis % 4, 4))
    wide = x.astype(np.float64)
    rrms = 1.0 / np.sqrt((wide * wide).mean(axis=axes) + float(np.float32(1e-5)))
    close(out[3], rrms, STATS)
    close(out[2], wide * rrms.reshape(rows + (1,) * len(axes)) * gamma, RMSNORM)


async def test_rms_norm_rrms_of_bf16_rows_through_f32(engine, rng):
    x = rng.uniform(-2, 2, (6, 16)).astype(np.float32)
    op = Op(0, "RMSNorm", [lt(0, (6, 16), "bf16")], [lt(1, (6, 16), "bf16"), lt(2, (6,), "bf16")], {})
    out = await run(engine, graph_of(op), {0: x})
    xb = normalization._dtype_io.store_reference(x, "bf16").astype(np.float64)
    rrms = 1.0 / np.sqrt((xb * xb).mean(axis=1) + float(np.float32(1e-5)))
    close(out[2], rrms, 2.0**-7)


async def test_primitives_write_the_statistics(engine, rng):
    stream = await engine.stream()
    x = rng.uniform(-2, 2, (3, 4, 10)).astype(np.float32)
    src = await engine.from_numpy(x)
    rrms = engine.memory(MemoryDesc((3, 4), "f32"))
    dst = engine.memory(src.desc)
    rms = RMSNormDesc(src.desc, dst.desc, 1e-5, rrms=rrms.desc)
    await stream.execute(await engine.create_primitive(rms), {"src": src, "rrms": rrms, "dst": dst})
    close(await rrms.to_numpy(), normalization.rms_statistics_reference(x), STATS)
    close(await dst.to_numpy(), normalization.rms_reference(x), RMSNORM)
    mean, variance = engine.memory(MemoryDesc((3, 2), "f32")), engine.memory(MemoryDesc((3, 2), "f32"))
    gn = GroupNormDesc(src.desc, 2, dst.desc, mean=mean.desc, variance=variance.desc)
    await stream.execute(await engine.create_primitive(gn),
                         {"src": src, "mean": mean, "variance": variance, "dst": dst})
    want_m, want_v = normalization.group_statistics_reference(x, 2)
    close(await mean.to_numpy(), want_m, STATS)
    close(await variance.to_numpy(), want_v, STATS)


def test_statistics_dims_are_checked():
    src = MemoryDesc((3, 4, 10), "f32")
    with pytest.raises(ArgumentMismatchError, match=r"rrms dims \(3,\) must be \(3, 4\)"):
        RMSNormDesc(src, rrms=MemoryDesc((3,), "f32"))
    with pytest.raises(ArgumentMismatchError, match=r"mean dims \(3, 4\) must be \(3, 2\) \(N, groups\)"):
        GroupNormDesc(src, 2, mean=MemoryDesc((3, 4), "f32"))
