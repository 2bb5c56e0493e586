"""The GPU matmul kernel (kernels/matmul_gpu.py: local-memory tiled SGEMM), run on PoCL.

The engine's configuration is forced to the GPU one (vector width 1, work-groups of 256), so
``matmul.generate`` hands dst of 64 x 64+ elements to ``matmul_gpu``. Inputs are small integers:
every f32 sum is exact, so results must equal ``matmul.reference`` (and the post-op references)
bit for bit. Shapes stay modest (PoCL runs 256-item work-groups with barriers slowly) but cover
tile edges in M, N and K, batches with broadcast, transposed and padded layouts, bias, post-ops
and storage types. Each tile configuration of ``matmul_gpu.TILES`` runs once, directly through
pyopencl (the primitive cache would return one kernel per descriptor whatever the tile).
"""

from __future__ import annotations

import numpy as np
import pytest
from _gpu_matmul import GPU, execute, gpu_shaped_fixture, ints, run_spec  # noqa: F401 (the gpu_shaped fixture)

from triodnn import MatmulDesc, MemoryDesc
from triodnn.kernels import KernelConfig, _dtype_io, _post_ops, matmul, matmul_gpu

# name: src dims, src strides, weights dims, weights strides, bias dims
CASES = {
    "edges_bias": ((129, 65), None, (65, 257), None, (257,)),
    "full_tiles": ((128, 128), None, (128, 128), None, None),
    "k_tail_aligned": ((96, 20), None, (20, 128), None, (96, 1)),
    "k_one": ((64, 1), None, (1, 64), None, None),
    "batch_broadcast": ((2, 1, 70, 40), None, (3, 40, 96), None, (70, 1)),
    "batch_weights_only": ((100, 36), None, (2, 36, 68), None, (2, 1, 68)),
    "transposed_aligned": ((128, 64), (1, 128), (64, 192), (1, 64), (1, 192)),
    "transposed_odd": ((130, 67), (1, 130), (67, 99), (1, 67), None),
    "src_t_only": ((72, 33), (1, 72), (33, 80), None, None),
    "padded_rows": ((100, 48), (52, 1), (48, 76), (80, 1), None),
    "batched_transposed": ((2, 3, 64, 32), (3 * 32 * 64, 32 * 64, 1, 64), (2, 3, 32, 64),
                           (3 * 64 * 32, 64 * 32, 1, 32), None),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_matches_reference_exactly(gpu_shaped, rng, case):
    src_dims, src_strides, wei_dims, wei_strides, bias_dims = CASES[case]
    a, w = ints(rng, src_dims), ints(rng, wei_dims)
    bias = None if bias_dims is None else ints(rng, bias_dims)
    desc = MatmulDesc(MemoryDesc(src_dims, "f32", src_strides), MemoryDesc(wei_dims, "f32", wei_strides),
                      bias=None if bias is None else MemoryDesc(bias_dims))
    arrays = {"src": a, "weights": w} | ({} if bias is None else {"bias": bias})
    primitive, got = await execute(gpu_shaped, desc, arrays)
    assert primitive.impl.startswith("ocl:gemm_tiled:"), primitive.impl
    np.testing.assert_array_equal(got, matmul.reference(a, w, bias))


async def test_strided_dst_and_post_ops(gpu_shaped, rng):
    """relu, sum (old dst) and two binary operands (a row vector and a full matrix), an output
    scale, into a column-major dst: element-by-element stores."""
    m, k, n = 90, 44, 130
    row_md, full_md = MemoryDesc((1, n)), MemoryDesc((m, n))
    chain = (("eltwise", "relu"), ("sum", 0.5), ("binary", "add", row_md), ("binary", "mul", full_md))
    dst_md = MemoryDesc((m, n), "f32", "ba")
    desc = MatmulDesc(MemoryDesc((m, k)), MemoryDesc((k, n)), dst_md, post_ops=chain, output_scale=2.0)
    a, w = ints(rng, (m, k)), ints(rng, (k, n))
    old = ints(rng, (m, n))
    row = ints(rng, (1, n))
    factor = rng.choice(np.array([0.25, 0.5, 1.0, 2.0], np.float32), (m, n))
    primitive, got = await execute(gpu_shaped, desc, {"src": a, "weights": w, "post_op_2_src1": row,
                                                      "post_op_3_src1": factor}, dst_init=old)
    assert primitive.impl.startswith("ocl:gemm_tiled:")
    ref = _post_ops.scaled_reference(desc.post_ops, matmul.reference(a, w), old_dst=old,
                                     operands={2: row, 3: factor}, output_scale=2.0)
    np.testing.assert_array_equal(got, ref)


async def test_post_ops_with_vector_stores_and_batch(gpu_shaped, rng):
    """A dense f32 dst (float4 stores), batched, with a bias, a sum and a per-batch operand."""
    b, m, k, n = 2, 70, 24, 132
    op_md = MemoryDesc((b, 1, n))
    chain = (("sum", 1.0), ("binary", "sub", op_md), ("eltwise", "abs"))
    desc = MatmulDesc(MemoryDesc((b, m, k)), MemoryDesc((k, n)), bias=MemoryDesc((m, 1)), post_ops=chain)
    a, w, bias = ints(rng, (b, m, k)), ints(rng, (k, n)), ints(rng, (m, 1))
    old, op = ints(rng, (b, m, n)), ints(rng, (b, 1, n))
    _, got = await execute(gpu_shaped, desc, {"src": a, "weights": w, "bias": bias, "post_op_1_src1": op},
                           dst_init=old)
    ref = _post_ops.reference(desc.post_ops, matmul.reference(a, w, bias), old_dst=old, operands={1: op})
    np.testing.assert_array_equal(got, ref)


# src, weights, bias, dst data types
DTYPE_CASES = {
    "bf16": ("bf16", "bf16", "bf16", "bf16"),
    "bf16_to_f32": ("bf16", "bf16", None, "f32"),
    "f16_mixed": ("f16", "bf16", "f32", "f16"),
    "u8_s8_to_s32": ("u8", "s8", None, "s32"),
}


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("case", list(DTYPE_CASES))
async def test_storage_types_exact(gpu_shaped, rng, case, transposed):
    """Wide (vector) loads of each type where aligned, element loads for the transposed odd K."""
    st, wt, bt, dt = DTYPE_CASES[case]
    m, k, n = (96, 40, 72) if not transposed else (80, 37, 66)
    a, w = ints(rng, (m, k), st), ints(rng, (k, n), wt)
    bias = None if bt is None else ints(rng, (n,), bt)
    wei_md = MemoryDesc((k, n), wt, "ba" if transposed else None)
    desc = MatmulDesc(MemoryDesc((m, k), st), wei_md, MemoryDesc((m, n), dt),
                      None if bias is None else MemoryDesc((n,), bt))
    arrays = {"src": a, "weights": w} | ({} if bias is None else {"bias": bias})
    primitive, got = await execute(gpu_shaped, desc, arrays)
    assert primitive.impl.startswith("ocl:gemm_tiled:")
    want = matmul.reference(a, w, bias, dst_dtype=dt)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


async def test_bf16_post_ops_round_like_the_reference(gpu_shaped, rng):
    m, k, n = 65, 48, 100
    chain = (("eltwise", "relu"), ("sum", 0.5), ("binary", "mul", MemoryDesc((1, n))))
    desc = MatmulDesc(MemoryDesc((m, k), "bf16"), MemoryDesc((k, n), "bf16"), MemoryDesc((m, n), "bf16"),
                      post_ops=chain, output_scale=0.5)
    a, w, old = ints(rng, (m, k), "bf16"), ints(rng, (k, n), "bf16"), ints(rng, (m, n), "bf16")
    factor = rng.choice(np.array([0.25, 0.5, 1.0, 2.0], np.float32), (1, n))
    _, got = await execute(gpu_shaped, desc, {"src": a, "weights": w, "post_op_2_src1": factor}, dst_init=old)
    ref = _post_ops.scaled_reference(desc.post_ops, matmul.reference(a, w), old_dst=old, operands={2: factor},
                                     output_scale=0.5)
    np.testing.assert_array_equal(got, _dtype_io.store_reference(ref, "bf16"))


@pytest.mark.parametrize("tile", list(matmul_gpu.TILES))
async def test_every_tile_configuration(engine, rng, tile):
    """Each tile on a batched problem with edges in M, N and K (K = 128 for the K-split tiles:
    whole slabs per split) and a bias."""
    if matmul_gpu.TILES[tile].local_bytes() > engine.info.local_mem_size:
        pytest.skip(f"tile {tile} needs {matmul_gpu.TILES[tile].local_bytes()} bytes of local memory; "
                    f"the device offers {engine.info.local_mem_size}")
    k = 70 if matmul_gpu.TILES[tile].ks == 1 else 128
    a, w, bias = ints(rng, (2, 150, k)), ints(rng, (k, 140)), ints(rng, (1, 140))
    desc = MatmulDesc(MemoryDesc(a.shape), MemoryDesc(w.shape), bias=MemoryDesc(bias.shape))
    spec = matmul_gpu.generate(desc, GPU, tile=tile)
    assert spec.impl == f"ocl:gemm_tiled:{matmul_gpu.TILES[tile].name}"
    got = run_spec(engine, spec, {"src": a, "weights": w, "bias": bias}, (2, 150, 140))
    np.testing.assert_array_equal(got, matmul.reference(a, w, bias))


def test_dispatch_and_impl_names():
    big = MatmulDesc(MemoryDesc((4096, 4096)), MemoryDesc((4096, 4096)))
    assert matmul.generate(big, GPU).impl == "ocl:gemm_tiled:128x128x8:r8x8:l16x16"
    assert matmul.generate(big, GPU).local_size == (256, 1, 1)
    small = matmul.generate(MatmulDesc(MemoryDesc((128, 128)), MemoryDesc((128, 128))), GPU)
    assert small.impl == "ocl:gemm_tiled:32x32x16:r4x4:l8x8:s4"
    assert small.local_size == (256, 1, 1)
    # M = 64 (an MLP's rows): the tiled kernel splits K 4 ways inside the work-group where K is
    # whole slabs per split; ``matmul.generate`` prefers the skinny kernel's split there (measured
    # faster on an H100: 11.5 vs 18.9 µs, see matmul.TILED_ROUND_WEIGHT).
    mlp_desc = MatmulDesc(MemoryDesc((64, 1024)), MemoryDesc((1024, 1024)))
    mlp = matmul_gpu.generate(mlp_desc, GPU)
    assert mlp.impl == "ocl:gemm_tiled:32x32x16:r4x4:l8x8:s4" and mlp.global_size == (32 * 256, 2, 1)
    assert matmul.generate(mlp_desc, GPU).impl == "ocl:skinny:8x32:t4:l256"
    # K = 1000 does not split into 4 x 16: unsplit small tiles, the most work-groups among them
    odd = matmul_gpu.generate(MatmulDesc(MemoryDesc((64, 1000)), MemoryDesc((1000, 1000))), GPU)
    assert odd.impl == "ocl:gemm_tiled:32x32x32:r4x4:l8x8"
    mid = matmul.generate(MatmulDesc(MemoryDesc((1024, 1024)), MemoryDesc((1024, 1024))), GPU)
    assert mid.impl.startswith("ocl:gemm_tiled:128x64x16:r8x8")
    # Tall and 13-16 columns wide: the 16-column tiles (the split one where the unsplit gives few
    # work-groups and K splits); 17+ columns and short ones keep the kernels they had.
    def tall(m, k, n):
        return matmul.generate(MatmulDesc(MemoryDesc((m, k)), MemoryDesc((k, n))), GPU).impl
    assert tall(65536, 1024, 16) == "ocl:gemm_tiled:128x16x32:r4x4:l4x32"
    assert tall(1000, 100, 13) == "ocl:gemm_tiled:128x16x32:r4x4:l4x32"
    assert tall(256, 64, 16) == "ocl:gemm_tiled:64x16x16:r4x4:l4x16:s4"
    assert tall(8192, 4096, 24).startswith("ocl:skinny:")
    assert tall(100, 64, 16).startswith("ocl:regblock:4x4") and tall(4096, 64, 12).startswith("ocl:regblock:4x4")
    # Narrow or small dst, or a CPU configuration: the existing kernels.
    assert matmul.generate(MatmulDesc(MemoryDesc((16, 64)), MemoryDesc((64, 512))), GPU).impl.startswith("ocl:regblock:4x4")
    assert matmul.generate(MatmulDesc(MemoryDesc((40, 64)), MemoryDesc((64, 40))), GPU).impl.startswith("ocl:regblock:4x4")
    narrow = KernelConfig(vector_width=1, local_size=16)
    assert matmul.generate(MatmulDesc(MemoryDesc((256, 64)), MemoryDesc((64, 256))), narrow).impl.startswith("ocl:regblock:4x4")
    cpu = KernelConfig(vector_width=16, local_size=16)
    assert matmul.generate(MatmulDesc(MemoryDesc((256, 64)), MemoryDesc((64, 256))), cpu).impl.startswith("ocl:regblock:6x64")


async def test_k_split_tiles_through_primitives(gpu_shaped, rng):
    """Small M: the K-split tile (4 splits summed in local memory) with bias, post-ops, a batch
    and a transposed weights; the unsplit small tile where K does not split."""
    m, k, n = 64, 256, 200
    chain = (("eltwise", "relu"), ("sum", 0.5), ("binary", "add", MemoryDesc((1, n))))
    desc = MatmulDesc(MemoryDesc((m, k)), MemoryDesc((k, n), "f32", "ba"), bias=MemoryDesc((n,)), post_ops=chain)
    a, w, bias, old, row = ints(rng, (m, k)), ints(rng, (k, n)), ints(rng, (n,)), ints(rng, (m, n)), ints(rng, (1, n))
    primitive, got = await execute(gpu_shaped, desc, {"src": a, "weights": w, "bias": bias, "post_op_2_src1": row},
                                   dst_init=old)
    four_way = matmul_gpu.TILES["32x32x16:r4x4:s4"].local_bytes() <= gpu_shaped._config.local_memory
    assert primitive.impl.endswith(":s4" if four_way else ":s2"), primitive.impl  # s2: 32 KiB devices
    ref = _post_ops.reference(desc.post_ops, matmul.reference(a, w, bias), old_dst=old, operands={2: row})
    np.testing.assert_array_equal(got, ref)
    a, w = ints(rng, (2, 40, 192)), ints(rng, (192, 120))
    primitive, got = await execute(gpu_shaped, MatmulDesc(MemoryDesc(a.shape), MemoryDesc(w.shape)),
                                   {"src": a, "weights": w})
    assert primitive.impl.endswith(":s4" if four_way else ":s2"), primitive.impl
    np.testing.assert_array_equal(got, matmul.reference(a, w))
    a, w = ints(rng, (64, 90)), ints(rng, (90, 96))
    primitive, got = await execute(gpu_shaped, MatmulDesc(MemoryDesc(a.shape), MemoryDesc(w.shape)),
                                   {"src": a, "weights": w})
    assert not primitive.impl.endswith(":s4") and not primitive.impl.endswith(":s2"), primitive.impl
    np.testing.assert_array_equal(got, matmul.reference(a, w))


def test_k_split_tile_refuses_a_k_it_cannot_split():
    with pytest.raises(ValueError, match="needs K a multiple of 64"):
        matmul_gpu.generate(MatmulDesc(MemoryDesc((64, 96)), MemoryDesc((96, 64))), GPU, tile="32x32x16:r4x4:s4")


def test_wide_loads_only_where_aligned():
    """float4 global loads and stores appear exactly where strides and extents allow them."""
    def source(src_dims, src_strides, wei_dims, wei_strides, dst_strides):
        desc = MatmulDesc(MemoryDesc(src_dims, "f32", src_strides), MemoryDesc(wei_dims, "f32", wei_strides),
                          MemoryDesc((src_dims[0], wei_dims[1]), "f32", dst_strides))
        return matmul_gpu.generate(desc, GPU).source

    aligned = source((256, 64), (64, 1), (64, 256), (256, 1), (256, 1))
    assert ("(__global const float4*)(src" in aligned and "(__global const float4*)(wei" in aligned
            and "(__global float4*)" in aligned)
    odd = source((256, 65), (65, 1), (65, 258), (258, 1), (258, 1))
    assert "(__global const float4*)" not in odd and "(__global float4*)" not in odd
    # bf16 loads as ushort4 where aligned
    bf16_desc = MatmulDesc(MemoryDesc((256, 64), "bf16"), MemoryDesc((64, 256), "bf16"), MemoryDesc((256, 256)))
    bf16 = matmul_gpu.generate(bf16_desc, GPU).source
    assert "(__global const ushort4*)(src" in bf16 and "(__global const ushort4*)(wei" in bf16


def test_bad_tile_is_refused():
    with pytest.raises(ValueError, match="does not fit"):
        matmul_gpu.generate(MatmulDesc(MemoryDesc((64, 64)), MemoryDesc((64, 64))), GPU, tile="128x128x6:r8x8")

