"""Static Quantize / Dequantize (``QuantizeDesc``): results against the float64 reference, exact
where the scales are powers of two (every division and product is exact, so only the stores
round), the registered tolerance otherwise; each error type."""

from __future__ import annotations

import numpy as np
import pytest

from triodnn import InvalidArgumentError, MemoryDesc, QuantizeDesc
from triodnn._values._errors import ArgumentMismatchError
from triodnn.kernels import kind_of, quantize, tolerance


async def run(engine, desc, array):
    src = await engine.from_numpy(array, desc.src)
    dst = engine.memory(desc.dst)
    await (await engine.stream()).execute(await engine.create_primitive(desc), {"src": src, "dst": dst})
    return await src.to_numpy(), await dst.to_numpy()


@pytest.mark.parametrize("dst", ["s8", "u8", "s4", "u4", "f8_e4m3", "f8_e5m2"])
async def test_quantize_per_tensor_and_per_channel(engine, rng, dst):
    x = (rng.standard_normal((2, 3, 5)) * 40).astype(np.float32)
    x.reshape(-1)[:6] = [0.5, 1.5, -2.5, 1e6, -1e6, np.nan]  # ties to even, saturation, NaN
    f8 = dst.startswith("f8")
    for axis, scales, zps in ((None, [0.5], [] if f8 else [3]), (1, [0.25, 2.0, 1.0], [] if f8 else [0, -2, 5]),
                              (-1, [1.0, 4.0, 0.125, 0.5, 2.0], [])):
        desc = QuantizeDesc("quantize", MemoryDesc(x.shape, "f32"), MemoryDesc(x.shape, dst, "cba"),
                            scales=scales, zps=zps, axis=axis)
        held, got = await run(engine, desc, x)
        want = quantize.reference(held, "quantize", desc.scales, desc.zps, desc.axis, dst)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)  # powers of two: exact, NaN where NaN
    if dst == "s8":  # scale 0.5, zp 3: the zero point is added before rounding, ties to even
        desc = QuantizeDesc("quantize", MemoryDesc((6,), "f32"), MemoryDesc((6,), "s8"), scales=[0.5], zps=[3])
        _, got = await run(engine, desc, np.array([0.25, 0.75, -1.25, 1e6, -1e6, np.nan], np.float32))
        assert got.tolist() == [4, 4, 0, 127, -128, 0]  # 3.5 -> 4, 4.5 -> 4, 0.5 -> 0, saturated, NaN -> 0


@pytest.mark.parametrize("src", ["s8", "u8", "s4", "u4", "f8_e4m3", "f8_e5m2"])
async def test_dequantize(engine, rng, src):
    low, high = {"s8": (-128, 127), "u8": (0, 255), "s4": (-8, 7), "u4": (0, 15)}.get(src, (-100, 100))
    x = rng.integers(low, high, (3, 4, 5), endpoint=True)
    f8 = src.startswith("f8")
    for dst in ("f32", "bf16"):
        for axis, scales, zps in ((None, [0.75], [] if f8 else [-3]), (0, [0.1, 2.0, 3.0], [] if f8 else [1, 0, 9])):
            desc = QuantizeDesc("dequantize", MemoryDesc(x.shape, src, "acb"), MemoryDesc(x.shape, dst),
                                scales=scales, zps=zps, axis=axis)
            held, got = await run(engine, desc, x)
            want = quantize.reference(held, "dequantize", desc.scales, desc.zps, desc.axis, dst)
            tolerance.check(got, want, kind_of(desc).tolerance(desc))


async def test_quantize_with_any_scale_is_within_the_registered_tolerance(engine, rng):
    x = (rng.standard_normal((4, 33)) * 10).astype(np.float32)
    desc = QuantizeDesc("quantize", MemoryDesc(x.shape, "f32"), MemoryDesc(x.shape, "u8"), scales=[0.0371], zps=[128])
    held, got = await run(engine, desc, x)
    want = quantize.reference(held, "quantize", desc.scales, desc.zps, None, "u8")
    tolerance.check(got, want, kind_of(desc).tolerance(desc))
    assert np.mean(got == want) > 0.99  # off by one step only at f32/float64 rounding ties


def test_errors_name_the_culprit():
    f32, s8 = MemoryDesc((2, 3), "f32"), MemoryDesc((2, 3), "s8")
    with pytest.raises(InvalidArgumentError, match="alg 'requantize'"):
        QuantizeDesc("requantize", f32, s8, scales=[1.0])
    with pytest.raises(InvalidArgumentError, match="the quantized side has dtype 's32'"):
        QuantizeDesc("quantize", f32, MemoryDesc((2, 3), "s32"), scales=[1.0])
    with pytest.raises(InvalidArgumentError, match="the float side has dtype 's8'"):
        QuantizeDesc("dequantize", s8, MemoryDesc((2, 3), "s8"), scales=[1.0])
    with pytest.raises(ArgumentMismatchError, match=r"2 scales for per-channel quantization over axis 1 \(3 channels\)"):
        QuantizeDesc("quantize", f32, s8, scales=[1.0, 2.0], axis=1)
    with pytest.raises(ArgumentMismatchError, match="2 zps for per-tensor"):
        QuantizeDesc("quantize", f32, s8, scales=[1.0], zps=[1, 2])
    with pytest.raises(InvalidArgumentError, match="axis 2 is out of range"):
        QuantizeDesc("quantize", f32, s8, scales=[1.0], axis=2)
    with pytest.raises(InvalidArgumentError, match="finite and nonzero"):
        QuantizeDesc("quantize", f32, s8, scales=[0.0])
    with pytest.raises(InvalidArgumentError, match="takes no zero points"):
        QuantizeDesc("quantize", f32, MemoryDesc((2, 3), "f8_e4m3"), scales=[1.0], zps=[1])
    with pytest.raises(InvalidArgumentError, match="zps .* must be integers"):
        QuantizeDesc("quantize", f32, s8, scales=[1.0], zps=[0.5])
    with pytest.raises(ArgumentMismatchError, match="dst dims"):
        QuantizeDesc("quantize", f32, MemoryDesc((3, 2), "s8"), scales=[1.0])
    desc = QuantizeDesc("quantize", f32, s8, scales=[1, 2], zps=[0, 1], axis=-2)
    assert desc.axis == 0 and desc.label == "quantize"
    assert desc == QuantizeDesc("quantize", f32, s8, scales=[1.0, 2.0], zps=[0, 1], axis=0)
