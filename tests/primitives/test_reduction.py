"""Every reduction algorithm against its float64 reference: axes, layouts, sizes, and errors."""

from __future__ import annotations

import math

import numpy as np
import pyopencl as cl
import pytest

from triodnn import ArgumentMismatchError, InvalidArgumentError, MemoryDesc
from triodnn._values._reduction_desc import ReductionDesc
from triodnn.kernels import generate, reduction, select_config, tolerance

# name: (src dims, dst dims, src strides, dst strides). oneDNN's convention: a reduced dim is 1.
CASES = {
    "1d": ((37,), (1,), None, None),
    "last": ((5, 37), (5, 1), None, None),
    "first": ((5, 37), (1, 37), None, None),
    "middle_4d": ((2, 3, 19, 5), (2, 1, 19, 5), None, None),
    "two_axes_4d": ((2, 3, 19, 5), (2, 1, 1, 5), None, None),
    "all": ((3, 7, 11), (1, 1, 1), None, None),
    "nhwc_channels": ((2, 6, 5, 3), (2, 1, 5, 3), "acdb", None),
    "transposed_padded": ((5, 37), (1, 37), "ba", (1, 40)),
    "padded_dst": ((4, 9, 17), (4, 9, 1), None, (12, 1, 1)),
    "nothing": ((3, 5), (3, 5), None, None),
}


def reduction_input(rng: np.random.Generator, alg: str, dims) -> np.ndarray:
    """Mixed signs, so sums cancel; a product's factors near 1 so it stays in range."""
    if alg == "mul":
        signs = np.where(rng.random(dims) < 0.5, -1.0, 1.0)
        return (signs * rng.uniform(0.8, 1.25, dims)).astype(np.float32)
    return rng.uniform(-5.0, 5.0, dims).astype(np.float32)


def alg_cases(alg: str) -> list[str]:
    """The generator writes an algorithm's accumulation (init, step, result) and a shape's loops and
    offsets independently: every algorithm on two_axes_4d (nested loops), the other shapes shared
    out in turn, so every shape runs once (a cold PoCL cache builds each program in 0.2-0.8 s)."""
    others = [name for name in CASES if name != "two_axes_4d"]
    i = reduction.ALGORITHMS.index(alg)
    return ["two_axes_4d"] + [name for k, name in enumerate(others) if k % len(reduction.ALGORITHMS) == i]


@pytest.mark.parametrize("alg", reduction.ALGORITHMS)
async def test_algorithm_on_every_shape(alg, engine, build, upload, rng):
    descs = {
        name: (MemoryDesc(CASES[name][0], "f32", CASES[name][2]), MemoryDesc(CASES[name][1], "f32", CASES[name][3]))
        for name in alg_cases(alg)
    }
    prims = await build({name: ReductionDesc(alg, src, dst) for name, (src, dst) in descs.items()})
    stream = await engine.stream()
    for name, (src_desc, dst_desc) in descs.items():
        prim = prims[name]
        assert prim.kind == "reduction" and prim.label == f"reduction:{alg}"
        x = reduction_input(rng, alg, src_desc.dims)
        src, dst = await upload(x, src_desc.strides), engine.memory(dst_desc)
        await dst.write(np.zeros(dst_desc.dims, np.float32))
        await stream.execute(prim, {"src": src, "dst": dst})
        count = src_desc.nelems // dst_desc.nelems
        try:
            ref = reduction.reference(alg, x, dst_desc.dims)
            tolerance.check(await dst.to_numpy(), ref, tolerance.reduction(alg, count))
        except AssertionError as exc:
            raise AssertionError(f"case {name}: {exc}") from None


async def test_padded_dst_keeps_its_padding(engine, upload, rng):
    """The kernel writes one element per output and nothing between them."""
    src_desc, dst_desc = MemoryDesc((4, 9)), MemoryDesc((4, 1), "f32", (3, 1))
    prim = await engine.create_primitive(ReductionDesc("max", src_desc, dst_desc))
    x = rng.uniform(-1, 1, (4, 9)).astype(np.float32)
    src, dst = await upload(x), engine.memory(dst_desc)
    queue = cl.CommandQueue(engine.cl_context, engine.cl_device)
    raw = np.full(dst_desc.span, 7.0, np.float32)
    cl.enqueue_copy(queue, dst.cl_buffer, raw).wait()
    await (await engine.stream()).execute(prim, {"src": src, "dst": dst})
    cl.enqueue_copy(queue, raw, dst.cl_buffer).wait()
    np.testing.assert_array_equal(raw[::3], x.max(axis=1))
    padding = np.ones(raw.shape, bool)
    padding[::3] = False
    assert np.all(raw[padding] == 7.0), raw


@pytest.mark.parametrize("alg", ["sum", "mean", "l1", "l2"])
async def test_long_sums_stay_accurate(alg, engine, upload, rng):
    """1e5 mixed-sign elements into one: a plain f32 sum drifts past benchdnn's threshold here;
    the compensated one stays within it."""
    n = 100_003
    x = rng.uniform(-1.0, 1.0, n).astype(np.float32)
    x[::7] += 3.0  # a sizeable total next to much cancellation
    prim = await engine.create_primitive(ReductionDesc(alg, MemoryDesc((n,)), MemoryDesc((1,))))
    src, dst = await upload(x), engine.memory(MemoryDesc((1,)))
    await (await engine.stream()).execute(prim, {"src": src, "dst": dst})
    tolerance.check(await dst.to_numpy(), reduction.reference(alg, x, (1,)), tolerance.reduction(alg, n))


async def test_scalar_shaped_result_of_a_4d_tensor(engine, upload, rng):
    dims = (3, 4, 5, 6)
    x = rng.uniform(-2, 2, dims).astype(np.float32)
    prim = await engine.create_primitive(ReductionDesc("sum", MemoryDesc(dims), MemoryDesc((1, 1, 1, 1))))
    src, dst = await upload(x), engine.memory(MemoryDesc((1, 1, 1, 1)))
    await (await engine.stream()).execute(prim, {"src": src, "dst": dst})
    got = await dst.to_numpy()
    assert got.shape == (1, 1, 1, 1)
    ref = np.full((1, 1, 1, 1), x.astype(np.float64).sum(), np.float32)
    tolerance.check(got, ref, tolerance.reduction("sum"))


def test_reduced_axes():
    assert reduction.reduced_axes((2, 3, 4), (2, 1, 4)) == (1,)
    assert reduction.reduced_axes((2, 1, 4), (1, 1, 1)) == (0, 2)
    assert reduction.reduced_axes((2, 3), (2, 3)) == ()


def test_bad_dims():
    with pytest.raises(ArgumentMismatchError, match=r"dst dims \(4, 1, 1\).*rank"):
        ReductionDesc("sum", MemoryDesc((4, 5)), MemoryDesc((4, 1, 1)))
    with pytest.raises(ArgumentMismatchError, match=r"dst dims \(4, 2\).*dimension 1"):
        ReductionDesc("sum", MemoryDesc((4, 5)), MemoryDesc((4, 2)))
    with pytest.raises(ArgumentMismatchError, match="dst dims"):
        ReductionDesc("sum", MemoryDesc((4, 1)), MemoryDesc((4, 5)))  # no broadcasting up


def test_bad_arguments():
    with pytest.raises(InvalidArgumentError, match="alg 'argmax'"):
        ReductionDesc("argmax", MemoryDesc((4, 5)), MemoryDesc((4, 1)))
    with pytest.raises(InvalidArgumentError, match="src"):
        ReductionDesc("sum", np.zeros((4, 5), np.float32), MemoryDesc((4, 1)))
    with pytest.raises(InvalidArgumentError, match="dst"):
        ReductionDesc("sum", MemoryDesc((4, 5)), (4, 1))


@pytest.mark.parametrize("which", ["src", "dst"])
def test_non_f32_is_supported(which):
    """Any storage type, f32 math (run in tests/primitives/test_dtypes_more.py): nothing to refuse by dtype."""
    src = MemoryDesc((4, 5), "s32" if which == "src" else "f32")
    dst = MemoryDesc((4, 1), "s32" if which == "dst" else "f32")
    desc = ReductionDesc("sum", src, dst)
    desc.check_supported()  # raised UnsupportedError while reductions were f32 only
    source = generate(desc, select_config("cpu", 4096)).source
    assert ("__global const int* src" if which == "src" else "__global int* dst") in source


def test_descriptors_are_values():
    a = ReductionDesc("sum", MemoryDesc((4, 5)), MemoryDesc((4, 1)))
    assert a == ReductionDesc("sum", MemoryDesc((4, 5)), MemoryDesc((4, 1)))
    assert hash(a) == hash(ReductionDesc("sum", MemoryDesc((4, 5)), MemoryDesc((4, 1))))
    assert a != ReductionDesc("mean", MemoryDesc((4, 5)), MemoryDesc((4, 1)))


def test_tolerance_of_products_grows_with_the_count():
    assert tolerance.reduction("mul", 1000) > tolerance.reduction("mul", 10) >= tolerance.reduction("sum")
    assert math.isclose(tolerance.reduction("l2"), 5 * np.finfo(np.float32).eps)


def test_reference_rejects_unknown_algorithm():
    with pytest.raises(ValueError, match="'argmax'"):
        reduction.reference("argmax", np.zeros(3), (1,))
