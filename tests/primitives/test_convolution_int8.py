"""ConvolutionDesc with src_quant / weights_quant / dst_quant (the int8 convolution): integer
inputs less their zero points, summed exactly, times the two scales once, bias and post-ops, a
quantized store; on the row-vector CPU path, the per-position path and the GPU configuration,
against the float64 reference. Bad combinations are refused by the descriptor."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from triodnn import ArgumentMismatchError, InvalidArgumentError, MemoryDesc, Quantization
from triodnn._values._convolution_desc import ConvolutionDesc
from triodnn.kernels import convolution, select_config

GPU = select_config("gpu", 256, 48 * 1024)
OC = 4  # a small channel block: the unrolled CPU kernels build in seconds, not half a minute cold


def int8_conv(layout: str, dst_dtype: str = "s8") -> ConvolutionDesc:
    return ConvolutionDesc(
        MemoryDesc((2, 8, 20, 20), "u8", layout), MemoryDesc((OC, 8, 3, 3), "s8"),
        MemoryDesc((2, OC, 20, 20), dst_dtype), MemoryDesc((OC,)), padding_l=1,
        src_quant=Quantization("u8", 0.05, 3), weights_quant=Quantization("s8", 0.02, 1),
        dst_quant=Quantization(dst_dtype, 0.1, -2) if dst_dtype != "f32" else None,
        post_ops=(("eltwise", "relu", 0.0, 0.0),))


@pytest.mark.parametrize("layout, gpu, impl, dst_dtype", [
    ("nchw", False, "row16", "s8"), ("nhwc", False, "oc4", "s8"), ("nchw", True, "oc4", "s8"), ("nhwc", False, "oc4", "f32"),
])
async def test_int8_convolution_matches_the_reference(engine, rng, layout, gpu, impl, dst_dtype):
    if gpu:
        engine._config = attrs.evolve(GPU, local_memory=min(GPU.local_memory, engine._config.local_memory))
    elif engine._config.vector_width < 16:
        pytest.skip("the CPU paths need the CPU configuration")
    desc = int8_conv(layout, dst_dtype)
    arrays = {"src": rng.integers(0, 256, (2, 8, 20, 20)).astype(np.uint8),
              "weights": rng.integers(-128, 128, (OC, 8, 3, 3)).astype(np.int8),
              "bias": rng.uniform(-1, 1, OC).astype(np.float32)}
    primitive = await engine.create_primitive(desc)
    assert impl in primitive.impl
    memories = {name: await engine.from_numpy(arrays[name], md) for name, md in desc.arg_descs.items() if name != "dst"}
    memories["dst"] = await engine.from_numpy(np.zeros(desc.dst.dims, np.int8 if dst_dtype == "s8" else np.float32),
                                              desc.dst)
    await (await engine.stream()).execute(primitive, memories)
    got = await memories["dst"].to_numpy()
    want = convolution.desc_reference(desc, arrays)
    if dst_dtype == "s8":
        assert np.array_equal(got, want)  # exact integer sums on both sides
        assert len(np.unique(got)) > 30
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("make, error, match", [
    (lambda: ConvolutionDesc(MemoryDesc((1, 4, 8, 8), "u8"), MemoryDesc((4, 4, 1, 1), "s8"),
                             src_quant=Quantization("s8", 0.1)),
     ArgumentMismatchError, "src has dtype 'u8' but src_quant is for 's8'"),
    (lambda: ConvolutionDesc(MemoryDesc((1, 4, 8, 8), "u8"), MemoryDesc((4, 4, 1, 1), "s8"),
                             src_quant=Quantization("u8", group=(1, 4))), InvalidArgumentError, "must be static"),
    (lambda: ConvolutionDesc(MemoryDesc((1, 4, 8, 8)), MemoryDesc((4, 4, 1, 1)), MemoryDesc((1, 4, 8, 8), "s8"),
                             dst_quant=Quantization("s8", 0.1), post_ops=(("sum", 1.0),)),
     InvalidArgumentError, "sum post-op cannot read a quantized dst"),
])
def test_bad_int8_convolutions(make, error, match):
    with pytest.raises(error, match=match):
        make()
