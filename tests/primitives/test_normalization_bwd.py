"""Normalization for training as primitives: BatchNormTrainingDesc, BatchNormBackwardDesc and
LayerNormBackwardDesc against their float64 references, every output, on the device's own
configuration (one work-item per job) and the GPU's (a work-group per job, local-memory sums);
f32 and bf16 data, with and without the scale and shift arguments, an NHWC layout, and the
typed errors of bad descriptors."""

from __future__ import annotations

import numpy as np
import pytest

from triodnn import (
    ArgumentMismatchError,
    BatchNormBackwardDesc,
    BatchNormTrainingDesc,
    InvalidArgumentError,
    LayerNormBackwardDesc,
    MemoryDesc,
    UnsupportedError,
)
from triodnn._values._dtypes import from_storage, to_storage
from triodnn.kernels import normalization_bwd, select_config, tolerance

BF16 = 2.0**-7  # an ulp of bf16 relative: the reference rounds to bf16 too, the kernel may land a step off


def md(*dims, dtype="f32", strides=None) -> MemoryDesc:
    return MemoryDesc(tuple(dims), dtype, strides)


def nhwc(n, c, h, w, dtype="f32") -> MemoryDesc:
    """(N, C, H, W) dims over channels-last memory, as the graph lowering views NXC tensors."""
    return MemoryDesc((n, c, h, w), dtype, (h * w * c, 1, w * c, c))


def as_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    return from_storage(to_storage(np.asarray(x, np.float32), dtype), dtype)


@pytest.fixture(params=["device", "gpu"])
async def shaped_engine(request, engine):
    """The default engine with its own kernel configuration, or with the GPU's (a work-group per
    job) as tests/kernels/test_gpu_shaped_kernels.py sets it."""
    if request.param == "gpu":
        engine._config = select_config("gpu", engine.info.max_work_group_size)
    return engine


async def run(engine, desc, arrays: dict) -> dict[str, np.ndarray]:
    primitive = await engine.create_primitive(desc)
    memories = {name: await engine.from_numpy(arrays[name], md) if name in arrays else engine.memory(md)
                for name, md in desc.arg_descs.items()}
    await (await engine.stream()).execute(primitive, memories)
    return {name: await memories[name].to_numpy() for name in desc.output_names}


def check_all(got: dict, want: dict, threshold: float) -> None:
    assert set(got) <= set(want)
    for name, values in got.items():
        tolerance.check(values, want[name], threshold)


# (data type, scale and shift or not): each kernel is a PoCL build, so the pairs, not the product.
@pytest.mark.parametrize(("dtype", "affine"), [("f32", True), ("bf16", False)])
async def test_batch_training_writes_dst_and_every_statistic(shaped_engine, rng, dtype, affine):
    c = md(6)
    src = md(3, 6, 7, 5, dtype=dtype)
    params = dict(scale=c, shift=c) if affine else {}
    desc = BatchNormTrainingDesc(src, epsilon=0.01, momentum=0.25, mean=c, variance=c, running_mean=c,
                                 running_variance=c, running_mean_dst=c, running_variance_dst=c, **params)
    x = as_dtype(rng.normal(0.4, 1.2, src.dims), dtype)
    arrays = {"src": x, **{name: rng.uniform(0.5, 2.0, 6).astype(np.float32)
                           for name in ("scale", "shift", "running_mean", "running_variance")}}
    got = await run(shaped_engine, desc, arrays)
    assert set(got) == {"dst", "mean", "variance", "running_mean_dst", "running_variance_dst"}
    want = normalization_bwd.batch_training_reference(
        x, epsilon=0.01, momentum=0.25, running_mean=arrays["running_mean"],
        running_variance=arrays["running_variance"], **{k: arrays[k] for k in params})
    want["dst"] = normalization_bwd._dtype_io.store_reference(want["dst"], dtype)
    tolerance.check(got.pop("dst"), want["dst"], BF16 if dtype == "bf16" else normalization_bwd.TRAINING)
    check_all(got, want, normalization_bwd.TRAINING)


async def test_batch_training_momentum_blends_the_old_running_statistics(engine):
    """oneDNN Graph's rule: momentum * running + (1 - momentum) * batch."""
    c = md(2)
    desc = BatchNormTrainingDesc(md(4, 2), epsilon=0.0, momentum=0.75, running_mean=c, running_mean_dst=c,
                                 running_variance=c, running_variance_dst=c)
    x = np.array([[1, 0], [2, 0], [3, 4], [6, 4]], np.float32)  # means 3, 2; variances 3.5, 4
    got = await run(engine, desc, {"src": x, "running_mean": np.array([1, 6], np.float32),
                                   "running_variance": np.array([0.5, 8], np.float32)})
    np.testing.assert_allclose(got["running_mean_dst"], [0.75 * 1 + 0.25 * 3, 0.75 * 6 + 0.25 * 2], rtol=1e-6)
    np.testing.assert_allclose(got["running_variance_dst"], [0.75 * 0.5 + 0.25 * 3.5, 0.75 * 8 + 0.25 * 4],
                               rtol=1e-6)


def _stats(x: np.ndarray, axes) -> tuple[np.ndarray, np.ndarray]:
    x = x.astype(np.float64)
    return x.mean(axis=axes).astype(np.float32), x.var(axis=axes).astype(np.float32)


@pytest.mark.parametrize(("dtype", "affine", "layout"),
                         [("f32", True, "nchw"), ("bf16", False, "nhwc"), ("f32", True, "nhwc")])
async def test_batch_backward_gives_diff_src_and_the_parameter_gradients(shaped_engine, rng, dtype, affine, layout):
    dims = (2, 5, 6, 7)
    data = nhwc(*dims, dtype=dtype) if layout == "nhwc" else md(*dims, dtype=dtype)
    c = md(5)
    extra = dict(scale=c, diff_scale=c, diff_shift=c) if affine else {}
    desc = BatchNormBackwardDesc(data, data, c, c, epsilon=0.0625, **extra)
    x = as_dtype(rng.normal(0.3, 1.5, dims), dtype)
    dd = as_dtype(rng.normal(0.0, 1.0, dims), dtype)
    mean, variance = _stats(x, (0, 2, 3))
    arrays = {"src": x, "diff_dst": dd, "mean": mean, "variance": variance,
              "scale": rng.uniform(0.5, 2.0, 5).astype(np.float32)}
    got = await run(shaped_engine, desc, arrays)
    assert set(got) == ({"diff_src", "diff_scale", "diff_shift"} if affine else {"diff_src"})
    want = normalization_bwd.batch_backward_reference(x, dd, mean, variance, epsilon=0.0625,
                                                      scale=arrays["scale"] if affine else None)
    if dtype == "bf16":
        want["diff_src"] = normalization_bwd._dtype_io.store_reference(want["diff_src"], "bf16")
    tolerance.check(got.pop("diff_src"), want["diff_src"], BF16 if dtype == "bf16" else normalization_bwd.BACKWARD)
    check_all(got, want, normalization_bwd.BACKWARD)


# Rows of 40 (a work-group each on the GPU configuration) and short rows, many of them.
@pytest.mark.parametrize(("dtype", "affine", "dims"),
                         [("f32", True, (3, 4, 40)), ("bf16", False, (3, 4, 40)), ("f32", True, (37, 5))])
async def test_layer_backward_gives_diff_src_and_the_parameter_gradients(shaped_engine, rng, dtype, affine, dims):
    data, rows, c = md(*dims, dtype=dtype), md(*dims[:-1]), md(dims[-1])
    extra = dict(scale=c, diff_scale=c, diff_shift=c) if affine else {}
    desc = LayerNormBackwardDesc(data, data, rows, rows, epsilon=1e-3, **extra)
    x = as_dtype(rng.normal(0.3, 1.5, dims), dtype)
    dd = as_dtype(rng.normal(0.0, 1.0, dims), dtype)
    mean, variance = _stats(x, -1)
    arrays = {"src": x, "diff_dst": dd, "mean": mean, "variance": variance,
              "scale": rng.uniform(0.5, 2.0, dims[-1]).astype(np.float32)}
    got = await run(shaped_engine, desc, arrays)
    assert set(got) == ({"diff_src", "diff_scale", "diff_shift"} if affine else {"diff_src"})
    want = normalization_bwd.layer_backward_reference(x, dd, mean, variance, epsilon=1e-3,
                                                      scale=arrays["scale"] if affine else None)
    if dtype == "bf16":
        want["diff_src"] = normalization_bwd._dtype_io.store_reference(want["diff_src"], "bf16")
    tolerance.check(got.pop("diff_src"), want["diff_src"], BF16 if dtype == "bf16" else normalization_bwd.BACKWARD)
    check_all(got, want, normalization_bwd.BACKWARD)


def test_the_gpu_configuration_takes_a_work_group_per_job():
    gpu, cpu = select_config("gpu", 256), select_config("cpu", 4096)
    desc = BatchNormBackwardDesc(md(2, 5, 6, 7), md(2, 5, 6, 7), md(5), md(5))
    assert normalization_bwd.generate_batch_backward(desc, gpu).impl.startswith("ocl:wg_job:l")
    assert normalization_bwd.generate_batch_backward(desc, cpu).impl.startswith("ocl:job:")
    short = LayerNormBackwardDesc(md(37, 5), md(37, 5), md(37), md(37))
    assert normalization_bwd.generate_layer_backward(short, gpu).impl.startswith("ocl:job:")


def test_bad_descriptors_raise_typed_errors_naming_the_argument():
    with pytest.raises(ArgumentMismatchError, match="mean dims"):
        BatchNormBackwardDesc(md(2, 5, 3), md(2, 5, 3), md(4), md(5))
    with pytest.raises(ArgumentMismatchError, match="diff_dst dims"):
        LayerNormBackwardDesc(md(2, 5), md(2, 4), md(2), md(2))
    with pytest.raises(ArgumentMismatchError, match="variance dims"):
        LayerNormBackwardDesc(md(2, 5), md(2, 5), md(2), md(5))
    with pytest.raises(InvalidArgumentError, match="running_mean is given without running_mean_dst"):
        BatchNormTrainingDesc(md(2, 3), running_mean=md(3))
    with pytest.raises(InvalidArgumentError, match="src dims"):
        BatchNormTrainingDesc(md(6))
    with pytest.raises(InvalidArgumentError, match="epsilon"):
        BatchNormTrainingDesc(md(2, 3), epsilon=-1.0)
    with pytest.raises(InvalidArgumentError, match="src is"):
        LayerNormBackwardDesc("src", md(2, 5), md(2), md(2))


async def test_statistics_of_another_type_than_f32_are_refused(engine):
    desc = BatchNormBackwardDesc(md(2, 3, 4), md(2, 3, 4), md(3, dtype="bf16"), md(3))
    with pytest.raises(UnsupportedError, match="mean has dtype 'bf16'"):
        await engine.create_primitive(desc)
