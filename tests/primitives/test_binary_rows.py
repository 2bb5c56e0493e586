"""The binary row path (``ocl:rows``): a row-major dst whose last dimension every source reads
contiguously or broadcasts, vectorised along the row. Storage types, post-ops and dst as a
source, on the CPU configuration (float16) and on the GPU configuration forced on this engine
(float4 from GPU_VECTOR_MIN elements), against the reference."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from triodnn import BinaryDesc, MemoryDesc
from triodnn.kernels import _dtype_io, binary, select_config, tolerance
from triodnn.kernels._spec import GPU_VECTOR, GPU_VECTOR_MIN

GPU = select_config("gpu", 256, 48 * 1024)


async def run(engine, desc, arrays):
    primitive = await engine.create_primitive(desc)
    memories = {name: await engine.from_numpy(arrays[name], md) for name, md in desc.arg_descs.items()
                if name in arrays}
    if "dst" not in memories:
        memories["dst"] = engine.memory(desc.dst)
    await (await engine.stream()).execute(primitive, memories)
    return primitive, await memories["dst"].to_numpy()


@pytest.mark.parametrize("src1_dtype, dst_dtype", [("bf16", "f32"), ("f32", "f16")])
async def test_rows_with_storage_types_and_post_ops(engine, rng, src1_dtype, dst_dtype):
    """A bf16 row (element loads into the vector), an f16 dst (element stores), a sum post-op
    reading dst and an operand laid out as dst."""
    if engine._config.vector_width == 1:
        pytest.skip("rows of this size take the general path in the GPU configuration")
    dims = (6, 48)
    post_ops = (("sum", 0.5), ("eltwise", "relu"), ("binary", "mul", MemoryDesc(dims)))
    desc = BinaryDesc("add", MemoryDesc(dims), MemoryDesc((48,), src1_dtype), MemoryDesc(dims, dst_dtype),
                      post_ops=post_ops)
    a = rng.uniform(-2, 2, dims).astype(np.float32)
    b = _dtype_io.store_reference(rng.uniform(-2, 2, (48,)).astype(np.float32), src1_dtype)
    old = _dtype_io.store_reference(rng.uniform(-2, 2, dims).astype(np.float32), dst_dtype)
    m = rng.uniform(-2, 2, dims).astype(np.float32)
    primitive, got = await run(engine, desc, {"src0": a, "src1": b, "dst": old, "post_op_2_src1": m})
    assert primitive.impl.startswith("ocl:rows:v16"), primitive.impl
    want = np.maximum(a + np.asarray(b, np.float32) + 0.5 * np.asarray(old, np.float32), 0) * m
    tolerance.check(np.asarray(got, np.float32), _dtype_io.store_reference(want, dst_dtype).astype(np.float32),
                    4 * tolerance.BINARY + _dtype_io.EPSILON[dst_dtype])


async def test_gpu_configuration_takes_float4_rows_from_a_million_elements(engine, rng):
    """GPU configuration: 2^20 elements (a row fewer stays general), a bias row with a post-op
    operand laid out as dst, then a per-row column."""
    engine._config = attrs.evolve(GPU, local_memory=min(GPU.local_memory, engine._config.local_memory))
    rows, cols = GPU_VECTOR_MIN // 1024, 1024
    small = BinaryDesc("add", MemoryDesc((rows - 1, cols)), MemoryDesc((1, cols)))
    assert binary.generate(small, engine._config).impl.startswith("ocl:broadcast:")
    dims = (rows, cols)
    a = rng.uniform(-2, 2, dims).astype(np.float32)
    row = rng.uniform(-2, 2, (1, cols)).astype(np.float32)
    column = rng.uniform(-2, 2, (rows, 1)).astype(np.float32)
    desc = BinaryDesc("sub", MemoryDesc(dims), MemoryDesc((1, cols)), post_ops=(("binary", "add", MemoryDesc(dims)),))
    primitive, got = await run(engine, desc, {"src0": a, "src1": row, "post_op_0_src1": a})
    assert primitive.impl.startswith(f"ocl:rows:v{GPU_VECTOR}"), primitive.impl
    tolerance.check(got, (a - row) + a, 2 * tolerance.BINARY)
    desc = BinaryDesc("mul", MemoryDesc(dims), MemoryDesc((rows, 1)))
    primitive, got = await run(engine, desc, {"src0": a, "src1": column})
    assert primitive.impl.startswith(f"ocl:rows:v{GPU_VECTOR}"), primitive.impl
    tolerance.check(got, a * column, tolerance.BINARY)
