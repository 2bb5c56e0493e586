"""SdpaDesc's score options beyond scale and additive mask: Select masks with a fill value (before
or after the scale), causal masks that fill with a value, soft-capping, and the SoftMax
statistics output, against the float64 reference.

Every case runs with the device's own configuration (PoCL: the CPU kernel); the cases that reach
each option of the GPU kernels run again with the GPU configuration forced (the split kernel) and
with a narrow work-group, as test_sdpa.py does.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from triodnn import ArgumentMismatchError, InvalidArgumentError, MemoryDesc
from triodnn._values._sdpa_desc import SdpaDesc
from triodnn.kernels import _dtype_io, sdpa, select_config, tolerance
from triodnn.kernels._spec import KernelConfig

THRESHOLD = 1e-5
GPU = select_config("gpu", 256, 48 * 1024)
NARROW = KernelConfig(vector_width=1, local_size=16)


def values(rng, shape) -> np.ndarray:
    return rng.uniform(-2.0, 2.0, shape).astype(np.float32)


async def run(engine, desc: SdpaDesc, arrays: dict) -> dict[str, np.ndarray]:
    """Every output of ``desc`` (prefilled with NaN, so an unwritten element shows)."""
    primitive = await engine.create_primitive(desc)
    memories = {}
    for name, md in desc.arg_descs.items():
        if name in ("dst", "stats"):
            memories[name] = await engine.from_numpy(np.full(md.dims, np.nan, _dtype_io.USER_NUMPY[md.dtype]), md)
        else:
            memories[name] = await engine.from_numpy(arrays[name], md)
    await (await engine.stream()).execute(primitive, memories)
    return {name: await memories[name].to_numpy() for name in ("dst", "stats") if name in memories}


def configure(engine, config: str):
    """``engine`` with its own configuration, the GPU one forced, or a narrow GPU work-group."""
    if config == "forced_gpu_config":
        engine._config = attrs.evolve(GPU, local_memory=min(GPU.local_memory, engine._config.local_memory))
    elif config == "narrow_gpu_config":
        engine._config = attrs.evolve(NARROW, local_memory=engine._config.local_memory)
    return engine


# name: q, k, v dims, select_mask dims, fill, fill_if, fill_before_scale, (scale, mode), softcap,
# mask dims, causal, stats
CASES = {
    # MHA-GPT: Select(cond, scores, fill) -> Divide -> Add mask
    "select_before_scale_then_mask": ((1, 3, 20, 16), (1, 3, 33, 16), (1, 3, 33, 16), (1, 1, 20, 33), -3.0, False,
                                      True, (4.0, "divide"), None, (1, 1, 1, 33), None, False),
    # distill_bert: Divide -> Select(cond, fill, scores), cond broadcast over rows
    "select_fill_if_true_keys_only": ((1, 2, 24, 16), (1, 2, 40, 16), (1, 2, 40, 16), (1, 1, 1, 40), -2.5, True,
                                      False, (8.0, "divide"), None, None, None, False),
    # cond broadcast over keys (a per-row vector), -inf fill: whole rows may be masked
    "select_rows_neg_inf": ((2, 2, 18, 16), (2, 2, 35, 16), (2, 2, 35, 16), (2, 1, 18, 1), -np.inf, False,
                            False, (0.25, "multiply"), None, None, None, True),
    # gemma2: Multiply -> Tanh -> Multiply -> Select (full cond)
    "softcap_then_select": ((1, 4, 2, 1, 32), (1, 4, 1, 70, 32), (1, 4, 1, 70, 32), (1, 4, 2, 1, 70), -4.0, False,
                            False, (0.5, "multiply"), 1.5, None, None, True),
    # implicit causal masks (GenIndex, GreaterEqual, Select) fill with a finite value
    "causal_fill_top_left": ((1, 2, 50, 16), (1, 2, 50, 16), (1, 2, 50, 16), None, -1.0, False, False,
                             (0.125, "multiply"), None, None, "top_left", True),
    "causal_fill_bottom_right_short_kv": ((1, 1, 40, 16), (1, 1, 24, 16), (1, 1, 24, 24), None, 2.0, False, False,
                                          (0.25, "multiply"), None, None, "bottom_right", False),
    "stats_causal": ((1, 2, 37, 16), (1, 2, 37, 16), (1, 2, 37, 16), None, None, False, False,
                     (0.25, "multiply"), None, (1, 2, 37, 37), "top_left", True),
}


# The GPU kernels once per option (compiles dominate this file's time on a cold cache: 8-25 s per
# forced GPU build). The split kernel: Select either way round (fill_if), before the scale with an
# additive mask, soft-capping with stats, a causal fill on rows that see no key; its causal mask
# without a fill and with an additive mask is test_sdpa.py's causal_with_mask. The flash kernel
# (plain scores): statistics under a causal mask and an additive one (stats_causal).
GPU_CASES = ("select_before_scale_then_mask", "select_fill_if_true_keys_only", "softcap_then_select",
             "causal_fill_bottom_right_short_kv", "stats_causal")
NARROW_CASES = ("select_before_scale_then_mask", "softcap_then_select", "causal_fill_top_left")
RUNS = [("device_config", case) for case in CASES] + [("forced_gpu_config", case) for case in GPU_CASES] + [
    ("narrow_gpu_config", case) for case in NARROW_CASES]


@pytest.mark.parametrize("config, case", RUNS)
async def test_matches_reference(engine, rng, config, case):
    engine = configure(engine, config)
    q_dims, k_dims, v_dims, cond_dims, fill, fill_if, before, scale, softcap, mask_dims, causal, stats = CASES[case]
    arrays = {"query": values(rng, q_dims), "key": values(rng, k_dims), "value": values(rng, v_dims),
              "scale": np.array([scale[0]], np.float32)}
    kwargs = dict(scale=MemoryDesc((1,)), scale_mode=scale[1], causal=causal, fill_if=fill_if, fill_before_scale=before)
    if cond_dims is not None:
        cond = rng.random(cond_dims) < 0.5
        cond.reshape(-1)[0] = not fill_if  # at least one score kept
        arrays["select_mask"] = cond.astype(np.uint8)
        kwargs["select_mask"] = MemoryDesc(cond_dims, "u8")
    if fill is not None:
        arrays["fill"] = np.array([fill], np.float32)
        kwargs["fill"] = MemoryDesc((1,))
    if softcap is not None:
        arrays["softcap"] = np.array([softcap], np.float32)
        kwargs["softcap"] = MemoryDesc((1,))
    if mask_dims is not None:
        arrays["mask"] = values(rng, mask_dims)
        kwargs["mask"] = MemoryDesc(mask_dims)
    desc = SdpaDesc(MemoryDesc(q_dims), MemoryDesc(k_dims), MemoryDesc(v_dims), **kwargs)
    if stats:
        desc = attrs.evolve(desc, stats=MemoryDesc(desc.dst.dims[:-1] + (1,)))
    got = await run(engine, desc, arrays)
    ref, ref_stats = sdpa.reference(
        arrays["query"], arrays["key"], arrays["value"], mask=arrays.get("mask"), scale=arrays["scale"],
        scale_mode=scale[1], causal=causal, softcap=arrays.get("softcap"), select_mask=arrays.get("select_mask"),
        fill=arrays.get("fill"), fill_if=fill_if, fill_before_scale=before, with_stats=True)
    tolerance.check(got["dst"], ref, THRESHOLD)
    if stats:
        finite = np.isfinite(ref_stats)
        assert np.array_equal(np.isfinite(got["stats"]), finite)
        assert np.all(got["stats"][~finite] == -np.inf)
        tolerance.check(got["stats"][finite], ref_stats[finite], THRESHOLD)
    if case == "causal_fill_bottom_right_short_kv":
        # The first Sq - Skv rows see only fill values: a uniform softmax, the mean of V's rows.
        np.testing.assert_allclose(got["dst"][..., :16, :], np.broadcast_to(
            arrays["value"].mean(axis=-2, keepdims=True), got["dst"][..., :16, :].shape), rtol=1e-5, atol=1e-5)


# The run-time offset replaces the constant diagonal in the same generated line, so one kernel of
# each GPU generator stands for the split and one-row kernels (the narrow one) and the flash
# kernel (the forced GPU configuration).
@pytest.mark.parametrize("config, add, sub", [
    ("device_config", 5, 2), ("narrow_gpu_config", 5, 2), ("forced_gpu_config", 5, 2),
    ("device_config", None, 4), ("device_config", 1, None)])
async def test_bottom_right_offset_at_run_time(engine, rng, config, add, sub):
    """Host-scalar Add/Subtract on the row index: kv > q + add - sub is filled."""
    engine = configure(engine, config)
    dims = (1, 2, 19, 16)
    arrays = {"query": values(rng, dims), "key": values(rng, dims), "value": values(rng, dims),
              "fill": np.float32([-1.5])}
    kwargs = dict(causal="bottom_right", fill=MemoryDesc((1,)))
    for name, v in (("causal_add", add), ("causal_sub", sub)):
        if v is not None:
            arrays[name] = np.int32([v])
            kwargs[name] = MemoryDesc((1,), "s32")
    desc = SdpaDesc(MemoryDesc(dims), MemoryDesc(dims), MemoryDesc(dims), **kwargs)
    got = await run(engine, desc, arrays)
    ref = sdpa.reference(arrays["query"], arrays["key"], arrays["value"], causal="bottom_right",
                         fill=arrays["fill"], causal_add=arrays.get("causal_add"), causal_sub=arrays.get("causal_sub"))
    offset = (add or 0) - (sub or 0)
    scores = arrays["query"].astype(np.float64) @ np.swapaxes(arrays["key"], -1, -2)
    scores = np.where(np.arange(19)[None, :] > np.arange(19)[:, None] + offset, -1.5, scores)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(ref, (p / p.sum(-1, keepdims=True)) @ arrays["value"], rtol=1e-5, atol=1e-6)
    tolerance.check(got["dst"], ref, THRESHOLD)


def _transposed(dims, dtype):
    """(…, S, D) stored as (…, D, S): a graph's K^T."""
    stored = dims[:-2] + (dims[-1], dims[-2])
    strides = list(MemoryDesc(stored).strides)
    strides[-1], strides[-2] = strides[-2], strides[-1]
    return MemoryDesc(dims, dtype, tuple(strides))


@pytest.mark.parametrize("skv, k_transposed, dtype, causal", [
    (37, True, "bf16", None), (10, True, "f32", "bottom_right"), (40, False, "f16", "top_left")])
async def test_short_queries(engine, rng, skv, k_transposed, dtype, causal):
    """Sq <= 4 (decoding): the CPU configuration's rowdot kernel, K either way, block edges."""
    q_dims, k_dims = (2, 3, 3, 32), (2, 1, skv, 32)
    arrays = {"query": values(rng, q_dims), "key": values(rng, k_dims), "value": values(rng, (2, 1, skv, 16)),
              "scale": np.float32([0.5]), "mask": values(rng, (2, 1, 1, skv))}
    arrays = {n: _dtype_io.store_reference(a, dtype) if n in ("query", "key", "value") else a for n, a in arrays.items()}
    key = _transposed(k_dims, dtype) if k_transposed else MemoryDesc(k_dims, dtype)
    desc = SdpaDesc(MemoryDesc(q_dims, dtype), key, MemoryDesc((2, 1, skv, 16), dtype), MemoryDesc((2, 3, 3, 16)),
                    scale=MemoryDesc((1,)), mask=MemoryDesc((2, 1, 1, skv)), causal=causal,
                    stats=MemoryDesc((2, 3, 3, 1)))
    if engine._config.vector_width >= 16:
        assert (await engine.create_primitive(desc)).impl.startswith("ocl:sdpa:rowdot")
    got = await run(engine, desc, arrays)
    ref, ref_stats = sdpa.reference(arrays["query"], arrays["key"], arrays["value"], scale=arrays["scale"],
                                    mask=arrays["mask"], causal=causal, with_stats=True)
    tolerance.check(got["dst"], ref, THRESHOLD)
    finite = np.isfinite(ref_stats)
    assert np.array_equal(np.isfinite(got["stats"]), finite)
    tolerance.check(got["stats"][finite], ref_stats[finite], THRESHOLD)


def test_reference_select_before_scale_scales_the_fill():
    q = np.ones((1, 2, 4), np.float32)
    k = np.ones((1, 3, 4), np.float32)
    v = np.arange(3, dtype=np.float32).reshape(1, 3, 1)
    cond = np.array([[1, 0, 1]], np.uint8)
    before = sdpa.reference(q, k, v, scale=np.float32([2.0]), scale_mode="divide", select_mask=cond,
                            fill=np.float32([4.0]), fill_before_scale=True)
    after = sdpa.reference(q, k, v, scale=np.float32([2.0]), scale_mode="divide", select_mask=cond,
                           fill=np.float32([2.0]))
    np.testing.assert_allclose(before, after)  # 4 / 2 == 2: the same scores


D = (1, 2, 8, 16)


@pytest.mark.parametrize("make, error, match", [
    (lambda: SdpaDesc(MemoryDesc(D), MemoryDesc(D), MemoryDesc(D), select_mask=MemoryDesc((1, 1, 8, 8), "u8")),
     InvalidArgumentError, "needs a fill"),
    (lambda: SdpaDesc(MemoryDesc(D), MemoryDesc(D), MemoryDesc(D), fill=MemoryDesc((1,))),
     InvalidArgumentError, "needs select_mask or causal"),
    (lambda: SdpaDesc(MemoryDesc(D), MemoryDesc(D), MemoryDesc(D), select_mask=MemoryDesc((1, 1, 3, 8), "u8"),
                      fill=MemoryDesc((1,))), ArgumentMismatchError, "select_mask dims"),
    (lambda: SdpaDesc(MemoryDesc(D), MemoryDesc(D), MemoryDesc(D), select_mask=MemoryDesc((8, 8), "u8"),
                      fill=MemoryDesc((2,))), ArgumentMismatchError, "fill dims"),
    (lambda: SdpaDesc(MemoryDesc(D), MemoryDesc(D), MemoryDesc(D), softcap=MemoryDesc((1, 2))),
     ArgumentMismatchError, "softcap dims"),
    (lambda: SdpaDesc(MemoryDesc(D), MemoryDesc(D), MemoryDesc(D), scale=MemoryDesc((1,)), softcap=MemoryDesc((1,)),
                      select_mask=MemoryDesc((8, 8), "u8"), fill=MemoryDesc((1,)), fill_before_scale=True),
     InvalidArgumentError, "tanh"),
    (lambda: SdpaDesc(MemoryDesc(D), MemoryDesc(D), MemoryDesc(D), stats=MemoryDesc((1, 2, 8, 2))),
     ArgumentMismatchError, "stats dims"),
    (lambda: SdpaDesc(MemoryDesc(D), MemoryDesc(D), MemoryDesc(D), causal="top_left",
                      causal_add=MemoryDesc((1,), "s32")), InvalidArgumentError, "bottom-right"),
    (lambda: SdpaDesc(MemoryDesc(D), MemoryDesc(D), MemoryDesc(D), causal="bottom_right",
                      causal_sub=MemoryDesc((2,), "s32")), ArgumentMismatchError, "causal_sub dims"),
])
def test_bad_descriptors(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_select_mask_must_be_boolean_bytes():
    desc = SdpaDesc(MemoryDesc(D), MemoryDesc(D), MemoryDesc(D), select_mask=MemoryDesc((8, 8), "f32"),
                    fill=MemoryDesc((1,)))
    with pytest.raises(Exception, match="select_mask"):
        desc.check_supported()


def test_without_scale_fill_before_scale_is_normalised():
    a = SdpaDesc(MemoryDesc(D), MemoryDesc(D), MemoryDesc(D), select_mask=MemoryDesc((8, 8), "u8"),
                 fill=MemoryDesc((1,)), fill_before_scale=True)
    b = SdpaDesc(MemoryDesc(D), MemoryDesc(D), MemoryDesc(D), select_mask=MemoryDesc((8, 8), "u8"),
                 fill=MemoryDesc((1,)))
    assert a == b
