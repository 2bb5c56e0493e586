"""Fused scaled-dot-product attention (SdpaDesc) against the float64 reference.

Every case runs with the device's own configuration (PoCL: the CPU kernel, query rows as vector
lanes), and the cases that reach each part of the GPU generator again with the GPU configuration
forced on the engine (the split kernel: 16 work-items per query row, K/V tiles in local memory; the
one-row-per-work-item kernel for large heads and narrow work-groups has its own tests), so the
kernels are checked on a CPU-only machine. The configuration is part of the primitive cache key,
so the two never share an entry.

Values lie in [-2, 2]; results must match the reference within 1e-5 (relative above 1 in
magnitude, absolute below: ``tolerance.check``), plus one rounding step of dst's storage type.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import triodnn
from triodnn import ArgumentMismatchError, InvalidArgumentError, MemoryDesc, UnsupportedError
from triodnn._values._dtypes import from_storage, to_storage
from triodnn._values._sdpa_desc import SdpaDesc
from triodnn.kernels import _dtype_io, generate, sdpa, select_config, tolerance
from triodnn.kernels._spec import KernelConfig, dense_strides

THRESHOLD = 1e-5
CPU = select_config("cpu", 4096)
GPU = select_config("gpu", 256, 48 * 1024)  # NVIDIA H100's local_mem_size
NARROW = KernelConfig(vector_width=1, local_size=16)  # a GPU work-group smaller than a warp


def values(rng, shape, dtype: str = "f32") -> np.ndarray:
    """User-facing values of ``dtype`` in [-2, 2), exact in its storage."""
    x = rng.uniform(-2.0, 2.0, shape).astype(np.float32)
    if dtype == "f16":
        return x.astype(np.float16)
    return from_storage(to_storage(x, dtype), dtype)


def transposed_view(dims: tuple[int, ...], dtype: str = "f32") -> MemoryDesc:
    """(…, S, D) stored as its transpose (…, D, S): what a graph's transposed K looks like."""
    stored = dims[:-2] + (dims[-1], dims[-2])
    strides = list(dense_strides(stored))
    strides[-1], strides[-2] = strides[-2], strides[-1]
    return MemoryDesc(dims, dtype, tuple(strides))


async def run(engine, desc: SdpaDesc, arrays: dict, primitive=None) -> np.ndarray:
    """Execute ``desc`` on ``arrays`` (dst prefilled with NaN, so an unwritten element shows)."""
    primitive = primitive or await engine.create_primitive(desc)
    memories = {}
    for name, md in desc.arg_descs.items():
        if name == "dst":
            memories[name] = await engine.from_numpy(np.full(md.dims, np.nan, _dtype_io.USER_NUMPY[md.dtype]), md)
        else:
            memories[name] = await engine.from_numpy(arrays[name], md)
    await (await engine.stream()).execute(primitive, memories)
    return await memories["dst"].to_numpy()


def check(got: np.ndarray, ref: np.ndarray, dst_dtype: str = "f32") -> None:
    assert got.dtype == _dtype_io.USER_NUMPY[dst_dtype]
    tolerance.check(got, ref, THRESHOLD + _dtype_io.EPSILON[dst_dtype])


def configure(engine, config: str):
    """(engine, expected impl prefix): the engine's own configuration, or the GPU one forced."""
    if config == "forced_gpu_config":
        # GPU-shaped, within what the device offers (Oclgrind: the OpenCL minimum, 32 KiB)
        engine._config = attrs.evolve(GPU, local_memory=min(GPU.local_memory, engine._config.local_memory))
    vectors = engine._config.vector_width >= 16
    return engine, "ocl:sdpa:rowlanes" if vectors else "ocl:sdpa:flash"


@pytest.fixture(params=["device_config", "forced_gpu_config"])
async def shaped(request, engine):
    return configure(engine, request.param)


# name: query, key, value dims, mask dims, (scale, mode), causal, K passed transposed
CASES = {
    "plain": ((2, 3, 32, 64), (2, 3, 32, 64), (2, 3, 32, 64), None, (0.125, "multiply"), None, False),
    "no_scale": ((1, 2, 24, 16), (1, 2, 40, 16), (1, 2, 40, 16), None, None, None, False),
    "mask_broadcast_keys_only": ((2, 4, 40, 32), (2, 4, 40, 32), (2, 4, 40, 32), (2, 1, 1, 40), (8.0, "divide"), None, False),
    "mask_full": ((2, 3, 24, 16), (2, 3, 40, 16), (2, 3, 40, 16), (2, 3, 24, 40), (0.25, "multiply"), None, False),
    "mask_per_row": ((1, 2, 20, 16), (1, 2, 37, 16), (1, 2, 37, 16), (1, 1, 20, 1), (0.25, "multiply"), None, False),
    "mask_2d": ((2, 2, 17, 16), (2, 2, 33, 16), (2, 2, 33, 16), (17, 33), (4.0, "divide"), None, False),
    "causal_top_left": ((1, 2, 50, 32), (1, 2, 50, 32), (1, 2, 50, 32), None, (0.125, "multiply"), "top_left", False),
    "causal_bottom_right": ((1, 2, 20, 16), (1, 2, 53, 16), (1, 2, 53, 16), None, (0.25, "multiply"), "bottom_right", False),
    # Sq > Skv: the first Sq - Skv rows see no key at all and give 0 (inf_as_zero).
    "causal_bottom_right_short_kv": ((1, 2, 40, 16), (1, 2, 24, 16), (1, 2, 24, 16), None, (0.25, "multiply"),
                                     "bottom_right", False),
    "causal_with_mask": ((2, 2, 35, 16), (2, 2, 35, 16), (2, 2, 35, 16), (2, 1, 35, 35), (4.0, "divide"), "top_left", False),
    "sq_skv_d_dv_differ": ((2, 3, 7, 24), (2, 3, 33, 24), (2, 3, 33, 40), (2, 1, 1, 33), (0.2, "multiply"), None, False),
    "odd_sizes": ((3, 7, 5), (3, 33, 5), (3, 33, 3), None, (0.5, "multiply"), None, False),
    "short_kv": ((1, 1, 40, 8), (1, 1, 5, 8), (1, 1, 5, 12), None, (0.5, "multiply"), None, False),
    "gqa_heads_broadcast": ((1, 8, 17, 32), (1, 1, 17, 32), (1, 1, 17, 32), None, (0.125, "multiply"), None, False),
    "gqa_grouped": ((2, 2, 4, 20, 16), (2, 2, 1, 37, 16), (2, 2, 1, 37, 24), (2, 1, 1, 1, 37), (4.0, "divide"), None, False),
    "k_transposed": ((2, 3, 37, 32), (2, 3, 45, 32), (2, 3, 45, 32), None, (0.125, "multiply"), None, True),
    "k_transposed_causal": ((1, 2, 48, 16), (1, 2, 48, 16), (1, 2, 48, 16), (1, 2, 48, 48), (0.25, "multiply"),
                            "bottom_right", True),
    "no_batch": ((19, 16), (23, 16), (23, 20), None, (0.25, "multiply"), None, False),
    # GPU split kernel: several K/V tiles with an edge, rows past Sq in the last work-group
    "long_kv_tiles": ((1, 2, 70, 64), (1, 2, 150, 64), (1, 2, 150, 64), (1, 1, 70, 150), (0.125, "multiply"), None, False),
    "long_causal_transposed": ((2, 1, 90, 32), (2, 1, 130, 32), (2, 1, 130, 48), (2, 1, 1, 130), (8.0, "divide"),
                               "bottom_right", True),
}


# The forced GPU configuration on the cases that reach each part of its generator: K/V tiles that
# fill exactly (plain: also the merge in several column chunks), padded head sizes (odd_sizes), no
# batch, causal with a mask, rows that see no key, several tiles with an edge (long_causal_transposed:
# also K transposed, Dv != D, a broadcast mask). Each such build costs 8-16 s of a cold PoCL cache;
# the other cases differ from these in shapes and strides only, which the device configuration and
# the shared index code check.
GPU_CASES = ("plain", "odd_sizes", "no_batch", "causal_with_mask", "causal_bottom_right_short_kv",
             "long_causal_transposed")
RUNS = [("device_config", case) for case in CASES] + [("forced_gpu_config", case) for case in GPU_CASES]


@pytest.mark.parametrize("config, case", RUNS)
async def test_matches_reference(engine, rng, config, case):
    engine, impl = configure(engine, config)
    q_dims, k_dims, v_dims, mask_dims, scale, causal, k_transposed = CASES[case]
    arrays = {"query": values(rng, q_dims), "key": values(rng, k_dims), "value": values(rng, v_dims)}
    kwargs = {"causal": causal}
    if mask_dims is not None:
        arrays["mask"] = values(rng, mask_dims)
        kwargs["mask"] = MemoryDesc(mask_dims)
    if scale is not None:
        arrays["scale"] = np.array([scale[0]], np.float32)
        kwargs.update(scale=MemoryDesc((1,)), scale_mode=scale[1])
    key = transposed_view(k_dims) if k_transposed else MemoryDesc(k_dims)
    desc = SdpaDesc(MemoryDesc(q_dims), key, MemoryDesc(v_dims), **kwargs)
    primitive = await engine.create_primitive(desc)
    assert primitive.impl.startswith(impl), primitive.impl
    assert primitive.kind == "sdpa" and primitive.impl == generate(desc, engine._config).impl
    got = await run(engine, desc, arrays, primitive)
    ref = sdpa.reference(
        arrays["query"], arrays["key"], arrays["value"], mask=arrays.get("mask"),
        scale=arrays.get("scale"), scale_mode=desc.scale_mode, causal=causal,
    )
    assert got.shape == desc.dst.dims
    try:
        check(got, ref)
    except AssertionError as exc:
        raise AssertionError(f"case {case}: {exc}") from None
    if case == "causal_bottom_right_short_kv":
        assert np.all(got[..., : 40 - 24, :] == 0.0)  # rows that see no key


async def test_fully_masked_rows_give_zero(shaped, rng):
    """inf_as_zero: a row whose mask is -inf everywhere is 0; a row masked but for one key is
    that key's value row; other rows are unaffected."""
    engine, _ = shaped
    sq, skv, d = 20, 37, 16
    q, k, v = values(rng, (2, sq, d)), values(rng, (2, skv, d)), values(rng, (2, skv, d))
    mask = values(rng, (2, sq, skv))
    mask[0, 3, :] = -np.inf
    mask[1, 17, :] = -np.inf
    mask[1, 5, :] = -np.inf
    mask[1, 5, 30] = 0.0
    desc = SdpaDesc(MemoryDesc(q.shape), MemoryDesc(k.shape), MemoryDesc(v.shape), mask=MemoryDesc(mask.shape))
    got = await run(engine, desc, {"query": q, "key": k, "value": v, "mask": mask})
    assert np.all(got[0, 3] == 0.0) and np.all(got[1, 17] == 0.0)
    np.testing.assert_allclose(got[1, 5], v[1, 30], rtol=0, atol=1e-6)
    check(got, sdpa.reference(q, k, v, mask=mask))


async def test_gpu_config_with_a_narrow_work_group(engine, rng):
    """The GPU kernel with 16-wide work-groups: several per head, causal bounds per group."""
    engine._config = NARROW
    q, k, v = values(rng, (1, 2, 45, 16)), values(rng, (1, 2, 45, 16)), values(rng, (1, 2, 45, 8))
    desc = SdpaDesc(MemoryDesc(q.shape), MemoryDesc(k.shape), MemoryDesc(v.shape), causal="top_left")
    primitive = await engine.create_primitive(desc)
    assert primitive.impl.startswith("ocl:sdpa:wg") and primitive.impl.endswith(":l16")
    got = await run(engine, desc, {"query": q, "key": k, "value": v}, primitive)
    check(got, sdpa.reference(q, k, v, causal="top_left"))


# query/key/value dtype, dst dtype, mask dtype
DTYPE_CASES = {
    "bf16->bf16": ("bf16", "bf16", "f32"),
    "bf16->f32": ("bf16", "f32", "bf16"),
    "f16->f16": ("f16", "f16", "f16"),
    "f32->bf16": ("f32", "bf16", "f32"),
}


# The GPU kernel reads and writes through the same _dtype_io helpers as the CPU one: f16 in and out,
# bf16 in (a bf16 mask too) with f32 out reach each of them there.
DTYPE_RUNS = [("device_config", case) for case in DTYPE_CASES] + [
    ("forced_gpu_config", case) for case in ("bf16->f32", "f16->f16")]


@pytest.mark.parametrize("config, case", DTYPE_RUNS)
async def test_storage_dtypes(engine, rng, config, case):
    """bf16/f16 storage (f32 math): K transposed and a causal mask too, as attention graphs use."""
    engine, _ = configure(engine, config)
    io, dst_dtype, mask_dtype = DTYPE_CASES[case]
    q_dims, kv_dims = (2, 2, 37, 32), (2, 2, 41, 32)
    arrays = {
        "query": values(rng, q_dims, io), "key": values(rng, kv_dims, io), "value": values(rng, kv_dims, io),
        "mask": values(rng, (2, 1, 1, 41), mask_dtype), "scale": np.array([8.0], np.float32),
    }
    desc = SdpaDesc(
        MemoryDesc(q_dims, io), transposed_view(kv_dims, io), MemoryDesc(kv_dims, io), MemoryDesc(q_dims, dst_dtype),
        mask=MemoryDesc((2, 1, 1, 41), mask_dtype), scale=MemoryDesc((1,)), scale_mode="divide", causal="bottom_right",
    )
    got = await run(engine, desc, arrays)
    ref = sdpa.reference(arrays["query"], arrays["key"], arrays["value"], mask=arrays["mask"], scale=8.0,
                         scale_mode="divide", causal="bottom_right")  # f32, then rounded to dst below
    check(got, _dtype_io.store_reference(ref, dst_dtype), dst_dtype)


async def test_strided_query_value_and_dst(shaped, rng):
    """Every argument with its own layout: heads-inner query (b, s, h, d order), padded value
    rows, a dst with padding between rows."""
    engine, _ = shaped
    b, h, s, d = 2, 3, 21, 16
    q, k, v = values(rng, (b, h, s, d)), values(rng, (b, h, s, d)), values(rng, (b, h, s, 24))
    q_md = MemoryDesc((b, h, s, d), "f32", "acbd")
    v_md = MemoryDesc((b, h, s, 24), "f32", (h * s * 32, s * 32, 32, 1))
    dst_md = MemoryDesc((b, h, s, 24), "f32", (h * s * 40, s * 40, 40, 1))
    desc = SdpaDesc(q_md, MemoryDesc(k.shape), v_md, dst_md, scale=MemoryDesc((1, 1)), scale_mode="multiply")
    got = await run(engine, desc, {"query": q, "key": k, "value": v, "scale": np.array([[0.25]], np.float32)})
    check(got, sdpa.reference(q, k, v, scale=0.25))


async def test_large_scores_are_stable(shaped, rng):
    """Scores in the thousands: the running maximum keeps exp from overflowing."""
    engine, _ = shaped
    q, k, v = values(rng, (1, 33, 16)) * 30, values(rng, (1, 40, 16)) * 30, values(rng, (1, 40, 16))
    desc = SdpaDesc(MemoryDesc(q.shape), MemoryDesc(k.shape), MemoryDesc(v.shape))
    got = await run(engine, desc, {"query": q, "key": k, "value": v})
    assert np.all(np.isfinite(got))
    check(got, sdpa.reference(q, k, v))


# -- descriptor ------------------------------------------------------------------------------------


def test_descriptor_values():
    q, kv = MemoryDesc((2, 8, 16, 64), "bf16"), MemoryDesc((2, 1, 24, 64), "bf16")
    desc = SdpaDesc(q, kv, kv, mask=MemoryDesc((24,)), causal="top_left")
    assert desc.kind == "sdpa" and desc.label == "sdpa:causal_top_left"
    assert desc.dst == MemoryDesc((2, 8, 16, 64), "bf16")
    assert list(desc.arg_descs) == ["query", "key", "value", "mask", "dst"]
    with_scale = SdpaDesc(q, kv, kv, scale=MemoryDesc((1,)), scale_mode="divide")
    assert list(with_scale.arg_descs) == ["query", "key", "value", "scale", "dst"]
    assert SdpaDesc(q, kv, kv, scale_mode="divide") == SdpaDesc(q, kv, kv)  # no scale: mode moot
    assert hash(desc) == hash(SdpaDesc(q, kv, kv, desc.dst, mask=MemoryDesc((24,)), causal="top_left"))
    assert desc != SdpaDesc(q, kv, kv, mask=MemoryDesc((24,)), causal="bottom_right")
    # a mask with a larger batch than query widens the output, as numpy's broadcast would
    wide = SdpaDesc(MemoryDesc((1, 4, 8)), MemoryDesc((1, 9, 8)), MemoryDesc((1, 9, 8)), mask=MemoryDesc((3, 4, 9)))
    assert wide.dst.dims == (3, 4, 8)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: SdpaDesc(MemoryDesc((2, 4, 64)), MemoryDesc((2, 5, 32)), MemoryDesc((2, 5, 32))),
         ArgumentMismatchError, r"query dims \(2, 4, 64\) have head size D=64 but key dims \(2, 5, 32\) have D=32"),
        (lambda: SdpaDesc(MemoryDesc((4, 8)), MemoryDesc((5, 8)), MemoryDesc((6, 8))),
         ArgumentMismatchError, "key dims .* have 5 rows .* value dims .* have 6"),
        (lambda: SdpaDesc(MemoryDesc((3, 4, 8)), MemoryDesc((2, 5, 8)), MemoryDesc((2, 5, 8))),
         ArgumentMismatchError, "batch dims of query .* do not broadcast"),
        (lambda: SdpaDesc(MemoryDesc((4, 8)), MemoryDesc((5, 8)), MemoryDesc((5, 8)), mask=MemoryDesc((4, 4))),
         ArgumentMismatchError, r"mask dims \(4, 4\) do not broadcast"),
        (lambda: SdpaDesc(MemoryDesc((4, 8)), MemoryDesc((5, 8)), MemoryDesc((5, 6)), MemoryDesc((4, 8))),
         ArgumentMismatchError, r"dst dims \(4, 8\) differ .* \(4, 6\)"),
        (lambda: SdpaDesc(MemoryDesc((4, 8)), MemoryDesc((5, 8)), MemoryDesc((5, 8)), scale=MemoryDesc((2,))),
         ArgumentMismatchError, "scale dims .* hold 2 elements"),
        (lambda: SdpaDesc(MemoryDesc((4, 8)), MemoryDesc((5, 8)), MemoryDesc((5, 8)), causal="upper"),
         InvalidArgumentError, "causal 'upper' is not one of"),
        (lambda: SdpaDesc(MemoryDesc((4, 8)), MemoryDesc((5, 8)), MemoryDesc((5, 8)), scale_mode="add"),
         InvalidArgumentError, "scale_mode 'add' is not one of"),
        (lambda: SdpaDesc(MemoryDesc((8,)), MemoryDesc((5, 8)), MemoryDesc((5, 8))),
         InvalidArgumentError, "query dims .* need at least 2"),
        (lambda: SdpaDesc((4, 8), MemoryDesc((5, 8)), MemoryDesc((5, 8))),
         InvalidArgumentError, "query is tuple"),
        (lambda: SdpaDesc(MemoryDesc((4, 8)), MemoryDesc((5, 8)), MemoryDesc((5, 8)), mask=np.zeros((4, 5))),
         InvalidArgumentError, "mask is ndarray"),
    ],
)
def test_bad_descriptors(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize(
    "make, culprit",
    [
        (lambda: SdpaDesc(MemoryDesc((4, 8), "s32"), MemoryDesc((5, 8)), MemoryDesc((5, 8))), "query has dtype 's32'"),
        (lambda: SdpaDesc(MemoryDesc((4, 8)), MemoryDesc((5, 8)), MemoryDesc((5, 8)), mask=MemoryDesc((4, 5), "boolean")),
         "mask has dtype 'boolean'"),
        (lambda: SdpaDesc(MemoryDesc((4, 8)), MemoryDesc((5, 8)), MemoryDesc((5, 8)), MemoryDesc((4, 8), "s32")),
         "dst has dtype 's32'"),
    ],
)
async def test_failed_create_caches_nothing(engine, make, culprit):
    desc = make()
    before_cache, before_engine = triodnn.primitive_cache_statistics(), engine.statistics()
    with pytest.raises(UnsupportedError, match=culprit):
        await engine.create_primitive(desc)
    after = triodnn.primitive_cache_statistics()
    assert (after.size, after.misses, after.in_flight_builds) == (before_cache.size, before_cache.misses, 0)
    stats = engine.statistics()
    assert stats.programs_built == before_engine.programs_built and stats.builds_in_flight == 0
    assert stats.live_buffers == before_engine.live_buffers
    with pytest.raises(UnsupportedError, match=culprit):
        generate(desc, CPU)


def test_mismatched_head_size_never_reaches_the_cache():
    """The D mismatch is refused when the descriptor is made, before any create."""
    before = triodnn.primitive_cache_statistics()
    with pytest.raises(ArgumentMismatchError, match="query .* key"):
        SdpaDesc(MemoryDesc((1, 2, 16, 64)), MemoryDesc((1, 2, 16, 48)), MemoryDesc((1, 2, 16, 64)))
    assert triodnn.primitive_cache_statistics() == before


# -- reference and generation (pure) -----------------------------------------------------------------


def test_reference_matches_naive_softmax(rng):
    q, k, v = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 7, 4)), rng.standard_normal((2, 7, 3))
    mask = rng.standard_normal((2, 5, 7))
    s = q @ np.swapaxes(k, -1, -2) / 2.0 + mask
    s = np.where(np.arange(7)[None, :] > np.arange(5)[:, None] + 2, -np.inf, s)  # bottom_right: offset 7 - 5
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v
    got = sdpa.reference(q, k, v, mask=mask, scale=np.array([2.0]), scale_mode="divide", causal="bottom_right")
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("config", [CPU, GPU], ids=["cpu_config", "gpu_config"])
def test_generation_is_deterministic_and_bakes_the_shape(config):
    desc = SdpaDesc(MemoryDesc((1, 4, 33, 16)), transposed_view((1, 4, 50, 16)), MemoryDesc((1, 4, 50, 8)),
                    mask=MemoryDesc((1, 1, 1, 50)), scale=MemoryDesc((1,)), causal="top_left")
    a, b = generate(desc, config), generate(desc, config)
    assert a == b
    assert a.arg_names == ("query", "key", "value", "scale", "mask", "dst")
    if config.vector_width >= 16:
        assert a.local_size == (1, 1) and a.global_size == (2, 4)  # 32 rows per work-item
        assert "exp(" not in a.source.replace("sd_exp(", "")  # the inlined exp only
    else:  # the flash kernel: 64 rows per work-group of 256, one group for 33 rows
        assert a.impl == "ocl:sdpa:flash:q64:k32:l256"
        assert a.local_size == (256, 1) and a.global_size == (256, 4)


def test_gpu_kernel_choice():
    """The flash kernel for plain scores on work-groups of 256 (64-row blocks of 32 keys up to
    head size 64; up to 128, 64 rows of 16 keys where local memory holds them, else 32 x 32, else
    none); the split kernel where q and O fit in registers and work-groups of
    64+ are allowed, or for the score variants flash lacks; else the one-row-per-work-item kernel."""
    def impl(d, dv, skv=128, config=GPU, **kwargs):
        return generate(SdpaDesc(MemoryDesc((1, 8, 128, d)), MemoryDesc((1, 8, skv, d)),
                                 MemoryDesc((1, 8, skv, dv)), **kwargs), config).impl
    assert impl(64, 64) == "ocl:sdpa:flash:q64:k32:l256"
    assert impl(128, 128) == "ocl:sdpa:flash:q64:k16:l256"
    assert impl(128, 128, config=attrs.evolve(GPU, local_memory=44 * 1024)) == "ocl:sdpa:flash:q32:k32:l256"
    assert not impl(128, 128, config=attrs.evolve(GPU, local_memory=32 * 1024)).startswith("ocl:sdpa:flash")
    assert impl(64, 64, softcap=MemoryDesc((1,)), scale=MemoryDesc((1,))) == "ocl:sdpa:wgsplit:q16x16:k64:l256"
    assert impl(64, 64, skv=20, softcap=MemoryDesc((1,))) == "ocl:sdpa:wgsplit:q16x16:k32:l256"
    assert impl(96, 96, softcap=MemoryDesc((1,))) == "ocl:sdpa:wgsplit:q16x16:k32:l256"  # tiles halved to fit
    assert (impl(64, 64, config=KernelConfig(vector_width=1, local_size=128, local_memory=48 * 1024))
            == "ocl:sdpa:wgsplit:q8x16:k64:l128")
    assert impl(256, 256).startswith("ocl:sdpa:wg:")  # past flash's heads; q and O past the registers
    assert impl(64, 64, config=NARROW).startswith("ocl:sdpa:wg:")


@pytest.mark.parametrize("local_kib, blocks", [(48, "q64:k16"), (44, "q32:k32")])
async def test_gpu_large_head(engine, rng, local_kib, blocks):
    """Head size 128: the flash kernel's blocks for the local memory (one key per work-item in the
    scores; 4 x 8 of O per work-item, read as two float4 of V, in 64 x 16)."""
    engine._config = attrs.evolve(GPU, local_memory=local_kib * 1024)
    q, k, v = values(rng, (1, 1, 20, 128)), values(rng, (1, 1, 45, 128)), values(rng, (1, 1, 45, 128))
    mask = values(rng, (1, 1, 20, 45))
    desc = SdpaDesc(MemoryDesc(q.shape), MemoryDesc(k.shape), MemoryDesc(v.shape), mask=MemoryDesc(mask.shape),
                    causal="top_left")
    primitive = await engine.create_primitive(desc)
    assert primitive.impl.startswith(f"ocl:sdpa:flash:{blocks}:")
    got = await run(engine, desc, {"query": q, "key": k, "value": v, "mask": mask}, primitive)
    check(got, sdpa.reference(q, k, v, mask=mask, causal="top_left"))
