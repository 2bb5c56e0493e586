"""DequantizingMatmulDesc: int4/int8 weights dequantized inside the matmul by tensors of scales
and zero points per group, against the float64 reference of the dequantized weights; both
kernels (the CPU's blocks, one element per work-item elsewhere) and the typed errors of bad
descriptors. tests/kernels/test_impl_coverage.py runs each implementation once more."""

from __future__ import annotations

import numpy as np
import pytest

import triodnn
from triodnn import DequantizingMatmulDesc, MemoryDesc
from triodnn.kernels import kind_of, tolerance

RANGES = {"u4": (0, 15), "s4": (-8, 7), "u8": (0, 255), "s8": (-128, 127)}


async def run(engine, rng, desc):
    prim = await engine.create_primitive(desc)
    m, k = desc.src.dims
    arrays = {"src": rng.uniform(-2, 2, (m, k)).astype(np.float16),
              "weights": rng.integers(*RANGES[desc.weights.dtype], desc.weights.dims, endpoint=True),
              "scales": rng.choice([0.0078125, 0.03125, 0.046875], desc.scales.dims).astype(np.float32)}
    if desc.zps is not None:
        arrays["zps"] = rng.integers(0, 8, desc.zps.dims)
    memories = {name: await engine.from_numpy(array, desc.arg_descs[name]) for name, array in arrays.items()}
    dst = engine.memory(desc.dst)
    await (await engine.stream()).execute(prim, {**memories, "dst": dst})
    got = await dst.to_numpy()
    tolerance.check(got, kind_of(desc).reference(desc, arrays), kind_of(desc).tolerance(desc))
    return prim.impl


@pytest.mark.parametrize("weights", ["u4", "s4", "u8", "s8"])
@pytest.mark.parametrize(("n", "group", "blocks"), [(64, (1, 32), True), (64, (8, 1), True), (24, (4, 8), False)],
                         ids=["blocks", "blocks_per_column", "per_element"])
@pytest.mark.parametrize("zps", [False, True], ids=["no_zp", "zp"])
async def test_matches_the_reference(engine, rng, weights, n, group, blocks, zps):
    k = 32
    placed = (k // group[0], n // group[1])
    desc = DequantizingMatmulDesc(MemoryDesc((3, k), "f16"), MemoryDesc((k, n), weights), MemoryDesc(placed, "f16"),
                                  MemoryDesc((3, n)), group, MemoryDesc(placed, "u8") if zps else None,
                                  dequantized="f16")
    impl = await run(engine, rng, desc)
    if engine.info.type == "cpu":
        assert (":1x32:" in impl) == blocks, impl


@pytest.mark.parametrize(("make", "error", "match"), [
    (lambda: DequantizingMatmulDesc(MemoryDesc((2, 8), "f16"), MemoryDesc((8, 6), "u4"), MemoryDesc((8, 2), "f16"),
                                    MemoryDesc((2, 6)), (1, 4)), triodnn.ArgumentMismatchError, "does not divide"),
    (lambda: DequantizingMatmulDesc(MemoryDesc((2, 8), "f16"), MemoryDesc((8, 8), "u4"), MemoryDesc((8, 4), "f16"),
                                    MemoryDesc((2, 8)), (1, 4)), triodnn.ArgumentMismatchError, r"scales dims \(8, 4\)"),
    (lambda: DequantizingMatmulDesc(MemoryDesc((2, 7), "f16"), MemoryDesc((8, 8), "u4"), MemoryDesc((8, 2), "f16"),
                                    MemoryDesc((2, 8)), (1, 4)), triodnn.ArgumentMismatchError, "K=7"),
    (lambda: DequantizingMatmulDesc(MemoryDesc((1, 2, 8), "f16"), MemoryDesc((8, 8), "u4"), MemoryDesc((8, 2), "f16"),
                                    MemoryDesc((2, 8)), (1, 4)), triodnn.InvalidArgumentError, "exactly 2"),
    (lambda: DequantizingMatmulDesc(MemoryDesc((2, 8), "f16"), MemoryDesc((8, 8), "u4"), MemoryDesc((8, 2), "f16"),
                                    MemoryDesc((2, 8)), (1, 4), dequantized="s8"), triodnn.InvalidArgumentError,
     "dequantized 's8'"),
])
def test_bad_descriptors_name_the_culprit(make, error, match):
    with pytest.raises(error, match=match):
        make()


async def test_float_weights_are_refused_at_creation_and_leave_no_entry(engine):
    desc = DequantizingMatmulDesc(MemoryDesc((2, 8), "f16"), MemoryDesc((8, 8), "f32"), MemoryDesc((8, 2), "f16"),
                                  MemoryDesc((2, 8)), (1, 4))
    before = triodnn.primitive_cache_statistics()
    with pytest.raises(triodnn.UnsupportedError, match="weights"):
        await engine.create_primitive(desc)
    after = triodnn.primitive_cache_statistics()
    assert (after.size, after.in_flight_builds) == (before.size, 0)
