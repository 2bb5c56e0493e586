"""QuantizedMatmulDesc: the int8 kernel against an independent numpy int64 reference (per-tensor
and per-channel scales, zero points, u8/s8 src, s8/u8/f32/bf16 dst, bias, a post-op chain,
batches and transposed weights), exactly for integer outputs, and each typed error."""

from __future__ import annotations

import numpy as np
import pytest

import triodnn
from triodnn import ArgumentMismatchError, InvalidArgumentError, MemoryDesc, QuantizedMatmulDesc, UnsupportedError
from triodnn.kernels import kind_of, quantized_matmul, select_config, tolerance


def md(*dims, dtype="f32", strides=None) -> MemoryDesc:
    return MemoryDesc(tuple(dims), dtype, strides)


def _ints(rng, dtype, shape):
    low, high = (-128, 128) if dtype == "s8" else (0, 256)
    return rng.integers(low, high, shape).astype(np.int8 if dtype == "s8" else np.uint8)


async def _run(engine, desc, arrays):
    primitive = await engine.create_primitive(desc)
    args = {name: await engine.from_numpy(array, desc.arg_descs[name]) for name, array in arrays.items()}
    args["dst"] = engine.memory(desc.dst)
    await (await engine.stream()).execute(primitive, args)
    return await args["dst"].to_numpy()


def _want(a, w, *, sa, za, sw, zw, bias=None, relu=False, ds=1.0, dz=0, dtype="f32"):
    """Written apart from the kernel module's reference: int64 products, f32 epilogue steps."""
    acc = np.matmul(a.astype(np.int64) - za, w.astype(np.int64) - np.asarray(zw, np.int64))
    y = acc.astype(np.float32) * (np.float64(sa) * np.asarray(sw, np.float64)).astype(np.float32)
    if bias is not None:
        y = (y + bias).astype(np.float32)
    if relu:
        y = np.maximum(y, np.float32(0))
    if dtype == "f32":
        return (y / np.float32(ds)).astype(np.float32)
    q = np.rint((y / np.float32(ds)).astype(np.float32) + np.float32(dz))
    low, high = (-128, 127) if dtype == "s8" else (0, 255)
    return np.clip(q, low, high).astype(np.int8 if dtype == "s8" else np.uint8)


CASES = [  # src dtype, weights dtype, dst dtype, per-channel weights
    ("u8", "s8", "s8", False), ("s8", "s8", "u8", True), ("u8", "s8", "f32", True), ("s8", "u8", "s8", True),
]


@pytest.fixture(params=["cpu", "gpu"])
async def shaped_engine(engine, request, monkeypatch):
    """The default engine with the CPU (register-blocked) or GPU kernel configuration (the
    configuration is part of the primitive cache key); on the GPU one, dst of 4096 elements or
    more take the tiled kernel, smaller ones one element per work-item."""
    engine._config = select_config(request.param, engine.info.max_work_group_size)
    monkeypatch.setattr(quantized_matmul, "TILED_MIN_DST", 4096)
    yield engine
    # The patched threshold chose kernels the cache key cannot see: empty the (process-wide)
    # primitive cache, or a later engine blob would pair these programs with the default choice.
    capacity = triodnn.get_primitive_cache_capacity()
    triodnn.set_primitive_cache_capacity(0)
    triodnn.set_primitive_cache_capacity(capacity)


@pytest.mark.parametrize(("sdt", "wdt", "ddt", "per_channel"), CASES)
async def test_matches_the_int64_reference(shaped_engine, rng, sdt, wdt, ddt, per_channel):
    engine = shaped_engine
    m, k, n = 70, 37, 70  # full and edge CPU blocks; on the GPU configuration, tiles (4900 elements)
    a, w = _ints(rng, sdt, (m, k)), _ints(rng, wdt, (k, n))
    bias = rng.uniform(-50, 50, (1, n)).astype(np.float32)
    za = 3 if sdt == "u8" else -2
    sw = rng.uniform(0.01, 0.05, n).round(4) if per_channel else (0.03,)
    zw = tuple(int(z) for z in rng.integers(0, 6, n)) if per_channel else (1,)
    ds, dz = (0.5, -5 if ddt == "s8" else 100) if ddt != "f32" else (1.0, 0)
    desc = QuantizedMatmulDesc(md(m, k, dtype=sdt), md(k, n, dtype=wdt), md(m, n, dtype=ddt), md(1, n),
                               src_scale=0.02, src_zp=za, wei_scales=sw, wei_zps=zw, dst_scale=ds, dst_zp=dz,
                               post_ops=(("eltwise", "relu", 0.0, 0.0),))
    got = await _run(engine, desc, {"src": a, "weights": w, "bias": bias})
    want = _want(a, w, sa=0.02, za=za, sw=sw, zw=zw, bias=bias, relu=True, ds=ds, dz=dz, dtype=ddt)
    if ddt == "f32":
        tolerance.check(got, want, kind_of(desc).tolerance(desc))
    else:
        np.testing.assert_array_equal(got, want)
        assert len(np.unique(got)) > 5  # not all saturated
    registered = kind_of(desc).reference(desc, {"src": a, "weights": w, "bias": bias})
    np.testing.assert_array_equal(registered, want)


# CPU configuration: K >= 16 takes the K-vectorised dot kernel (37: with a K tail), K = 9 the
# register-blocked one gathering transposed weights (N = 70: a full and an edge panel). GPU
# configuration: 1100 columns take the tiled kernel, the others one element per work-item.
@pytest.mark.parametrize(("n", "k"), [(7, 16), (40, 37), (1100, 16), (70, 9)])
async def test_batched_transposed_weights_and_binary_post_op(shaped_engine, rng, n, k):
    engine = shaped_engine
    a = _ints(rng, "u8", (2, 3, 4, k))
    w_nk = _ints(rng, "s8", (3, n, k))  # (N, K) per batch, read transposed
    wt = md(3, k, n, dtype="s8", strides=(n * k, 1, k))
    other = rng.uniform(-1, 1, (1, 1, 4, n)).astype(np.float32)
    desc = QuantizedMatmulDesc(md(2, 3, 4, k, dtype="u8"), wt, md(2, 3, 4, n, dtype="u8"),
                               src_scale=0.5, src_zp=128, wei_scales=(0.25,), wei_zps=(-3,), dst_scale=4.0,
                               dst_zp=128, post_ops=(("binary", "add", md(1, 1, 4, n)),))
    got = await _run(engine, desc, {"src": a, "weights": np.swapaxes(w_nk, -1, -2), "post_op_0_src1": other})
    acc = np.matmul(a.astype(np.int64) - 128, np.swapaxes(w_nk.astype(np.int64), -1, -2) + 3)
    y = (acc.astype(np.float32) * np.float32(0.125) + other).astype(np.float32)
    want = np.clip(np.rint((y / np.float32(4.0)).astype(np.float32) + np.float32(128)), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 5


async def test_bf16_dst_and_default_f32(engine, rng):
    a, w = _ints(rng, "s8", (3, 8)), _ints(rng, "s8", (8, 5))
    desc = QuantizedMatmulDesc(md(3, 8, dtype="s8"), md(8, 5, dtype="s8"), src_scale=0.5, wei_scales=(0.5,))
    assert desc.dst == md(3, 5)
    got = await _run(engine, desc, {"src": a, "weights": w})
    np.testing.assert_array_equal(got, (a.astype(np.int64) @ w.astype(np.int64)) * np.float32(0.25))
    bf = QuantizedMatmulDesc(md(3, 8, dtype="s8"), md(8, 5, dtype="s8"), md(3, 5, dtype="bf16"))
    got = await _run(engine, bf, {"src": a, "weights": w})
    tolerance.check(got, kind_of(bf).reference(bf, {"src": a, "weights": w}), 2**-8)


def test_typed_errors():
    s8 = lambda *d: md(*d, dtype="s8")  # noqa: E731
    with pytest.raises(InvalidArgumentError, match="src has dtype 'f32'"):
        QuantizedMatmulDesc(md(2, 3), s8(3, 4))
    with pytest.raises(ArgumentMismatchError, match="K=3"):
        QuantizedMatmulDesc(s8(2, 3), s8(5, 4))
    with pytest.raises(ArgumentMismatchError, match="2 wei_scales"):
        QuantizedMatmulDesc(s8(2, 3), s8(3, 4), wei_scales=(1.0, 2.0))
    with pytest.raises(ArgumentMismatchError, match="3 wei_zps"):
        QuantizedMatmulDesc(s8(2, 3), s8(3, 4), wei_zps=(1, 2, 3))
    with pytest.raises(InvalidArgumentError, match="src_zp 300"):
        QuantizedMatmulDesc(s8(2, 3), s8(3, 4), src_zp=300)
    with pytest.raises(InvalidArgumentError, match="dst_zp 3 .*float dst"):
        QuantizedMatmulDesc(s8(2, 3), s8(3, 4), dst_zp=3)
    with pytest.raises(InvalidArgumentError, match="src_scale"):
        QuantizedMatmulDesc(s8(2, 3), s8(3, 4), src_scale=0.0)
    with pytest.raises(InvalidArgumentError, match="zero points"):
        QuantizedMatmulDesc(s8(2, 3), s8(3, 4), wei_zps=(1.5,))
    with pytest.raises(ArgumentMismatchError, match="bias dims"):
        QuantizedMatmulDesc(s8(2, 3), s8(3, 4), bias=md(3, 1))
    with pytest.raises(InvalidArgumentError, match="dst has dtype 's32'"):
        QuantizedMatmulDesc(s8(2, 3), s8(3, 4), md(2, 4, dtype="s32"))
    with pytest.raises(UnsupportedError, match="bias has dtype 's8'"):
        QuantizedMatmulDesc(s8(2, 3), s8(3, 4), bias=s8(1, 4)).check_supported()
