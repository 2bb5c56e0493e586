"""Resampling (nearest, linear over 1 to 3 spatial dims) against its float64 reference, and the
coordinate rules themselves against oneDNN's formulas."""

from __future__ import annotations

import numpy as np
import pytest

from triodnn import ArgumentMismatchError, InvalidArgumentError, MemoryDesc
from triodnn._values._resampling_desc import ResamplingDesc
from triodnn.kernels import kind_of, resampling, tolerance

# name: (alg, src dims, dst dims, src strides, dst strides, align_corners)
CASES = {
    "nearest_down_2d": ("nearest", (2, 3, 7, 14), (2, 3, 6, 12), None, None, False),
    "nearest_up_1d": ("nearest", (1, 4, 3), (1, 4, 8), None, None, False),
    "nearest_3d_nhwc": ("nearest", (1, 5, 3, 4, 2), (1, 5, 6, 3, 5), "acdeb", None, False),
    "linear_1d": ("linear", (2, 3, 5), (2, 3, 9), None, None, False),
    "bilinear_down": ("linear", (2, 3, 7, 14), (2, 3, 6, 12), None, None, False),
    "bilinear_nhwc_dst": ("linear", (1, 4, 5, 6), (1, 4, 9, 4), None, "acdb", False),
    "trilinear": ("linear", (1, 2, 3, 4, 5), (1, 2, 5, 3, 7), None, None, False),
    "bilinear_align_corners": ("linear", (2, 3, 4, 5), (2, 3, 7, 9), None, None, True),
    "align_corners_to_one": ("linear", (1, 2, 4, 5), (1, 2, 1, 3), None, None, True),
}


async def test_every_case(engine, build, upload, rng):
    descs = {
        name: ResamplingDesc(alg, MemoryDesc(s, "f32", ss), MemoryDesc(d, "f32", ds), align_corners=ac)
        for name, (alg, s, d, ss, ds, ac) in CASES.items()
    }
    prims = await build(descs)
    stream = await engine.stream()
    for name, (alg, s, d, ss, _, ac) in CASES.items():
        desc = descs[name]
        assert prims[name].impl.startswith(f"ocl:resampling:{alg}:")
        x = rng.uniform(-4.0, 4.0, s).astype(np.float32)
        dst = engine.memory(desc.dst)
        await stream.execute(prims[name], {"src": await upload(x, ss), "dst": dst})
        got = await dst.to_numpy()
        want = resampling.reference(alg, x, d[2:], align_corners=ac)
        try:
            tolerance.check(got, want, kind_of(desc).tolerance(desc))
        except AssertionError as exc:
            raise AssertionError(f"case {name}: {exc}") from None


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
async def test_low_precision_storage(dtype, engine, rng):
    desc = ResamplingDesc("linear", MemoryDesc((1, 3, 4, 6), dtype), MemoryDesc((1, 3, 8, 5), dtype))
    prim = await engine.create_primitive(desc)
    x = rng.uniform(-2.0, 2.0, desc.src.dims).astype(np.float32)
    src = await engine.from_numpy(x, desc.src)
    dst = engine.memory(desc.dst)
    await (await engine.stream()).execute(prim, {"src": src, "dst": dst})
    want = kind_of(desc).reference(desc, {"src": await src.to_numpy()})
    # One rounding to the narrow type, which the f32 sums may push across a tie: one ulp.
    ulp = {"f16": 2.0**-10, "bf16": 2.0**-7}[dtype]
    tolerance.check(await dst.to_numpy(), want, 2 * ulp)


def test_coordinates_follow_onednn():
    # half-pixel: s = (y + 0.5) * I / O - 0.5; nearest rounds half away from zero.
    assert resampling.coefficients("nearest", 7, 6) == [0, 1, 2, 4, 5, 6]
    assert resampling.coefficients("nearest", 3, 8) == [0, 0, 0, 1, 1, 2, 2, 2]
    assert resampling.coefficients("nearest", 2, 4) == [0, 0, 1, 1]  # s = -0.25, 0.25, 0.75, 1.25
    assert resampling.coefficients("nearest", 4, 2) == [1, 3]  # s = 0.5, 2.5: the ties go up
    left, right, w0, w1 = resampling.coefficients("linear", 2, 4)
    assert (left, right) == ([0, 0, 0, 1], [0, 1, 1, 1])  # s < 0 clamps both to 0
    assert [float(w) for w in w1] == [0.25, 0.25, 0.75, 0.25]
    assert [float(a + b) for a, b in zip(w0, w1)] == [1.0] * 4
    left, right, _, w1 = resampling.coefficients("linear", 4, 3, align_corners=True)
    assert (left, right, [float(w) for w in w1]) == ([0, 1, 3], [0, 2, 3], [0.0, 0.5, 0.0])


def test_identity_size_copies():
    x = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    for alg in resampling.ALGORITHMS:
        np.testing.assert_array_equal(resampling.reference(alg, x, (3, 4)), x)


def test_bad_arguments():
    src = MemoryDesc((2, 3, 4, 4))
    with pytest.raises(InvalidArgumentError, match="alg 'cubic' is not a resampling algorithm"):
        ResamplingDesc("cubic", src, MemoryDesc((2, 3, 8, 8)))
    with pytest.raises(ArgumentMismatchError, match=r"dst dims \(2, 4, 8, 8\) must keep src's rank and its N and C"):
        ResamplingDesc("linear", src, MemoryDesc((2, 4, 8, 8)))
    with pytest.raises(ArgumentMismatchError, match="dst dims"):
        ResamplingDesc("linear", src, MemoryDesc((2, 3, 8)))
    with pytest.raises(ArgumentMismatchError, match="1 to 3 spatial dims"):
        ResamplingDesc("linear", MemoryDesc((2, 3)), MemoryDesc((2, 3)))
    with pytest.raises(InvalidArgumentError, match="align_corners applies to linear resampling only"):
        ResamplingDesc("nearest", src, MemoryDesc((2, 3, 8, 8)), align_corners=True)
    with pytest.raises(InvalidArgumentError, match="dst is tuple"):
        ResamplingDesc("nearest", src, (2, 3, 8, 8))
    with pytest.raises(ValueError, match="unknown resampling algorithm"):
        resampling.coefficients("cubic", 3, 4)
