"""Sum and concat: N inputs ``src0`` .. ``src{N-1}`` in any layout, against numpy references.

Sum is compared with benchdnn's sum threshold, f32 eps times the number of inputs
(``kernels.sum.threshold``); inputs lie in [-1, 1] so partial sums stay small. Concat is a copy:
compared exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

import triodnn
from triodnn import MemoryDesc
from triodnn._values._concat_desc import ConcatDesc
from triodnn._values._sum_desc import SumDesc
from triodnn.kernels import concat, generate, select_config, tolerance
from triodnn.kernels import sum as sum_kernels

CPU = select_config("cpu", 4096)
GPU = select_config("gpu", 256)


def floats(rng, shape) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, shape).astype(np.float32)


async def run(engine, desc, arrays: list[np.ndarray]) -> np.ndarray:
    primitive = await engine.create_primitive(desc)
    stream = await engine.stream()
    args = {
        f"src{i}": await engine.from_numpy(a, desc.arg_descs[f"src{i}"]) for i, a in enumerate(arrays)
    }
    args["dst"] = engine.memory(desc.dst)
    await stream.execute(primitive, args)
    return await args["dst"].to_numpy()


# -- sum -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 5])
@pytest.mark.parametrize("shape", [(1,), (37,), (4, 33), (2, 3, 5, 7)])
async def test_sum_dense(engine, rng, n, shape):
    arrays = [floats(rng, shape) for _ in range(n)]
    scales = tuple(float(s) for s in rng.uniform(-2.0, 2.0, n))
    desc = SumDesc(tuple(MemoryDesc(shape) for _ in range(n)), scales)
    assert generate(desc, CPU).impl.startswith("ocl:flat:v16")
    got = await run(engine, desc, arrays)
    tolerance.check(got, sum_kernels.reference(arrays, scales), sum_kernels.threshold(n))


@pytest.mark.parametrize("n", [1, 2, 5])
async def test_sum_default_scales_are_ones(engine, rng, n):
    arrays = [floats(rng, (3, 50)) for _ in range(n)]
    desc = SumDesc(tuple(MemoryDesc((3, 50)) for _ in range(n)))
    assert desc.scales == (1.0,) * n
    assert desc == SumDesc(tuple(MemoryDesc((3, 50)) for _ in range(n)), [1] * n)
    got = await run(engine, desc, arrays)
    tolerance.check(got, sum_kernels.reference(arrays), sum_kernels.threshold(n))


async def test_sum_strided_and_transposed_inputs(engine, rng):
    shape = (3, 4, 5, 6)
    srcs = (
        MemoryDesc(shape, "f32", "nhwc"),
        MemoryDesc(shape, "f32"),
        MemoryDesc(shape, "f32", "dcba"),
        MemoryDesc(shape, "f32", (200, 40, 8, 1)),  # rows padded 6 -> 8, outermost 160 -> 200
    )
    dst = MemoryDesc(shape, "f32", "nhwc")
    arrays = [floats(rng, shape) for _ in srcs]
    scales = (0.5, -1.0, 2.0, 0.25)
    desc = SumDesc(srcs, scales, dst)
    assert generate(desc, CPU).impl.startswith("ocl:strided")
    got = await run(engine, desc, arrays)
    tolerance.check(got, sum_kernels.reference(arrays, scales), sum_kernels.threshold(len(srcs)))


async def test_sum_same_permuted_layout_runs_flat(engine, rng):
    shape = (2, 3, 4, 5)
    desc = SumDesc((MemoryDesc(shape, "f32", "nhwc"),) * 3, (1.0, 2.0, -3.0), MemoryDesc(shape, "f32", "nhwc"))
    assert generate(desc, CPU).impl.startswith("ocl:flat")
    arrays = [floats(rng, shape) for _ in range(3)]
    got = await run(engine, desc, arrays)
    tolerance.check(got, sum_kernels.reference(arrays, desc.scales), sum_kernels.threshold(3))


@pytest.mark.parametrize("layout", [None, "acb"])
async def test_sum_in_place_into_src0(engine, rng, layout):
    """dst may be src0's memory when the descriptors are equal: each element is read, then written."""
    shape = (5, 7, 9)
    md = MemoryDesc(shape, "f32", layout)
    desc = SumDesc((md, md, md), (2.0, 0.5, -1.0), md)
    arrays = [floats(rng, shape) for _ in range(3)]
    primitive = await engine.create_primitive(desc)
    stream = await engine.stream()
    mems = [await engine.from_numpy(a, md) for a in arrays]
    await stream.execute(primitive, {"src0": mems[0], "src1": mems[1], "src2": mems[2], "dst": mems[0]})
    got = await mems[0].to_numpy()
    tolerance.check(got, sum_kernels.reference(arrays, desc.scales), sum_kernels.threshold(3))


def test_sum_generates_in_bounds_for_gpu_config_and_names_args():
    desc = SumDesc((MemoryDesc((3, 3)), MemoryDesc((3, 3), "f32", "ba")))
    spec = generate(desc, GPU)
    assert spec.arg_names == ("src0", "src1", "dst") == tuple(desc.arg_descs)
    assert spec.global_size[0] % spec.local_size[0] == 0


def test_sum_descs_are_cache_keys():
    a = SumDesc([MemoryDesc((2, 2))] * 2, [1, 2])
    b = SumDesc((MemoryDesc((2, 2)),) * 2, (1.0, 2.0))
    assert a == b and hash(a) == hash(b) and isinstance(a.srcs, tuple)
    assert SumDesc((MemoryDesc((2,)),), (0.0,)) != SumDesc((MemoryDesc((2,)),), (-0.0,))


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: SumDesc(()), triodnn.InvalidArgumentError, "srcs has 0 inputs"),
        (lambda: SumDesc((MemoryDesc((2,)),) * 65), triodnn.InvalidArgumentError, "1 to 64"),
        (lambda: SumDesc(MemoryDesc((2,))), triodnn.InvalidArgumentError, "srcs is MemoryDesc"),
        (lambda: SumDesc((MemoryDesc((2,)), "x")), triodnn.InvalidArgumentError, r"srcs\[1\] is str"),
        (lambda: SumDesc((MemoryDesc((2, 3)), MemoryDesc((3, 2)))), triodnn.ArgumentMismatchError, r"srcs\[1\] dims"),
        (lambda: SumDesc((MemoryDesc((2,)),) * 2, (1.0,)), triodnn.InvalidArgumentError, "scales has 1 values for 2"),
        (lambda: SumDesc((MemoryDesc((2,)),), (float("nan"),)), triodnn.InvalidArgumentError, r"scales\[0\]"),
        (lambda: SumDesc((MemoryDesc((2,)),), ("a",)), triodnn.InvalidArgumentError, r"scales\[0\]"),
        (lambda: SumDesc((MemoryDesc((2,)),), 1.0), triodnn.InvalidArgumentError, "scales"),
        (lambda: SumDesc((MemoryDesc((2,)),), None, MemoryDesc((3,))), triodnn.ArgumentMismatchError, "dst dims"),
    ],
)
def test_sum_bad_arguments_name_the_argument(build, error, match):
    with pytest.raises(error, match=match):
        build()


async def test_sum_of_f16_runs(engine):
    """Non-f32 storage is supported (tests/primitives/test_dtypes.py covers the data types)."""
    desc = SumDesc((MemoryDesc((4,), "f16"), MemoryDesc((4,), "f16")))
    arrays = [np.array([0.5, -1.0, 2.0, 3.0], np.float16)] * 2
    got = await run(engine, desc, arrays)
    np.testing.assert_array_equal(got, np.array([1.0, -2.0, 4.0, 6.0], np.float16))


# -- concat --------------------------------------------------------------------------------------


def _split_shapes(shape: tuple[int, ...], axis: int, sizes: tuple[int, ...]) -> list[tuple[int, ...]]:
    return [shape[:axis] + (s,) + shape[axis + 1:] for s in sizes]


@pytest.mark.parametrize(
    "shape, axis, sizes",
    [
        ((), 0, (1,)),
        ((), 0, (3, 17, 1)),
        ((5,), 0, (2, 4)),             # 2-D along the first axis
        ((5,), -1, (1, 3, 2, 7, 4)),   # 2-D along the last axis
        ((2, 6), 1, (3, 1, 5)),        # 3-D middle
        ((4, 5), 0, (2, 3)),           # 3-D first
        ((2, 3, 4), 3, (5, 6)),        # 4-D last
        ((2, 3, 4), 1, (1, 2, 3, 4, 5)),  # 4-D middle, five inputs
        ((3, 4, 5), 0, (2,)),          # 4-D first, one input
    ],
)
async def test_concat_dense(engine, rng, shape, axis, sizes):
    norm = axis % (len(shape) + 1)
    shapes = _split_shapes(shape, norm, sizes)
    arrays = [floats(rng, s) for s in shapes]
    desc = ConcatDesc(tuple(MemoryDesc(s) for s in shapes), axis)
    assert desc.axis == norm
    got = await run(engine, desc, arrays)
    assert np.array_equal(got, concat.reference(arrays, norm))


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
async def test_concat_mixed_layouts(engine, rng, axis):
    base = (2, 3, 4, 5)
    shapes = _split_shapes(base, axis, (base[axis], 2, 1))
    layouts = ("nhwc", "nchw", "dcba")
    srcs = tuple(MemoryDesc(s, "f32", t) for s, t in zip(shapes, layouts))
    arrays = [floats(rng, s) for s in shapes]
    for dst_layout in (None, "nhwc"):
        dims = list(base)
        dims[axis] = base[axis] + 3
        desc = ConcatDesc(srcs, axis, None if dst_layout is None else MemoryDesc(tuple(dims), "f32", dst_layout))
        got = await run(engine, desc, arrays)
        assert np.array_equal(got, concat.reference(arrays, axis))


async def test_concat_padded_strides(engine, rng):
    a, b = floats(rng, (3, 5)), floats(rng, (3, 2))
    srcs = (MemoryDesc((3, 5), "f32", (8, 1)), MemoryDesc((3, 2), "f32", (1, 4)))
    dst = MemoryDesc((3, 7), "f32", (9, 1))
    got = await run(engine, ConcatDesc(srcs, -1, dst), [a, b])
    assert np.array_equal(got, np.concatenate([a, b], axis=1))


def test_concat_many_inputs_generates_for_gpu_config():
    srcs = tuple(MemoryDesc((2, i + 1)) for i in range(64))
    desc = ConcatDesc(srcs, 1)
    spec = generate(desc, GPU)
    assert desc.dst.dims == (2, sum(range(1, 65)))
    assert spec.arg_names == tuple(f"src{i}" for i in range(64)) + ("dst",) == tuple(desc.arg_descs)


def test_concat_descs_are_cache_keys():
    a = ConcatDesc([MemoryDesc((2, 3)), MemoryDesc((2, 4))], -1)
    b = ConcatDesc((MemoryDesc((2, 3)), MemoryDesc((2, 4))), 1)
    assert a == b and hash(a) == hash(b)


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: ConcatDesc((), 0), triodnn.InvalidArgumentError, "srcs has 0 inputs"),
        (lambda: ConcatDesc([MemoryDesc((2,)), None], 0), triodnn.InvalidArgumentError, r"srcs\[1\] is NoneType"),
        (lambda: ConcatDesc((MemoryDesc((2, 3)),), 2), triodnn.InvalidArgumentError, "axis 2 is out of range"),
        (lambda: ConcatDesc((MemoryDesc((2, 3)),), -3), triodnn.InvalidArgumentError, "axis -3"),
        (lambda: ConcatDesc((MemoryDesc((2, 3)),), 1.0), triodnn.InvalidArgumentError, "axis"),
        (lambda: ConcatDesc((MemoryDesc((2, 3)),), True), triodnn.InvalidArgumentError, "axis"),
        (lambda: ConcatDesc((MemoryDesc((2, 3)), MemoryDesc((3, 3))), 1), triodnn.ArgumentMismatchError,
         r"srcs\[1\] dims \(3, 3\) differ"),
        (lambda: ConcatDesc((MemoryDesc((2, 3)), MemoryDesc((2, 3, 1))), 1), triodnn.ArgumentMismatchError,
         r"srcs\[1\] dims .* 3 dimensions"),
        (lambda: ConcatDesc((MemoryDesc((2, 3)), MemoryDesc((2, 4))), 1, MemoryDesc((2, 8))), triodnn.ArgumentMismatchError,
         "dst dims"),
    ],
)
def test_concat_bad_arguments_name_the_argument(build, error, match):
    with pytest.raises(error, match=match):
        build()


async def test_concat_converts_an_s32_source_to_f32(engine):
    """Non-f32 storage is supported (tests/primitives/test_dtypes.py covers the data types)."""
    desc = ConcatDesc((MemoryDesc((2, 3), "f32"), MemoryDesc((2, 3), "s32")), 0)
    a, b = np.full((2, 3), 0.5, np.float32), np.arange(6, dtype=np.int32).reshape(2, 3)
    got = await run(engine, desc, [a, b])
    np.testing.assert_array_equal(got, np.concatenate([a, b.astype(np.float32)]))
