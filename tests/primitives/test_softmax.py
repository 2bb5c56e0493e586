"""Softmax and logsoftmax against the float64 reference, on each code path the generator has."""

from __future__ import annotations

import numpy as np
import pytest

from triodnn import ArgumentMismatchError, InvalidArgumentError, MemoryDesc, UnsupportedError
from triodnn._values._softmax_desc import SoftmaxDesc
from triodnn.kernels import softmax, tolerance

# name: (dims, axis, src strides, dst strides, expected impl prefix). Sizes avoid multiples of 16
# where the scalar path is meant, and take them where the vector path is.
CASES = {
    "1d": ((37,), 0, None, None, "ocl:row:v1"),
    "1d_vector": ((64,), -1, None, None, "ocl:row:v16"),
    "last": ((5, 37), -1, None, None, "ocl:row:v1"),
    "last_vector": ((6, 48), 1, None, None, "ocl:row:v16"),
    "last_vector_padded": ((3, 32), -1, (48, 1), (40, 1), "ocl:row:v8"),
    "first": ((33, 7), 0, None, None, "ocl:row:v1"),
    "middle_4d": ((2, 3, 19, 5), 2, None, None, "ocl:row:v1"),
    "middle_4d_nhwc": ((2, 19, 3, 5), 1, "acdb", None, "ocl:row:v1"),
    "transposed": ((5, 37), -1, "ba", (40, 1), "ocl:row:v1"),
}


@pytest.mark.parametrize("alg", softmax.ALGORITHMS)
async def test_algorithm_on_every_path(alg, engine, build, upload, rng):
    cases = {
        name: (dims, axis, MemoryDesc(dims, "f32", s), MemoryDesc(dims, "f32", d), impl)
        for name, (dims, axis, s, d, impl) in CASES.items()
    }
    prims = await build({
        name: SoftmaxDesc(alg, src, dst, axis=axis) for name, (_, axis, src, dst, _) in cases.items()
    })
    stream = await engine.stream()
    vectors = engine._config.vector_width > 1  # the configuration the engine builds with
    for name, (dims, axis, src_desc, dst_desc, impl) in cases.items():
        prim = prims[name]
        # GPUs (one element per work-item) take the per-row scalar path or, for rows of 32 or
        # more, a work-group per row.
        assert prim.impl.startswith(impl if vectors else ("ocl:row:v1", "ocl:wg_row:")), (name, prim.impl)
        assert prim.kind == "softmax" and prim.label == f"softmax:{alg}"
        x = rng.uniform(-20.0, 20.0, dims).astype(np.float32)
        src, dst = await upload(x, src_desc.strides), engine.memory(dst_desc)
        await dst.write(np.zeros(dims, np.float32))
        await stream.execute(prim, {"src": src, "dst": dst})
        ref = softmax.reference(alg, x, axis=axis)
        try:
            tolerance.check(await dst.to_numpy(), ref, tolerance.softmax(alg))
        except AssertionError as exc:
            raise AssertionError(f"case {name}: {exc}") from None
        np.testing.assert_array_equal(await src.to_numpy(), x)  # the source is left alone


@pytest.mark.parametrize("alg", softmax.ALGORITHMS)
async def test_in_place(alg, engine, build, upload, rng):
    """src and dst one memory: the vector path, the scalar path, and a strided axis."""
    cases = {"vector": ((4, 32), -1, None), "scalar": ((4, 21), -1, None), "strided": ((9, 6), 0, (1, 11))}
    prims = await build({
        name: SoftmaxDesc(alg, MemoryDesc(dims, "f32", strides), axis=axis)
        for name, (dims, axis, strides) in cases.items()
    })
    stream = await engine.stream()
    for name, (dims, axis, strides) in cases.items():
        x = rng.uniform(-8.0, 8.0, dims).astype(np.float32)
        memory = await upload(x, strides)
        await stream.execute(prims[name], {"src": memory, "dst": memory})
        tolerance.check(await memory.to_numpy(), softmax.reference(alg, x, axis=axis), tolerance.softmax(alg))


@pytest.mark.parametrize("alg", softmax.ALGORITHMS)
async def test_large_magnitudes_are_stable(alg, engine, build, upload):
    """Subtracting the row maximum first: no exp overflow, so no inf/inf = nan."""
    x = np.array([[1000.0, 1000.0, -1000.0], [-1e4, 80.0, 90.0], [3e4, 3e4, 3e4]], np.float32)
    wide = np.tile(np.array([1000.0, -1000.0, 999.0, 88.5], np.float32), (2, 4))  # the vector path
    prims = await build({
        "scalar": SoftmaxDesc(alg, MemoryDesc(x.shape)),
        "vector": SoftmaxDesc(alg, MemoryDesc(wide.shape)),
    })
    stream = await engine.stream()
    for name, data in (("scalar", x), ("vector", wide)):
        src, dst = await upload(data), engine.memory(MemoryDesc(data.shape))
        await stream.execute(prims[name], {"src": src, "dst": dst})
        got = await dst.to_numpy()
        assert np.all(np.isfinite(got)), got
        tolerance.check(got, softmax.reference(alg, data), tolerance.softmax(alg))
    expected_first = [0.5, 0.5, 0.0] if alg == "softmax" else [-np.log(2), -np.log(2), -2000 - np.log(2)]
    src, dst = await upload(x), engine.memory(MemoryDesc(x.shape))
    await stream.execute(prims["scalar"], {"src": src, "dst": dst})
    np.testing.assert_allclose((await dst.to_numpy())[0], expected_first, rtol=1e-6)


def test_axis_is_normalised():
    desc = MemoryDesc((4, 5, 6))
    assert SoftmaxDesc("softmax", desc, axis=-1) == SoftmaxDesc("softmax", desc, axis=2)
    assert hash(SoftmaxDesc("softmax", desc, axis=-3)) == hash(SoftmaxDesc("softmax", desc, axis=np.int64(0)))
    assert SoftmaxDesc("softmax", desc).axis == 2
    assert SoftmaxDesc("softmax", desc).dst is desc
    assert SoftmaxDesc("softmax", desc) != SoftmaxDesc("logsoftmax", desc)


@pytest.mark.parametrize("axis", [2, -3, 7, 1.0, "1", True, None])
def test_bad_axis(axis):
    with pytest.raises(InvalidArgumentError, match="axis"):
        SoftmaxDesc("softmax", MemoryDesc((4, 5)), axis=axis)


def test_bad_arguments():
    with pytest.raises(InvalidArgumentError, match="alg 'softmin'"):
        SoftmaxDesc("softmin", MemoryDesc((4, 5)))
    with pytest.raises(ArgumentMismatchError, match="dst dims"):
        SoftmaxDesc("softmax", MemoryDesc((4, 5)), MemoryDesc((5, 4)))
    with pytest.raises(InvalidArgumentError, match="src"):
        SoftmaxDesc("softmax", np.zeros((4, 5), np.float32))
    with pytest.raises(InvalidArgumentError, match="dst"):
        SoftmaxDesc("softmax", MemoryDesc((4, 5)), (4, 5))


@pytest.mark.parametrize("which", ["src", "dst"])
async def test_non_f32_is_unsupported(which, engine):
    """An f16 src or dst is fine (tests/primitives/test_dtypes_more.py); a post-op operand must be f32."""
    f32, f16 = MemoryDesc((4, 5)), MemoryDesc((4, 5), "f16")
    chain = (("binary", "add", f16),)
    desc = (SoftmaxDesc("softmax", f16, f32, post_ops=chain) if which == "src"
            else SoftmaxDesc("softmax", f32, f16, post_ops=chain))
    with pytest.raises(UnsupportedError, match="post_op_0_src1 has dtype 'f16'"):
        await engine.create_primitive(desc)


def test_reference_rejects_unknown_algorithm():
    with pytest.raises(ValueError, match="'softmin'"):
        softmax.reference("softmin", np.zeros(3))
