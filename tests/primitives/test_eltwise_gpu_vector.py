"""The GPU configuration's flat eltwise on large tensors: GPU_VECTOR elements per work-item
(``ocl:flat:v4...``), with a tail, a post-op operand and narrow storage types, against the
reference; checked on PoCL with the GPU configuration forced on the engine."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from triodnn import EltwiseDesc, MemoryDesc
from triodnn.kernels import _dtype_io, eltwise, select_config, tolerance

GPU = select_config("gpu", 256, 48 * 1024)
N = eltwise.GPU_VECTOR_MIN + 3  # a tail past the last float4


@pytest.mark.parametrize("alg, src_dtype, dst_dtype, post_op", [
    ("gelu_erf", "f32", "f32", False), ("relu", "bf16", "f32", True), ("swish", "f32", "f16", False),
])
async def test_large_flat_eltwise_takes_vectors(engine, rng, alg, src_dtype, dst_dtype, post_op):
    engine._config = attrs.evolve(GPU, local_memory=min(GPU.local_memory, engine._config.local_memory))
    params = {"alpha": 1.0} if alg == "swish" else {}
    post_ops = (("binary", "add", MemoryDesc((N,))),) if post_op else ()
    desc = EltwiseDesc(alg, MemoryDesc((N,), src_dtype), MemoryDesc((N,), dst_dtype), post_ops=post_ops, **params)
    primitive = await engine.create_primitive(desc)
    assert primitive.impl.startswith(f"ocl:flat:v{eltwise.GPU_VECTOR}"), primitive.impl
    x = _dtype_io.store_reference(rng.uniform(-4, 4, N).astype(np.float32), src_dtype)
    memories = {"src": await engine.from_numpy(x, desc.src),
                "dst": await engine.from_numpy(np.zeros(N, _dtype_io.USER_NUMPY[dst_dtype]), desc.dst)}
    want = eltwise.reference(alg, np.asarray(x, np.float32), **params)
    if post_op:
        b = rng.uniform(-1, 1, N).astype(np.float32)
        memories["post_op_0_src1"] = await engine.from_numpy(b, MemoryDesc((N,)))
        want = want + b
    await (await engine.stream()).execute(primitive, memories)
    got = await memories["dst"].to_numpy()
    tolerance.check(np.asarray(got, np.float32), _dtype_io.store_reference(want, dst_dtype).astype(np.float32),
                    tolerance.eltwise(alg) + _dtype_io.EPSILON[dst_dtype])
