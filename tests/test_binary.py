"""Every binary algorithm against numpy, for each broadcast pattern and code path."""

from __future__ import annotations

import numpy as np
import pytest

import triodnn
from triodnn import BinaryDesc, MemoryDesc
from triodnn.kernels import binary, tolerance

ALGS = binary.ALGORITHMS


def operands(rng, alg, shape0, shape1):
    """Random sources; ``div`` gets a divisor bounded away from zero."""
    a = rng.uniform(-4, 4, shape0).astype(np.float32)
    b = rng.uniform(-4, 4, shape1).astype(np.float32)
    if alg == "div":
        b = (np.sign(b) + (b == 0)) * rng.uniform(0.25, 4, shape1).astype(np.float32)
    return a, b


# name: (src0 dims, src1 dims, src0 strides, src1 strides, dst strides, impl path)
CASES = {
    "same_shape": ((7, 19), (7, 19), None, None, None, "flat"),  # 133: vector part + tail
    "scalar": ((7, 19), (1,), None, None, None, "scalar_b"),
    "scalar_2d": ((7, 19), (1, 1), None, None, None, "scalar_b"),
    "row": ((7, 19), (1, 19), None, None, None, "broadcast"),
    "column": ((7, 19), (7, 1), None, None, None, "broadcast"),
    "both_sides": ((4, 1), (1, 5), None, None, None, "broadcast"),
    "lower_rank": ((3, 4, 5), (4, 5), None, None, None, "broadcast"),
    "lower_rank_1d": ((3, 4, 5), (5,), None, None, None, "broadcast"),
    "src0_broadcast": ((5,), (3, 1, 5), None, None, None, "broadcast"),
    "strided": ((6, 9), (6, 9), "ba", (16, 1), (12, 1), "broadcast"),
    "strided_row": ((6, 9), (1, 9), (1, 8), None, "ba", "broadcast"),
    "permuted": ((6, 9), (6, 9), "ba", "ba", "ba", "flat"),
    "nhwc": ((2, 3, 4, 5), (1, 3, 1, 1), "nhwc", None, "nhwc", "broadcast"),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_all_algorithms(case, engine, build, upload, rng):
    shape0, shape1, strides0, strides1, dst_strides, path = CASES[case]
    dims = tuple(np.broadcast_shapes(shape0, shape1))
    d0 = MemoryDesc(shape0, "f32", strides0)
    d1 = MemoryDesc(shape1, "f32", strides1)
    dd = MemoryDesc(dims, "f32", dst_strides)
    prims = await build({alg: BinaryDesc(alg, d0, d1, dd) for alg in ALGS})
    stream = await engine.stream(triodnn.StreamFlags.out_of_order)
    for alg in ALGS:
        assert prims[alg].impl.split(":")[1] == path, prims[alg].impl
        a, b = operands(rng, alg, shape0, shape1)
        src0, src1, dst = await upload(a, strides0), await upload(b, strides1), engine.memory(dd)
        await stream.execute(prims[alg], {"src0": src0, "src1": src1, "dst": dst})
        got = await dst.to_numpy()
        ref = binary.reference(alg, a, b)
        assert got.shape == dims == ref.shape
        try:
            tolerance.check(got, ref, tolerance.BINARY)
        except AssertionError as exc:
            raise AssertionError(f"{alg}: {exc}") from None


@pytest.mark.parametrize(
    "shape0, shape1, path",
    [((7, 19), (7, 19), "flat"), ((7, 19), (1,), "scalar_b"), ((7, 19), (1, 19), "broadcast"),
     ((3, 4, 5), (5,), "broadcast")],
    ids=["same", "scalar", "row", "lower_rank"],
)
async def test_in_place_into_src0(shape0, shape1, path, engine, build, upload, rng):
    """dst may be src0 (same memory): each element is read before it is written, by one work-item."""
    d0, d1 = MemoryDesc(shape0), MemoryDesc(shape1)
    prims = await build({alg: BinaryDesc(alg, d0, d1, d0) for alg in ALGS})
    stream = await engine.stream()
    for alg in ALGS:
        assert prims[alg].impl.split(":")[1] == path
        a, b = operands(rng, alg, shape0, shape1)
        src0, src1 = await upload(a), await upload(b)
        await stream.execute(prims[alg], {"src0": src0, "src1": src1, "dst": src0})
        tolerance.check(await src0.to_numpy(), binary.reference(alg, a, b), tolerance.BINARY)
        np.testing.assert_array_equal(await src1.to_numpy(), b)


async def test_in_place_into_src1(engine, upload, rng):
    a, b = operands(rng, "sub", (1, 11), (4, 11))
    d0, d1 = MemoryDesc(a.shape), MemoryDesc(b.shape)
    prim = await engine.create_primitive(BinaryDesc("sub", d0, d1, d1))
    src0, src1 = await upload(a), await upload(b)
    await (await engine.stream()).execute(prim, {"src0": src0, "src1": src1, "dst": src1})
    tolerance.check(await src1.to_numpy(), a - b, tolerance.BINARY)


def test_default_dst_is_the_dense_broadcast_shape():
    desc = BinaryDesc("add", MemoryDesc((4, 1)), MemoryDesc((3, 1, 5)))
    assert desc.dst == MemoryDesc((3, 4, 5))
    assert desc.arg_descs == {"src0": desc.src0, "src1": desc.src1, "dst": desc.dst}
    assert desc.label == "binary:add" and desc.kind == "binary"


async def test_min_max_pick_exact_operands(engine, build, upload):
    """min/max return one of the inputs bit for bit (no arithmetic), ties and signed zeros included."""
    a = np.array([1.0, -2.0, 3.5, 0.0, -0.0, 5.0, -1e-38, 7.0, 2.0] * 2, np.float32)
    b = np.array([1.0, 2.0, -3.5, -0.0, 0.0, 5.0, 1e-38, -7.0, 2.5] * 2, np.float32)
    d = MemoryDesc(a.shape)
    prims = await build({alg: BinaryDesc(alg, d, d) for alg in ("min", "max")})
    stream = await engine.stream()
    src0, src1, dst = await upload(a), await upload(b), engine.memory(d)
    await stream.execute(prims["min"], {"src0": src0, "src1": src1, "dst": dst})
    assert set(map(float, await dst.to_numpy())) <= set(map(float, np.concatenate([a, b])))
    np.testing.assert_array_equal(await dst.to_numpy(), np.minimum(a, b))
    await stream.execute(prims["max"], {"src0": src0, "src1": src1, "dst": dst})
    np.testing.assert_array_equal(await dst.to_numpy(), np.maximum(a, b))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # the reference's inf
async def test_special_values(engine, build, upload):
    """inf/nan and signed zeros follow IEEE like numpy (min/max NaN rules differ, documented: no NaN there)."""
    a = np.array([np.inf, np.inf, 0, 1, -1, np.nan, 1, 3e38, -3e38, 1e-38, 0, -0.0, 5, np.inf, -7, 2] * 2,
                 np.float32)
    b = np.array([np.inf, -np.inf, 0, 0, 0, 1, np.nan, 3e38, 3e38, 1e-38, -0.0, 0.0, np.inf, 2, 7, -0.0] * 2,
                 np.float32)
    d = MemoryDesc(a.shape)
    prims = await build({alg: BinaryDesc(alg, d, d) for alg in ALGS})
    stream = await engine.stream()
    for alg in ALGS:
        keep = ~(np.isnan(a) | np.isnan(b)) if alg in ("min", "max") else np.ones(a.shape, bool)
        src0, src1 = await upload(np.where(keep, a, 0)), await upload(np.where(keep, b, 0))
        dst = engine.memory(d)
        await stream.execute(prims[alg], {"src0": src0, "src1": src1, "dst": dst})
        got, ref = await dst.to_numpy(), binary.reference(alg, np.where(keep, a, 0), np.where(keep, b, 0))
        try:
            tolerance.check(got, ref, tolerance.BINARY)
        except AssertionError as exc:
            raise AssertionError(f"{alg}: {exc}") from None


def test_reference_rejects_unknown_algorithm():
    with pytest.raises(ValueError, match="'pow'"):
        binary.reference("pow", np.zeros(2), np.zeros(2))
