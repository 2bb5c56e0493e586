"""ConvolutionBackwardWeightsDesc: the kernel against the float64 reference (strided, padded,
dilated, grouped, 1D/2D/3D, NHWC, low-precision storage), the reference against the adjoint
identity of the forward convolution, and each error type."""

from __future__ import annotations

import numpy as np
import pytest

from triodnn import ArgumentMismatchError, ConvolutionBackwardWeightsDesc, InvalidArgumentError, MemoryDesc
from triodnn.kernels import convolution, convolution_bwd_weights, kind_of, tolerance

# name: (src dims, diff_weights dims, geometry)
CASES = {
    "2d_plain": ((2, 3, 5, 5), (4, 3, 3, 3), {}),
    "2d_stride2_padded": ((1, 4, 6, 7), (6, 4, 3, 3), {"strides": 2, "padding_l": 1, "padding_r": (0, 1)}),
    "2d_grouped_dilated": ((2, 4, 6, 6), (6, 2, 2, 3), {"groups": 2, "dilation": 2, "padding_l": (1, 2)}),
    "1d": ((2, 3, 9), (2, 3, 3), {"strides": 3, "padding_l": 2, "padding_r": 1}),
    "3d": ((1, 2, 3, 4, 4), (3, 2, 2, 3, 2), {"strides": (1, 2, 1), "padding_l": (0, 1, 1)}),
}


def _geometry(src_dims, wei_dims, geometry):
    nsp = len(src_dims) - 2

    def axis(name, default):
        v = geometry.get(name, default)
        return tuple(v) if isinstance(v, tuple) else (v,) * nsp

    s, pl, dil = axis("strides", 1), axis("padding_l", 0), axis("dilation", 1)
    pr = axis("padding_r", pl)
    out = tuple(convolution.out_size(src_dims[2 + i], wei_dims[2 + i], s[i], pl[i], pr[i], dil[i]) for i in range(nsp))
    return (src_dims[0], wei_dims[0]) + out


async def _run(engine, desc, x, dy) -> np.ndarray:
    primitive = await engine.create_primitive(desc)
    args = {"src": await engine.from_numpy(x, desc.src), "diff_dst": await engine.from_numpy(dy, desc.diff_dst),
            "diff_weights": engine.memory(desc.diff_weights)}
    await (await engine.stream()).execute(primitive, args)
    return await args["diff_weights"].to_numpy()


@pytest.mark.parametrize("name", CASES)
async def test_every_case_matches_the_reference(engine, rng, name):
    src_dims, wei_dims, geometry = CASES[name]
    dst_dims = _geometry(src_dims, wei_dims, geometry)
    desc = ConvolutionBackwardWeightsDesc(MemoryDesc(src_dims), MemoryDesc(dst_dims), MemoryDesc(wei_dims), **geometry)
    x = rng.uniform(-1, 1, src_dims).astype(np.float32)
    dy = rng.uniform(-1, 1, dst_dims).astype(np.float32)
    got = await _run(engine, desc, x, dy)
    registered = kind_of(desc)
    tolerance.check(got, registered.reference(desc, {"src": x, "diff_dst": dy}), registered.tolerance(desc))


async def test_channels_last_layouts_and_integer_data_are_exact(engine, rng):
    src = MemoryDesc((2, 4, 5, 5), "f32", "nhwc")
    dst = MemoryDesc((2, 6, 3, 3), "f32", "nhwc")
    wei = MemoryDesc((6, 2, 3, 3), "f32", (1, 54, 18, 6))  # an hwio-like order
    desc = ConvolutionBackwardWeightsDesc(src, dst, wei, strides=2, padding_l=1, groups=2)
    x = rng.integers(-3, 4, src.dims).astype(np.float32)
    dy = rng.integers(-3, 4, dst.dims).astype(np.float32)
    got = await _run(engine, desc, x, dy)
    want = convolution_bwd_weights.reference(x, dy, (3, 3), strides=(2, 2), padding_l=(1, 1), groups=2)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
async def test_low_precision_storage(engine, rng, dtype):
    x = rng.integers(-2, 3, (1, 3, 6, 6)).astype(np.float32)
    dy = rng.integers(-2, 3, (1, 4, 3, 3)).astype(np.float32)
    desc = ConvolutionBackwardWeightsDesc(MemoryDesc(x.shape, dtype), MemoryDesc(dy.shape, dtype),
                                          MemoryDesc((4, 3, 2, 2), dtype), strides=2)
    got = await _run(engine, desc, x, dy)
    want = convolution_bwd_weights.reference(x, dy, (2, 2), strides=(2, 2))
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("geometry", [{"strides": 2, "padding_l": 1, "groups": 1},
                                      {"strides": 3, "padding_l": 2, "dilation": 2, "groups": 2}])
def test_reference_is_the_gradient_of_convolution(geometry, rng):
    """<conv(x, w), dy> is linear in w, so it equals <w, diff_weights> for every w."""
    groups, s, p, d = geometry["groups"], geometry["strides"], geometry["padding_l"], geometry.get("dilation", 1)
    x = rng.standard_normal((2, 4, 9, 8))
    w = rng.standard_normal((6, 4 // groups, 3, 2))
    y = convolution.reference(x, w, strides=(s, s), padding_l=(p, p), dilation=(d, d), groups=groups)
    dy = rng.standard_normal(y.shape)
    dw = convolution_bwd_weights.reference(x, dy, (3, 2), strides=(s, s), padding_l=(p, p), dilation=(d, d),
                                           groups=groups)
    np.testing.assert_allclose(np.sum(np.asarray(y, np.float64) * dy), np.sum(w * dw), rtol=1e-5)


def test_bad_descriptors_raise_typed_errors():
    src, wei = MemoryDesc((1, 4, 5, 5)), MemoryDesc((6, 4, 3, 3))
    with pytest.raises(ArgumentMismatchError, match="diff_dst dims"):
        ConvolutionBackwardWeightsDesc(src, MemoryDesc((1, 6, 4, 4)), wei)
    with pytest.raises(ArgumentMismatchError, match="input channels per group"):
        ConvolutionBackwardWeightsDesc(src, MemoryDesc((1, 6, 3, 3)), wei, groups=2)
    with pytest.raises(InvalidArgumentError, match="dilation"):
        ConvolutionBackwardWeightsDesc(src, MemoryDesc((1, 6, 3, 3)), wei, dilation=0)
    with pytest.raises(InvalidArgumentError, match="diff_weights"):
        ConvolutionBackwardWeightsDesc(src, MemoryDesc((1, 6, 3, 3)), "weights")
