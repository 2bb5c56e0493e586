"""The GPU configuration's tiled transpose (``ocl:tiled``): src contiguous along one axis, dst
along another, through __local tiles; exact against the reference for same-type moves and
conversions, edges not multiples of the tile, batch dims. Checked on PoCL with the GPU
configuration forced on the engine (the configuration is part of the primitive key)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from triodnn import MemoryDesc
from triodnn._values._reorder_desc import ReorderDesc
from triodnn.kernels import reorder, select_config

GPU = select_config("gpu", 256, 48 * 1024)

# (dims, src layout, dst layout, src dtype, dst dtype)
CASES = {
    "2d_edges": ((70, 45), "ba", "ab", "f32", "f32"),
    "nchw_to_nhwc": ((2, 40, 9, 33), "abcd", "acdb", "f32", "f32"),
    "convert_bf16": ((33, 64), "ab", "ba", "f32", "bf16"),
    "s8_to_f32": ((3, 32, 40), "acb", "abc", "s8", "f32"),
}


@pytest.mark.parametrize("name", list(CASES))
async def test_tiled_transpose(engine, rng, name):
    engine._config = attrs.evolve(GPU, local_memory=min(GPU.local_memory, engine._config.local_memory))
    dims, src_layout, dst_layout, src_dtype, dst_dtype = CASES[name]
    desc = ReorderDesc(MemoryDesc(dims, src_dtype, src_layout), MemoryDesc(dims, dst_dtype, dst_layout))
    primitive = await engine.create_primitive(desc)
    assert primitive.impl.startswith("ocl:tiled"), primitive.impl
    if src_dtype == "s8":
        x = rng.integers(-128, 128, dims).astype(np.int8)
    else:
        x = rng.uniform(-3, 3, dims).astype(np.float32)
    src = await engine.from_numpy(x, desc.src)
    dst = await engine.from_numpy(np.zeros(dims, np.float32), desc.dst)
    await (await engine.stream()).execute(primitive, {"src": src, "dst": dst})
    got = await dst.to_numpy()
    want = reorder.reference(x, src_dtype, dst_dtype)
    assert np.array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
