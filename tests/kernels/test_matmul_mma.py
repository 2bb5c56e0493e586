"""The tensor-core matmul (kernels/matmul_mma.py): which problems it takes, and its results.

Generation is checked everywhere; the kernels run only on an NVIDIA device of sm_80 or later
(inline PTX: ``cp.async``, ``ldmatrix``, ``mma.sync``), where ``matmul.generate`` hands them every
bf16 and f16 matmul they can read. Inputs are small integers, exact in bf16 and f16, so every f32
sum is exact and results must equal ``matmul.reference`` (and the post-op references) bit for bit.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from _gpu_matmul import ints, run_spec

from triodnn import MatmulDesc, MemoryDesc
from triodnn._values._dtypes import to_storage
from triodnn.kernels import _dtype_io, _post_ops, matmul, matmul_mma, select_config

SM90 = select_config("gpu", 1024, 48 * 1024, nvidia_sm=90)
NO_TENSOR_CORES = select_config("gpu", 1024, 48 * 1024)


def md(*dims, dtype="bf16", strides=None) -> MemoryDesc:
    return MemoryDesc(tuple(dims), dtype, strides)


@pytest.fixture
def tensor_cores(engine):
    if engine.info.nvidia_sm < matmul_mma.MIN_SM:
        pytest.skip(f"the tensor-core kernels need an NVIDIA device of sm_{matmul_mma.MIN_SM}+; this is {engine}")
    return engine


def test_it_takes_bf16_and_f16_in_layouts_it_reads():
    assert matmul_mma.applies(MatmulDesc(md(64, 64), md(64, 64)), SM90)
    assert matmul_mma.applies(MatmulDesc(md(3, 40, 72, dtype="f16"), md(72, 24, dtype="f16"),
                                         md(3, 40, 24, dtype="f32")), SM90)
    assert matmul_mma.applies(MatmulDesc(md(64, 64), md(64, 40, strides="ba")), SM90)  # K-contiguous weights
    refused = {
        "another vendor": (MatmulDesc(md(64, 64), md(64, 64)), NO_TENSOR_CORES),
        "before sm_80": (MatmulDesc(md(64, 64), md(64, 64)), attrs.evolve(SM90, nvidia_sm=75)),
        "f32": (MatmulDesc(md(64, 64, dtype="f32"), md(64, 64, dtype="f32")), SM90),
        "mixed types": (MatmulDesc(md(64, 64), md(64, 64, dtype="f16")), SM90),
        "K not whole chunks": (MatmulDesc(md(64, 60), md(60, 64)), SM90),
        "N not whole chunks, N contiguous": (MatmulDesc(md(64, 64), md(64, 60)), SM90),
        "src K-strided": (MatmulDesc(md(64, 64, strides="ba"), md(64, 64)), SM90),
        "rows not 16-byte aligned": (MatmulDesc(md(64, 64, strides=(68, 1)), md(64, 64)), SM90),
        "dst under 16 rows": (MatmulDesc(md(8, 64), md(64, 64)), SM90),
    }
    assert {why for why, (desc, config) in refused.items() if matmul_mma.applies(desc, config)} == set()
    assert matmul.generate(MatmulDesc(md(64, 64), md(64, 64)), SM90).impl.startswith("ocl:gemm_mma:")
    assert not matmul.generate(MatmulDesc(md(64, 64), md(64, 64)), NO_TENSOR_CORES).impl.startswith("ocl:gemm_mma:")
    # Few work-groups over a long K: the skinny kernel's K split (see matmul_mma.work).
    long_k = MatmulDesc(md(16, 32768), md(32768, 1024))
    assert matmul_mma.applies(long_k, SM90) and matmul.generate(long_k, SM90).impl.startswith("ocl:skinny:")
    assert matmul.generate(MatmulDesc(md(64, 1024), md(1024, 1024)), SM90).impl.startswith("ocl:gemm_mma:")


def test_tiles_and_their_choice():
    for tile in matmul_mma.TILES.values():
        tile.check()
        assert tile.local_bytes(k_major=True) <= 48 * 1024 - 64 and tile.local_bytes(k_major=False) <= 48 * 1024 - 64
    with pytest.raises(ValueError, match="tensor-core tile 256x256x32:w2x2:p2 does not fit"):
        matmul_mma.MmaTile(256, 256, 32, 2, 2).check()
    choose = lambda m, n, batch=1: matmul_mma.choose_tile(m, n, batch, SM90).name  # noqa: E731
    assert choose(4096, 4096) == "128x128x32:w2x4:p2"  # 1024 work-groups
    assert choose(1024, 1024) == "64x128x32:w2x2:p2"  # 128 work-groups
    assert choose(64, 1024) == "32x64x32:w1x2:p3"  # the most work-groups of the small tiles
    spec = matmul.generate(MatmulDesc(md(4096, 4096), md(4096, 4096)), SM90)
    assert spec.impl == "ocl:gemm_mma:128x128x32:w2x4:p2" and spec.local_size == (256, 1, 1)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in spec.source
    half = matmul.generate(MatmulDesc(md(64, 64, dtype="f16"), md(64, 64, dtype="f16")), SM90)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in half.source
    assert SM90 != NO_TENSOR_CORES  # primitive cache keys tell the two apart


@pytest.mark.parametrize("tile", list(matmul_mma.TILES))
async def test_every_tile(tensor_cores, rng, tile):
    """Each tile on a batched problem with edges in M and N, a K tail and a bias."""
    a, w, bias = ints(rng, (2, 150, 72), "bf16"), ints(rng, (72, 136), "bf16"), ints(rng, (1, 136))
    desc = MatmulDesc(md(*a.shape), md(*w.shape), md(2, 150, 136, dtype="f32"), bias=md(1, 136, dtype="f32"))
    spec = matmul_mma.generate(desc, tensor_cores.kernel_config, tile=tile)
    assert spec.impl == f"ocl:gemm_mma:{tile}"
    got = run_spec(tensor_cores, spec, {"src": to_storage(a, "bf16"), "weights": to_storage(w, "bf16"), "bias": bias},
                   desc.dst.dims)
    np.testing.assert_array_equal(got, matmul.reference(a, w, bias))


async def _primitive(engine, desc, arrays, dst_init=None):
    primitive = await engine.create_primitive(desc)
    memories = {name: await engine.from_numpy(arrays[name], m) if name in arrays else engine.memory(m)
                for name, m in desc.arg_descs.items()}
    if dst_init is not None:
        memories["dst"] = await engine.from_numpy(dst_init, desc.dst)
    await (await engine.stream()).execute(primitive, memories)
    return primitive, await memories["dst"].to_numpy()


@pytest.mark.parametrize("dtype, dst_dtype, transposed", [
    ("bf16", "bf16", False), ("f16", "f16", True), ("bf16", "f32", True), ("f16", "bf16", False)])
async def test_layouts_types_and_post_ops(tensor_cores, rng, dtype, dst_dtype, transposed):
    """Through the primitive API: batches broadcast, weights K-contiguous or N-contiguous, every dst
    type its pair stores write, an output scale and a post-op chain with a binary operand."""
    a, w = ints(rng, (2, 1, 70, 48), dtype), ints(rng, (3, 48, 40), dtype)
    scale = rng.choice(np.array([0.25, 0.5, 2.0], np.float32), (1, 40))
    w_desc = md(3, 48, 40, dtype=dtype, strides=(40 * 48, 1, 48) if transposed else None)
    chain = (("eltwise", "relu", 0.0, 0.0), ("binary", "mul", md(1, 40, dtype="f32")))
    desc = MatmulDesc(md(2, 1, 70, 48, dtype=dtype), w_desc, md(2, 3, 70, 40, dtype=dst_dtype),
                      post_ops=chain, output_scale=0.5)
    primitive, got = await _primitive(tensor_cores, desc, {"src": a, "weights": w, "post_op_1_src1": scale})
    assert primitive.impl.startswith("ocl:gemm_mma:")
    ref = _post_ops.scaled_reference(chain, matmul.reference(a, w), operands={1: scale}, output_scale=0.5)
    np.testing.assert_array_equal(got, _dtype_io.store_reference(ref, dst_dtype))


async def test_a_sum_post_op_reads_dst(tensor_cores, rng):
    a, w, old = ints(rng, (130, 64), "bf16"), ints(rng, (64, 72), "bf16"), ints(rng, (130, 72), "bf16")
    desc = MatmulDesc(md(130, 64), md(64, 72), post_ops=(("sum", 2.0),))
    primitive, got = await _primitive(tensor_cores, desc, {"src": a, "weights": w}, dst_init=old)
    assert primitive.impl.startswith("ocl:gemm_mma:")
    ref = _post_ops.scaled_reference(desc.post_ops, matmul.reference(a, w), old_dst=old)
    np.testing.assert_array_equal(got, _dtype_io.store_reference(ref, "bf16"))


@pytest.mark.parametrize("tile", list(matmul_mma.TF32_TILES))
@pytest.mark.parametrize("transposed", [False, True])
async def test_every_tf32_tile(tensor_cores, rng, tile, transposed):
    """f32 under fpmath "tf32" on the tensor cores: small integers are exact in TF32, so the
    result equals the f32 reference; a batch, edges in M and N, a K tail, a bias."""
    a, w, bias = ints(rng, (2, 150, 72)), ints(rng, (72, 136)), ints(rng, (1, 136))
    w_desc = md(72, 136, dtype="f32", strides="ba" if transposed else None)
    desc = MatmulDesc(md(2, 150, 72, dtype="f32"), w_desc, md(2, 150, 136, dtype="f32"),
                      bias=md(1, 136, dtype="f32"), fpmath="tf32")
    spec = matmul_mma.generate(desc, tensor_cores.kernel_config, tile=tile)
    assert spec.impl == f"ocl:gemm_mma:{tile}:tf32"
    stored = np.ascontiguousarray(w.T) if transposed else w
    got = run_spec(tensor_cores, spec, {"src": a, "weights": stored, "bias": bias}, desc.dst.dims)
    np.testing.assert_array_equal(got, matmul.reference(a, w, bias))


def test_tf32_only_where_fpmath_allows_it():
    f32 = MatmulDesc(md(64, 64, dtype="f32"), md(64, 64, dtype="f32"))
    with pytest.raises(ValueError, match="needs bf16 or f16"):
        matmul_mma.generate(f32, SM90, tile="64x64x16:w2x2:p2")  # strict: no TF32 kernel at all
    for mode in ("tf32", "any"):
        assert matmul_mma.tf32_operands(attrs.evolve(f32, fpmath=mode))
    for mode in ("strict", "bf16", "f16"):
        assert not matmul_mma.tf32_operands(attrs.evolve(f32, fpmath=mode))
    # Chosen by itself only once measured on a GPU (TF32_CHOSEN); f32 stays on the CUDA cores until then.
    assert matmul_mma.applies(attrs.evolve(f32, fpmath="tf32"), SM90) is matmul_mma.TF32_CHOSEN
