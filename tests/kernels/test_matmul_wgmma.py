"""The warp-group tensor-core matmul (kernels/matmul_wgmma.py) and the PTX retargeting it needs.

Generation and retargeting are checked everywhere; the kernels run only on an sm_90 NVIDIA device
(H100, H200), built as the engine builds kernels (``actors.build_program``). ``matmul.generate``
does not choose them yet (``matmul_mma`` is faster, see ``matmul_wgmma.TILES``), so every tile runs
here. Inputs are small integers, exact in bf16 and f16, so every f32 sum is exact and results must
equal ``matmul.reference`` (and the post-op references) bit for bit.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from _gpu_matmul import ints, run_spec

from triodnn import MatmulDesc, MemoryDesc
from triodnn._values._dtypes import to_storage
from triodnn.kernels import _dtype_io, _post_ops, _ptx, matmul, matmul_wgmma, select_config

SM90 = select_config("gpu", 1024, 48 * 1024, nvidia_sm=90)


def md(*dims, dtype="bf16", strides=None) -> MemoryDesc:
    return MemoryDesc(tuple(dims), dtype, strides)


@pytest.fixture
def hopper(engine):
    if engine.info.nvidia_sm != matmul_wgmma.SM:
        pytest.skip(f"the warp-group kernels need an NVIDIA device of sm_{matmul_wgmma.SM}; this is {engine}")
    return engine


def test_retarget_opens_the_marked_instructions_and_raises_the_target():
    ptx = "\n".join([
        "//", ".version 7.8", ".target sm_90, texmode_independent", ".address_size 64",
        "\t// begin inline asm", "\t" + _ptx.MARK + "wgmma.fence.sync.aligned;", "\t// end inline asm",
        "\t// a comment of the compiler's own", "\tret;",
    ])
    out = _ptx.retarget(ptx, "sm_90a").splitlines()
    assert out[1:3] == [".version 8.0", ".target sm_90a"]
    assert "\twgmma.fence.sync.aligned;" in out and "\t// a comment of the compiler's own" in out
    assert _ptx.MARK not in "\n".join(out)
    assert _ptx.retarget(".version 9.0\n.target sm_90\n", "sm_90a") == ".version 9.0\n.target sm_90a\n"
    assert _ptx.marked("{", "x;", "}") == f"{_ptx.MARK}{{\\n{_ptx.MARK}x;\\n{_ptx.MARK}}}"


def test_it_takes_what_matmul_mma_reads_on_sm90_only():
    big = MatmulDesc(md(4096, 4096), md(4096, 4096))
    assert matmul_wgmma.applies(big, SM90)
    assert not matmul_wgmma.applies(big, attrs.evolve(SM90, nvidia_sm=80))
    assert not matmul_wgmma.applies(big, attrs.evolve(SM90, nvidia_sm=100))  # wgmma is sm_90a only
    assert not matmul_wgmma.applies(MatmulDesc(md(64, 64, dtype="f32"), md(64, 64, dtype="f32")), SM90)
    assert not matmul_wgmma.applies(MatmulDesc(md(64, 60), md(60, 64)), SM90)
    spec = matmul_wgmma.generate(big, SM90)
    assert spec.impl == "ocl:gemm_wgmma:128x256x16:p3:i1:r4" and spec.ptx_target == "sm_90a"
    assert spec.local_size == (256, 1, 1) and spec.global_size == (16 * 256, 32, 1)
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in spec.source
    # every wgmma instruction is hidden from the OpenCL compiler's PTX target
    assert all(line.count("wgmma.") == line.count(_ptx.MARK + "wgmma.") for line in spec.source.splitlines())
    half = matmul_wgmma.generate(MatmulDesc(md(2048, 2048, dtype="f16"), md(2048, 2048, dtype="f16")), SM90)
    assert "m64n128k16.f32.f16.f16" in half.source
    # matmul.generate keeps the faster mma.sync kernel
    assert matmul.generate(big, SM90).impl.startswith("ocl:gemm_mma:")


def test_tiles_and_their_choice():
    for tile in matmul_wgmma.TILES.values():
        tile.check()
        assert tile.local_bytes() <= 48 * 1024 - 64
    for bad in ("128x256x32:p3:i1", "128x128x16:p2:i1", "32x64x16:p3:i1", "64x264x16:p3:i1",
                "128x128x16:p4:i1:r2"):  # through registers, stages must be 2 + inflight
        with pytest.raises(ValueError, match=f"warp-group tile {bad} does not fit"):
            matmul_wgmma._tile(bad)
    assert matmul_wgmma._tile("128x256x16:p3:i1:r4").prefetch == 4
    choose = lambda m, n, batch=1: matmul_wgmma.choose_tile(m, n, batch, SM90).name  # noqa: E731
    assert choose(4096, 4096) == "128x256x16:p3:i1:r4"  # 512 work-groups
    assert choose(2048, 2048) == "128x128x16:p3:i1:r4"  # 128x256 gives 128, under one per multiprocessor
    assert choose(128, 128) == "64x64x32:p4:i1"  # the most work-groups


@pytest.mark.parametrize("tile", list(matmul_wgmma.TILES))
@pytest.mark.parametrize("k_major", [True, False])
async def test_every_tile(hopper, rng, tile, k_major):
    """Each tile on a batched problem with edges in M and N, a K tail and a bias, weights either
    N-contiguous (read transposed) or K-contiguous."""
    a, w, bias = ints(rng, (2, 150, 72), "bf16"), ints(rng, (72, 136), "bf16"), ints(rng, (1, 136))
    w_desc = md(72, 136) if k_major else md(72, 136, strides=(1, 72))
    desc = MatmulDesc(md(*a.shape), w_desc, md(2, 150, 136, dtype="f32"), bias=md(1, 136, dtype="f32"))
    spec = matmul_wgmma.generate(desc, hopper.kernel_config, tile=tile)
    assert spec.impl == f"ocl:gemm_wgmma:{tile}"
    stored = w if k_major else np.ascontiguousarray(w.T)
    got = run_spec(hopper, spec, {"src": to_storage(a, "bf16"), "weights": to_storage(stored, "bf16"), "bias": bias},
                   desc.dst.dims)
    np.testing.assert_array_equal(got, matmul.reference(a, w, bias))


@pytest.mark.parametrize("dtype, dst_dtype, transposed", [("bf16", "bf16", False), ("f16", "f16", True)])
async def test_post_ops_and_dst_types(hopper, rng, dtype, dst_dtype, transposed):
    """The chosen tile of a batch, with an output scale and a post-op chain with a binary operand,
    into a bf16 or f16 dst (pair stores)."""
    a, w = ints(rng, (2, 520, 64), dtype), ints(rng, (64, 1032), dtype)
    scale = rng.choice(np.array([0.25, 0.5, 2.0], np.float32), (1, 1032))
    w_desc = md(64, 1032, dtype=dtype, strides=(1, 64) if transposed else None)
    chain = (("eltwise", "relu", 0.0, 0.0), ("binary", "mul", md(1, 1032, dtype="f32")))
    desc = MatmulDesc(md(2, 520, 64, dtype=dtype), w_desc, md(2, 520, 1032, dtype=dst_dtype),
                      post_ops=chain, output_scale=0.5)
    spec = matmul_wgmma.generate(desc, hopper.kernel_config)
    stored = w if not transposed else np.ascontiguousarray(w.T)
    got = run_spec(hopper, spec, {"src": to_storage(a, dtype), "weights": to_storage(stored, dtype),
                                  "post_op_1_src1": scale}, desc.dst.dims, np.float16 if dst_dtype == "f16" else np.uint16)
    if dst_dtype == "bf16":
        got = (got.astype(np.uint32) << 16).view(np.float32)
    ref = _post_ops.scaled_reference(chain, matmul.reference(a, w), operands={1: scale}, output_scale=0.5)
    np.testing.assert_array_equal(got.astype(np.float32), _dtype_io.store_reference(ref, dst_dtype).astype(np.float32))
