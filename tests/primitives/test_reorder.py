"""Reorder: data type pairs (every one with TRIODNN_REORDER_ALL_PAIRS=1), layout changes, the copy path, argument errors.

Inputs hold the values where conversions go wrong: rounding ties (to even), saturation edges,
negative numbers, NaN and infinities, f16/bf16 overflow and ties, s32 beyond f32's 24 bits. The
expected values come from ``kernels.reorder.reference`` applied to what the source memory
actually holds (read back, so upload rounding of bf16/f16 is accounted for); results must match
exactly, NaN positions and signs of zero included.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

import triodnn
from triodnn import MemoryDesc
from triodnn._values._errors import ArgumentMismatchError, InvalidArgumentError
from triodnn._values._reorder_desc import ReorderDesc
from triodnn.kernels import generate, reorder, select_config

DTYPES = reorder.DTYPES
SHAPE = (3, 5, 7)  # odd everywhere; 105 elements: 6 full float16 vectors and a tail of 9

_TIES = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, -127.5, -128.5, 254.5, 255.5, -0.49, 0.49]
_SPECIAL = {
    "f32": _TIES + [
        0.0, -0.0, 300.0, -300.0, 1e10, -1e10, 3e9, -3e9, 2147483520.0, -2147483648.0, 2**31,
        65504.0, 65519.99, 65520.0, -65520.0, 6e-5, 1e-8, -1e-8, 3.4e38, -3.4e38,
        1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 1 + 3 * 2**-11, -(1 + 3 * 2**-8), 1 + 2**-8 + 2**-20,
        np.nan, np.inf, -np.inf, -np.nan,
    ],
    "f16": _TIES + [
        0.0, -0.0, 300.0, -300.0, 65504.0, -65504.0, 6e-5, 6e-8, 1 + 2**-8, 1 + 3 * 2**-8,
        -(1 + 3 * 2**-8), 1 + 2**-10, np.nan, np.inf, -np.inf,
    ],
    "bf16": _TIES + [
        0.0, -0.0, 300.0, -300.0, 1e10, -1e10, 3e9, -3e9, 2**31, -(2**31), 65536.0, 65280.0,
        1e-30, 3.38e38, np.nan, np.inf, -np.inf,
    ],
    "s32": [
        0, 1, -1, 127, 128, -128, -129, 255, 256, -256, 65504, 65519, 65520, 70000, -70000,
        2**24 + 1, 2**24 + 3, -(2**24 + 3), 2**31 - 1, -(2**31), 2**31 - 65, 1000000007,
    ],
    "s8": [-128, -127, -1, 0, 1, 126, 127],
    "u8": [0, 1, 127, 128, 200, 254, 255],
    "boolean": [False, True, True, False],
    "s64": [0, 1, -1, 2**24 + 1, -(2**24 + 3), 2**31, -(2**31) - 1, 2**40 + 1, 2**62, -(2**63)],
    # f8 ties, overflow to NaN (e4m3) or infinity (e5m2), subnormals: test_low_precision_types.
    "f8_e4m3": [0.0, -0.0, 448.0, -448.0, 464.0, 2.0**-9, 1.5 * 2.0**-9, 1.0625, np.nan],
    "f8_e5m2": [0.0, -0.0, 57344.0, -57344.0, 61440.0, 2.0**-16, 1.125, np.nan, np.inf, -np.inf],
    "s4": [-8, -7, -1, 0, 1, 6, 7],  # packed two a byte: test_low_precision_types
    "u4": [0, 1, 7, 8, 14, 15],
}


def source_values(rng, dtype: str, shape=SHAPE) -> np.ndarray:
    """The special values of ``dtype`` first, the rest random, in the user-facing numpy type."""
    n = int(np.prod(shape))
    special = _SPECIAL[dtype]
    if dtype == "boolean":
        values = np.concatenate([np.array(special, dtype=np.bool_), rng.random(n) < 0.5])[:n]
        return values.reshape(shape)
    if dtype in ("f32", "f16", "bf16", "f8_e4m3", "f8_e5m2"):
        fill = (rng.standard_normal(n) * 100).astype(np.float32)
        numpy_type = np.float16 if dtype == "f16" else np.float32
    else:
        info = np.iinfo({"s32": np.int32, "s8": np.int8, "u8": np.uint8, "s64": np.int64,
                         "s4": np.int8, "u4": np.uint8}[dtype])
        low, high = {"s4": (-8, 7), "u4": (0, 15)}.get(dtype, (info.min, info.max))
        fill = rng.integers(low, high, n, endpoint=True)
        numpy_type = info.dtype
    with np.errstate(over="ignore"):
        values = np.concatenate([np.array(special, dtype=np.float64), fill.astype(np.float64)])[:n]
        return values.astype(numpy_type).reshape(shape)


async def run_reorder(engine, desc: ReorderDesc, array, primitive=None):
    """(source values as stored, result) of reordering ``array`` with ``desc``."""
    primitive = primitive or await engine.create_primitive(desc)
    stream = await engine.stream()
    src = await engine.from_numpy(array, desc.src)
    dst = engine.memory(desc.dst)
    await stream.execute(primitive, {"src": src, "dst": dst})
    return await src.to_numpy(), await dst.to_numpy()


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)  # NaNs equal where both are NaN
    if got.dtype.kind == "f":
        finite = ~np.isnan(want)
        np.testing.assert_array_equal(np.signbit(got[finite]), np.signbit(want[finite]))


def user_dtype(dtype: str) -> np.dtype:
    return np.dtype(np.float32) if dtype in ("bf16", "f8_e4m3", "f8_e5m2") else MemoryDesc((1,), dtype).numpy_dtype


# All 144 (source, destination) pairs with TRIODNN_REORDER_ALL_PAIRS=1. Every pair is a program of
# its own, 1-2 s each on PoCL with a cold cache (~250 s for the 144 on 2 cores), and a converting
# pair's kernel is the same two helpers composed, ``store_dst(load_src(x))`` through f32
# (kernels/reorder.py writes nothing for a particular pair); one data type on both sides is the copy.
ALL_PAIRS = os.environ.get("TRIODNN_REORDER_ALL_PAIRS") == "1"


def destinations(src_dtype: str) -> tuple[str, ...]:
    """The destinations ``src_dtype`` is reordered to by default: f32 (every load, checked alone:
    the f32 store keeps what it is given), itself (the copy), and two others that rotate with the
    source, so each store also follows two loads besides f32's; f32 itself goes to every type
    (every store, on f32's edge values: ties, saturation, NaN, infinities, overflow). 56 of the 144 pairs."""
    if ALL_PAIRS or src_dtype == "f32":
        return DTYPES
    others = [d for d in DTYPES if d != "f32"]
    i = others.index(src_dtype)
    picked = {"f32", src_dtype, others[(i + 1) % len(others)], others[(i + 5) % len(others)]}
    return tuple(d for d in DTYPES if d in picked)


def test_the_default_pairs_reach_every_load_and_store_twice():
    pairs = {(s, d) for s in DTYPES for d in destinations(s) if s != d}
    for dtype in DTYPES:
        assert (dtype, "f32") in pairs or dtype == "f32"
        assert ("f32", dtype) in pairs or dtype == "f32"
        assert len({s for s, d in pairs if d == dtype and s != "f32"}) >= 2
        assert len({d for s, d in pairs if s == dtype and d != "f32"}) >= 2 or dtype == "f32"
    assert {(d, d) for d in DTYPES} <= {(s, d) for s in DTYPES for d in destinations(s)}  # every copy


@pytest.mark.parametrize("src_dtype", DTYPES)
async def test_every_dtype_pair(engine, rng, build, src_dtype):
    """One source type against its destinations (``destinations``; every one with
    TRIODNN_REORDER_ALL_PAIRS=1), built concurrently, dense row-major."""
    array = source_values(rng, src_dtype)
    descs = {dst: ReorderDesc(MemoryDesc(SHAPE, src_dtype), MemoryDesc(SHAPE, dst)) for dst in destinations(src_dtype)}
    prims = await build(descs)
    for dst_dtype, desc in descs.items():
        stored, got = await run_reorder(engine, desc, array, prims[dst_dtype])
        want = reorder.reference(stored, src_dtype, dst_dtype)
        assert want.dtype == user_dtype(dst_dtype)
        try:
            assert_same(got, want)
        except AssertionError as exc:
            raise AssertionError(f"{src_dtype} -> {dst_dtype}: {exc}") from None
        # s4/u4 never copy bytes: each element is loaded and stored (packed nibbles).
        copies = dst_dtype == src_dtype and src_dtype not in ("s4", "u4")
        expected_path = "ocl:copy:" if copies else "ocl:convert:"
        assert prims[dst_dtype].impl.startswith(expected_path)


def test_reference_rules():
    """The reference itself: ties to even, saturation, NaN -> 0 for integers, NaN kept for floats."""
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 127.5, -128.5, 300.0, -300.0, np.nan, np.inf, -np.inf],
                 dtype=np.float32)
    np.testing.assert_array_equal(
        reorder.reference(x, "f32", "s8"), [0, 2, 2, 0, -2, 127, -128, 127, -128, 0, 127, -128]
    )
    np.testing.assert_array_equal(
        reorder.reference(x, "f32", "u8"), [0, 2, 2, 0, 0, 128, 0, 255, 0, 0, 255, 0]
    )
    np.testing.assert_array_equal(
        reorder.reference(np.array([3e9, -3e9, np.nan, 2.5], np.float32), "f32", "s32"),
        [2**31 - 1, -(2**31), 0, 2],
    )
    bf = reorder.reference(np.array([1 + 2**-8, 1 + 3 * 2**-8, np.nan, 3.4e38], np.float32), "f32", "bf16")
    assert bf[0] == 1.0 and bf[1] == 1 + 2**-6 and np.isnan(bf[2]) and bf[3] == np.inf
    # s32 widens through f32: 2**24 + 1 is not an f32, it rounds to 2**24 (even).
    assert reorder.reference(np.array([2**24 + 1], np.int32), "s32", "f32")[0] == 2**24
    assert reorder.reference(np.array([2**24 + 1], np.int32), "s32", "s32")[0] == 2**24 + 1


@pytest.mark.parametrize(
    "dims, src_layout, dst_layout, src_dtype, dst_dtype",
    [
        ((2, 3, 5, 7), "nchw", "nhwc", "f32", "f32"),
        ((2, 3, 5, 7), "nhwc", "nchw", "f32", "bf16"),
        ((2, 3, 5, 7), "nchw", "nhwc", "f32", "s8"),
        ((2, 3, 5, 7), "nhwc", "nchw", "u8", "f32"),
        ((2, 3, 5, 7), "nhwc", "nchw", "f16", "f16"),
        ((9, 13), "ab", "ba", "s32", "s32"),              # transpose, exact s32 bits
        ((9, 13), "ba", "ab", "bf16", "f16"),
        ((9, 13), (16, 1), "ab", "f32", "u8"),           # padded rows on the source
        ((9, 13), "ab", (1, 11), "s8", "s32"),           # padded columns on the destination
        ((3, 5, 7), (48, 8, 1), (1, 3, 16), "f16", "s8"),  # padded on both sides, transposed
        ((3, 5, 7), (48, 8, 1), (48, 8, 1), "f32", "f32"),  # same padded strides: not dense
        ((1, 5, 1, 3), "nchw", "nhwc", "f32", "f16"),     # unit dims
        ((1,), "a", "a", "f32", "s32"),
    ],
)
async def test_layout_changes(engine, rng, dims, src_layout, dst_layout, src_dtype, dst_dtype):
    desc = ReorderDesc(MemoryDesc(dims, src_dtype, src_layout), MemoryDesc(dims, dst_dtype, dst_layout))
    stored, got = await run_reorder(engine, desc, source_values(rng, src_dtype, dims))
    assert_same(got, reorder.reference(stored, src_dtype, dst_dtype))
    primitive = await engine.create_primitive(desc)
    if src_dtype != dst_dtype or src_dtype in ("s4", "u4"):
        assert primitive.impl.startswith("ocl:convert:")
    elif desc.src.strides == desc.dst.strides and desc.src.is_dense:
        assert primitive.impl.startswith("ocl:copy:")
    else:
        assert primitive.impl.startswith("ocl:strided:")


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d not in ("s4", "u4")])  # packed: no copy
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
async def test_copy_path(engine, rng, dtype, layout):
    """Same data type and dense layout on both sides: a flat copy of the stored bits."""
    dims = (2, 3, 5, 7)
    md = MemoryDesc(dims, dtype, layout)
    desc = ReorderDesc(md, md)
    primitive = await engine.create_primitive(desc)
    assert primitive.impl.startswith("ocl:copy:")
    assert primitive.kind == "reorder"
    stored, got = await run_reorder(engine, desc, source_values(rng, dtype, dims), primitive)
    assert_same(got, stored)


async def test_copy_keeps_nan_payloads(engine):
    """Same-type reorders move bits: a signalling-looking f32 NaN payload survives, in both paths."""
    bits = np.array([0x7F800001, 0xFFC12345, 0x3F800000, 0x80000000, 0x7FBFFFFF], dtype=np.uint32)
    array = bits.view(np.float32)
    for dst_strides in ((1,), (2,)):
        desc = ReorderDesc(MemoryDesc((5,), "f32"), MemoryDesc((5,), "f32", dst_strides))
        _, got = await run_reorder(engine, desc, array)
        np.testing.assert_array_equal(got.view(np.uint32), bits)


def test_generated_paths_and_impl_names():
    config = select_config("cpu", 4096)
    dense = MemoryDesc((4, 6), "f16")
    copy = generate(ReorderDesc(dense, dense), config)
    assert copy.impl == f"ocl:copy:{config.name}" and copy.arg_names == ("src", "dst")
    assert "vload_half" not in copy.source  # f16 copies move ushort bits
    convert = generate(ReorderDesc(dense, MemoryDesc((4, 6), "f32")), config)
    assert convert.impl == f"ocl:convert:l{config.local_size}" and "vload_half" in convert.source
    strided = generate(ReorderDesc(dense, MemoryDesc((4, 6), "f16", "ba")), config)
    assert strided.impl == f"ocl:strided:l{config.local_size}"


def test_descriptor_is_a_value():
    a = ReorderDesc(MemoryDesc((2, 3), "f32"), MemoryDesc((2, 3), "s8", "ba"))
    b = ReorderDesc(MemoryDesc((2, 3), "f32", "ab"), MemoryDesc((2, 3), "s8", (1, 2)))
    assert a == b and hash(a) == hash(b)
    assert a.kind == "reorder" and list(a.arg_descs) == ["src", "dst"]
    for s, d in itertools.product(DTYPES, DTYPES):
        ReorderDesc(MemoryDesc((2,), s), MemoryDesc((2,), d)).check_supported()  # all supported


async def test_same_descriptor_is_one_cache_entry(engine):
    desc = ReorderDesc(MemoryDesc((3, 4), "u8"), MemoryDesc((3, 4), "bf16", "ba"))
    first = await engine.create_primitive(desc)
    second = await engine.create_primitive(
        ReorderDesc(MemoryDesc((3, 4), "u8"), MemoryDesc((3, 4), "bf16", "ba"))
    )
    assert first.impl == second.impl


def test_dims_mismatch_names_both():
    with pytest.raises(ArgumentMismatchError, match=r"dst dims \(3, 2\).*src dims \(2, 3\)"):
        ReorderDesc(MemoryDesc((2, 3), "f32"), MemoryDesc((3, 2), "f32"))
    with pytest.raises(ArgumentMismatchError, match=r"\(6,\).*\(2, 3\)"):
        ReorderDesc(MemoryDesc((2, 3), "s8"), MemoryDesc((6,), "s8"))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: ReorderDesc(np.zeros(3), MemoryDesc((3,))), "src is ndarray"),
        (lambda: ReorderDesc(MemoryDesc((3,)), "f32"), "dst is str"),
        (lambda: ReorderDesc(MemoryDesc((3,), "f64"), MemoryDesc((3,))), "dtype 'f64'"),
    ],
)
def test_bad_arguments(make, match):
    with pytest.raises(InvalidArgumentError, match=match):
        make()


async def test_wrong_memory_at_execution(engine):
    desc = ReorderDesc(MemoryDesc((4,), "f32"), MemoryDesc((4,), "s8"))
    primitive = await engine.create_primitive(desc)
    stream = await engine.stream()
    src = await engine.from_numpy(np.zeros(4, np.float32))
    wrong = engine.memory(MemoryDesc((4,), "u8"))
    with pytest.raises(ArgumentMismatchError, match="'dst'"):
        await stream.execute(primitive, {"src": src, "dst": wrong})
    assert isinstance(primitive, triodnn.Primitive)
