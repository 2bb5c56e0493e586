"""Quantized attention (SdpaDesc's ``*_quant``): int8 operands dequantized as they load, grouped
run-time scales (compressed K/V), probabilities through Quantize -> Dequantize (the kernel's
second pass), a quantized dst, bf16/f16 score rounding, each against the float64 reference that
rounds as the op-by-op graph does.

The int8 MHA, compressed K/V and recomputed-scores cases run with the device's own configuration
and with the GPU one forced (the split kernel), as tests/primitives/test_sdpa.py does; the f32
and fp8 probability cases, whose split-kernel code is the int8 case's, with the device's only
(a cold PoCL build of a split kernel takes 15-40 s). A quantized result may land on the neighbouring
integer where the kernel's f32 sum and the reference's float64 one straddle a rounding tie:
the checks allow one step on a few elements (benchdnn allows a point in 1024 before its norm
check) and count them.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from triodnn import ArgumentMismatchError, InvalidArgumentError, MemoryDesc, Quantization
from triodnn._values._convolution_desc import ConvolutionDesc
from triodnn._values._dtypes import from_storage, to_storage
from triodnn._values._sdpa_desc import SdpaDesc
from triodnn.kernels import _dtype_io, sdpa, sdpa_gpu, select_config
from triodnn.kernels._spec import dense_strides

GPU = select_config("gpu", 256, 48 * 1024)


@pytest.fixture(params=["device_config", "forced_gpu_config"])
async def configured(request, engine):
    if request.param == "forced_gpu_config":
        engine._config = attrs.evolve(GPU, local_memory=min(GPU.local_memory, engine._config.local_memory))
    return engine


def transposed(dims: tuple[int, ...], dtype: str) -> MemoryDesc:
    """(…, S, D) stored as (…, D, S): a graph's K^T, as the lowering hands it over."""
    stored = dims[:-2] + (dims[-1], dims[-2])
    strides = list(dense_strides(stored))
    strides[-1], strides[-2] = strides[-2], strides[-1]
    return MemoryDesc(dims, dtype, tuple(strides))


async def run(engine, desc: SdpaDesc, arrays: dict) -> np.ndarray:
    primitive = await engine.create_primitive(desc)
    memories = {}
    for name, md in desc.arg_descs.items():
        if name == "dst":
            memories[name] = await engine.from_numpy(np.zeros(md.dims, _dtype_io.USER_NUMPY[md.dtype]), md)
        else:
            memories[name] = await engine.from_numpy(arrays[name], md)
    await (await engine.stream()).execute(primitive, memories)
    return await memories["dst"].to_numpy()


def reference(desc: SdpaDesc, arrays: dict) -> np.ndarray:
    return sdpa._reference(desc, arrays)


def off_by(got: np.ndarray, want: np.ndarray) -> tuple[float, int]:
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return float(diff.max()), int(np.count_nonzero(diff))


def mha_int8(dims=(1, 2, 40, 16), skv=40):
    """MHA-distill_bert-int8's shape of computation: u8 Q, K^T, V with zero points, bf16 casts,
    bf16 scores divided by a bf16 scale, a Select mask, u8 probabilities, a u8 dst."""
    b, h, sq, d = dims
    deq = dict(round_out="bf16")
    desc = SdpaDesc(
        MemoryDesc(dims, "u8"), transposed((b, h, skv, d), "u8"), MemoryDesc((b, h, skv, d), "u8"),
        MemoryDesc((b, h, sq, d), "u8"),
        scale=MemoryDesc((1,), "bf16"), scale_mode="divide", select_mask=MemoryDesc((b, 1, 1, skv), "boolean"),
        fill=MemoryDesc((1,), "bf16"),
        query_quant=Quantization("u8", 0.0125, 133, **deq), key_quant=Quantization("u8", 0.021, 122, **deq),
        value_quant=Quantization("u8", 0.045, 97, **deq),
        probs_quant=Quantization("u8", 1 / 255, 0, round_in="bf16", round_out="bf16"),
        dst_quant=Quantization("u8", 0.039, 93, round_in="bf16"), score_rounding="bf16",
    )
    return desc


async def test_int8_attention_with_quantized_probabilities(configured, rng):
    desc = mha_int8()
    b, h, sq, d = desc.query.dims
    skv = desc.key.dims[-2]
    arrays = {
        "query": rng.integers(60, 200, (b, h, sq, d)).astype(np.uint8),
        "key": rng.integers(60, 200, (b, h, skv, d)).astype(np.uint8),
        "value": rng.integers(0, 256, (b, h, skv, d)).astype(np.uint8),
        "scale": from_storage(to_storage(np.array([2.0], np.float32), "bf16"), "bf16"),
        "select_mask": rng.random((b, 1, 1, skv)) < 0.8,
        "fill": np.array([-np.inf], np.float32),
    }
    got = await run(configured, desc, arrays)
    want = reference(desc, arrays)
    assert got.dtype == np.uint8 and got.shape == want.shape
    worst, count = off_by(got, want)
    assert worst <= 1 and count <= got.size // 1024, (worst, count)
    assert len(np.unique(got)) > 20  # the scores are not flat: the check sees real attention


async def test_f32_attention_with_quantized_probabilities(engine, rng):
    """f32 operands, probabilities through u8: the second pass normalises them exactly."""
    b, h, sq, skv, d, causal = 2, 2, 37, 53, 16, "top_left"
    desc = SdpaDesc(MemoryDesc((b, h, sq, d)), MemoryDesc((b, h, skv, d)), MemoryDesc((b, h, skv, d)),
                    causal=causal, probs_quant=Quantization("u8", 1 / 255, 0))
    arrays = {name: rng.uniform(-2, 2, md.dims).astype(np.float32)
              for name, md in desc.arg_descs.items() if name != "dst"}
    got = await run(engine, desc, arrays)
    want = reference(desc, arrays)
    unquantized = sdpa.reference(arrays["query"], arrays["key"], arrays["value"], causal=causal)
    assert np.abs(got - want).max() <= 1e-4
    assert np.abs(want - unquantized).max() > 1e-3  # the quantization shows, and the kernel has it


async def test_compressed_kv_with_grouped_scales(configured, rng):
    """sdpa-compressed-kv-int4's computation: s4 K^T grouped along D with s4 zero points, u8 V
    grouped along Dv, f16 scales, f16 Q, f16 scores, an f16 dst."""
    b, h, sq, skv, d = 1, 2, 20, 32, 64
    k_dims, v_dims = (b, h, skv, d), (b, h, skv, d)
    desc = SdpaDesc(
        MemoryDesc((b, h, sq, d), "f16"), transposed(k_dims, "s4"), MemoryDesc(v_dims, "u8"),
        MemoryDesc((b, h, sq, d), "f16"),
        key_quant=Quantization("s4", group=(1, 32)), key_scales=transposed((b, h, skv, 2), "f16"),
        key_zps=transposed((b, h, skv, 2), "s4"),
        value_quant=Quantization("u8", group=(1, 16)), value_scales=MemoryDesc((b, h, skv, 4), "f16"),
        value_zps=MemoryDesc((b, h, skv, 4), "u8"), score_rounding="f16",
    )
    arrays = {
        "query": rng.uniform(-1, 1, (b, h, sq, d)).astype(np.float16),
        "key": rng.integers(-8, 8, k_dims).astype(np.int8),
        "key_scales": rng.uniform(0.01, 0.05, (b, h, skv, 2)).astype(np.float16),
        "key_zps": rng.integers(-2, 3, (b, h, skv, 2)).astype(np.int8),
        "value": rng.integers(0, 256, v_dims).astype(np.uint8),
        "value_scales": rng.uniform(0.005, 0.01, (b, h, skv, 4)).astype(np.float16),
        "value_zps": rng.integers(120, 136, (b, h, skv, 4)).astype(np.uint8),
    }
    got = await run(configured, desc, arrays)
    want = reference(desc, arrays)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2**-9, atol=2**-9)


def test_quantization_values_refuse_what_they_cannot_mean():
    with pytest.raises(InvalidArgumentError, match="either a static scale or a group"):
        Quantization("u8")
    with pytest.raises(InvalidArgumentError, match="outside u8's range"):
        Quantization("u8", 0.1, 300)
    with pytest.raises(InvalidArgumentError, match="has no zero point"):
        Quantization("f8_e4m3", 0.5, 1)
    with pytest.raises(InvalidArgumentError, match="quantized dtype"):
        Quantization("f32", 0.5)


@pytest.mark.parametrize("make, error, match", [
    (lambda: SdpaDesc(MemoryDesc((1, 4, 8), "u8"), MemoryDesc((1, 4, 8)), MemoryDesc((1, 4, 8))),
     InvalidArgumentError, "query has the quantized dtype 'u8'"),
    (lambda: SdpaDesc(MemoryDesc((1, 4, 8)), MemoryDesc((1, 4, 8), "s8"), MemoryDesc((1, 4, 8)),
                      key_quant=Quantization("u8", 0.1)),
     ArgumentMismatchError, "key has dtype 's8' but key_quant is for 'u8'"),
    (lambda: SdpaDesc(MemoryDesc((1, 4, 8)), MemoryDesc((1, 4, 8), "s8"), MemoryDesc((1, 4, 8)),
                      key_quant=Quantization("s8", group=(1, 4)), key_scales=MemoryDesc((1, 4, 4))),
     ArgumentMismatchError, r"key_scales dims \(1, 4, 4\) differ from \(1, 4, 2\)"),
    (lambda: SdpaDesc(MemoryDesc((1, 4, 8)), MemoryDesc((1, 4, 8), "s8"), MemoryDesc((1, 4, 8)),
                      key_quant=Quantization("s8", group=(1, 3)), key_scales=MemoryDesc((1, 4, 2))),
     ArgumentMismatchError, "does not divide"),
    (lambda: SdpaDesc(MemoryDesc((1, 4, 8)), MemoryDesc((1, 4, 8), "s8"), MemoryDesc((1, 4, 8)),
                      key_quant=Quantization("s8", group=(1, 4))),
     InvalidArgumentError, "needs its run-time key_scales"),
    (lambda: SdpaDesc(MemoryDesc((1, 4, 8)), MemoryDesc((1, 4, 8)), MemoryDesc((1, 4, 8)), MemoryDesc((1, 4, 8), "u8")),
     InvalidArgumentError, "dst has the quantized dtype"),
])
def test_bad_quantized_descriptors(make, error, match):
    with pytest.raises(error, match=match):
        make()


async def test_fp8_probabilities(engine, rng):
    """sdpa-fp8's computation: f8_e4m3 Q, K, V (static scale), probabilities through f8_e4m3, an
    f8_e4m3 dst: the f8 round trip is the type's own rounding, lane by lane."""
    b, h, sq, skv, d = 2, 2, 24, 40, 16
    f8 = MemoryDesc((b, h, sq, d), "f8_e4m3")
    desc = SdpaDesc(f8, MemoryDesc((b, h, skv, d), "f8_e4m3"), MemoryDesc((b, h, skv, d), "f8_e4m3"),
                    MemoryDesc((b, h, sq, d), "f8_e4m3"), mask=MemoryDesc((b, 1, 1, skv)),
                    query_quant=Quantization("f8_e4m3", 0.25), key_quant=Quantization("f8_e4m3", 0.25),
                    value_quant=Quantization("f8_e4m3", 0.25), probs_quant=Quantization("f8_e4m3", 0.25),
                    dst_quant=Quantization("f8_e4m3", 0.25))
    arrays = {name: _dtype_io.store_reference(rng.uniform(-6, 6, md.dims).astype(np.float32), "f8_e4m3")
              for name, md in desc.arg_descs.items() if name in ("query", "key", "value")}
    arrays["mask"] = rng.uniform(-1, 0, (b, 1, 1, skv)).astype(np.float32)
    got = await run(engine, desc, arrays)
    want = reference(desc, arrays)
    worst, count = off_by(got, want)
    assert count <= got.size // 100 and worst <= 2.0 ** -3 * np.abs(want).max(), (worst, count)


async def test_scores_recomputed_where_they_do_not_fit(configured, rng, monkeypatch):
    """The second pass recomputes Q @ K^T where the first pass's scores would not fit (__local
    memory on the CPU kernel, GPU_CACHED_SCORES on the split kernel): the same numbers."""
    monkeypatch.setattr(sdpa_gpu, "GPU_CACHED_SCORES", 0)
    if configured._config.vector_width >= 16:  # room for Q^T and O (64 B a row vector and column), not the scores
        configured._config = attrs.evolve(configured._config, local_memory=8192)
    b, h, sq, skv, d = 1, 2, 29, 61, 16  # dims of their own: no cached primitive of the other form
    desc = SdpaDesc(MemoryDesc((b, h, sq, d)), MemoryDesc((b, h, skv, d)), MemoryDesc((b, h, skv, d)),
                    probs_quant=Quantization("s8", 1 / 127, -3))
    arrays = {name: rng.uniform(-2, 2, md.dims).astype(np.float32)
              for name, md in desc.arg_descs.items() if name != "dst"}
    got = await run(configured, desc, arrays)
    assert np.abs(got - reference(desc, arrays)).max() <= 1e-4


async def test_quantized_primitives_travel_in_cache_blobs(rt):
    """A Quantization inside a descriptor survives the blob's JSON (attention and convolution)."""
    first, second = await rt.engine(), await rt.engine()
    for desc in (mha_int8(dims=(1, 1, 8, 16), skv=8),
                 ConvolutionDesc(MemoryDesc((1, 4, 6, 6), "u8"), MemoryDesc((4, 4, 1, 1), "s8"),
                                 MemoryDesc((1, 4, 6, 6), "s8"), src_quant=Quantization("u8", 0.5, 2),
                                 weights_quant=Quantization("s8", 0.25), dst_quant=Quantization("s8", 2.0, -1))):
        primitive = await first.create_primitive(desc)
        loaded = await second.create_primitive_from_cache_blob(primitive.cache_blob())
        assert loaded.desc == desc and loaded.impl == primitive.impl
