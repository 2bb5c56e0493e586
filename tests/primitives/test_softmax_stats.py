"""Softmax's stats output (oneDNN Graph's SoftMax second output, the rows' log-sum-exp) and
``inf_as_zero``, on each code path, against the float64 references. ``shape`` runs each test with
the device's own kernel configuration and with the GPU one (vector width 1: the per-row scalar
path and the work-group per row path), set on the engine as tests/kernels/test_gpu_shaped_kernels.py
does."""

from __future__ import annotations

import numpy as np
import pytest

from triodnn import ArgumentMismatchError, InvalidArgumentError, MemoryDesc
from triodnn._values._softmax_desc import SoftmaxDesc
from triodnn.kernels import select_config, softmax, tolerance

# name: (dims, axis, src strides, stats strides). The row lengths pick the paths as in
# test_softmax.py: 37 scalar, 48 the float16 rows on a CPU (a work-group per row on a GPU).
CASES = {
    "scalar": ((5, 37), -1, None, None),
    "vector": ((6, 48), 1, None, None),
    "strided_axis": ((33, 7), 0, None, None),
    "nhwc_4d": ((2, 19, 3, 5), 1, "acdb", (15, 1, 5, 1)),
    "long_rows": ((3, 200), -1, None, (2, 1)),
}


@pytest.fixture(params=["device", "gpu_shaped"])
def shape(request, engine):
    if request.param == "gpu_shaped":
        engine._config = select_config("gpu", engine.info.max_work_group_size)
    return request.param


def _stats_desc(dims, axis, strides):
    stats_dims = tuple(1 if i == axis % len(dims) else d for i, d in enumerate(dims))
    return MemoryDesc(stats_dims, "f32", strides)


# The GPU configuration with softmax only: its work-group kernels are slow to build on a CPU
# device (about 5 s each, cold), and logsoftmax stores the stats with the same code.
@pytest.mark.parametrize("alg, shape", [("softmax", "device"), ("logsoftmax", "device"), ("softmax", "gpu_shaped")],
                         indirect=["shape"])
async def test_stats_on_every_path(alg, shape, engine, build, upload, rng):
    # On the GPU configuration one case per path: a row (19 < 32), a contiguous and a strided axis
    # over a work-group each.
    cases = {name: case for name, case in CASES.items()
             if shape == "device" or name in ("nhwc_4d", "long_rows", "strided_axis")}
    descs = {
        name: SoftmaxDesc(alg, MemoryDesc(dims, "f32", s), axis=axis, stats=_stats_desc(dims, axis, st))
        for name, (dims, axis, s, st) in cases.items()
    }
    prims = await build(descs)
    impls = {prim.impl.split(":")[1] for prim in prims.values()}
    gpu_config = shape == "gpu_shaped" or engine.kind == "gpu"  # the device's own, on a GPU
    assert impls == ({"row", "wg_row"} if gpu_config else {"row"}), impls
    stream = await engine.stream()
    for name, (dims, axis, s, _) in cases.items():
        desc = descs[name]
        assert tuple(desc.arg_descs) == ("src", "dst", "stats")
        x = rng.uniform(-20.0, 20.0, dims).astype(np.float32)
        src, dst, stats = await upload(x, s), engine.memory(desc.dst), engine.memory(desc.stats)
        await stream.execute(prims[name], {"src": src, "dst": dst, "stats": stats})
        threshold = tolerance.softmax(alg)
        tolerance.check(await dst.to_numpy(), softmax.reference(alg, x, axis=axis), threshold)
        got = await stats.to_numpy()
        assert got.shape == desc.stats.dims
        # The log-sum-exp is above 1 in magnitude here, so this is a relative check.
        tolerance.check(got, softmax.stats_reference(x, axis=axis), threshold)


async def test_inf_as_zero(shape, engine, build, upload, rng):
    """Rows of -inf only give zeros and a stats of -inf; without the mode they give NaN."""
    shapes = {"scalar": (4, 21), "vector": (4, 64)}
    descs = {}
    for name, dims in shapes.items():
        stats = MemoryDesc((dims[0], 1))
        descs[name] = SoftmaxDesc("softmax", MemoryDesc(dims), stats=stats, inf_as_zero=True)
        descs[name + "_plain"] = SoftmaxDesc("softmax", MemoryDesc(dims), stats=stats)
    prims = await build(descs)
    stream = await engine.stream()
    for name, desc in descs.items():
        dims = desc.src.dims
        x = rng.uniform(-4.0, 4.0, dims).astype(np.float32)
        x[1, :] = -np.inf              # masked entirely
        x[2, ::2] = -np.inf            # partly masked: an ordinary row
        dst, stats = engine.memory(desc.dst), engine.memory(desc.stats)
        await stream.execute(prims[name], {"src": await upload(x), "dst": dst, "stats": stats})
        got, got_stats = await dst.to_numpy(), await stats.to_numpy()
        want = softmax.reference("softmax", x, inf_as_zero=desc.inf_as_zero)
        want_stats = softmax.stats_reference(x, inf_as_zero=desc.inf_as_zero)
        tolerance.check(got, want, tolerance.SOFTMAX)
        tolerance.check(got_stats, want_stats, tolerance.SOFTMAX)
        if desc.inf_as_zero:
            assert np.all(got[1] == 0.0) and got_stats[1, 0] == -np.inf, name
            assert np.all(got[2, ::2] == 0.0) and abs(got[2].sum() - 1.0) < 1e-5, name
        else:
            assert np.all(np.isnan(got[1])) and np.isnan(got_stats[1, 0]), name


def test_stats_reference_is_the_log_sum_exp():
    x = np.array([[0.0, np.log(3.0)], [1000.0, 1000.0]], np.float32)
    np.testing.assert_allclose(softmax.stats_reference(x), [[np.log(4.0)], [1000.0 + np.log(2.0)]], rtol=1e-6)


def test_bad_arguments():
    src = MemoryDesc((4, 5))
    with pytest.raises(ArgumentMismatchError, match=r"stats dims \(4, 5\) must be src dims \(4, 5\) with axis 1 as 1"):
        SoftmaxDesc("softmax", src, stats=src)
    with pytest.raises(InvalidArgumentError, match="stats is tuple"):
        SoftmaxDesc("softmax", src, stats=(4, 1))
    with pytest.raises(InvalidArgumentError, match="inf_as_zero applies to softmax only"):
        SoftmaxDesc("logsoftmax", src, inf_as_zero=True)
    with pytest.raises(InvalidArgumentError, match="inf_as_zero must be a bool"):
        SoftmaxDesc("softmax", src, inf_as_zero=1)
    with pytest.raises(ValueError, match="no stats output"):
        softmax.desc_stats_reference(SoftmaxDesc("softmax", src), {"src": np.zeros((4, 5))})


def test_descriptors_differ_by_stats_and_mode():
    src = MemoryDesc((4, 5))
    plain = SoftmaxDesc("softmax", src)
    assert plain != SoftmaxDesc("softmax", src, stats=MemoryDesc((4, 1)))
    assert plain != SoftmaxDesc("softmax", src, inf_as_zero=True)
    assert tuple(plain.arg_descs) == ("src", "dst")
