"""The GPU configuration's work-group-per-output reduction (``ocl:wg_output``): few outputs over
long reductions, every algorithm, against the float64 reference; checked on PoCL with the GPU
configuration forced on the engine (the configuration is part of the primitive key)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from triodnn import MemoryDesc
from triodnn._values._reduction_desc import ReductionDesc
from triodnn.kernels import reduction, select_config, tolerance

GPU = select_config("gpu", 256, 48 * 1024)
# (src dims, dst dims, src layout): a contiguous last axis; two reduced axes, the innermost
# strided (the channels of NHWC kept); a bf16 source.
CASES = {
    "rows": ((6, 1000), (6, 1)),
    "two_axes_nhwc": ((3, 5, 7, 40), (1, 5, 1, 1)),
}


# Every algorithm once, the two shapes in turn (a cold PoCL cache builds each program in seconds).
PAIRS = [(alg, list(CASES)[i % 2]) for i, alg in enumerate(reduction.ALGORITHMS)]


@pytest.mark.parametrize("alg, name", PAIRS)
async def test_work_group_per_output(engine, rng, alg, name):
    engine._config = attrs.evolve(GPU, local_memory=min(GPU.local_memory, engine._config.local_memory))
    stream = await engine.stream()
    for src_dims, dst_dims in [CASES[name]]:
        layout = "acdb" if name.endswith("nhwc") else None
        src_md = MemoryDesc(src_dims, "f32", layout)
        desc = ReductionDesc(alg, src_md, MemoryDesc(dst_dims))
        primitive = await engine.create_primitive(desc)
        assert primitive.impl.startswith("ocl:wg_output"), (name, primitive.impl)
        if alg == "mul":
            x = (np.where(rng.random(src_dims) < 0.5, -1.0, 1.0) * rng.uniform(0.995, 1.005, src_dims)).astype(np.float32)
        else:
            x = rng.uniform(-5.0, 5.0, src_dims).astype(np.float32)
        src = await engine.from_numpy(x, src_md)
        dst = await engine.from_numpy(np.full(dst_dims, np.nan, np.float32), desc.dst)
        await stream.execute(primitive, {"src": src, "dst": dst})
        got = await dst.to_numpy()
        want = reduction.reference(alg, x, dst_dims)
        tolerance.check(got, want, reduction.desc_tolerance(desc))


@pytest.mark.parametrize("config", ["cpu", "gpu"])
async def test_a_product_that_leaves_f32_part_way_comes_back(engine, config):
    """mul keeps its exponent apart, on the per-output and the work-group path: a running f32
    product overflowed (and inf * 0 made NaN) on rows whose whole product fits f32 (ReduceProd
    over 784 elements of oneDNN's suites); numpy's float64 np.prod overflows too on the first row,
    so the reference keeps its exponent apart the same way (``reduction.product``)."""
    if config == "gpu":
        engine._config = attrs.evolve(GPU, local_memory=min(GPU.local_memory, engine._config.local_memory))
    rows = np.ones((4, 1000), np.float32)
    rows[0, :81] = np.concatenate([np.full(40, 1e10), np.full(40, 1e-10), [3.0]])  # 1e400, then back: 3
    rows[1, :14] = np.concatenate([np.full(10, 1e30), [0.0], np.full(3, 2.0)])  # past f32, then 0: 0, not NaN
    rows[2, :90] = np.concatenate([np.full(45, 1e-30), np.full(45, 1e30)])  # under, then back: 1
    rows[3, :3] = [1e30, 1e30, -1e30]  # a product past f32 stays -inf
    desc = ReductionDesc("mul", MemoryDesc(rows.shape), MemoryDesc((4, 1)))
    primitive = await engine.create_primitive(desc)
    assert primitive.impl.startswith("ocl:wg_output" if config == "gpu" else "ocl:per_output")
    src = await engine.from_numpy(rows, desc.src)
    dst = engine.memory(desc.dst)
    await (await engine.stream()).execute(primitive, {"src": src, "dst": dst})
    got = (await dst.to_numpy()).ravel()
    np.testing.assert_allclose(got[:3], [3.0, 0.0, 1.0], rtol=1e-5)
    assert got[3] == -np.inf
    np.testing.assert_allclose(reduction.reference("mul", rows, (4, 1)).ravel()[:3], [3.0, 0.0, 1.0], rtol=1e-5)
