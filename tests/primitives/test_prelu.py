"""PReLU against its float64 reference: every broadcast of the slope, strided layouts, storage types."""

from __future__ import annotations

import numpy as np
import pytest

from triodnn import ArgumentMismatchError, InvalidArgumentError, MemoryDesc
from triodnn._values._prelu_desc import PreluDesc
from triodnn.kernels import kind_of, prelu, tolerance

# name: (src dims, weights dims, src strides, dst strides)
CASES = {
    "whole_tensor": ((4, 6, 3, 5), (4, 6, 3, 5), None, None),
    "channel_wise": ((2, 6, 3, 5), (1, 6, 1, 1), None, None),
    "shared": ((2, 6, 3, 5), (1,), None, None),
    "last_dim": ((3, 7, 5), (5,), None, None),
    "nhwc_src": ((2, 6, 3, 5), (1, 6, 1, 1), "acdb", None),
    "strided_dst": ((5, 9), (5, 1), None, (16, 1)),
}


async def test_every_broadcast(engine, build, upload, rng):
    prims = await build({
        name: PreluDesc(MemoryDesc(s, "f32", ss), MemoryDesc(w), MemoryDesc(s, "f32", ds))
        for name, (s, w, ss, ds) in CASES.items()
    })
    stream = await engine.stream()
    for name, (s, w, ss, ds) in CASES.items():
        assert prims[name].kind == "prelu" and prims[name].impl.startswith("ocl:prelu:")
        x = rng.uniform(-4.0, 4.0, s).astype(np.float32)
        x.flat[0], x.flat[1] = 0.0, -0.0
        slope = rng.uniform(-2.0, 2.0, w).astype(np.float32)
        src, weights = await upload(x, ss), await upload(slope)
        dst = engine.memory(MemoryDesc(s, "f32", ds))
        await stream.execute(prims[name], {"src": src, "weights": weights, "dst": dst})
        got = await dst.to_numpy()
        want = prelu.reference(x, slope)
        tolerance.check(got, want, kind_of(prims[name].desc).tolerance(prims[name].desc))
        # One rounding of one product: the kernel matches the float32 formula exactly.
        np.testing.assert_array_equal(got, np.where(x >= 0, x, np.broadcast_to(slope, s) * x), err_msg=name)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
async def test_low_precision_storage(dtype, engine, rng):
    src = MemoryDesc((3, 8, 4), dtype)
    desc = PreluDesc(src, MemoryDesc((8, 1)))
    prim = await engine.create_primitive(desc)
    x = rng.uniform(-3.0, 3.0, src.dims).astype(np.float32)
    slope = rng.uniform(0.0, 0.5, (8, 1)).astype(np.float32)
    args = {"src": await engine.from_numpy(x, src), "weights": await engine.from_numpy(slope), "dst": engine.memory(src)}
    await (await engine.stream()).execute(prim, args)
    inputs = {"src": await args["src"].to_numpy(), "weights": slope}
    want = kind_of(desc).reference(desc, inputs)
    np.testing.assert_array_equal(await args["dst"].to_numpy(), want)


def test_reference_keeps_nan_and_negative_zero():
    x = np.array([np.nan, -0.0, -2.0, 3.0], np.float32)
    y = prelu.reference(x, np.float32(0.5).reshape(1))
    assert np.isnan(y[0]) and np.signbit(y[1]) and y[2] == -1.0 and y[3] == 3.0


def test_dst_defaults_to_src_and_descriptors_are_values():
    src = MemoryDesc((2, 3))
    assert PreluDesc(src, MemoryDesc((3,))).dst is src
    assert PreluDesc(src, MemoryDesc((3,))) == PreluDesc(src, MemoryDesc((3,)), src)
    assert PreluDesc(src, MemoryDesc((3,))).label == "prelu"


def test_bad_arguments():
    with pytest.raises(ArgumentMismatchError, match=r"weights dims \(2, 3\) do not broadcast to src dims \(3, 3\)"):
        PreluDesc(MemoryDesc((3, 3)), MemoryDesc((2, 3)))
    with pytest.raises(ArgumentMismatchError, match="weights dims"):
        PreluDesc(MemoryDesc((3,)), MemoryDesc((1, 3)))  # the slope never widens dst
    with pytest.raises(ArgumentMismatchError, match="dst dims"):
        PreluDesc(MemoryDesc((3, 4)), MemoryDesc((4,)), MemoryDesc((4, 3)))
    with pytest.raises(InvalidArgumentError, match="weights"):
        PreluDesc(MemoryDesc((3, 4)), (4,))
    with pytest.raises(InvalidArgumentError, match="src"):
        PreluDesc(np.zeros((3, 4)), MemoryDesc((4,)))
