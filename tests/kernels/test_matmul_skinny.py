"""The GPU matmul for small dst and long K (kernels/matmul_skinny.py: K split across a work-group),
run on PoCL, and ``matmul.generate``'s rule for choosing it.

PoCL runs any work-group shape, so the kernel generated for the GPU configuration (vector width
1, work-groups of 256, NVIDIA's 48 KiB of local memory) runs here as it would there. Inputs are
small integers, so every f32 sum is exact (|sum| <= 16 K < 2**24) and results must equal the
reference bit for bit; tanh is held to its eltwise tolerance. The shape sweep runs generated
specs directly through pyopencl on one module-wide context (the primitive cache would key each
on the descriptor); features that need strides and storage types go through primitives on an
engine forced to the GPU configuration, where the selection rule must pick this kernel.
"""

from __future__ import annotations

import attrs
import numpy as np
import pyopencl as cl
import pytest
from _gpu_matmul import GPU, execute, gpu_shaped_fixture, ints  # noqa: F401 (the gpu_shaped fixture)
from conftest import default_record

from triodnn import MatmulDesc, MemoryDesc
from triodnn._values._dtypes import from_storage, to_storage
from triodnn.kernels import KernelConfig, _dtype_io, _post_ops, matmul, matmul_skinny, program_source, tolerance

TANH = tolerance.eltwise("tanh")


@pytest.fixture(scope="module")
def cl_context():
    """Held for the module: Intel's CPU runtime answers a queue's context query only while the
    context object itself is alive (PoCL keeps it alive through its queues)."""
    return cl.Context([default_record().device])


@pytest.fixture(scope="module")
def cl_queue(cl_context):
    """One queue on the default device for the whole module."""
    return cl.CommandQueue(cl_context)


def run_spec(queue, spec, arrays: dict, dst_shape) -> np.ndarray:
    """Run ``spec`` on dense f32 buffers (``arrays`` by argument name); dst starts at zero."""
    ctx, mf = queue.context, cl.mem_flags
    buffers = [cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(arrays[name], np.float32))
               for name in spec.arg_names[:-1]]
    out = np.zeros(dst_shape, np.float32)
    dst = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=out)
    program = cl.Program(ctx, program_source(spec, GPU)).build()
    getattr(program, spec.name)(queue, spec.global_size, spec.local_size, *buffers, dst)
    cl.enqueue_copy(queue, out, dst)
    queue.finish()
    return out


# M in 1, 2, 8, 16; K in 1, 7, 64, 4096, 32768; N in 1, 3, 32, 64: every value of each with
# several of the others, each with a chain ("bias": a bias row; "relu", "tanh"; "add": a binary
# add of a (1, N) row, "add_col" of an (M, 1) column); block None: choose_block's.
SWEEP = [
    # (M, K, N), chain, block
    ((1, 1, 1), (), None),
    ((1, 7, 3), ("bias",), None),
    ((1, 64, 64), ("tanh",), None),
    ((1, 32768, 64), ("relu",), None),
    ((2, 7, 32), ("add",), None),
    ((2, 4096, 3), ("bias", "relu"), None),
    ((2, 64, 1), (), None),
    ((8, 1, 32), ("add_col",), None),
    ((8, 64, 3), (), None),
    ((8, 4096, 64), ("bias", "add"), None),
    ((8, 32768, 32), ("add",), None),
    ((16, 7, 64), ("relu", "add_col"), None),
    ((16, 4096, 1), ("bias",), None),
    ((16, 32768, 3), (), None),
    # forced blocks: rows and columns past M and N (clamped), 2 columns per work-item, a
    # work-group of one warp, each work-item all the block's columns
    ((2, 64, 3), ("bias",), "4x4:t4:l256"),
    ((3, 4099, 70), ("add",), "2x64:t4:l256"),
    ((16, 1024, 64), ("relu",), "16x16:t2:l256"),
    ((5, 300, 9), (), "4x8:t4:l32"),
    ((8, 1000, 8), ("bias",), "8x8:t4:l256"),
]


def _desc_and_inputs(rng, m, k, n, chain):
    a, w = ints(rng, (m, k)), ints(rng, (k, n))
    arrays, post_ops, bias = {"src": a, "weights": w}, [], None
    operands = {}
    for name in chain:
        if name == "bias":
            bias = arrays["bias"] = ints(rng, (n,))
        elif name in ("relu", "tanh"):
            post_ops.append(("eltwise", name))
        else:
            shape = (1, n) if name == "add" else (m, 1)
            operand = ints(rng, shape)
            operands[len(post_ops)] = arrays[f"post_op_{len(post_ops)}_src1"] = operand
            post_ops.append(("binary", "add", MemoryDesc(shape)))
    desc = MatmulDesc(MemoryDesc((m, k)), MemoryDesc((k, n)), bias=None if bias is None else MemoryDesc((n,)),
                      post_ops=tuple(post_ops))
    ref = _post_ops.reference(desc.post_ops, matmul.reference(a, w, bias), operands=operands)
    return desc, arrays, ref


SWEEP_IDS = ["x".join(map(str, shape)) + "".join(f"-{c}" for c in chain) + (f"-{block}" if block else "")
             for shape, chain, block in SWEEP]


@pytest.mark.parametrize(("shape", "chain", "block"), SWEEP, ids=SWEEP_IDS)
def test_shapes_blocks_and_chains(cl_queue, rng, shape, chain, block):
    m, k, n = shape
    desc, arrays, ref = _desc_and_inputs(rng, m, k, n, chain)
    spec = matmul_skinny.generate(desc, GPU, block=block)
    blk = matmul_skinny.block(spec.impl.removeprefix("ocl:skinny:"))
    assert block is None or blk == matmul_skinny.block(block)
    assert spec.local_size == (blk.local, 1, 1)
    assert spec.global_size == (-(-n // blk.rn) * blk.local, -(-m // blk.rm), 1)
    got = run_spec(cl_queue, spec, arrays, (m, n))
    if "tanh" in chain:
        tolerance.check(got, ref, TANH)
    else:
        np.testing.assert_array_equal(got, ref)


# -- through primitives, where matmul.generate must choose this kernel ------------------------


async def test_batched_broadcast_with_bias_and_chain(gpu_shaped, rng):
    """Batch 2 x 3: src broadcast over the second batch dim, weights over the first; a bias per
    column and a binary add broadcast over rows and the first batch dim, then relu."""
    m, k, n = 8, 640, 24
    a, w, bias, op = ints(rng, (2, 1, m, k)), ints(rng, (3, k, n)), ints(rng, (n,)), ints(rng, (1, 3, 1, n))
    chain = (("binary", "add", MemoryDesc(op.shape)), ("eltwise", "relu"))
    desc = MatmulDesc(MemoryDesc(a.shape), MemoryDesc(w.shape), bias=MemoryDesc(bias.shape), post_ops=chain)
    primitive, got = await execute(gpu_shaped, desc, {"src": a, "weights": w, "bias": bias, "post_op_0_src1": op})
    assert primitive.impl.startswith("ocl:skinny:"), primitive.impl
    ref = _post_ops.reference(desc.post_ops, matmul.reference(a, w, bias), operands={0: op})
    assert got.shape == (2, 3, m, n)
    np.testing.assert_array_equal(got, ref)


async def test_transposed_operands_output_scale_and_sum(gpu_shaped, rng):
    """src stored M-major, weights K-major (a linear layer's N x K: float4 reads along K), an
    output scale, a sum post-op reading the old dst, into a column-major dst."""
    m, k, n = 6, 1028, 20
    a, w, bias, old = ints(rng, (m, k)), ints(rng, (k, n)), ints(rng, (m, 1)), ints(rng, (m, n))
    desc = MatmulDesc(MemoryDesc((m, k), "f32", "ba"), MemoryDesc((k, n), "f32", "ba"), MemoryDesc((m, n), "f32", "ba"),
                      bias=MemoryDesc((m, 1)), post_ops=(("sum", 0.5),), output_scale=2.0)
    primitive, got = await execute(gpu_shaped, desc, {"src": a, "weights": w, "bias": bias}, dst_init=old)
    assert primitive.impl.startswith("ocl:skinny:"), primitive.impl
    ref = _post_ops.scaled_reference(desc.post_ops, matmul.reference(a, w, bias), old_dst=old, output_scale=2.0)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize(("src_dt", "wei_dt", "dst_dt"), [("bf16", "bf16", "bf16"), ("f16", "bf16", "f16")])
async def test_storage_types(gpu_shaped, rng, src_dt, wei_dt, dst_dt):
    """bf16 / f16 loads (ushort4, vload_half4 where aligned) and stores; tanh after an output
    scale of 1/64 keeps the results away from tanh's flat ends."""
    m, k, n = 4, 2048, 40
    a, w = ints(rng, (m, k), src_dt), ints(rng, (k, n), wei_dt)
    desc = MatmulDesc(MemoryDesc((m, k), src_dt), MemoryDesc((k, n), wei_dt), MemoryDesc((m, n), dst_dt),
                      post_ops=(("eltwise", "tanh"),), output_scale=1 / 64)
    primitive, got = await execute(gpu_shaped, desc, {"src": a, "weights": w})
    assert primitive.impl.startswith("ocl:skinny:"), primitive.impl
    ref = _post_ops.scaled_reference(desc.post_ops, matmul.reference(a, w), output_scale=1 / 64)
    want = _dtype_io.store_reference(ref, dst_dt)
    assert got.dtype == want.dtype
    tolerance.check(got, want, TANH + _dtype_io.EPSILON[dst_dt])
    # the stored values are what the storage type can hold
    np.testing.assert_array_equal(from_storage(to_storage(np.asarray(got, np.float32), dst_dt), dst_dt), got)


async def test_bench_graph_dag_shape_with_tanh(gpu_shaped, rng):
    """The MatMul of bench_graph_dag (8 x 32768 by 32768 x 32) with its fused Tanh."""
    a, w = rng.uniform(-1, 1, (8, 32768)).astype(np.float32), rng.uniform(-0.01, 0.01, (32768, 32)).astype(np.float32)
    desc = MatmulDesc(MemoryDesc(a.shape), MemoryDesc(w.shape), post_ops=(("eltwise", "tanh"),))
    primitive, got = await execute(gpu_shaped, desc, {"src": a, "weights": w})
    assert primitive.impl == "ocl:skinny:1x4:t4:l256"
    ref = _post_ops.reference(desc.post_ops, matmul.reference(a, w))
    tolerance.check(got, ref, tolerance.matmul(32768) + TANH)


# -- the selection rule ------------------------------------------------------------------------


def impl(m, k, n, config=GPU, batch=(), post_ops=()):
    desc = MatmulDesc(MemoryDesc(batch + (m, k)), MemoryDesc((k, n)), post_ops=post_ops)
    return matmul.generate(desc, config).impl


def test_selection_rule():
    # Small dst, long K: the register-blocked kernel would run a few work-items through all of K.
    assert impl(8, 32768, 32) == "ocl:skinny:1x4:t4:l256"
    assert impl(8, 32768, 32, post_ops=(("eltwise", "tanh"),)) == "ocl:skinny:1x4:t4:l256"  # post-ops change nothing
    assert impl(1, 4096, 4096).startswith("ocl:skinny:")
    assert impl(16, 1024, 1024).startswith("ocl:skinny:")
    assert impl(4, 8192, 256).startswith("ocl:skinny:")
    assert impl(32, 65536, 32).startswith("ocl:skinny:")  # 32 x 32 is under the tiled kernel's 64 x 64
    assert impl(8, 128, 8, batch=(2, 3)).startswith("ocl:skinny:")
    # K under MIN_ROUNDS (128) rounds: the register-blocked kernel.
    assert matmul_skinny.MIN_ROUNDS == 128
    assert impl(8, 127, 8).startswith("ocl:regblock:4x4")
    assert impl(8, 128, 8).startswith("ocl:skinny:")
    assert impl(16, 64, 512).startswith("ocl:regblock:4x4")
    # TARGET_ITEMS: 4 x 4 blocks of 16 x 65536 make 65536 work-items, enough; one column fewer is not.
    assert impl(16, 256, 65536).startswith("ocl:regblock:4x4")
    assert impl(16, 256, 65532).startswith("ocl:skinny:")
    # The tiled kernel's chain is K slabs per split, TILED_ROUND_WEIGHT rounds each: at M = 64 (an
    # MLP's rows) 16 slabs per split of 4 already lose to the skinny kernel.
    assert impl(64, 1024, 1024) == "ocl:skinny:8x32:t4:l256"
    assert impl(64, 1000, 1000).startswith("ocl:skinny:")
    assert impl(128, 128, 128).startswith("ocl:gemm_tiled:")  # 2 slabs per split of 4
    assert impl(4096, 4096, 4096).startswith("ocl:gemm_tiled:128x128")
    assert impl(64, 16384, 64).startswith("ocl:skinny:")  # 256 slabs of 16 per split of 4
    # Neither the CPU configuration nor work-groups narrower than a warp.
    assert impl(8, 32768, 32, KernelConfig(vector_width=16, local_size=16)).startswith("ocl:regblock:8x32")
    assert impl(8, 32768, 32, KernelConfig(vector_width=1, local_size=16)).startswith("ocl:regblock:4x4")


def test_existing_work_and_prefers():
    desc = MatmulDesc(MemoryDesc((8, 32768)), MemoryDesc((32768, 32)))
    assert matmul.existing_work(desc, GPU) == (2 * 8, 32768)  # 4 x 4 blocks, one round per k
    mlp = MatmulDesc(MemoryDesc((64, 1024)), MemoryDesc((1024, 1024)))
    assert matmul.existing_work(mlp, GPU) == (2 * 32 * 256, 1024 // 4 // 16 * matmul.TILED_ROUND_WEIGHT)
    assert matmul_skinny.prefers(16, 32768, GPU)
    assert not matmul_skinny.prefers(matmul_skinny.TARGET_ITEMS, 32768, GPU)
    assert not matmul_skinny.prefers(16, 127, GPU)
    assert not matmul_skinny.prefers(16, 32768, KernelConfig(vector_width=16, local_size=16))


def test_choose_block():
    """The model's picks are the H100's best blocks where they were measured (skinny_check.py):
    one src row and one float4 of columns for the bench shape (64 work-groups, 32 rounds per
    work-item), 8 x 32 at 64x1024x1024 and 1 x 16 at 1x4096x4096; every pick fits the kernel's
    layout and the configuration's local memory."""
    f32 = lambda ext, k, s_x, s_k: matmul_skinny._Layout("f32", ext, k, s_x, s_k, ())  # noqa: E731
    blk = matmul_skinny.choose_block(8, 32, 32768, 1, f32(8, 32768, 32768, 1), f32(32, 32768, 1, 32), GPU)
    assert blk == matmul_skinny.Block(1, 4, 4, 256) and (blk.nt, blk.kt) == (1, 256)
    assert matmul_skinny.choose_block(64, 1024, 1024, 1, f32(64, 1024, 1024, 1), f32(1024, 1024, 1, 1024),
                                      GPU) == matmul_skinny.Block(8, 32, 4, 256)
    assert matmul_skinny.choose_block(1, 4096, 4096, 1, f32(1, 4096, 4096, 1), f32(4096, 4096, 1, 4096),
                                      GPU) == matmul_skinny.Block(1, 16, 4, 256)
    small = KernelConfig(vector_width=1, local_size=256, local_memory=8192)
    for m, k, n in [(16, 4096, 64), (1, 4096, 4096), (2, 100, 3)]:
        for config in (GPU, small):
            b = matmul_skinny.choose_block(m, n, k, 1, f32(m, k, k, 1), f32(n, k, 1, n), config)
            b.check()
            assert b.local_bytes() <= config.local_memory and b.rm * b.tn <= matmul_skinny.MAX_ACC


def test_refusals():
    desc = MatmulDesc(MemoryDesc((8, 256)), MemoryDesc((256, 8)))
    with pytest.raises(ValueError, match="does not fit"):
        matmul_skinny.generate(desc, GPU, block="32x16:t4:l256")  # 32 x 4 sums per work-item
    with pytest.raises(ValueError, match="does not fit"):
        matmul_skinny.generate(desc, GPU, block="3x4:t4:l256")  # not a power of two
    with pytest.raises(ValueError, match="local memory"):
        matmul_skinny.generate(desc, attrs.evolve(GPU, local_memory=4096), block="8x8:t4:l256")


# -- the other kernels' epilogues with post-ops ------------------------------------------------


def test_gpu_regblock_sums_are_scalars(cl_queue, rng):
    """The 4 x 4 register-blocked GPU kernel keeps its sums in named scalars (a C array indexed
    in a loop left registers once a tanh made the epilogue loop too big to unroll); edge blocks
    with a bias and tanh, on PoCL."""
    m, k, n = 6, 64, 7
    a, w, bias = ints(rng, (m, k)), ints(rng, (k, n)), ints(rng, (n,))
    desc = MatmulDesc(MemoryDesc((m, k)), MemoryDesc((k, n)), bias=MemoryDesc((n,)), post_ops=(("eltwise", "tanh"),))
    spec = matmul.generate(desc, GPU)
    assert spec.impl.startswith("ocl:regblock:4x4") and "acc[" not in spec.source and "acc3_3" in spec.source
    got = run_spec(cl_queue, spec, {"src": a, "weights": w, "bias": bias}, (m, n))
    tolerance.check(got, _post_ops.reference(desc.post_ops, matmul.reference(a, w, bias)), TANH)


def test_cpu_epilogue_with_post_ops_is_a_function():
    """On the CPU configuration a chain moves the epilogue out of the kernel body into a function
    that is not inlined; without one the kernel is as before."""
    cpu = KernelConfig(vector_width=16, local_size=16, local_memory=1 << 20)
    plain = matmul.generate(MatmulDesc(MemoryDesc((8, 32768)), MemoryDesc((32768, 32))), cpu)
    fused = matmul.generate(MatmulDesc(MemoryDesc((8, 32768)), MemoryDesc((32768, 32)),
                                       post_ops=(("eltwise", "tanh"),)), cpu)
    assert plain.impl == "ocl:regblock:8x32:k256:m8:direct:l1x1" and "mm_epilogue" not in plain.source
    assert fused.impl == "ocl:regblock:8x32:k256:m8:direct:staged:l1x1"
    body = fused.source[fused.source.index("__kernel"):]
    assert "post_op_0" not in body and body.count("mm_epilogue(") == 1
