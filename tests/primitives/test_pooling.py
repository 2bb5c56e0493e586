"""Pooling forward against the float64 reference: 1D/2D/3D, padding, strides, dilation, layouts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from triodnn import ArgumentMismatchError, InvalidArgumentError, MemoryDesc
from triodnn._values._pooling_desc import PoolingDesc
from triodnn.kernels import generate, pooling, select_config, tolerance

# name: (src dims, src strides, dst strides, geometry). Odd sizes throughout; the layouts cover
# dense NCX, channel-last (NXC) by tag, and padded strides that leave gaps.
CASES = {
    "1d": ((2, 3, 11), None, None, dict(kernel=3, strides=2, padding_l=1)),
    "1d_nwc_dilated": ((2, 5, 13), "nwc", None, dict(kernel=3, strides=1, padding_l=2, padding_r=1, dilation=2)),
    "2d": ((2, 3, 9, 7), None, None, dict(kernel=(3, 2), strides=(2, 1), padding_l=(1, 0), padding_r=(1, 1))),
    "2d_nhwc_to_nchw": ((1, 4, 8, 9), "nhwc", "nchw", dict(kernel=3, strides=2, padding_l=1)),
    "2d_dilated_asym": ((2, 2, 10, 11), None, "nhwc",
                        dict(kernel=(2, 3), strides=(3, 2), padding_l=(1, 2), padding_r=(0, 1), dilation=(3, 2))),
    "2d_global": ((3, 2, 5, 6), None, None, dict(kernel=(5, 6), strides=1, padding_l=0)),
    "2d_gapped": ((2, 3, 5, 5), (100, 30, 6, 1), None, dict(kernel=2, strides=1, padding_l=1)),
    "3d": ((1, 2, 5, 6, 7), None, None, dict(kernel=(2, 3, 3), strides=(1, 2, 2), padding_l=(0, 1, 1), padding_r=(1, 1, 0))),
    "3d_ndhwc_dilated": ((2, 3, 6, 5, 7), "ndhwc", None, dict(kernel=2, strides=2, padding_l=1, dilation=(2, 1, 3))),
}


def _dst_desc(src_dims, geometry, dst_strides):
    dims = PoolingDesc("max", MemoryDesc(src_dims), **geometry).dst.dims
    return MemoryDesc(dims, "f32", dst_strides)


def alg_cases(alg: str) -> list[str]:
    """The generator writes an algorithm's accumulation and divisor and a case's window walk
    independently: every algorithm on the padded, dilated 2d and 3d cases (windows clipped on each
    side: the taps avg_exclude_padding counts), the other cases shared out in turn, so every case
    runs once (a cold PoCL cache builds each program in 0.2-0.8 s)."""
    common = ["2d_dilated_asym", "3d"]
    others = [name for name in CASES if name not in common]
    i = pooling.ALGORITHMS.index(alg)
    return common + [name for k, name in enumerate(others) if k % len(pooling.ALGORITHMS) == i]


@pytest.mark.parametrize("alg", pooling.ALGORITHMS)
async def test_algorithm_on_every_case(alg, engine, build, upload, rng):
    descs = {
        name: PoolingDesc(alg, MemoryDesc(dims, "f32", s), _dst_desc(dims, g, d), **g)
        for name, (dims, s, d, g) in CASES.items() if name in alg_cases(alg)
    }
    prims = await build(descs)
    stream = await engine.stream()
    for name, (dims, _, _, geometry) in CASES.items():
        if name not in descs:
            continue
        desc, prim = descs[name], prims[name]
        assert prim.kind == "pooling" and prim.label == f"pooling:{alg}"
        x = rng.uniform(-5.0, 5.0, dims).astype(np.float32)
        src, dst = await upload(x, desc.src.strides), engine.memory(desc.dst)
        await dst.write(np.full(desc.dst.dims, np.nan, np.float32))
        await stream.execute(prim, {"src": src, "dst": dst})
        ref = pooling.reference(alg, x, **geometry)
        assert ref.shape == desc.dst.dims, name
        threshold = pooling.tolerance(alg, math.prod(desc.kernel))
        try:
            tolerance.check(await dst.to_numpy(), ref, threshold)
        except AssertionError as exc:
            raise AssertionError(f"case {name}: {exc}") from None
        np.testing.assert_array_equal(await src.to_numpy(), x)


def test_dst_dims_follow_onednn():
    # out = (in + pl + pr - ((k - 1) * dil + 1)) // s + 1
    desc = PoolingDesc("max", MemoryDesc((2, 3, 10, 11)), kernel=(3, 2), strides=(2, 3),
                       padding_l=(1, 0), padding_r=(0, 2), dilation=(2, 1))
    assert desc.dst.dims == (2, 3, (10 + 1 + 0 - 5) // 2 + 1, (11 + 0 + 2 - 2) // 3 + 1)
    assert desc.dst.is_dense
    assert desc.padding_r == (0, 2) and desc.dilation == (2, 1)
    # Scalars broadcast to every spatial dim; padding_r defaults to padding_l, dilation to 1.
    a = PoolingDesc("max", MemoryDesc((1, 1, 6, 6)), kernel=2, strides=2, padding_l=1)
    b = PoolingDesc("max", MemoryDesc((1, 1, 6, 6)), kernel=(2, 2), strides=[2, 2], padding_l=(1, 1),
                    padding_r=(1, 1), dilation=(1, 1))
    assert a == b and hash(a) == hash(b)
    assert a != PoolingDesc("avg_include_padding", MemoryDesc((1, 1, 6, 6)), kernel=2, strides=2, padding_l=1)


def test_reference_known_values():
    x = np.arange(1, 6, dtype=np.float32).reshape(1, 1, 5)  # 1 2 3 4 5
    geo = dict(kernel=3, strides=2, padding_l=1)
    np.testing.assert_array_equal(pooling.reference("max", x, **geo)[0, 0], [2, 4, 5])
    np.testing.assert_allclose(pooling.reference("avg_include_padding", x, **geo)[0, 0], [1, 3, 3])
    np.testing.assert_allclose(pooling.reference("avg_exclude_padding", x, **geo)[0, 0], [1.5, 3, 4.5])
    dil = pooling.reference("max", x, kernel=2, strides=1, padding_l=0, dilation=(3,))
    np.testing.assert_array_equal(dil[0, 0], [4, 5])


async def test_max_picks_the_element_exactly(engine, build, upload):
    """Negative inputs next to padding: padding never wins a max (it is not a zero)."""
    x = -np.arange(1, 26, dtype=np.float32).reshape(1, 1, 5, 5)
    geo = dict(kernel=3, strides=2, padding_l=1)
    desc = PoolingDesc("max", MemoryDesc(x.shape), **geo)
    prim = (await build({"p": desc}))["p"]
    src, dst = await upload(x), engine.memory(desc.dst)
    stream = await engine.stream()
    await stream.execute(prim, {"src": src, "dst": dst})
    got = await dst.to_numpy()
    np.testing.assert_array_equal(got, pooling.reference("max", x, **geo))
    assert got.max() < 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(kernel=(2, 2, 2)), "kernel"),
        (dict(kernel=0), "kernel"),
        (dict(strides=0), "strides"),
        (dict(strides=(1, 1, 1)), "strides"),
        (dict(padding_l=-1), "padding_l"),
        (dict(padding_r=(0, -1)), "padding_r"),
        (dict(dilation=0), "dilation"),
        (dict(kernel=9), "kernel"),  # larger than the input plus padding
        (dict(kernel=2, padding_l=3), "padding"),  # first window entirely in padding
        (dict(kernel=2.0), "kernel"),
        (dict(strides=True), "strides"),
        (dict(padding_l="1"), "padding_l"),
    ],
)
def test_bad_geometry(kwargs, match):
    geo = dict(kernel=2, strides=1, padding_l=0)
    geo.update(kwargs)
    with pytest.raises(InvalidArgumentError, match=match):
        PoolingDesc("max", MemoryDesc((1, 2, 5, 5)), **geo)


def test_bad_arguments():
    geo = dict(kernel=2, strides=1, padding_l=0)
    with pytest.raises(InvalidArgumentError, match="alg 'min'"):
        PoolingDesc("min", MemoryDesc((1, 2, 5, 5)), **geo)
    with pytest.raises(InvalidArgumentError, match="spatial"):
        PoolingDesc("max", MemoryDesc((2, 5)), **geo)
    with pytest.raises(InvalidArgumentError, match="spatial"):
        PoolingDesc("max", MemoryDesc((1, 1, 2, 2, 2, 2)), **geo)
    with pytest.raises(InvalidArgumentError, match="src"):
        PoolingDesc("max", np.zeros((1, 2, 5, 5), np.float32), **geo)
    with pytest.raises(InvalidArgumentError, match="dst"):
        PoolingDesc("max", MemoryDesc((1, 2, 5, 5)), (1, 2, 4, 4), **geo)
    with pytest.raises(ArgumentMismatchError, match="dst dims"):
        PoolingDesc("max", MemoryDesc((1, 2, 5, 5)), MemoryDesc((1, 2, 5, 5)), **geo)
    with pytest.raises(TypeError):
        PoolingDesc("max", MemoryDesc((1, 2, 5, 5)), strides=1, padding_l=0)  # kernel is required


@pytest.mark.parametrize("which", ["src", "dst"])
def test_non_f32_is_supported(which):
    """Any storage type with f32 math (run in tests/primitives/test_dtypes_more.py): no dtype is refused."""
    geo = dict(kernel=2, strides=2, padding_l=0)
    src = MemoryDesc((1, 2, 4, 4), "f16" if which == "src" else "f32")
    dst = MemoryDesc((1, 2, 2, 2), "f16" if which == "dst" else "f32")
    desc = PoolingDesc("max", src, dst, **geo)
    desc.check_supported()  # raised UnsupportedError while pooling was f32 only
    source = generate(desc, select_config("cpu", 4096)).source
    assert ("vload_half" if which == "src" else "vstore_half_rte") in source
