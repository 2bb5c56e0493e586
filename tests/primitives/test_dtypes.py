"""Storage data types beyond f32 for eltwise, binary, sum and concat ("f32 math, any storage").

Each argument has its own data type; kernels compute in f32 and store with dst's conversion. The
numpy references take and return user-facing values (bf16 as float32, boolean as bool) and round
their f32 result through dst's storage as the kernels do (``_dtype_io.store_reference``). Float
results are compared with the kind's tolerance widened to one ulp of dst's type (two f32 results a
hair apart can round to neighbouring f16/bf16 values); integer results must lie between the
stores of the reference's tolerance bounds (rounding is monotone), so only a tie may go either
way; booleans and copies are exact.
"""

from __future__ import annotations

import numpy as np
import pytest
from _sweeps import (
    CPU,
    FLOATS,
    assert_refused_caching_nothing,
    check_stored_bounded,
    dtype_pairs,
    execute,
    execute_in_place,
    relu_sum_mul,
    values,
)

import triodnn
from triodnn import BinaryDesc, EltwiseDesc, MemoryDesc
from triodnn._values._concat_desc import ConcatDesc
from triodnn._values._dtypes import from_storage, to_storage
from triodnn._values._sum_desc import SumDesc
from triodnn.kernels import _dtype_io, _post_ops, binary, concat, eltwise, tolerance
from triodnn.kernels import sum as sum_kernels

SHAPE = (3, 37)  # 111 elements: six float16 vectors and a tail


# -- storage helpers -------------------------------------------------------------------------------


def test_store_reference_matches_the_upload_rounding_of_floating_types():
    """The references round through storage exactly as ``to_storage``/``from_storage`` do."""
    x = np.array([0.0, -0.0, 1.0, 1.00390625, 1.01171875, 3.14159, -65519.0, 65520.0, 1e-8,
                  np.inf, -np.inf, np.nan, 3.4e38], np.float32)
    for dtype in FLOATS:
        with np.errstate(over="ignore"):
            through_storage = from_storage(to_storage(x, dtype), dtype)
        np.testing.assert_array_equal(_dtype_io.store_reference(x, dtype), through_storage)
    np.testing.assert_array_equal(
        _dtype_io.store_reference(x, "boolean"), [False, False] + [True] * 11
    )


def test_store_reference_of_integers_rounds_to_even_saturates_and_zeroes_nan():
    x = np.array([-1e10, -129.0, -128.6, -2.5, -0.5, 0.5, 1.5, 126.5, 127.5, 300.0, np.nan, np.inf],
                 np.float32)
    np.testing.assert_array_equal(
        _dtype_io.store_reference(x, "s8"), [-128, -128, -128, -2, 0, 0, 2, 126, 127, 127, 0, 127]
    )
    np.testing.assert_array_equal(
        _dtype_io.store_reference(x, "u8"), [0, 0, 0, 0, 0, 0, 2, 126, 128, 255, 0, 255]
    )
    big = np.array([3e9, -3e9, 2.0**31, np.nan], np.float32)
    np.testing.assert_array_equal(
        _dtype_io.store_reference(big, "s32"), [2**31 - 1, -(2**31), 2**31 - 1, 0]
    )


async def test_boolean_memory_round_trips_numpy_bool_arrays(engine):
    x = np.array([[True, False, True], [False, False, True]])
    assert MemoryDesc.like(x) == MemoryDesc((2, 3), "boolean")
    assert MemoryDesc((2, 3), "boolean").nbytes == 6
    mem = await engine.from_numpy(x)
    got = await mem.to_numpy()
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, x)
    strided = await engine.from_numpy(x, MemoryDesc((2, 3), "boolean", "ba"))
    np.testing.assert_array_equal(await strided.to_numpy(), x)


async def test_boolean_upload_is_value_nonzero_and_reads_any_nonzero_byte_as_true(engine):
    floats = np.array([0.0, -0.0, np.nan, 0.5, -3.0], np.float32)
    mem = await engine.from_numpy(floats, MemoryDesc((5,), "boolean"))
    np.testing.assert_array_equal(await mem.to_numpy(), [False, False, True, True, True])
    # Bytes other than 0/1 (memory another program filled) read as true, on the host and in kernels.
    odd_bytes = np.array([0, 2, 255, 1, 0], np.uint8).view(np.bool_)
    await mem.write(odd_bytes)
    np.testing.assert_array_equal(await mem.to_numpy(), [False, True, True, True, False])
    desc = EltwiseDesc("linear", MemoryDesc((5,), "boolean"), MemoryDesc((5,)), alpha=1.0)
    primitive = await engine.create_primitive(desc)
    dst = engine.memory(desc.dst)
    await (await engine.stream()).execute(primitive, {"src": mem, "dst": dst})
    np.testing.assert_array_equal(await dst.to_numpy(), [0.0, 1.0, 1.0, 1.0, 0.0])


# -- eltwise ---------------------------------------------------------------------------------------

ELTWISE_DTYPES = [("f32", "bf16"), ("bf16", "f32"), ("f16", "f16"), ("s8", "f32"), ("f32", "u8")]


def eltwise_values(rng, alg: str, dtype: str) -> np.ndarray:
    if dtype == "s8":  # integers; exp kept below f32 overflow
        return values(rng, dtype, SHAPE, -20, 21) if alg == "exp" else values(rng, dtype, SHAPE, -128, 128)
    if dtype == "f32":  # u8 destinations: results on both sides of [0, 255] to saturate
        return values(rng, dtype, SHAPE, -6.0, 6.0) if alg == "exp" else values(rng, dtype, SHAPE, -40.0, 400.0)
    return values(rng, dtype, SHAPE, -6.0, 6.0)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@dtype_pairs(ELTWISE_DTYPES)
@pytest.mark.parametrize("alg", ["relu", "gelu_erf", "exp"])
async def test_eltwise_converts_storage(engine, rng, alg, src_dtype, dst_dtype):
    x = eltwise_values(rng, alg, src_dtype)
    desc = EltwiseDesc(alg, MemoryDesc(SHAPE, src_dtype), MemoryDesc(SHAPE, dst_dtype))
    assert triodnn.kernels.generate(desc, CPU).impl.startswith("ocl:flat:v16")  # non-f32 keeps the flat path
    got = await execute(engine, desc, {"src": x})
    ref = eltwise.reference(alg, x)
    check_stored_bounded(got, ref, tolerance.eltwise(alg), dst_dtype)
    if alg == "relu":  # exact in f32: the stored result is the reference's, bit for bit
        np.testing.assert_array_equal(got, eltwise.reference(alg, x, dst_dtype=dst_dtype))
        if dst_dtype == "u8":
            assert (got == 255).any() and (got == 0).any(), "the data should saturate both ways"


async def test_eltwise_strided_between_storage_types(engine, rng):
    shape = (2, 3, 4, 5)
    x = values(rng, "bf16", shape)
    desc = EltwiseDesc("gelu_tanh", MemoryDesc(shape, "bf16", "nhwc"), MemoryDesc(shape, "f16", (80, 20, 5, 1)))
    assert triodnn.kernels.generate(desc, CPU).impl.startswith("ocl:strided")
    got = await execute(engine, desc, {"src": x})
    check_stored_bounded(got, eltwise.reference("gelu_tanh", x), tolerance.eltwise("gelu_tanh"), "f16")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
async def test_eltwise_in_place(engine, rng, dtype):
    x = values(rng, dtype, SHAPE)
    got = await execute_in_place(engine, EltwiseDesc("square", MemoryDesc(SHAPE, dtype)), x)
    check_stored_bounded(got, eltwise.reference("square", x), tolerance.eltwise("square"), dtype)


@pytest.mark.parametrize("shape", [SHAPE, (2, 3, 5)], ids=["flat", "po_bcast"])
async def test_eltwise_post_ops_with_bf16_dst(engine, rng, shape):
    """A sum post-op reads the old dst through its storage type; binary operands stay f32."""
    operand_dims = shape if shape == SHAPE else (3, 1)
    chain = relu_sum_mul(operand_dims)
    desc = EltwiseDesc("linear", MemoryDesc(shape, "s8"), MemoryDesc(shape, "bf16"), alpha=0.5, beta=-1.0,
                       post_ops=chain)
    x = values(rng, "s8", shape, -128, 128)
    old_dst = values(rng, "bf16", shape)
    factor = values(rng, "f32", operand_dims, 0.5, 2.0)
    got = await execute(engine, desc, {"src": x, "post_op_2_src1": factor}, dst_init=old_dst)
    ref = _post_ops.reference(desc.post_ops, eltwise.reference("linear", x, alpha=0.5, beta=-1.0),
                              old_dst=old_dst, operands={2: factor})
    check_stored_bounded(got, ref, 2 * tolerance.ELTWISE, "bf16")


# -- binary ----------------------------------------------------------------------------------------

# name: (src0 dims and dtype, src1 dims and dtype, dst dtype, path)
BINARY_CASES = {
    "flat": (((4, 33), "u8"), ((4, 33), "f32"), "bf16", "flat"),
    "scalar": (((4, 33), "bf16"), ((1,), "f16"), "f32", "scalar_b"),
    "broadcast": (((2, 4, 33), "bf16"), ((33,), "s8"), "f16", "broadcast"),
    "broadcast_int": (((4, 1), "s32"), ((1, 33), "f32"), "s32", "broadcast"),
}


@pytest.mark.parametrize("case", list(BINARY_CASES))
async def test_binary_add_of_mixed_storage_types(engine, rng, case):
    (dims0, t0), (dims1, t1), dst_dtype, path = BINARY_CASES[case]
    a, b = values(rng, t0, dims0, -100, 100), values(rng, t1, dims1, -100, 100)
    d0, d1 = MemoryDesc(dims0, t0), MemoryDesc(dims1, t1)
    dims = tuple(np.broadcast_shapes(dims0, dims1))
    desc = BinaryDesc("add", d0, d1, MemoryDesc(dims, dst_dtype))
    assert triodnn.kernels.generate(desc, CPU).impl.startswith(f"ocl:{path}")
    got = await execute(engine, desc, {"src0": a, "src1": b})
    check_stored_bounded(got, binary.reference("add", a, b), tolerance.binary("add"), dst_dtype)


@pytest.mark.parametrize("dims1", [(5, 40), (1, 40)], ids=["flat", "broadcast"])
@pytest.mark.parametrize("alg, dst_dtype", [("ge", "boolean"), ("gt", "boolean"), ("eq", "u8"), ("lt", "f32")])
async def test_comparison_of_s32_into_any_dst(engine, rng, alg, dst_dtype, dims1):
    a = values(rng, "s32", (5, 40), -3, 4)
    b = values(rng, "s32", dims1, -3, 4)
    desc = BinaryDesc(alg, MemoryDesc((5, 40), "s32"), MemoryDesc(dims1, "s32"), MemoryDesc((5, 40), dst_dtype))
    got = await execute(engine, desc, {"src0": a, "src1": b})
    expected = {"ge": a >= b, "gt": a > b, "eq": a == b, "lt": a < b}[alg]
    assert got.dtype == _dtype_io.USER_NUMPY[dst_dtype]
    np.testing.assert_array_equal(got, expected.astype(got.dtype))
    np.testing.assert_array_equal(got, binary.reference(alg, a, b, dst_dtype=dst_dtype))


async def test_select_with_a_broadcast_boolean_attention_mask(engine, rng):
    """dst = mask ? scores : -inf with a [1, 1, 1, N] mask, as an attention mask."""
    shape, n = (2, 3, 4, 37), 37
    scores = values(rng, "bf16", shape)
    mask = values(rng, "boolean", (1, 1, 1, n))
    fill = np.array([-np.inf], np.float32)
    desc = BinaryDesc(
        "select", MemoryDesc(shape, "bf16"), MemoryDesc((1,)), MemoryDesc(shape, "bf16"),
        src2=MemoryDesc((1, 1, 1, n), "boolean"),
    )
    assert triodnn.kernels.generate(desc, CPU).impl.startswith("ocl:broadcast")
    got = await execute(engine, desc, {"src0": scores, "src1": fill, "src2": mask})
    np.testing.assert_array_equal(got, np.where(mask, scores, -np.inf).astype(np.float32))
    np.testing.assert_array_equal(got, binary.reference("select", scores, fill, mask, dst_dtype="bf16"))


@pytest.mark.parametrize("cond_dtype", ["boolean", "u8", "s32", "f32"])
async def test_select_condition_of_any_type(engine, rng, cond_dtype):
    cond = values(rng, cond_dtype, SHAPE, -2, 3)
    a, b = values(rng, "f16", SHAPE), values(rng, "s8", SHAPE, -100, 100)
    desc = BinaryDesc(
        "select", MemoryDesc(SHAPE, "f16"), MemoryDesc(SHAPE, "s8"), MemoryDesc(SHAPE, "f32"),
        src2=MemoryDesc(SHAPE, cond_dtype),
    )
    assert triodnn.kernels.generate(desc, CPU).impl.startswith("ocl:flat")
    got = await execute(engine, desc, {"src0": a, "src1": b, "src2": cond})
    np.testing.assert_array_equal(got, np.where(cond != 0, a.astype(np.float32), b.astype(np.float32)))


# -- sum and concat --------------------------------------------------------------------------------


@pytest.mark.parametrize("dst_dtype, dst_strides", [("bf16", None), ("f32", "ba")], ids=["flat", "strided"])
async def test_sum_of_bf16_inputs_with_scales(engine, rng, dst_dtype, dst_strides):
    arrays = [values(rng, "bf16", SHAPE, -1.0, 1.0) for _ in range(3)]
    scales = (0.5, -1.25, 2.0)
    desc = SumDesc(tuple(MemoryDesc(SHAPE, "bf16") for _ in arrays), scales, MemoryDesc(SHAPE, dst_dtype, dst_strides))
    assert triodnn.kernels.generate(desc, CPU).impl.startswith("ocl:flat" if dst_strides is None else "ocl:strided")
    got = await execute(engine, desc, {f"src{i}": a for i, a in enumerate(arrays)})
    check_stored_bounded(got, sum_kernels.reference(arrays, scales), sum_kernels.threshold(3), dst_dtype)
    if dst_dtype == "bf16":
        np.testing.assert_array_equal(got, sum_kernels.reference(arrays, scales, dst_dtype="bf16"))


async def test_concat_of_bf16_copies_bits(engine, rng):
    a = values(rng, "bf16", (2, 3, 5))
    b = values(rng, "bf16", (2, 4, 5))
    payload_nan = np.array(0x7FC10000, np.uint32).view(np.float32)  # a NaN a conversion could lose
    a[0, 0, 0] = payload_nan
    desc = ConcatDesc((MemoryDesc(a.shape, "bf16"), MemoryDesc(b.shape, "bf16", "acb")), axis=1)
    got = await execute(engine, desc, {"src0": a, "src1": b})
    expected = concat.reference([a, b], 1, dst_dtype="bf16")
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


async def test_concat_of_boolean_with_a_converted_u8_source(engine, rng):
    a = values(rng, "boolean", (3, 4))
    b = values(rng, "boolean", (3, 2))
    c = np.array([[0, 2], [255, 0], [1, 7]], np.uint8)  # nonzero: true
    desc = ConcatDesc(
        (MemoryDesc(a.shape, "boolean"), MemoryDesc(b.shape, "boolean"), MemoryDesc(c.shape, "u8")), axis=-1
    )
    assert desc.dst.dtype == "boolean"
    got = await execute(engine, desc, {"src0": a, "src1": b, "src2": c})
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, np.concatenate([a, b, c != 0], axis=1))
    np.testing.assert_array_equal(
        got, concat.reference([a, b, c], 1, src_dtypes=("boolean", "boolean", "u8"), dst_dtype="boolean")
    )


async def test_concat_of_s32_beyond_f32_precision_is_exact(engine):
    a = np.array([[2**24 + 1, -(2**31)]], np.int32)
    b = np.array([[2**31 - 1, 7]], np.int32)
    desc = ConcatDesc((MemoryDesc((1, 2), "s32"), MemoryDesc((1, 2), "s32")), axis=0)
    got = await execute(engine, desc, {"src0": a, "src1": b})
    np.testing.assert_array_equal(got, np.concatenate([a, b]))


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["f64", "bool", "bfloat16", None])
def test_unknown_dtype_name_is_invalid(name):
    with pytest.raises(triodnn.InvalidArgumentError, match="is not a triodnn data type"):
        MemoryDesc((4,), name)


@pytest.mark.parametrize("make", ["eltwise", "binary"])
async def test_bf16_post_op_operand_is_unsupported_and_caches_nothing(engine, make):
    md = MemoryDesc((8,), "bf16")
    chain = (("eltwise", "relu"), ("binary", "add", MemoryDesc((8,), "bf16")))
    desc = EltwiseDesc("relu", md, post_ops=chain) if make == "eltwise" else BinaryDesc("add", md, md, post_ops=chain)
    await assert_refused_caching_nothing(engine, desc, r"post_ops\[1\] .*post_op_1_src1 has dtype 'bf16'")


def test_every_storage_type_generates_for_each_kind():
    """All pairs compile to source here (pure); the device tests above run a sample of them."""
    for src in _dtype_io.DTYPES:
        for dst in _dtype_io.DTYPES:
            for md_dst in (MemoryDesc((4, 5), dst), MemoryDesc((4, 5), dst, "ba")):
                triodnn.kernels.generate(EltwiseDesc("relu", MemoryDesc((4, 5), src), md_dst), CPU)
                triodnn.kernels.generate(BinaryDesc("add", MemoryDesc((4, 5), src), MemoryDesc((5,), dst), md_dst), CPU)
                triodnn.kernels.generate(SumDesc((MemoryDesc((4, 5), src), MemoryDesc((4, 5), dst)), None, md_dst), CPU)
                triodnn.kernels.generate(ConcatDesc((MemoryDesc((4, 5), src), MemoryDesc((4, 5), dst)), 0), CPU)
