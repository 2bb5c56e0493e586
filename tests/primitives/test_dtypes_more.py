"""Storage data types for matmul, softmax, reduction, pooling, the normalizations, convolution and
reorder's boolean ("f32 math, any storage", as tests/primitives/test_dtypes.py for eltwise, binary, sum and
concat).

Each argument has its own data type; kernels load into f32, compute in f32 and store with dst's
conversion. The numpy references take user-facing values (bf16 as float32) and their f32 result is
rounded through dst's storage (``_dtype_io.store_reference``). Float results are compared with the
kind's tolerance plus one rounding step of dst's type (two f32 results a hair apart can round to
neighbouring bf16/f16 values). Matmul and convolution on small integers are exact in f32 (ints up
to 8 are exact in bf16), so their stored results must equal the reference's bit for bit.

The normalizations' scale, shift, mean and variance stay f32, as oneDNN's, and binary post-op
operands stay f32: those are refused, leaving nothing cached.

``shaped_engine`` runs each test twice where the kernel has two shapes: with the device's own
configuration (PoCL: 16-wide vectors, the CPU paths) and with vector width 1 (the GPU paths, which
would otherwise never run on a CPU-only machine).
"""

from __future__ import annotations

import numpy as np
import pytest
from _sweeps import (
    CPU,
    FLOAT_PAIRS,
    assert_refused_caching_nothing,
    check_stored,
    dtype_pairs,
    execute,
    execute_in_place,
    ints,
    relu_sum_mul,
)
from _sweeps import values as _values

import triodnn
from triodnn import (
    BatchNormInferenceDesc,
    ConvolutionDesc,
    GroupNormDesc,
    LayerNormDesc,
    MatmulDesc,
    MemoryDesc,
    PoolingDesc,
    ReductionDesc,
    RMSNormDesc,
    SoftmaxDesc,
)
from triodnn._values._reorder_desc import ReorderDesc
from triodnn.kernels import (
    KernelConfig,
    _dtype_io,
    _post_ops,
    convolution,
    matmul,
    normalization,
    pooling,
    reduction,
    reorder,
    select_config,
    softmax,
    tolerance,
)

GPU = select_config("gpu", 256)
NARROW = KernelConfig(vector_width=1, local_size=16)  # the GPU paths, run on the CPU device


def values(rng, dtype: str, shape, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    """``_sweeps.values``, in [-2, 2) unless told."""
    return _values(rng, dtype, shape, low, high)


def assert_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


@pytest.fixture(params=["device", "v1"])
async def shaped_engine(request, engine):
    """(engine, its kernel configuration): the default engine with its own configuration, or
    with vector width 1 (the GPU shape of every kernel). The configuration is part of the
    primitive cache key, so the two never share an entry; the engine is this test's own."""
    if request.param == "v1":
        engine._config = NARROW
        return engine, NARROW
    return engine, engine._config


# -- matmul ----------------------------------------------------------------------------------------

# src dims, weights dims, bias dims, (src, weights, bias, dst) data types
MATMUL_CASES = {
    "small": ((5, 7), (7, 3), None, ("bf16", "bf16", None, "f32")),
    "edges_bias": ((33, 20), (20, 40), (40,), ("bf16", "bf16", "bf16", "bf16")),
    "full_tiles": ((2, 32, 16), (16, 32), (32, 1), ("f16", "f16", "f32", "f32")),
    "batch_mixed": ((3, 1, 9, 24), (4, 24, 17), None, ("f16", "bf16", None, "f16")),
    "wide_k": ((17, 64), (64, 33), None, ("bf16", "bf16", None, "bf16")),
    "f32_into_bf16": ((16, 48), (48, 64), (1, 64), ("f32", "f32", "f32", "bf16")),
}


@pytest.mark.parametrize("case", list(MATMUL_CASES))
async def test_matmul_of_small_integers_is_exact(shaped_engine, rng, case):
    """Integers up to 8 are exact in bf16 and f16 and their sums exact in f32: the stored result
    is the reference's, bit for bit, whatever dst's type rounds."""
    src_dims, wei_dims, bias_dims, (st, wt, bt, dt) = MATMUL_CASES[case]
    a, w = ints(rng, src_dims, st), ints(rng, wei_dims, wt)
    bias = None if bias_dims is None else ints(rng, bias_dims, bt)
    dims = MatmulDesc(MemoryDesc(src_dims), MemoryDesc(wei_dims)).dst.dims
    desc = MatmulDesc(MemoryDesc(src_dims, st), MemoryDesc(wei_dims, wt), MemoryDesc(dims, dt),
                      None if bias is None else MemoryDesc(bias_dims, bt))
    arrays = {"src": a, "weights": w} | ({} if bias is None else {"bias": bias})
    engine, config = shaped_engine
    primitive = await engine.create_primitive(desc)
    assert primitive.impl == matmul.generate(desc, config).impl
    got = await execute(engine, desc, arrays, primitive=primitive)
    assert_bits_equal(got, matmul.reference(a, w, bias, dst_dtype=dt))


@pytest.mark.parametrize("dst_dtype", ["f32", "bf16"])
async def test_matmul_attention_scores_from_bf16(engine, rng, dst_dtype):
    """Q @ K^T as attention computes it: bf16 inputs, K transposed through its strides, an f32 (or
    bf16) result scaled by 1/sqrt(d)."""
    q = values(rng, "bf16", (2, 3, 37, 64))
    k = values(rng, "bf16", (2, 3, 37, 64))
    k_t = MemoryDesc((2, 3, 64, 37), "bf16", (3 * 37 * 64, 37 * 64, 1, 64))
    desc = MatmulDesc(MemoryDesc(q.shape, "bf16"), k_t, MemoryDesc((2, 3, 37, 37), dst_dtype), output_scale=0.125)
    got = await execute(engine, desc, {"src": q, "weights": np.swapaxes(k, -1, -2)})
    ref = _post_ops.scaled_reference((), matmul.reference(q, np.swapaxes(k, -1, -2)), output_scale=0.125)
    check_stored(got, ref, 1e-6 * 64, dst_dtype)


async def test_matmul_post_ops_on_a_bf16_dst(shaped_engine, rng):
    """relu, a sum reading the old bf16 dst, a broadcast f32 multiplier, output_scale: all exact
    on integer data, so the bf16 store must match bit for bit."""
    m, k, n = 33, 20, 40
    chain = relu_sum_mul((1, n))
    desc = MatmulDesc(MemoryDesc((m, k), "bf16"), MemoryDesc((k, n), "bf16"), MemoryDesc((m, n), "bf16"),
                      post_ops=chain, output_scale=0.5)
    a, w = ints(rng, (m, k), "bf16"), ints(rng, (k, n), "bf16")
    old = ints(rng, (m, n), "bf16")
    factor = rng.choice(np.array([0.25, 0.5, 1.0, 2.0], np.float32), (1, n))
    got = await execute(shaped_engine[0], desc, {"src": a, "weights": w, "post_op_2_src1": factor}, dst_init=old)
    ref = _post_ops.scaled_reference(desc.post_ops, matmul.reference(a, w), old_dst=old, operands={2: factor},
                                      output_scale=0.5)
    assert_bits_equal(got, _dtype_io.store_reference(ref, "bf16"))


async def test_matmul_of_integers_accumulates_exactly_below_2_pow_24(engine, rng):
    a = values(rng, "u8", (9, 30), 0, 256)
    w = values(rng, "s8", (30, 20), -128, 128)
    desc = MatmulDesc(MemoryDesc(a.shape, "u8"), MemoryDesc(w.shape, "s8"), MemoryDesc((9, 20), "s32"))
    got = await execute(engine, desc, {"src": a, "weights": w})
    np.testing.assert_array_equal(got, a.astype(np.int64) @ w.astype(np.int64))


# -- softmax ---------------------------------------------------------------------------------------

# dims, axis, src dtype, dst dtype, path on the CPU configuration
SOFTMAX_CASES = {
    "f32->bf16": ((4, 64), -1, "f32", "bf16", "v16"),
    "bf16->f32": ((4, 64), -1, "bf16", "f32", "v16"),
    "bf16->bf16": ((2, 3, 48), -1, "bf16", "bf16", "v16"),
    "f32->f16": ((3, 37), -1, "f32", "f16", "v1"),
    "f16->f16_axis1": ((2, 16, 5), 1, "f16", "f16", "v1"),
    "bf16->f16": ((5, 37), -1, "bf16", "f16", "v1"),
}


@pytest.mark.parametrize("alg", ["softmax", "logsoftmax"])
@pytest.mark.parametrize("case", list(SOFTMAX_CASES))
async def test_softmax_converts_storage(engine, rng, alg, case):
    dims, axis, src_dtype, dst_dtype, path = SOFTMAX_CASES[case]
    x = values(rng, src_dtype, dims, -5.0, 5.0)
    desc = SoftmaxDesc(alg, MemoryDesc(dims, src_dtype), MemoryDesc(dims, dst_dtype), axis=axis)
    assert softmax.generate(desc, CPU).impl.startswith(f"ocl:row:{path}")
    got = await execute(engine, desc, {"src": x})
    check_stored(got, softmax.reference(alg, x, axis=axis), tolerance.softmax(alg), dst_dtype)


@pytest.mark.parametrize("dims", [(4, 64), (4, 37)], ids=["vector", "scalar"])
async def test_softmax_in_place_on_bf16(engine, rng, dims):
    x = values(rng, "bf16", dims, -5.0, 5.0)
    got = await execute_in_place(engine, SoftmaxDesc("softmax", MemoryDesc(dims, "bf16")), x)
    check_stored(got, softmax.reference("softmax", x), tolerance.SOFTMAX, "bf16")


@pytest.mark.parametrize("dims", [(4, 64), (4, 37)], ids=["vector", "scalar"])
async def test_softmax_post_ops_read_a_bf16_dst(engine, rng, dims):
    operand = MemoryDesc((1, dims[1]))
    chain = (("sum", 1.0), ("binary", "add", operand))
    desc = SoftmaxDesc("softmax", MemoryDesc(dims, "bf16"), MemoryDesc(dims, "bf16"), post_ops=chain,
                       output_scale=2.0)
    x, old = values(rng, "bf16", dims, -5.0, 5.0), values(rng, "bf16", dims)
    b = values(rng, "f32", operand.dims)
    got = await execute(engine, desc, {"src": x, "post_op_1_src1": b}, dst_init=old)
    ref = softmax.reference("softmax", x, output_scale=2.0, post_ops=desc.post_ops, old_dst=old, operands={1: b})
    check_stored(got, ref, 2 * tolerance.SOFTMAX, "bf16")


# -- reduction -------------------------------------------------------------------------------------

# alg, src dims, dst dims, src dtype, dst dtype, value range
REDUCTION_CASES = [
    ("sum", (6, 40), (6, 1), "bf16", "f32", (-2, 2)),
    ("mean", (4, 5, 33), (1, 5, 1), "f16", "f16", (-2, 2)),
    ("max", (6, 40), (1, 40), "bf16", "bf16", (-2, 2)),
    ("l2", (3, 50), (3, 1), "bf16", "bf16", (-2, 2)),
    ("mul", (5, 8), (5, 1), "f16", "f32", (0.5, 1.5)),
    ("sum", (7, 30), (7, 1), "s8", "s32", (-128, 128)),
    ("min", (4, 9), (4, 1), "u8", "u8", (0, 256)),
]


@pytest.mark.parametrize(
    "alg, src_dims, dst_dims, src_dtype, dst_dtype, bounds", REDUCTION_CASES,
    ids=[f"{c[0]}:{c[3]}->{c[4]}" for c in REDUCTION_CASES],
)
async def test_reduction_converts_storage(engine, rng, alg, src_dims, dst_dims, src_dtype, dst_dtype, bounds):
    x = values(rng, src_dtype, src_dims, *bounds)
    desc = ReductionDesc(alg, MemoryDesc(src_dims, src_dtype), MemoryDesc(dst_dims, dst_dtype))
    got = await execute(engine, desc, {"src": x})
    count = int(np.prod(src_dims)) // int(np.prod(dst_dims))
    check_stored(got, reduction.reference(alg, x, dst_dims), tolerance.reduction(alg, count), dst_dtype)


async def test_reduction_counts_a_boolean_mask(engine, rng):
    mask = values(rng, "boolean", (3, 4, 50))
    desc = ReductionDesc("sum", MemoryDesc(mask.shape, "boolean"), MemoryDesc((3, 1, 1), "s32"))
    got = await execute(engine, desc, {"src": mask})
    np.testing.assert_array_equal(got, mask.sum(axis=(1, 2), keepdims=True))


# -- layer and RMS normalization -------------------------------------------------------------------


@dtype_pairs(FLOAT_PAIRS)
async def test_layer_norm_converts_storage(engine, rng, src_dtype, dst_dtype):
    """src and dst of any type; scale, shift and the mean/variance outputs stay f32."""
    dims = (6, 48)
    x = values(rng, src_dtype, dims)
    scale, shift = values(rng, "f32", (48,), 0.5, 1.5), values(rng, "f32", (48,))
    desc = LayerNormDesc(MemoryDesc(dims, src_dtype), MemoryDesc(dims, dst_dtype), scale=MemoryDesc((48,)),
                         shift=MemoryDesc((48,)), mean=MemoryDesc((6,)), variance=MemoryDesc((6,)))
    got = await execute(engine, desc, {"src": x, "scale": scale, "shift": shift}, outputs=("dst", "mean", "variance"))
    ref, mean, variance = normalization.layer_reference(x, scale=scale, shift=shift)
    check_stored(got["dst"], ref, tolerance.normalization("layer_normalization"), dst_dtype)
    tolerance.check(got["mean"], mean, normalization.STATS)
    tolerance.check(got["variance"], variance, normalization.STATS)


@dtype_pairs(FLOAT_PAIRS)
async def test_rms_norm_converts_storage(engine, rng, src_dtype, dst_dtype):
    dims = (3, 5, 40)
    x = values(rng, src_dtype, dims)
    scale = values(rng, "f32", (40,), 0.5, 1.5)
    desc = RMSNormDesc(MemoryDesc(dims, src_dtype), MemoryDesc(dims, dst_dtype), scale=MemoryDesc((40,)))
    got = await execute(engine, desc, {"src": x, "scale": scale})
    check_stored(got, normalization.rms_reference(x, scale=scale), tolerance.normalization("rms_normalization"),
                 dst_dtype)


async def test_layer_norm_in_place_on_bf16_with_a_sum_post_op(engine, rng):
    """In place, the sum post-op reads src's bf16 value right before that element is written."""
    x = values(rng, "bf16", (4, 40))
    got = await execute_in_place(engine, LayerNormDesc(MemoryDesc(x.shape, "bf16"), post_ops=(("sum", 1.0),)), x)
    ref, _, _ = normalization.layer_reference(x, post_ops=(("sum", 1.0),), old_dst=x)
    check_stored(got, ref, 2 * tolerance.normalization("layer_normalization"), "bf16")


# -- pooling, batch and group normalization --------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bf16", "f16", "s8"])
async def test_max_pooling_of_one_type_is_exact(engine, rng, dtype):
    x = values(rng, dtype, (2, 3, 9, 9), -100, 100)
    geo = dict(kernel=3, strides=2, padding_l=1)
    desc = PoolingDesc("max", MemoryDesc(x.shape, dtype), MemoryDesc((2, 3, 5, 5), dtype), **geo)
    got = await execute(engine, desc, {"src": x})
    assert_bits_equal(got, pooling.reference("max", x, dst_dtype=dtype, **geo))


@pytest.mark.parametrize("alg", ["avg_exclude_padding", "avg_include_padding"])
@dtype_pairs(FLOAT_PAIRS)
async def test_average_pooling_converts_storage(engine, rng, alg, src_dtype, dst_dtype):
    x = values(rng, src_dtype, (1, 4, 10, 10))
    geo = dict(kernel=3, strides=1, padding_l=1)
    desc = PoolingDesc(alg, MemoryDesc(x.shape, src_dtype, "nhwc"), MemoryDesc((1, 4, 10, 10), dst_dtype), **geo)
    got = await execute(engine, desc, {"src": x})
    check_stored(got, pooling.reference(alg, x, **geo), tolerance.pooling(alg, 9), dst_dtype)


@pytest.mark.parametrize("src_dtype, dst_dtype, layout", [("bf16", "bf16", "nchw"), ("f16", "f32", "nhwc")])
async def test_batch_norm_converts_storage(engine, rng, src_dtype, dst_dtype, layout):
    dims = (2, 5, 4, 4)
    x = values(rng, src_dtype, dims)
    mean, variance = values(rng, "f32", (5,), -0.5, 0.5), values(rng, "f32", (5,), 0.5, 2.0)
    scale, shift = values(rng, "f32", (5,), 0.5, 1.5), values(rng, "f32", (5,))
    c = MemoryDesc((5,))
    desc = BatchNormInferenceDesc(MemoryDesc(dims, src_dtype, layout), c, c, MemoryDesc(dims, dst_dtype),
                                  scale=c, shift=c)
    got = await execute(engine, desc, {"src": x, "mean": mean, "variance": variance, "scale": scale, "shift": shift})
    ref = normalization.batch_reference(x, mean, variance, scale=scale, shift=shift)
    check_stored(got, ref, tolerance.normalization("batch_normalization"), dst_dtype)


@dtype_pairs(FLOAT_PAIRS)
async def test_group_norm_converts_storage(engine, rng, src_dtype, dst_dtype):
    dims = (2, 6, 3, 5)
    x = values(rng, src_dtype, dims)
    scale, shift = values(rng, "f32", (6,), 0.5, 1.5), values(rng, "f32", (6,))
    desc = GroupNormDesc(MemoryDesc(dims, src_dtype), 3, MemoryDesc(dims, dst_dtype),
                         scale=MemoryDesc((6,)), shift=MemoryDesc((6,)))
    got = await execute(engine, desc, {"src": x, "scale": scale, "shift": shift})
    ref = normalization.group_reference(x, 3, scale=scale, shift=shift)
    check_stored(got, ref, tolerance.normalization("group_normalization"), dst_dtype)


# -- convolution -----------------------------------------------------------------------------------

# src dims, weights dims, geometry, (src, weights, bias, dst) data types, src layout, CPU path
CONV_CASES = {
    "per_position": ((1, 2, 5, 5), (3, 2, 3, 3), {}, ("bf16", "bf16", "bf16", "f32"), "nchw", "direct:oc"),
    "nhwc": ((2, 4, 7, 6), (5, 4, 3, 3), dict(padding_l=1), ("f16", "bf16", None, "f16"), "nhwc", "direct:oc"),
    "row_vector": ((2, 4, 20, 20), (8, 4, 3, 3), dict(padding_l=1), ("bf16", "bf16", "f32", "bf16"), "nchw",
                   "direct:row16"),
    # Three rows: one block of three output rows per work-item (h3). At 18 rows the f16 kernel took
    # eight (h8), 47 kB of source that PoCL compiled in ~30 s; the last row block shifted up is
    # dtype-blind index code, which test_post_ops_kinds.py's "row16-four-rows" checks on f32.
    "depthwise": ((1, 6, 3, 18), (6, 1, 3, 3), dict(padding_l=1, groups=6), ("f16", "f16", None, "f16"), "nchw",
                  "direct:row16"),
    "strided_1d": ((2, 3, 40), (4, 3, 5), dict(strides=2, dilation=2, padding_l=3), ("bf16", "f32", None, "bf16"),
                   "ncw", "direct:oc"),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
async def test_convolution_of_small_integers_is_exact(shaped_engine, rng, case):
    src_dims, wei_dims, geo, (st, wt, bt, dt), layout, path = CONV_CASES[case]
    x, w = ints(rng, src_dims, st), ints(rng, wei_dims, wt)
    bias = None if bt is None else ints(rng, (wei_dims[0],), bt)
    shape = ConvolutionDesc(MemoryDesc(src_dims), MemoryDesc(wei_dims), **geo).dst.dims
    desc = ConvolutionDesc(
        MemoryDesc(src_dims, st, layout), MemoryDesc(wei_dims, wt), MemoryDesc(shape, dt),
        None if bias is None else MemoryDesc(bias.shape, bt), **geo,
    )
    assert convolution.generate(desc, CPU).impl.startswith(f"ocl:{path}")
    arrays = {"src": x, "weights": w} | ({} if bias is None else {"bias": bias})
    engine, config = shaped_engine
    primitive = await engine.create_primitive(desc)
    assert primitive.impl == convolution.generate(desc, config).impl
    got = await execute(engine, desc, arrays, primitive=primitive)
    ref = convolution.reference(x, w, bias, groups=desc.groups, strides=desc.strides, padding_l=desc.padding_l,
                                dilation=desc.dilation, dst_dtype=dt)
    assert_bits_equal(got, ref)


async def test_convolution_row_vector_post_ops_on_a_bf16_dst(engine, rng):
    """Row-vector path with a shifted last block (20 outputs: 16 + 4): the sum post-op reads the
    old bf16 dst lane by lane; a per-channel f32 multiplier; exact on integers."""
    x, w = ints(rng, (1, 3, 6, 20), "bf16"), ints(rng, (4, 3, 3, 3), "bf16")
    factor = rng.choice(np.array([0.5, 1.0, 2.0], np.float32), (1, 4, 1, 1))
    chain = (("sum", 0.5), ("binary", "mul", MemoryDesc(factor.shape)))
    desc = ConvolutionDesc(MemoryDesc(x.shape, "bf16"), MemoryDesc(w.shape, "bf16"), MemoryDesc((1, 4, 6, 20), "bf16"),
                           padding_l=1, post_ops=chain)
    assert convolution.generate(desc, CPU).impl.startswith("ocl:direct:row16")
    old = ints(rng, (1, 4, 6, 20), "bf16")
    got = await execute(engine, desc, {"src": x, "weights": w, "post_op_1_src1": factor}, dst_init=old)
    ref = convolution.reference(x, w, padding_l=(1, 1), post_ops=desc.post_ops, old_dst=old, operands={1: factor},
                                dst_dtype="bf16")
    assert_bits_equal(got, ref)


async def test_convolution_of_random_bf16_into_f32(engine, rng):
    x = values(rng, "bf16", (1, 16, 9, 20))
    w = values(rng, "bf16", (8, 16, 3, 3))
    desc = ConvolutionDesc(MemoryDesc(x.shape, "bf16"), MemoryDesc(w.shape, "bf16"), MemoryDesc((1, 8, 9, 20)),
                           padding_l=1)
    got = await execute(engine, desc, {"src": x, "weights": w})
    check_stored(got, convolution.reference(x, w, padding_l=(1, 1)), 1e-6 * 16 * 9, "f32")


# -- reorder's boolean -----------------------------------------------------------------------------


@dtype_pairs([("f32", "boolean"), ("boolean", "f32"), ("boolean", "bf16"), ("boolean", "boolean"), ("s8", "boolean")])
async def test_reorder_of_boolean_across_layouts(engine, rng, src_dtype, dst_dtype):
    dims = (3, 5, 7)
    x = values(rng, src_dtype, dims, -2, 3)
    if src_dtype == "f32":
        x[0, 0, :3] = [np.nan, -0.0, 0.0]  # NaN is true, both zeros false
    desc = ReorderDesc(MemoryDesc(dims, src_dtype, "acb"), MemoryDesc(dims, dst_dtype, "cba"))
    got = await execute(engine, desc, {"src": x})
    expected = reorder.reference(x, src_dtype, dst_dtype)
    assert expected.dtype == _dtype_io.USER_NUMPY[dst_dtype]
    assert_bits_equal(got, expected)


async def test_reorder_reads_any_nonzero_boolean_byte_as_true(engine):
    odd = np.array([0, 2, 255, 1, 0, 128], np.uint8).view(np.bool_)
    md = MemoryDesc((6,), "boolean")
    src = engine.memory(md)
    await src.write(odd)
    for dst_dtype, expected in (("u8", [0, 1, 1, 1, 0, 1]), ("f32", [0.0, 1.0, 1.0, 1.0, 0.0, 1.0])):
        desc = ReorderDesc(md, MemoryDesc((6,), dst_dtype, (2,)))  # strided: the convert path
        primitive = await engine.create_primitive(desc)
        dst = engine.memory(desc.dst)
        await (await engine.stream()).execute(primitive, {"src": src, "dst": dst})
        np.testing.assert_array_equal(await dst.to_numpy(), expected)


# -- refused -------------------------------------------------------------------------------------


def md(dims, dtype="f32"):
    return MemoryDesc(dims, dtype)


UNSUPPORTED = {
    "layer_scale": (lambda: LayerNormDesc(md((3, 4), "bf16"), scale=md((4,), "bf16")), "scale has dtype 'bf16'"),
    "layer_shift": (lambda: LayerNormDesc(md((3, 4)), shift=md((4,), "f16")), "shift has dtype 'f16'"),
    "layer_mean": (lambda: LayerNormDesc(md((3, 4), "bf16"), mean=md((3,), "bf16")), "mean has dtype 'bf16'"),
    "layer_variance": (lambda: LayerNormDesc(md((3, 4), "f16"), variance=md((3,), "f16")),
                       "variance has dtype 'f16'"),
    "rms_scale": (lambda: RMSNormDesc(md((3, 4), "f16"), scale=md((4,), "f16")), "scale has dtype 'f16'"),
    "batch_mean": (lambda: BatchNormInferenceDesc(md((2, 4, 3), "bf16"), md((4,), "bf16"), md((4,))),
                   "mean has dtype 'bf16'"),
    "batch_variance": (lambda: BatchNormInferenceDesc(md((2, 4, 3)), md((4,)), md((4,), "s8")),
                       "variance has dtype 's8'"),
    "group_shift": (lambda: GroupNormDesc(md((2, 4, 3), "bf16"), 2, shift=md((4,), "bf16")),
                    "shift has dtype 'bf16'"),
    "matmul_operand": (lambda: MatmulDesc(md((4, 8), "bf16"), md((8, 5), "bf16"), md((4, 5)),
                                          post_ops=(("binary", "add", md((1, 5), "bf16")),)),
                       r"post_ops\[0\] binary operand post_op_0_src1 has dtype 'bf16'"),
    "softmax_operand": (lambda: SoftmaxDesc("softmax", md((4, 8)), md((4, 8), "bf16"),
                                            post_ops=(("binary", "mul", md((4, 8), "f16")),)),
                        "post_op_0_src1 has dtype 'f16'"),
    "convolution_operand": (lambda: ConvolutionDesc(md((1, 2, 5, 5), "bf16"), md((3, 2, 3, 3), "bf16"),
                                                    post_ops=(("sum",), ("binary", "add", md((1, 3, 1, 1), "bf16")))),
                            "post_op_1_src1 has dtype 'bf16'"),
    "layer_operand": (lambda: LayerNormDesc(md((3, 4), "bf16"), post_ops=(("binary", "add", md((4,), "u8")),)),
                      "post_op_0_src1 has dtype 'u8'"),
}


@pytest.mark.parametrize("case", list(UNSUPPORTED))
async def test_unsupported_data_types_are_refused_and_cache_nothing(engine, case):
    make, culprit = UNSUPPORTED[case]
    desc = make()
    await assert_refused_caching_nothing(engine, desc, culprit)
    with pytest.raises(triodnn.UnsupportedError, match=culprit):
        triodnn.kernels.generate(desc, CPU)


# -- generation (pure) -----------------------------------------------------------------------------


def descriptors(src: str, dst: str) -> list:
    """One descriptor per kind, src and dst (and weights, bias) of the given types."""
    s4, d4 = MemoryDesc((2, 3, 17, 18), src), MemoryDesc((2, 3, 17, 18), dst)
    c = MemoryDesc((3,))
    return [
        MatmulDesc(MemoryDesc((2, 17, 9), src), MemoryDesc((9, 33), src), MemoryDesc((2, 17, 33), dst),
                   MemoryDesc((33,), src), post_ops=(("sum", 0.5),)),
        SoftmaxDesc("softmax", MemoryDesc((3, 32), src), MemoryDesc((3, 32), dst), post_ops=(("sum", 1.0),)),
        SoftmaxDesc("logsoftmax", MemoryDesc((3, 33), src), MemoryDesc((3, 33), dst)),
        ReductionDesc("mean", s4, MemoryDesc((2, 1, 17, 1), dst)),
        PoolingDesc("avg_exclude_padding", s4, kernel=3, strides=2, padding_l=1),
        PoolingDesc("max", s4, MemoryDesc((2, 3, 9, 9), dst), kernel=3, strides=2, padding_l=1),
        LayerNormDesc(s4, d4, scale=MemoryDesc((18,)), mean=MemoryDesc((2, 3, 17)), post_ops=(("sum", 1.0),)),
        RMSNormDesc(s4, d4, scale=MemoryDesc((18,))),
        BatchNormInferenceDesc(s4, c, c, d4, post_ops=(("sum", 1.0),)),
        GroupNormDesc(s4, 3, d4, shift=c, post_ops=(("sum", 1.0),)),
        ConvolutionDesc(s4, MemoryDesc((4, 3, 3, 3), src), MemoryDesc((2, 4, 15, 16), dst), MemoryDesc((4,), src),
                        post_ops=(("sum", 1.0),)),
        ConvolutionDesc(MemoryDesc((1, 2, 5, 5), src), MemoryDesc((3, 2, 3, 3), src), MemoryDesc((1, 3, 3, 3), dst)),
        ReorderDesc(s4, MemoryDesc((2, 3, 17, 18), dst, "nhwc")),
    ]


def test_every_storage_type_generates_for_each_kind():
    """All pairs generate, on both configurations (the device tests above run a sample)."""
    for src in _dtype_io.DTYPES:
        for dst in _dtype_io.DTYPES:
            for desc in descriptors(src, dst):
                desc.check_supported()
                for config in (CPU, GPU):
                    source = triodnn.kernels.generate(desc, config).source
                    if desc.dst.dtype == "bf16" and desc.src.dtype != "bf16":
                        assert "store_bf16(" in source, desc


def test_all_f32_kernels_have_no_conversion_helpers():
    """The all-f32 kernels are the plain ones: no load_/store_ helpers, no half built-ins."""
    for desc in descriptors("f32", "f32"):
        for config in (CPU, GPU):
            source = triodnn.kernels.generate(desc, config).source
            for helper in ("load_", "store_", "vload_half", "vstore_half", "ushort"):
                assert helper not in source, (desc.kind, helper)
