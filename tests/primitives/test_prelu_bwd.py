"""PreluBackwardDesc: diff_src and the reduced diff_weights against the float64 reference for
full, per-channel, shared and scalar slopes, oneDNN's value at src == 0, narrow storage, strided
layouts, and each error type."""

from __future__ import annotations

import numpy as np
import pytest

from triodnn import ArgumentMismatchError, MemoryDesc, PreluBackwardDesc
from triodnn.kernels import kind_of, prelu_bwd, tolerance


def md(*dims, dtype="f32", strides=None) -> MemoryDesc:
    return MemoryDesc(tuple(dims), dtype, strides)


async def _run(engine, desc: PreluBackwardDesc, inputs: dict[str, np.ndarray]):
    primitive = await engine.create_primitive(desc)
    args = {name: await engine.from_numpy(inputs[name], getattr(desc, name)) for name in ("src", "weights", "diff_dst")}
    args["diff_src"] = engine.memory(desc.diff_src)
    args["diff_weights"] = engine.memory(desc.diff_weights)
    await (await engine.stream()).execute(primitive, args)
    return await args["diff_src"].to_numpy(), await args["diff_weights"].to_numpy()


def _inputs(rng, src_dims, weights_dims):
    return {"src": rng.uniform(-2.0, 2.0, src_dims).astype(np.float32),
            "weights": rng.uniform(-1.0, 1.0, weights_dims).astype(np.float32),
            "diff_dst": rng.uniform(-2.0, 2.0, src_dims).astype(np.float32)}


@pytest.mark.parametrize("weights_dims", [(2, 5, 3, 4), (1, 5, 1, 1), (3, 4), (1,), (5, 1, 1)])
async def test_matches_the_reference(engine, rng, weights_dims):
    src_dims = (2, 5, 3, 4)
    desc = PreluBackwardDesc(md(*src_dims), md(*weights_dims), md(*src_dims))
    inputs = _inputs(rng, src_dims, weights_dims)
    diff_src, diff_weights = await _run(engine, desc, inputs)
    want_src, want_weights = prelu_bwd.desc_references(desc, inputs)
    threshold = kind_of(desc).tolerance(desc)
    tolerance.check(diff_src, want_src, threshold)
    tolerance.check(diff_weights, want_weights, threshold)
    assert diff_weights.shape == weights_dims


async def test_zero_takes_the_slope_side(engine):
    src = np.array([-2.0, 0.0, 3.0], np.float32)
    inputs = {"src": src, "weights": np.full(3, 0.5, np.float32), "diff_dst": np.full(3, 4.0, np.float32)}
    desc = PreluBackwardDesc(md(3), md(3), md(3))
    diff_src, diff_weights = await _run(engine, desc, inputs)
    np.testing.assert_array_equal(diff_src, [2.0, 2.0, 4.0])
    np.testing.assert_array_equal(diff_weights, [-8.0, 0.0, 0.0])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
async def test_narrow_storage_and_strided_layouts(engine, rng, dtype):
    src_dims = (2, 3, 4)
    desc = PreluBackwardDesc(md(*src_dims, dtype=dtype, strides="acb"), md(1, 4, dtype=dtype),
                             md(*src_dims, dtype=dtype), md(*src_dims, strides="bac"), md(1, 4, dtype=dtype))
    inputs = {name: np.round(a * 4) / 4 for name, a in _inputs(rng, src_dims, (1, 4)).items()}  # exact in both
    diff_src, diff_weights = await _run(engine, desc, inputs)
    want_src, want_weights = prelu_bwd.reference(inputs["src"], inputs["weights"], inputs["diff_dst"],
                                                 diff_weights_dtype=dtype)
    tolerance.check(diff_src, want_src, 0.0)
    tolerance.check(diff_weights, want_weights, 0.0)  # sums of 6 quarter products: exact


def test_defaults():
    desc = PreluBackwardDesc(md(2, 3), md(3, dtype="bf16"), md(2, 3))
    assert (desc.diff_src, desc.diff_weights) == (desc.src, desc.weights)


def test_errors_name_the_culprit():
    with pytest.raises(ArgumentMismatchError, match="weights dims"):
        PreluBackwardDesc(md(2, 3), md(2), md(2, 3))
    with pytest.raises(ArgumentMismatchError, match="diff_dst dims"):
        PreluBackwardDesc(md(2, 3), md(3), md(3, 2))
    with pytest.raises(ArgumentMismatchError, match="diff_src dims"):
        PreluBackwardDesc(md(2, 3), md(3), md(2, 3), md(6))
    with pytest.raises(ArgumentMismatchError, match="diff_weights dims"):
        PreluBackwardDesc(md(2, 3), md(3), md(2, 3), None, md(1, 3))
