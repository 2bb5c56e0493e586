"""Softmax and layer/RMS normalization shaped for a GPU (vector width 1, work-groups up to 256), run
on whatever device the default engine has (PoCL's CPU device here), against the numpy references.

On the GPU configuration rows of 32 or more elements take one work-group each (``ocl:wg_row:l{L}``,
L from 32 to 256 as the row needs): work-items stride over the row, partial max/sums meet in a
local-memory tree with barriers; rows of at most 32 elements per work-item stay in registers
(``r{n}`` in the impl), longer ones are re-read each pass. Shorter rows, and strided axes over
thousands of side-by-side rows, keep one work-item per row (``ocl:row:v1``). The engine's
configuration is a private field, set here as tests/primitives/test_dtypes_more.py does; it is part of the
primitive cache key, so these primitives never share an entry with the device's own.

The accuracy tests hold a row of one dominant element and many tiny terms: each ``exp`` of the
rest, just under half an ulp of the running sum, vanished from a plain f32 sum (2e-5 relative on
a row of 384, measured on an H200), which benchdnn's 10 * eps softmax threshold does not allow.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from triodnn import LayerNormDesc, MemoryDesc, RMSNormDesc, SoftmaxDesc
from triodnn._values._dtypes import from_storage, to_storage
from triodnn.kernels import KernelConfig, _dtype_io, generate, normalization, select_config, softmax, tolerance

CPU = select_config("cpu", 4096)
GPU = select_config("gpu", 256)
SMALL_GROUPS = KernelConfig(vector_width=1, local_size=16)  # more work-items per row than 256 allows here

# ln(2**24 / 0.99): exp(-GAP) is just under half an ulp of 1, so a plain f32 sum starting at the
# dominant term's 1 drops every other term.
GAP = float(np.log(2.0**24 / 0.99))


@pytest.fixture
async def gpu_engine_shape(engine):
    """The default engine with the GPU configuration (its work-group size capped by the device's)."""
    engine._config = select_config("gpu", engine.info.max_work_group_size)
    assert engine._config == GPU
    return engine


def bf16(x: np.ndarray) -> np.ndarray:
    return from_storage(to_storage(np.asarray(x, np.float32), "bf16"), "bf16")


def threshold(base: float, chain: tuple) -> float:
    """The kind's threshold, or the loosest of the chain's eltwise post-ops where that is looser."""
    return max([base] + [tolerance.eltwise(op[1]) for op in chain if op[0] == "eltwise"])


async def execute(engine, desc, arrays: dict, dst_init=None, outputs=("dst",)):
    """Run ``desc``; returns (primitive, {output name: array})."""
    primitive = await engine.create_primitive(desc)
    memories = {}
    for name, md in desc.arg_descs.items():
        if name in arrays:
            memories[name] = await engine.from_numpy(arrays[name], md)
        elif name == "dst" and dst_init is not None:
            memories[name] = await engine.from_numpy(dst_init, md)
        else:
            memories[name] = engine.memory(md)
            if md.dtype == "f32":  # NaN until the kernel writes it
                await memories[name].write(np.full(md.dims, np.nan, np.float32))
    await (await engine.stream()).execute(primitive, memories)
    return primitive, {name: await memories[name].to_numpy() for name in outputs}


def check_stored(got, ref_f32, base: float, dtype: str) -> None:
    tolerance.check(got, _dtype_io.store_reference(ref_f32, dtype), base + _dtype_io.EPSILON[dtype])


# -- softmax ---------------------------------------------------------------------------------------

# name: (dims, axis, src strides, dst strides, impl on the GPU configuration). Three rows where
# test_softmax_keeps_tiny_terms runs the same row length on the GPU configuration (its
# ``dominated_rows``), so the two tests share those programs: 384, 4096 and 9000 (10-18 s PoCL
# builds each with a cold cache) and 20.
SOFTMAX_CASES = {
    "last_384": ((3, 384), -1, None, None, "ocl:wg_row:l32r12"),
    "last_1000_tail": ((3, 1000), -1, None, None, "ocl:wg_row:l64r16"),  # the last slot past the end on some items
    "last_4096": ((3, 4096), -1, None, None, "ocl:wg_row:l256r16"),
    "last_8192": ((2, 8192), -1, None, None, "ocl:wg_row:l256r32"),  # the most elements held in registers
    "last_9000_streamed": ((3, 9000), -1, None, None, "ocl:wg_row:l256"),
    "middle": ((2, 40, 3), 1, None, None, "ocl:wg_row:l32r2"),
    "first": ((300, 3), 0, None, None, "ocl:wg_row:l32r10"),
    "strided": ((6, 100), -1, (1, 8), (104, 1), "ocl:wg_row:l32r4"),
    "nhwc_channels": ((2, 48, 3, 5), 1, "acdb", None, "ocl:wg_row:l32r2"),
    "short_row": ((3, 20), -1, None, None, "ocl:row:v1l256"),
}


# Both algorithms where the generated code differs by algorithm: a row held in registers
# (last_384) and the one-work-item row (short_row); test_softmax_with_small_work_groups has both on
# a streamed row. The other cases vary the work-group size, elements per work-item and strides,
# which the generator writes the same way for either algorithm: one each, in turn (each work-group
# kernel is a 5-18 s PoCL build on a cold cache).
SOFTMAX_RUNS = [(case, alg) for i, case in enumerate(SOFTMAX_CASES) for alg in softmax.ALGORITHMS
                if case in ("last_384", "short_row") or alg == softmax.ALGORITHMS[i % 2]]


@pytest.mark.parametrize("case, alg", SOFTMAX_RUNS)
async def test_softmax(gpu_engine_shape, rng, case, alg):
    dims, axis, s, d, impl = SOFTMAX_CASES[case]
    desc = SoftmaxDesc(alg, MemoryDesc(dims, "f32", s), MemoryDesc(dims, "f32", d), axis=axis)
    x = rng.uniform(-20.0, 20.0, dims).astype(np.float32)
    primitive, got = await execute(gpu_engine_shape, desc, {"src": x})
    assert primitive.impl == impl
    tolerance.check(got["dst"], softmax.reference(alg, x, axis=axis), tolerance.softmax(alg))


@pytest.mark.parametrize("alg", softmax.ALGORITHMS)
@pytest.mark.parametrize("dims", [(3, 100), (2, 600)], ids=["cached", "streamed"])
async def test_softmax_with_small_work_groups(engine, rng, alg, dims):
    """Work-groups of 16: 7 (38) elements per work-item, a four-level tree."""
    engine._config = SMALL_GROUPS
    x = rng.uniform(-20.0, 20.0, dims).astype(np.float32)
    primitive, got = await execute(engine, SoftmaxDesc(alg, MemoryDesc(dims)), {"src": x})
    assert primitive.impl == ("ocl:wg_row:l16r7" if dims[1] == 100 else "ocl:wg_row:l16")
    tolerance.check(got["dst"], softmax.reference(alg, x), tolerance.softmax(alg))


@pytest.mark.parametrize(
    "alg, dims, axis, dst_dtype",
    [("softmax", (4, 384), -1, "f32"), ("logsoftmax", (4, 384), -1, "bf16"), ("softmax", (3, 40, 2), 1, "bf16"),
     ("softmax", (2, 9000), -1, "f32"), ("logsoftmax", (2, 9000), -1, "f16")],
    ids=["cached", "cached_bf16", "middle_bf16", "streamed", "streamed_f16"],
)
async def test_softmax_post_ops(gpu_engine_shape, rng, alg, dims, axis, dst_dtype):
    """output_scale, a binary operand along the row, a sum reading the old dst, an eltwise."""
    along = tuple(v if i == axis % len(dims) else 1 for i, v in enumerate(dims))
    chain = (("binary", "add", MemoryDesc(along)), ("sum", 0.5), ("eltwise", "tanh"))
    desc = SoftmaxDesc(alg, MemoryDesc(dims), MemoryDesc(dims, dst_dtype), axis=axis, post_ops=chain,
                       output_scale=1.5)
    x = rng.uniform(-8.0, 8.0, dims).astype(np.float32)
    b = rng.standard_normal(along).astype(np.float32)
    old = _dtype_io.store_reference(rng.standard_normal(dims).astype(np.float32), dst_dtype)
    primitive, got = await execute(gpu_engine_shape, desc, {"src": x, "post_op_0_src1": b}, dst_init=old)
    assert primitive.impl.startswith("ocl:wg_row:")
    ref = softmax.reference(alg, x, axis=axis, output_scale=1.5, post_ops=desc.post_ops, old_dst=old, operands={0: b})
    check_stored(got["dst"], ref, 2 * threshold(tolerance.softmax(alg), chain), dst_dtype)


# The row held in registers and the streamed row, one storage type each: the type changes the
# loads and stores only, not the order of reads and writes this checks.
@pytest.mark.parametrize("dims, dtype", [((4, 384), "f32"), ((2, 9000), "bf16")], ids=["cached-f32", "streamed-bf16"])
async def test_softmax_in_place_sum_adds_src(gpu_engine_shape, rng, dims, dtype):
    """In place, each work-item reads its own elements before writing them: the sum adds src."""
    md = MemoryDesc(dims, dtype)
    desc = SoftmaxDesc("softmax", md, post_ops=(("sum", 1.0),))
    x = rng.uniform(-5.0, 5.0, dims).astype(np.float32)
    x = bf16(x) if dtype == "bf16" else x
    primitive = await gpu_engine_shape.create_primitive(desc)
    assert primitive.impl.startswith("ocl:wg_row:")
    mem = await gpu_engine_shape.from_numpy(x, md)
    await (await gpu_engine_shape.stream()).execute(primitive, {"src": mem, "dst": mem})
    ref = softmax.reference("softmax", x, post_ops=desc.post_ops, old_dst=x)
    check_stored(await mem.to_numpy(), ref, 2 * tolerance.SOFTMAX, dtype)


# -- accuracy --------------------------------------------------------------------------------------


def dominated_rows(n: int, gap: float) -> np.ndarray:
    """Rows of zeros but one element ``gap`` above the rest: first, in the middle, last."""
    x = np.zeros((3, n), np.float32)
    x[0, 0] = x[1, n // 2 + 1] = x[2, n - 1] = gap
    return x


# Both algorithms everywhere but on the GPU's 4096 and 9000 rows, where softmax alone: logsoftmax
# sums the same exp(x - m) through the same tree there (the 384 row checks it on the GPU), and
# each of those work-group kernels is a 10-18 s PoCL build on a cold cache.
TINY_RUNS = [(shape, n, alg) for shape in ("gpu", "device") for n in (20, 384, 4096, 9000) for alg in softmax.ALGORITHMS
             if not (shape == "gpu" and n >= 4096 and alg == "logsoftmax")]


@pytest.mark.parametrize("gap", [30.0, GAP], ids=["gap30", "gap_half_ulp"])
@pytest.mark.parametrize("shape, n, alg", TINY_RUNS)
async def test_softmax_keeps_tiny_terms(engine, n, gap, alg, shape):
    """One element far above the rest: its softmax, 1 / (1 + (n - 1) * exp(-gap)), within 10 eps.
    With the gap just above ln(2**24) every other term is below half an ulp of 1; a plain sum lost
    them all (1.9e-5 on 384, 2.4e-4 on 4096 on the GPU row path; 1.5e-5 on the CPU's float16 lanes
    at 4096). Both configurations: the GPU's work-group and short-row paths, the device's own."""
    if shape == "gpu":
        engine._config = GPU
    x = dominated_rows(n, gap)
    primitive, got = await execute(engine, SoftmaxDesc(alg, MemoryDesc(x.shape)), {"src": x})
    if shape == "gpu":
        assert primitive.impl.startswith("ocl:row:v1" if n < 32 else "ocl:wg_row:")
    tolerance.check(got["dst"], softmax.reference(alg, x), tolerance.softmax(alg))


# -- layer and RMS normalization -------------------------------------------------------------------


def norm_data(rng, dims, offset: float = 3.0) -> np.ndarray:
    return (rng.uniform(-2.0, 2.0, dims) + offset).astype(np.float32)


# name: (dims, axis, src layout, dst layout, impl on the GPU configuration)
LNORM_CASES = {
    "last_1024": ((3, 4, 1024), -1, None, None, "ocl:wg_row:l64r16"),
    "last_383_tail": ((5, 383), -1, None, None, "ocl:wg_row:l32r12"),
    "last_8192": ((2, 8192), -1, None, None, "ocl:wg_row:l256r32"),
    "streamed": ((2, 9000), -1, None, None, "ocl:wg_row:l256"),
    "middle": ((3, 50, 4), 1, None, "acb", "ocl:wg_row:l32r2"),
    "tnc_to_ntc": ((40, 3, 2), 0, "bac", None, "ocl:wg_row:l32r2"),
    "strided": ((6, 100), -1, (128, 1), (1, 6), "ocl:wg_row:l32r4"),
    "short_row": ((4, 20), -1, None, None, "ocl:row:v1l256"),
}


@pytest.mark.parametrize("case", list(LNORM_CASES))
async def test_layer_norm(gpu_engine_shape, rng, case):
    """scale, shift, and the mean and variance outputs."""
    dims, axis, s, d, impl = LNORM_CASES[case]
    c = dims[axis]
    stat_dims = tuple(v for i, v in enumerate(dims) if i != axis % len(dims))
    desc = LayerNormDesc(MemoryDesc(dims, "f32", s), MemoryDesc(dims, "f32", d), axis=axis, epsilon=1e-4,
                         scale=MemoryDesc((c,)), shift=MemoryDesc((c,)), mean=MemoryDesc(stat_dims),
                         variance=MemoryDesc(stat_dims))
    x = norm_data(rng, dims)
    scale = rng.uniform(0.5, 1.5, c).astype(np.float32)
    shift = rng.uniform(-1.0, 1.0, c).astype(np.float32)
    primitive, got = await execute(gpu_engine_shape, desc, {"src": x, "scale": scale, "shift": shift},
                                   outputs=("dst", "mean", "variance"))
    assert primitive.impl == impl
    ref, mean, variance = normalization.layer_reference(x, axis=axis, epsilon=1e-4, scale=scale, shift=shift)
    tolerance.check(got["dst"], ref, tolerance.normalization("layer_normalization"))
    tolerance.check(got["mean"], mean, normalization.STATS)
    tolerance.check(got["variance"], variance, normalization.STATS)


@pytest.mark.parametrize("dims", [(4, 384), (2, 9000)], ids=["cached", "streamed"])
async def test_layer_norm_post_ops_into_bf16(gpu_engine_shape, rng, dims):
    """bf16 src and dst, output_scale, a per-row multiplier, a sum reading the old bf16 dst, an
    eltwise; the statistics stay f32."""
    per_row = (dims[0], 1)
    chain = (("binary", "mul", MemoryDesc(per_row)), ("sum", 0.5), ("eltwise", "gelu_erf"))
    rows = (dims[0],)
    desc = LayerNormDesc(MemoryDesc(dims, "bf16"), MemoryDesc(dims, "bf16"), scale=MemoryDesc((dims[1],)),
                         mean=MemoryDesc(rows), variance=MemoryDesc(rows), post_ops=chain, output_scale=0.75)
    x = bf16(norm_data(rng, dims, 1.0))
    scale = rng.uniform(0.5, 1.5, dims[1]).astype(np.float32)
    factor = rng.uniform(0.5, 2.0, per_row).astype(np.float32)
    old = bf16(rng.standard_normal(dims))
    primitive, got = await execute(
        gpu_engine_shape, desc, {"src": x, "scale": scale, "post_op_0_src1": factor}, dst_init=old,
        outputs=("dst", "mean", "variance"),
    )
    assert primitive.impl.startswith("ocl:wg_row:")
    ref, mean, variance = normalization.layer_reference(x, scale=scale, output_scale=0.75, post_ops=desc.post_ops,
                                                        old_dst=old, operands={0: factor})
    check_stored(got["dst"], ref, 2 * threshold(tolerance.normalization("layer_normalization"), chain), "bf16")
    tolerance.check(got["mean"], mean, normalization.STATS)
    tolerance.check(got["variance"], variance, normalization.STATS)


@pytest.mark.parametrize("dims", [(4, 384), (2, 9000)], ids=["cached", "streamed"])
async def test_layer_norm_in_place_sum_adds_src(gpu_engine_shape, rng, dims):
    md = MemoryDesc(dims)
    desc = LayerNormDesc(md, post_ops=(("sum", 1.0),), output_scale=0.5)
    x = norm_data(rng, dims)
    primitive = await gpu_engine_shape.create_primitive(desc)
    assert primitive.impl.startswith("ocl:wg_row:")
    mem = await gpu_engine_shape.from_numpy(x, md)
    await (await gpu_engine_shape.stream()).execute(primitive, {"src": mem, "dst": mem})
    ref, _, _ = normalization.layer_reference(x, output_scale=0.5, post_ops=desc.post_ops, old_dst=x)
    tolerance.check(await mem.to_numpy(), ref, 2 * tolerance.normalization("layer_normalization"))


async def test_layer_norm_with_small_work_groups(engine, rng):
    engine._config = SMALL_GROUPS
    dims = (3, 600)
    desc = LayerNormDesc(MemoryDesc(dims), mean=MemoryDesc((3,)), variance=MemoryDesc((3,)))
    x = norm_data(rng, dims)
    primitive, got = await execute(engine, desc, {"src": x}, outputs=("dst", "mean", "variance"))
    assert primitive.impl == "ocl:wg_row:l16"
    ref, mean, variance = normalization.layer_reference(x)
    tolerance.check(got["dst"], ref, tolerance.normalization("layer_normalization"))
    tolerance.check(got["mean"], mean, normalization.STATS)
    tolerance.check(got["variance"], variance, normalization.STATS)


# name: (dims, src dtype, dst dtype, post-ops, impl)
RMS_CASES = {
    "cached": ((3, 5, 1024), "f32", "f32", False, "ocl:wg_row:l64r16"),
    "cached_bf16": ((4, 384), "bf16", "bf16", False, "ocl:wg_row:l32r12"),
    "streamed": ((2, 9000), "f32", "f32", False, "ocl:wg_row:l256"),
    "post_ops": ((4, 130), "f32", "bf16", True, "ocl:wg_row:l32r5"),
    "short_row": ((6, 24), "f32", "f32", False, "ocl:row:v1l256"),
}


@pytest.mark.parametrize("case", list(RMS_CASES))
async def test_rms_norm(gpu_engine_shape, rng, case):
    dims, src_dtype, dst_dtype, with_post_ops, impl = RMS_CASES[case]
    c = dims[-1]
    chain = (("eltwise", "relu"), ("binary", "add", MemoryDesc((c,))), ("sum", -1.0)) if with_post_ops else ()
    desc = RMSNormDesc(MemoryDesc(dims, src_dtype), MemoryDesc(dims, dst_dtype), scale=MemoryDesc((c,)),
                       post_ops=chain, output_scale=2.0 if with_post_ops else 1.0)
    x = norm_data(rng, dims, 0.5)
    x = bf16(x) if src_dtype == "bf16" else x
    scale = rng.uniform(0.5, 1.5, c).astype(np.float32)
    arrays = {"src": x, "scale": scale}
    operands = {}
    if with_post_ops:
        operands = {1: rng.standard_normal((c,)).astype(np.float32)}
        arrays["post_op_1_src1"] = operands[1]
    old = _dtype_io.store_reference(rng.standard_normal(dims).astype(np.float32), dst_dtype)
    primitive, got = await execute(gpu_engine_shape, desc, arrays, dst_init=old)
    assert primitive.impl == impl
    ref = normalization.rms_reference(x, scale=scale, output_scale=desc.output_scale, post_ops=desc.post_ops,
                                      old_dst=old, operands=operands)
    base = tolerance.normalization("rms_normalization")
    check_stored(got["dst"], ref, 2 * base if with_post_ops else base, dst_dtype)


# -- which path (generation only) ------------------------------------------------------------------


def test_impl_names_the_path():
    def softmax_impl(dims, axis=-1, config=GPU, strides=None):
        return generate(SoftmaxDesc("softmax", MemoryDesc(dims, "f32", strides), axis=axis), config).impl

    def layer_impl(dims, config=GPU, rms=False):
        desc = RMSNormDesc(MemoryDesc(dims)) if rms else LayerNormDesc(MemoryDesc(dims))
        return generate(desc, config).impl

    # The benchmark shapes: softmax 4096x4096 and layer norm 8x384x1024 on the GPU configuration.
    assert softmax_impl((4096, 4096)) == "ocl:wg_row:l256r16"
    assert layer_impl((8, 384, 1024)) == "ocl:wg_row:l64r16"
    assert layer_impl((8, 384, 1024), rms=True) == "ocl:wg_row:l64r16"
    # Work-groups sized for up to 16 elements each, from 32 work-items to 256; rows past 32
    # elements per work-item are streamed.
    assert softmax_impl((36864, 384)) == "ocl:wg_row:l32r12"
    assert softmax_impl((2, 4097)) == "ocl:wg_row:l256r17"
    assert softmax_impl((2, 8192)) == "ocl:wg_row:l256r32"
    assert softmax_impl((2, 8193)) == "ocl:wg_row:l256"
    assert softmax_impl((8, 32)) == "ocl:wg_row:l32r1"
    assert softmax_impl((8, 31)) == "ocl:row:v1l256"
    assert layer_impl((8, 31)) == "ocl:row:v1l256"
    # A strided axis over many side-by-side rows: one work-item per row reads coalesced.
    assert softmax_impl((2, 40, 32768), axis=1) == "ocl:row:v1l256"
    assert softmax_impl((2, 40, 4096), axis=1) == "ocl:row:v1l256"
    assert softmax_impl((2, 40, 4095), axis=1) == "ocl:wg_row:l32r2"
    assert softmax_impl((8192, 40), axis=1) == "ocl:wg_row:l32r2"  # a contiguous axis: always
    # The CPU configuration never takes the work-group path.
    assert softmax_impl((4096, 4096), config=CPU) == "ocl:row:v16l16"
    assert softmax_impl((5, 37), config=CPU) == "ocl:row:v1l16"
    assert layer_impl((8, 384, 1024), config=CPU) == "ocl:row:v16l16"  # the float16 row path
    # The launch: one work-group per row.
    spec = generate(SoftmaxDesc("softmax", MemoryDesc((10, 4096))), GPU)
    assert spec.global_size == (10 * 256,) and spec.local_size == (256,)
    assert "barrier(CLK_LOCAL_MEM_FENCE)" in spec.source and "reqd_work_group_size(256, 1, 1)" in spec.source
    spec = generate(SoftmaxDesc("softmax", MemoryDesc((10, 384))), GPU)
    assert spec.global_size == (10 * 32,) and spec.local_size == (32,)


def test_local_memory_stays_within_two_arrays_of_the_work_group():
    """At most 2 x 256 floats of __local memory (2 KiB), whatever the row."""
    for desc in (SoftmaxDesc("logsoftmax", MemoryDesc((3, 90000))),
                 LayerNormDesc(MemoryDesc((3, 9000)), mean=MemoryDesc((3,))),
                 RMSNormDesc(MemoryDesc((3, 384)))):
        spec = generate(desc, select_config("gpu", 1024))
        sizes = [int(v) for v in re.findall(r"__local float \w+\[(\d+)\];", spec.source)]
        assert len(sizes) == 2 and all(v == spec.local_size[0] <= 256 for v in sizes), sizes


def test_all_f32_gpu_kernels_have_no_conversion_helpers():
    for desc in (SoftmaxDesc("softmax", MemoryDesc((3, 384)), post_ops=(("sum", 1.0),)),
                 LayerNormDesc(MemoryDesc((3, 384)), scale=MemoryDesc((384,)))):
        source = generate(desc, GPU).source
        for helper in ("load_", "store_", "vload_half", "ushort"):
            assert helper not in source


def test_post_op_operand_names_survive_the_work_group_path():
    chain = (("binary", "add", MemoryDesc((1, 384))),)
    desc = SoftmaxDesc("softmax", MemoryDesc((3, 384)), post_ops=chain, output_scale=2.0)
    spec = generate(desc, GPU)
    assert spec.arg_names == tuple(desc.arg_descs) == ("src", "post_op_0_src1", "dst")
