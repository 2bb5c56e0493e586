"""ResamplingBackwardDesc: nearest and linear gradients (1 to 3 spatial dims, up and down,
align_corners) against the float64 reference, the reference against the forward's transpose,
narrow storage, strided layouts, and each error type."""

from __future__ import annotations

import numpy as np
import pytest

from triodnn import ArgumentMismatchError, InvalidArgumentError, MemoryDesc, ResamplingBackwardDesc
from triodnn.kernels import kind_of, resampling, resampling_bwd, tolerance


def md(*dims, dtype="f32", strides=None) -> MemoryDesc:
    return MemoryDesc(tuple(dims), dtype, strides)


async def _run(engine, desc: ResamplingBackwardDesc, dd: np.ndarray) -> np.ndarray:
    primitive = await engine.create_primitive(desc)
    args = {"diff_dst": await engine.from_numpy(dd, desc.diff_dst), "diff_src": engine.memory(desc.diff_src)}
    await (await engine.stream()).execute(primitive, args)
    return await args["diff_src"].to_numpy()


CASES = [
    ("nearest", (2, 3, 5), (2, 3, 11), False),
    ("nearest", (1, 2, 7, 14), (1, 2, 6, 12), False),
    ("linear", (1, 2, 7, 14), (1, 2, 6, 12), False),
    ("linear", (2, 2, 3, 4), (2, 2, 7, 9), False),
    ("linear", (1, 2, 3, 4), (1, 2, 5, 2), True),
    ("linear", (1, 1, 2, 3, 4), (1, 1, 3, 5, 2), False),
]


@pytest.mark.parametrize(("alg", "src_dims", "dst_dims", "align"), CASES)
async def test_matches_the_reference(engine, rng, alg, src_dims, dst_dims, align):
    desc = ResamplingBackwardDesc(alg, md(*dst_dims), md(*src_dims), align_corners=align)
    dd = rng.uniform(-2.0, 2.0, dst_dims).astype(np.float32)
    got = await _run(engine, desc, dd)
    registered = kind_of(desc)
    tolerance.check(got, registered.reference(desc, {"diff_dst": dd}), registered.tolerance(desc))


@pytest.mark.parametrize(("alg", "src_dims", "dst_dims", "align"), CASES)
def test_reference_is_the_forwards_transpose(rng, alg, src_dims, dst_dims, align):
    """<resample(x), dd> == <x, resample_bwd(dd)> for any x and dd."""
    x = rng.uniform(-1.0, 1.0, src_dims).astype(np.float32)
    dd = rng.uniform(-1.0, 1.0, dst_dims).astype(np.float32)
    y = np.asarray(resampling.reference(alg, x, dst_dims[2:], align_corners=align), np.float64)
    g = np.asarray(resampling_bwd.reference(alg, dd, src_dims[2:], align_corners=align), np.float64)
    assert np.sum(y * dd) == pytest.approx(np.sum(x * g), rel=1e-5)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
async def test_narrow_storage_and_strided_layouts(engine, rng, dtype):
    desc = ResamplingBackwardDesc("nearest", md(2, 3, 4, 6, dtype=dtype, strides="acdb"),
                                  md(2, 3, 2, 3, strides="bacd"))
    dd = (rng.integers(-8, 9, (2, 3, 4, 6)) / 4).astype(np.float32)
    got = await _run(engine, desc, dd)
    tolerance.check(got, resampling_bwd.reference("nearest", dd, (2, 3)), 0.0)  # sums of 4 quarters: exact


def test_errors_name_the_culprit():
    with pytest.raises(InvalidArgumentError, match="resampling"):
        ResamplingBackwardDesc("cubic", md(1, 1, 4), md(1, 1, 2))
    with pytest.raises(ArgumentMismatchError, match="diff_src dims"):
        ResamplingBackwardDesc("linear", md(1, 4), md(1, 2))
    with pytest.raises(ArgumentMismatchError, match="diff_dst dims"):
        ResamplingBackwardDesc("linear", md(1, 2, 4), md(1, 3, 2))
    with pytest.raises(InvalidArgumentError, match="align_corners applies to linear"):
        ResamplingBackwardDesc("nearest", md(1, 1, 4), md(1, 1, 2), align_corners=True)
    with pytest.raises(ValueError, match="unknown resampling algorithm"):
        resampling_bwd.contributions("cubic", 2, 4)
