"""Every binary algorithm against numpy, for each broadcast pattern and code path; select (three
inputs) in its own tests below."""

from __future__ import annotations

import numpy as np
import pytest

import triodnn
from triodnn import (
    ArgumentMismatchError,
    BinaryDesc,
    InvalidArgumentError,
    MemoryDesc,
    MissingArgumentError,
)
from triodnn.kernels import KernelConfig, binary, tolerance

ALGS = tuple(alg for alg in binary.ALGORITHMS if alg not in binary.TERNARY)  # two inputs
COMPARISONS = ("ge", "gt", "le", "lt", "eq", "ne")


def operands(rng, alg, shape0, shape1):
    """Random sources; ``div`` gets a divisor bounded away from zero, comparisons small integers
    and halves, so that ties (eq, ge, le) occur."""
    if alg in COMPARISONS:
        return (rng.integers(-4, 5, shape0) / 2).astype(np.float32), (
            rng.integers(-4, 5, shape1) / 2
        ).astype(np.float32)
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
    "5d_lower_rank": ((2, 3, 1, 4, 5), (3, 2, 1, 1), None, None, None, "broadcast"),
    "6d_both_sides": ((2, 1, 3, 1, 4, 5), (1, 3, 1, 2, 1, 5), None, None, None, "broadcast"),
    "6d_same": ((2, 2, 3, 2, 2, 3), (2, 2, 3, 2, 2, 3), None, None, None, "flat"),  # 144: 9 x 16
    "6d_scalar": ((2, 2, 3, 2, 2, 3), (1, 1, 1, 1, 1, 1), None, None, None, "scalar_b"),
    "6d_strided": ((2, 3, 1, 4, 2, 5), (1, 3, 1, 4, 1, 1), "fedcba", "acdefb", "acdefb", "broadcast"),
    # Rows of a multiple of the vector ("rows" where the configuration's vector divides the row:
    # the CPU's float16, a GPU's float4 only from GPU_VECTOR_MIN elements, so "broadcast" there).
    "row_vector": ((5, 32), (1, 32), None, None, None, "rows"),
    "column_vector": ((5, 32), (5, 1), None, None, None, "rows"),
    "lower_rank_vector": ((3, 4, 16), (4, 16), None, None, None, "rows"),
    "src0_broadcast_vector": ((4, 1, 16), (1, 3, 16), None, None, None, "rows"),
    "padded_rows_vector": ((5, 32), (1, 32), (48, 1), None, None, "rows"),  # src0 rows 48 apart
    "row_of_eight": ((3, 24), (1, 24), None, None, None, "rows"),  # float8 on the CPU
    "odd_padding": ((5, 32), (1, 32), (33, 1), None, None, "broadcast"),  # rows off the vector
}


def expected_path(path: str, config: KernelConfig) -> str:
    return "broadcast" if path == "rows" and config.vector_width == 1 else path


def case_algorithms(case: str) -> tuple[str, ...]:
    """Every algorithm on same_shape, whose flat kernel has each algorithm's vector and scalar (tail)
    expression; two in turn on each other case, whose indexing the generator writes the same way
    for every algorithm (a cold PoCL cache builds each program in 0.2-0.8 s). Turn by turn, each
    algorithm meets the broadcast path's scalar expression too."""
    if case == "same_shape":
        return ALGS
    i = list(CASES).index(case)
    return tuple(ALGS[(2 * i + k) % len(ALGS)] for k in range(2))


@pytest.mark.parametrize("case", list(CASES))
async def test_all_algorithms(case, engine, build, upload, rng):
    shape0, shape1, strides0, strides1, dst_strides, path = CASES[case]
    dims = tuple(np.broadcast_shapes(shape0, shape1))
    d0 = MemoryDesc(shape0, "f32", strides0)
    d1 = MemoryDesc(shape1, "f32", strides1)
    dd = MemoryDesc(dims, "f32", dst_strides)
    algs = case_algorithms(case)
    prims = await build({alg: BinaryDesc(alg, d0, d1, dd) for alg in algs})
    stream = await engine.stream(triodnn.StreamFlags.out_of_order)
    for alg in algs:
        assert prims[alg].impl.split(":")[1] == expected_path(path, engine._config), prims[alg].impl
        a, b = operands(rng, alg, shape0, shape1)
        src0, src1, dst = await upload(a, strides0), await upload(b, strides1), engine.memory(dd)
        await stream.execute(prims[alg], {"src0": src0, "src1": src1, "dst": dst})
        got = await dst.to_numpy()
        ref = binary.reference(alg, a, b)
        assert got.shape == dims == ref.shape
        try:
            tolerance.check(got, ref, tolerance.binary(alg))
        except AssertionError as exc:
            raise AssertionError(f"{alg}: {exc}") from None


@pytest.mark.parametrize("case", ["same_shape", "scalar", "row", "lower_rank_1d"])
async def test_in_place_into_src0(case, engine, build, upload, rng):
    """dst may be src0 (same memory): each element is read before it is written, by one work-item.

    The descriptors are test_all_algorithms' own for the case (a dense dst of src0's shape is
    src0's descriptor), so they share its programs: every algorithm in place on the flat path,
    the case's two on the scalar and broadcast paths, whose indexing is the same for every
    algorithm. Every algorithm on each of the three took ~30 s of cold builds."""
    shape0, shape1, _, _, _, path = CASES[case]
    d0, d1 = MemoryDesc(shape0), MemoryDesc(shape1)
    algs = case_algorithms(case)
    prims = await build({alg: BinaryDesc(alg, d0, d1, d0) for alg in algs})
    stream = await engine.stream()
    for alg in algs:
        assert prims[alg].impl.split(":")[1] == path
        a, b = operands(rng, alg, shape0, shape1)
        src0, src1 = await upload(a), await upload(b)
        await stream.execute(prims[alg], {"src0": src0, "src1": src1, "dst": src0})
        tolerance.check(await src0.to_numpy(), binary.reference(alg, a, b), tolerance.binary(alg))
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
    a = same_shape([1.0, -2.0, 3.5, 0.0, -0.0, 5.0, -1e-38, 7.0, 2.0])
    b = same_shape([1.0, 2.0, -3.5, -0.0, 0.0, 5.0, 1e-38, -7.0, 2.5])
    d = MemoryDesc(a.shape)
    prims = await build({alg: BinaryDesc(alg, d, d) for alg in ("min", "max")})
    stream = await engine.stream()
    src0, src1, dst = await upload(a), await upload(b), engine.memory(d)
    await stream.execute(prims["min"], {"src0": src0, "src1": src1, "dst": dst})
    assert set(map(float, (await dst.to_numpy()).ravel())) <= set(map(float, np.concatenate([a, b]).ravel()))
    np.testing.assert_array_equal(await dst.to_numpy(), np.minimum(a, b))
    await stream.execute(prims["max"], {"src0": src0, "src1": src1, "dst": dst})
    np.testing.assert_array_equal(await dst.to_numpy(), np.maximum(a, b))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # the reference's inf
def same_shape(values: list[float]) -> np.ndarray:
    """``values`` repeated over test_all_algorithms' same_shape case (7 x 19: 8 float16 vectors and a
    tail of 5), whose flat programs the value tests share instead of building their own (one
    program per algorithm, 0.2-0.8 s each with a cold PoCL cache); the values reach both the vector
    and the scalar tail expressions."""
    return np.resize(np.array(values, np.float32), CASES["same_shape"][0])


async def test_special_values(engine, build, upload):
    """inf/nan and signed zeros follow IEEE like numpy (min/max NaN rules differ, documented: no NaN there)."""
    a = same_shape([np.inf, np.inf, 0, 1, -1, np.nan, 1, 3e38, -3e38, 1e-38, 0, -0.0, 5, np.inf, -7, 2])
    b = same_shape([np.inf, -np.inf, 0, 0, 0, 1, np.nan, 3e38, 3e38, 1e-38, -0.0, 0.0, np.inf, 2, 7, -0.0])
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
            tolerance.check(got, ref, tolerance.binary(alg))
        except AssertionError as exc:
            raise AssertionError(f"{alg}: {exc}") from None


def test_reference_rejects_unknown_algorithm():
    with pytest.raises(ValueError, match="'pow'"):
        binary.reference("pow", np.zeros(2), np.zeros(2))


async def test_comparisons_write_exact_ones_and_zeros(engine, build, upload):
    """1.0/0.0 exactly; NaN compares false except for ne; -0 equals 0; infinities order."""
    a = same_shape([1, 1, 2, np.nan, 1, np.nan, -0.0, np.inf, -np.inf, np.inf, 3e38, -5])
    b = same_shape([1, 2, 1, 1, np.nan, np.nan, 0.0, np.inf, np.inf, 3e38, np.inf, -5])
    d = MemoryDesc(a.shape)
    prims = await build({alg: BinaryDesc(alg, d, d) for alg in COMPARISONS})
    stream = await engine.stream()
    src0, src1 = await upload(a), await upload(b)
    expected = {
        "ge": a >= b, "gt": a > b, "le": a <= b, "lt": a < b, "eq": a == b, "ne": a != b,
    }
    for alg in COMPARISONS:
        dst = engine.memory(d)
        await stream.execute(prims[alg], {"src0": src0, "src1": src1, "dst": dst})
        got = await dst.to_numpy()
        np.testing.assert_array_equal(got, expected[alg].astype(np.float32), err_msg=alg)
        np.testing.assert_array_equal(got, binary.reference(alg, a, b), err_msg=alg)
        assert not np.any(np.signbit(got)), alg
    assert tolerance.binary("eq") == tolerance.binary("select") == 0.0
    assert tolerance.binary("add") == tolerance.BINARY


def condition(rng, shape) -> np.ndarray:
    """select's condition: zeros of both signs, ordinary values, and a NaN and an inf (true)."""
    values = np.array([0.0, -0.0, 1.0, -2.5, 0.0, np.nan, np.inf, 0.0, 1e-30], np.float32)
    return rng.choice(values, size=shape).astype(np.float32)


def select_operands(rng, shape0, shape1):
    a = rng.uniform(-4, 4, shape0).astype(np.float32)
    b = rng.uniform(-4, 4, shape1).astype(np.float32)
    a.reshape(-1)[:2] = [np.nan, np.inf][: a.size]  # copied bit for bit, never computed on
    b.reshape(-1)[:1] = [-np.inf]
    return a, b


# name: (src0 dims, src1 dims, src2 dims, src0/src1/src2/dst strides, impl path)
SELECT_CASES = {
    "same_shape": ((7, 19), (7, 19), (7, 19), (None, None, None, None), "flat"),
    "scalar_src1": ((7, 19), (1,), (7, 19), (None, None, None, None), "scalar_b"),
    "scalar_cond": ((7, 19), (7, 19), (1, 1), (None, None, None, None), "scalar_c"),
    "scalar_both": ((7, 19), (1,), (1,), (None, None, None, None), "scalar_bc"),
    "cond_row": ((7, 19), (7, 19), (19,), (None, None, None, None), "broadcast"),
    "cond_broadcasts_sources": ((19,), (7, 1), (7, 19), (None, None, None, None), "broadcast"),
    "strided": ((6, 9), (6, 9), (6, 9), ("ba", (16, 1), "ba", (12, 1)), "broadcast"),
    "5d": ((2, 3, 1, 4, 5), (3, 1, 1, 1), (2, 1, 2, 1, 1), (None, None, None, None), "broadcast"),
    "6d": ((2, 1, 3, 1, 4, 5), (1, 3, 1, 2, 1, 5), (2, 3, 3, 1, 1, 1),
           ("fedcba", None, "acdefb", "acdefb"), "broadcast"),
    "rows": ((6, 32), (6, 1), (32,), (None, None, None, None), "rows"),
}


@pytest.mark.parametrize("case", list(SELECT_CASES))
async def test_select(case, engine, upload, rng):
    """dst = src2 ? src0 : src1, each of the three broadcast (up to 6-D), bit for bit."""
    shape0, shape1, shape2, (st0, st1, st2, std), path = SELECT_CASES[case]
    dims = tuple(np.broadcast_shapes(shape0, shape1, shape2))
    d0, d1, d2 = (MemoryDesc(s, "f32", st) for s, st in ((shape0, st0), (shape1, st1), (shape2, st2)))
    dd = MemoryDesc(dims, "f32", std)
    desc = BinaryDesc("select", d0, d1, dd, src2=d2)
    prim = await engine.create_primitive(desc)
    assert prim.impl.split(":")[1] == expected_path(path, engine._config), prim.impl
    assert prim.spec.arg_names == ("src0", "src1", "src2", "dst")
    a, b = select_operands(rng, shape0, shape1)
    c = condition(rng, shape2)
    src0, src1, src2 = await upload(a, st0), await upload(b, st1), await upload(c, st2)
    dst = engine.memory(dd)
    await (await engine.stream()).execute(prim, {"src0": src0, "src1": src1, "src2": src2, "dst": dst})
    got = await dst.to_numpy()
    ref = binary.reference("select", a, b, c)
    assert got.shape == dims == ref.shape
    tolerance.check(got, ref, tolerance.binary("select"))
    np.testing.assert_array_equal(got, np.where(c != 0, a, b))


async def test_select_in_place(engine, build, upload, rng):
    """dst may be src0, src1 or the condition itself."""
    shape = (5, 37)
    d = MemoryDesc(shape)
    prim = await engine.create_primitive(BinaryDesc("select", d, d, src2=d))
    stream = await engine.stream()
    for into in ("src0", "src1", "src2"):
        a, b = select_operands(rng, shape, shape)
        c = condition(rng, shape)
        mems = {"src0": await upload(a), "src1": await upload(b), "src2": await upload(c)}
        await stream.execute(prim, {**mems, "dst": mems[into]})
        tolerance.check(await mems[into].to_numpy(), binary.reference("select", a, b, c), 0.0)


async def test_select_arguments(engine, upload):
    """src2 is select's alone: required there, refused elsewhere, at description and execution."""
    d, row, odd = MemoryDesc((4, 6)), MemoryDesc((6,)), MemoryDesc((5,))
    with pytest.raises(ArgumentMismatchError, match="src2"):
        BinaryDesc("select", d, d)
    for alg in ("add", "ge"):
        with pytest.raises(ArgumentMismatchError, match="src2"):
            BinaryDesc(alg, d, d, src2=d)
    with pytest.raises(ArgumentMismatchError, match="src2 dims"):
        BinaryDesc("select", d, d, src2=odd)
    with pytest.raises(ArgumentMismatchError, match="broadcast"):
        BinaryDesc("select", d, row, MemoryDesc((3, 4, 6)), src2=row)
    with pytest.raises(InvalidArgumentError, match="src2"):
        BinaryDesc("select", d, d, src2=(4, 6))

    desc = BinaryDesc("select", row, MemoryDesc((1,)), src2=MemoryDesc((3, 1, 1)))
    assert desc.dst == MemoryDesc((3, 1, 6))
    assert list(desc.arg_descs) == ["src0", "src1", "src2", "dst"]
    assert desc != BinaryDesc("select", row, MemoryDesc((1,)), src2=MemoryDesc((3, 1, 6)))
    assert list(BinaryDesc("add", d, row).arg_descs) == ["src0", "src1", "dst"]

    prims = {
        "select": await engine.create_primitive(BinaryDesc("select", d, d, src2=d)),
        "add": await engine.create_primitive(BinaryDesc("add", d, d)),
    }
    stream = await engine.stream()
    x = await upload(np.ones((4, 6), np.float32))
    with pytest.raises(MissingArgumentError, match="src2"):
        await stream.execute(prims["select"], {"src0": x, "src1": x, "dst": x})
    with pytest.raises(ArgumentMismatchError, match="src2"):
        await stream.execute(prims["add"], {"src0": x, "src1": x, "src2": x, "dst": x})

    blob = prims["select"].cache_blob()  # src2 survives the round trip through a blob
    again = await engine.create_primitive_from_cache_blob(blob)
    assert again.desc == prims["select"].desc and again.desc.src2 == d


def test_generator_and_reference_check_src2():
    # The generator takes a descriptor, which refuses a missing or extra src2 before any source.
    config = KernelConfig(vector_width=4, local_size=4)
    d = MemoryDesc((4,))
    with pytest.raises(ValueError, match="src2"):
        binary.generate(BinaryDesc("select", d, d), config)
    with pytest.raises(ValueError, match="src2"):
        binary.generate(BinaryDesc("add", d, d, src2=d), config)
    with pytest.raises(ValueError, match="src2"):
        binary.reference("select", np.zeros(2), np.zeros(2))
    with pytest.raises(ValueError, match="src2"):
        binary.reference("mul", np.zeros(2), np.zeros(2), np.zeros(2))
