"""Dynamic Quantize / Dequantize (``DynamicQuantizeDesc``): scales and zero points as tensors,
per tensor, per channel and per group, against the float64 reference (exact with power-of-two
scales: only the stores round); each error type."""

from __future__ import annotations

import numpy as np
import pytest

from triodnn import DynamicQuantizeDesc, InvalidArgumentError, MemoryDesc, UnsupportedError
from triodnn._values._errors import ArgumentMismatchError
from triodnn.kernels import dynamic_quantize

SHAPE = (2, 6, 4)
GROUPS = {"per_tensor": SHAPE, "per_channel": (2, 1, 4), "per_group": (1, 3, 2)}


async def run(engine, desc, arrays):
    memories = {name: await engine.from_numpy(arrays[name], md) for name, md in desc.arg_descs.items() if name != "dst"}
    memories["dst"] = engine.memory(desc.dst)
    await (await engine.stream()).execute(await engine.create_primitive(desc), memories)
    held = {name: await m.to_numpy() for name, m in memories.items() if name != "dst"}
    return held, await memories["dst"].to_numpy()


def scales_for(rng, dims):
    return (2.0 ** rng.integers(-3, 3, dims)).astype(np.float32)


@pytest.mark.parametrize("src", ["s4", "u4", "s8", "u8"])
@pytest.mark.parametrize("qtype", sorted(GROUPS))
async def test_dynamic_dequantize(engine, rng, src, qtype):
    low, high = {"s8": (-128, 127), "u8": (0, 255), "s4": (-8, 7), "u4": (0, 15)}[src]
    group = GROUPS[qtype]
    dims = tuple(d // g for d, g in zip(SHAPE, group))
    x = rng.integers(low, high, SHAPE, endpoint=True)
    arrays = {"src": x, "scales": scales_for(rng, dims), "zps": rng.integers(low, high, dims, endpoint=True)}
    for dst, with_zps in (("f32", True), ("bf16", False), ("f16", True)):
        desc = DynamicQuantizeDesc("dequantize", MemoryDesc(SHAPE, src, "cba"), MemoryDesc(dims, dst),
                                   MemoryDesc(SHAPE, dst), group, MemoryDesc(dims, src) if with_zps else None)
        held, got = await run(engine, desc, arrays)
        want = dynamic_quantize.reference(held["src"], held["scales"], held.get("zps"), group, "dequantize", dst)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dst", ["s8", "u4", "f8_e5m2"])
async def test_dynamic_quantize_per_group(engine, rng, dst):
    group = GROUPS["per_group"]
    dims = tuple(d // g for d, g in zip(SHAPE, group))
    x = (rng.standard_normal(SHAPE) * 20).astype(np.float32)
    zp_type = "u8" if dst == "u4" else "s8"
    arrays = {"src": x, "scales": scales_for(rng, dims), "zps": rng.integers(0, 4, dims)}
    zps = None if dst.startswith("f8") else MemoryDesc(dims, zp_type)
    desc = DynamicQuantizeDesc("quantize", MemoryDesc(SHAPE, "f32"), MemoryDesc(dims, "f32"), MemoryDesc(SHAPE, dst),
                               group, zps)
    held, got = await run(engine, desc, arrays)
    want = dynamic_quantize.reference(held["src"], held["scales"], held.get("zps"), group, "quantize", dst)
    np.testing.assert_array_equal(got, want)


async def test_errors_name_the_culprit(engine):
    src, f32 = MemoryDesc(SHAPE, "s4"), MemoryDesc(SHAPE, "f32")
    with pytest.raises(ArgumentMismatchError, match=r"group_shape \(1, 4, 2\) does not divide"):
        DynamicQuantizeDesc("dequantize", src, MemoryDesc((2, 1, 2), "f32"), f32, (1, 4, 2))
    with pytest.raises(ArgumentMismatchError, match=r"scales dims \(2, 3, 2\) do not match .* expected \(2, 2, 2\)"):
        DynamicQuantizeDesc("dequantize", src, MemoryDesc((2, 3, 2), "f32"), f32, (1, 3, 2))
    with pytest.raises(InvalidArgumentError, match="the float side has dtype 's8'"):
        DynamicQuantizeDesc("dequantize", src, MemoryDesc((1, 1, 1), "f32"), MemoryDesc(SHAPE, "s8"), SHAPE)
    with pytest.raises(InvalidArgumentError, match="alg 'x'"):
        DynamicQuantizeDesc("x", src, MemoryDesc((1, 1, 1), "f32"), f32, SHAPE)
    desc = DynamicQuantizeDesc("dequantize", src, MemoryDesc((1, 1, 1), "s32"), f32, SHAPE)
    with pytest.raises(UnsupportedError, match="scales has dtype 's32'"):
        await engine.create_primitive(desc)
    assert desc.label == "dynamic_dequantize"
