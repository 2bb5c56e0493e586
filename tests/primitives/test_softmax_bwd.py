"""SoftmaxBackwardDesc: softmax and logsoftmax gradients against the float64 reference (and a
finite-difference check of the formulas), strided axes, narrow storage, and each error type."""

from __future__ import annotations

import numpy as np
import pytest

from triodnn import ArgumentMismatchError, InvalidArgumentError, MemoryDesc, SoftmaxBackwardDesc
from triodnn.kernels import kind_of, softmax, softmax_bwd, tolerance


def md(*dims, dtype="f32", strides=None) -> MemoryDesc:
    return MemoryDesc(tuple(dims), dtype, strides)


async def _run(engine, desc: SoftmaxBackwardDesc, dst: np.ndarray, dd: np.ndarray) -> np.ndarray:
    primitive = await engine.create_primitive(desc)
    args = {"dst": await engine.from_numpy(dst, desc.dst), "diff_dst": await engine.from_numpy(dd, desc.diff_dst),
            "diff_src": engine.memory(desc.diff_src)}
    await (await engine.stream()).execute(primitive, args)
    return await args["diff_src"].to_numpy()


def _forward(rng, alg: str, dims, axis: int):
    src = rng.uniform(-3.0, 3.0, dims).astype(np.float32)
    return softmax.reference(alg, src, axis=axis), rng.uniform(-2.0, 2.0, dims).astype(np.float32)


@pytest.mark.parametrize("alg", ["softmax", "logsoftmax"])
@pytest.mark.parametrize(("dims", "axis"), [((3, 37), 1), ((2, 9, 3, 4), 1), ((5, 6, 7), 0)])
async def test_matches_the_reference(engine, rng, alg, dims, axis):
    desc = SoftmaxBackwardDesc(alg, md(*dims), md(*dims), axis=axis)
    dst, dd = _forward(rng, alg, dims, axis)
    got = await _run(engine, desc, dst, dd)
    registered = kind_of(desc)
    tolerance.check(got, registered.reference(desc, {"dst": dst, "diff_dst": dd}), registered.tolerance(desc))


@pytest.mark.parametrize("alg", ["softmax", "logsoftmax"])
def test_reference_is_the_gradient_of_the_forward(rng, alg):
    """Central differences of sum(dd * alg(x)) agree with the reference's diff_src."""
    x = rng.uniform(-2.0, 2.0, (2, 5))
    dd = rng.uniform(-1.0, 1.0, (2, 5))

    def loss(values: np.ndarray) -> float:
        shifted = values - values.max(axis=1, keepdims=True)
        log_sm = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return float(np.sum(dd * (log_sm if alg == "logsoftmax" else np.exp(log_sm))))

    h = 1e-6
    numeric = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[index] = h
        numeric[index] = (loss(x + step) - loss(x - step)) / (2 * h)
    shifted = x - x.max(axis=1, keepdims=True)
    log_sm = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    dst = log_sm if alg == "logsoftmax" else np.exp(log_sm)
    got = softmax_bwd.reference(alg, dst.astype(np.float32), dd.astype(np.float32), axis=1)
    np.testing.assert_allclose(got, numeric, atol=1e-5)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
async def test_narrow_storage_and_strided_layouts(engine, rng, dtype):
    dims = (2, 6, 5)
    desc = SoftmaxBackwardDesc("softmax", md(*dims, dtype=dtype, strides="acb"), md(*dims, dtype=dtype),
                               md(*dims, strides="bac"), axis=-2)
    dst = (rng.integers(0, 9, dims) / 8).astype(np.float32)  # exact in both types
    dd = (rng.integers(-8, 9, dims) / 4).astype(np.float32)
    got = await _run(engine, desc, dst, dd)
    tolerance.check(got, softmax_bwd.reference("softmax", dst, dd, axis=1), softmax_bwd.threshold("softmax"))
    assert desc.axis == 1


def test_defaults():
    desc = SoftmaxBackwardDesc("logsoftmax", md(2, 3), md(2, 3, dtype="bf16"))
    assert (desc.axis, desc.diff_src) == (1, desc.diff_dst)
    assert desc == SoftmaxBackwardDesc("logsoftmax", md(2, 3), md(2, 3, dtype="bf16"), axis=1)


def test_errors_name_the_culprit():
    with pytest.raises(InvalidArgumentError, match="softmax"):
        SoftmaxBackwardDesc("softmin", md(4), md(4))
    with pytest.raises(ArgumentMismatchError, match="diff_dst dims"):
        SoftmaxBackwardDesc("softmax", md(4), md(5))
    with pytest.raises(ArgumentMismatchError, match="diff_src dims"):
        SoftmaxBackwardDesc("softmax", md(4), md(4), md(2, 2))
    with pytest.raises(InvalidArgumentError, match="axis"):
        SoftmaxBackwardDesc("softmax", md(4, 2), md(4, 2), axis=2)
    with pytest.raises(ValueError, match="unknown softmax algorithm"):
        softmax_bwd.reference("softmin", np.zeros(2), np.zeros(2))
