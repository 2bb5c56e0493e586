"""Fused SDPA backward (SdpaBackwardDesc, dq and dkdv parts) against the float64 reference, with
the device's own kernel configuration (PoCL: float16 vectors over the head) and the GPU one
forced on the engine (one scalar lane per row); typed errors for bad descriptors."""

from __future__ import annotations

import numpy as np
import pytest

from triodnn import ArgumentMismatchError, InvalidArgumentError, MemoryDesc, UnsupportedError
from triodnn._values._dtypes import from_storage, to_storage
from triodnn._values._sdpa_backward_desc import SdpaBackwardDesc
from triodnn.kernels import _dtype_io, generate, sdpa, sdpa_backward, select_config, tolerance


def values(rng, shape, dtype: str = "f32") -> np.ndarray:
    x = rng.uniform(-1.0, 1.0, shape).astype(np.float32)
    if dtype == "f16":
        return x.astype(np.float16)
    return from_storage(to_storage(x, dtype), dtype)


def problem(rng, batch, sq, skv, d, dtype="f32", mask=False, causal=None):
    """Consistent inputs: O and stats from numpy's forward of Q, K, V (and the mask)."""
    arrays = {"query": values(rng, batch + (sq, d), dtype), "key": values(rng, batch + (skv, d), dtype),
              "value": values(rng, batch + (skv, d), dtype), "scale": np.array([0.125], np.float32)}
    if mask:
        arrays["mask"] = values(rng, (1,) * len(batch) + (sq, skv), dtype)
    o, stats = sdpa.reference(arrays["query"], arrays["key"], arrays["value"], mask=arrays.get("mask"),
                              scale=arrays["scale"], causal=causal, dst_dtype=dtype, with_stats=True)
    arrays.update(dst=o, stats=stats, diff_dst=values(rng, o.shape, dtype))
    return arrays


def descs(arrays, dtype, causal=None, delta=False):
    """The dq and dkdv descriptors; with ``delta``, dq writes D and dkdv reads it."""
    md = {n: MemoryDesc(a.shape, "f32" if n in ("stats", "scale") else dtype) for n, a in arrays.items()}
    args = [md[n] for n in ("query", "key", "value", "dst", "diff_dst", "stats")]
    extra = dict(scale=md["scale"], mask=md.get("mask"), causal=causal)
    rows = md["stats"] if delta else None
    return (SdpaBackwardDesc("dq", *args, **extra, delta_out=rows),
            SdpaBackwardDesc("dkdv", *args, **extra, delta=rows))


async def run(engine, desc, arrays):
    primitive = await engine.create_primitive(desc)
    outs = ("diff_query", "delta_out") if desc.part == "dq" else ("diff_key", "diff_value")
    outs = tuple(n for n in outs if getattr(desc, n) is not None)
    memories = {}
    for name, md in desc.arg_descs.items():
        if name in outs:
            memories[name] = await engine.from_numpy(np.full(md.dims, np.nan, _dtype_io.USER_NUMPY[md.dtype]), md)
        else:
            memories[name] = await engine.from_numpy(arrays[name], md)
    await (await engine.stream()).execute(primitive, memories)
    return {n: await memories[n].to_numpy() for n in outs}


@pytest.fixture(params=["cpu", "gpu"])
async def shaped_engine(engine, request):
    engine._config = select_config(request.param, engine.info.max_work_group_size)
    return engine


@pytest.mark.parametrize(("dtype", "mask", "causal", "delta"), [
    ("f32", True, None, False), ("f32", False, "top_left", True), ("bf16", True, None, True),
    ("f16", False, "bottom_right", False),
])
async def test_matches_the_reference(shaped_engine, rng, dtype, mask, causal, delta):
    arrays = problem(rng, (2, 3), 19, 23, 32, dtype, mask=mask, causal=causal)
    arrays["delta"] = sdpa_backward.reference(
        arrays["query"], arrays["key"], arrays["value"], arrays["dst"], arrays["diff_dst"], arrays["stats"],
        scale=arrays["scale"], mask=arrays.get("mask"), causal=causal)["delta"].astype(np.float32)
    for desc in descs({n: a for n, a in arrays.items() if n != "delta"}, dtype, causal, delta):
        got = await run(shaped_engine, desc, arrays)
        want = sdpa_backward.desc_reference(desc, arrays)
        assert set(got) == set(want)
        for name in got:
            # Gradients are sums of up to Skv terms: checked against the largest value.
            scale = max(1.0, float(np.max(np.abs(_dtype_io.widen(want[name])))))
            tolerance.check(_dtype_io.widen(got[name]) / scale, _dtype_io.widen(want[name]) / scale,
                            sdpa_backward.tolerance_of(desc) * 4)


def test_cpu_config_takes_rows_as_lanes():
    md = MemoryDesc((2, 8, 64), "f32")
    stats = MemoryDesc((2, 8, 1), "f32")
    desc = SdpaBackwardDesc("dq", md, md, md, md, md, stats)
    assert ":lanes16:" in generate(desc, select_config("cpu", 4096)).impl
    assert ":rows1:" in generate(desc, select_config("gpu", 256)).impl


def test_reference_matches_the_gradient_of_the_forward(rng):
    """The reference's dQ, dK, dV are the derivatives of sum(dO * O) (central differences)."""
    arrays = problem(rng, (1,), 3, 4, 2, mask=True)
    for n in ("query", "key", "value"):
        arrays[n] = arrays[n].astype(np.float64)

    def loss(q, k, v):
        s = q @ k.swapaxes(-1, -2) * 0.125 + arrays["mask"].astype(np.float64)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return float(np.sum((p @ v) * arrays["diff_dst"]))

    o, stats = sdpa.reference(arrays["query"], arrays["key"], arrays["value"], mask=arrays["mask"],
                              scale=arrays["scale"], with_stats=True)
    got = sdpa_backward.reference(arrays["query"], arrays["key"], arrays["value"], o, arrays["diff_dst"],
                                  stats, scale=arrays["scale"], mask=arrays["mask"])
    for i, n in enumerate(("query", "key", "value")):
        want = np.zeros_like(arrays[n])
        for idx in np.ndindex(arrays[n].shape):
            args = [arrays["query"].copy(), arrays["key"].copy(), arrays["value"].copy()]
            args[i][idx] += 1e-5
            up = loss(*args)
            args[i][idx] -= 2e-5
            want[idx] = (up - loss(*args)) / 2e-5
        np.testing.assert_allclose(got[f"diff_{n}"], want, rtol=1e-3, atol=1e-4)


def test_bad_descriptors_raise_typed_errors():
    q, s = MemoryDesc((2, 8, 16), "f32"), MemoryDesc((2, 8, 1), "f32")
    with pytest.raises(InvalidArgumentError, match="part"):
        SdpaBackwardDesc("dx", q, q, q, q, q, s)
    with pytest.raises(ArgumentMismatchError, match="key"):
        SdpaBackwardDesc("dq", q, MemoryDesc((2, 8, 8), "f32"), q, q, q, s)
    with pytest.raises(ArgumentMismatchError, match="GQA|broadcast"):
        SdpaBackwardDesc("dq", q, MemoryDesc((1, 8, 16), "f32"), MemoryDesc((1, 8, 16), "f32"), q, q, s)
    with pytest.raises(ArgumentMismatchError, match="stats"):
        SdpaBackwardDesc("dq", q, q, q, q, q, MemoryDesc((2, 8, 2), "f32"))
    with pytest.raises(ArgumentMismatchError, match="scale"):
        SdpaBackwardDesc("dq", q, q, q, q, q, s, scale=MemoryDesc((2,), "f32"))
    with pytest.raises(InvalidArgumentError, match="diff_key"):
        SdpaBackwardDesc("dq", q, q, q, q, q, s, diff_key=q)
    with pytest.raises(ArgumentMismatchError, match="mask"):
        SdpaBackwardDesc("dq", q, q, q, q, q, s, mask=MemoryDesc((8, 9), "f32"))
    with pytest.raises(InvalidArgumentError, match="delta"):
        SdpaBackwardDesc("dq", q, q, q, q, q, s, delta=s)
    with pytest.raises(ArgumentMismatchError, match="delta_out"):
        SdpaBackwardDesc("dq", q, q, q, q, q, s, delta_out=q)
    with pytest.raises(UnsupportedError):
        SdpaBackwardDesc("dq", MemoryDesc((2, 8, 16), "s8"), q, q, q, q, s).check_supported()
