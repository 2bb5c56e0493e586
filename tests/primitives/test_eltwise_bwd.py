"""EltwiseBackwardDesc: every algorithm against the float64 reference with the registered
tolerance, on src and (where defined) on dst, the storage types, strided layouts, the values at the
non-differentiable points, and each error type."""

from __future__ import annotations

import numpy as np
import pytest

from triodnn import ArgumentMismatchError, EltwiseBackwardDesc, InvalidArgumentError, MemoryDesc
from triodnn._values._eltwise_bwd_desc import ELTWISE_BACKWARD_ALGORITHMS
from triodnn.kernels import eltwise_bwd, kind_of, tolerance

# Parameters each algorithm is tried with (None: the defaults).
PARAMS = {"clip": (-1.0, 1.5), "elu": (0.7, None), "hardsigmoid": (0.4, 0.5), "relu": (0.1, None),
          "soft_relu": (1.5, None)}
CASES = [(alg, use_dst) for alg, can in ELTWISE_BACKWARD_ALGORITHMS.items() for use_dst in (False, True)
         if can or not use_dst]


def md(*dims, dtype="f32", strides=None) -> MemoryDesc:
    return MemoryDesc(tuple(dims), dtype, strides)


def _inputs(rng, alg: str, use_dst: bool, dims):
    low = 0.05 if alg == "sqrt" else -3.0
    x = rng.uniform(low, 3.0, dims)
    if use_dst:  # a plausible forward dst
        x = {"sigmoid": 1 / (1 + np.exp(-x)), "tanh": np.tanh(x)}.get(alg, x)
    return x.astype(np.float32), rng.uniform(-2.0, 2.0, dims).astype(np.float32)


async def _run(engine, desc: EltwiseBackwardDesc, x: np.ndarray, dd: np.ndarray) -> np.ndarray:
    primitive = await engine.create_primitive(desc)
    args = {"src_or_dst": await engine.from_numpy(x, desc.src_or_dst),
            "diff_dst": await engine.from_numpy(dd, desc.diff_dst),
            "diff_src": engine.memory(desc.diff_src)}
    await (await engine.stream()).execute(primitive, args)
    return await args["diff_src"].to_numpy()


@pytest.mark.parametrize(("alg", "use_dst"), CASES)
async def test_each_algorithm_matches_the_reference(engine, rng, alg, use_dst):
    alpha, beta = PARAMS.get(alg, (None, None))
    kwargs = {k: v for k, v in (("alpha", alpha), ("beta", beta)) if v is not None}
    desc = EltwiseBackwardDesc(alg, md(3, 41), md(3, 41), use_dst=use_dst, **kwargs)
    x, dd = _inputs(rng, alg, use_dst, (3, 41))
    got = await _run(engine, desc, x, dd)
    registered = kind_of(desc)
    tolerance.check(got, registered.reference(desc, {"src_or_dst": x, "diff_dst": dd}), registered.tolerance(desc))


async def test_values_at_the_kinks_are_onednns(engine):
    """relu and elu take the negative branch at 0, abs gives 0, clip (clip_v2) nothing at a bound,
    hardswish the flat sides at its ends."""
    x = np.array([-3.0, -1.0, 0.0, 1.0, 3.0], np.float32)
    dd = np.full(5, 2.0, np.float32)
    # elu with alpha 0.5: its negative branch is 0.5 * e^x at 0 (1.0 after diff_dst's 2), not 2.
    want = {"relu": [0, 0, 0, 2, 2], "abs": [-2, -2, 0, 2, 2], "elu": [np.exp(-3), np.exp(-1), 1.0, 2, 2],
            "hardswish": [0, 2 * (-2 / 6 + 0.5), 1.0, 2 * (2 / 6 + 0.5), 2]}
    for alg, values in want.items():
        desc = EltwiseBackwardDesc(alg, md(5), md(5), **({"alpha": 0.5} if alg == "elu" else {}))
        np.testing.assert_allclose(await _run(engine, desc, x, dd), values, rtol=1e-6, err_msg=alg)
    clip = EltwiseBackwardDesc("clip", md(5), md(5), alpha=-1.0, beta=1.0)
    np.testing.assert_array_equal(await _run(engine, clip, x, dd), [0, 0, 2, 0, 0])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
async def test_narrow_storage_and_strided_layouts(engine, rng, dtype):
    src = md(2, 5, 7, dtype=dtype, strides="acb")
    diff_dst = md(2, 5, 7, dtype=dtype)
    desc = EltwiseBackwardDesc("gelu_erf", src, diff_dst, md(2, 5, 7, dtype="f32", strides="bac"))
    x, dd = (np.round(a * 4) / 4 for a in _inputs(rng, "gelu_erf", False, (2, 5, 7)))  # exact in both
    got = await _run(engine, desc, x.astype(np.float32), dd.astype(np.float32))
    want = eltwise_bwd.reference("gelu_erf", x, dd)
    tolerance.check(got, want, eltwise_bwd.threshold("gelu_erf"))


def test_defaults_and_the_output_desc():
    desc = EltwiseBackwardDesc("hardswish", md(4), md(4))
    assert (desc.alpha, desc.beta, desc.use_dst) == (pytest.approx(1 / 6), 0.5, False)
    assert desc.diff_src == desc.src_or_dst
    assert EltwiseBackwardDesc("soft_relu", md(4), md(4)).alpha == 1.0
    assert desc == EltwiseBackwardDesc("hardswish", md(4), md(4), alpha=1 / 6, beta=0.5)


def test_errors_name_the_culprit():
    with pytest.raises(InvalidArgumentError, match="eltwise backward"):
        EltwiseBackwardDesc("exp", md(4), md(4))
    with pytest.raises(InvalidArgumentError, match="gelu_erf backward needs the forward's src"):
        EltwiseBackwardDesc("gelu_erf", md(4), md(4), use_dst=True)
    with pytest.raises(InvalidArgumentError, match="relu backward with use_dst needs alpha >= 0"):
        EltwiseBackwardDesc("relu", md(4), md(4), alpha=-0.5, use_dst=True)
    with pytest.raises(ArgumentMismatchError, match="diff_dst dims"):
        EltwiseBackwardDesc("relu", md(4), md(5))
    with pytest.raises(ArgumentMismatchError, match="diff_src dims"):
        EltwiseBackwardDesc("relu", md(4), md(4), md(2, 2))
    with pytest.raises(InvalidArgumentError, match="clip needs alpha <= beta"):
        EltwiseBackwardDesc("clip", md(4), md(4), alpha=2.0, beta=1.0)
    with pytest.raises(InvalidArgumentError, match="soft_relu divides by alpha"):
        EltwiseBackwardDesc("soft_relu", md(4), md(4), alpha=0.0)
    with pytest.raises(InvalidArgumentError, match="use_dst must be a bool"):
        EltwiseBackwardDesc("relu", md(4), md(4), use_dst=1)
    with pytest.raises(ValueError, match="no eltwise backward algorithm"):
        eltwise_bwd.derivative("exp", np.zeros(2))
