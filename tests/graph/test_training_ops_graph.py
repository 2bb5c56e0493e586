"""SoftMaxBackward, LogSoftmaxBackward, PReLUBackward and InterpolateBackward through the
graph API: the runs of benchdnn's CI set (../shared/graphs/benchdnn/op/f32, their shapes cut
down, the harness's op attributes and data types applied) with benchdnn's verdict through
``run_case``; and the ops' defaults, slope placement, layouts and errors on small graphs written
here, checked against numpy."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _shared import GRAPHS, require

from triodnn import InvalidGraphError, ShapeInferenceError
from triodnn.graph import Graph, LogicalTensor, Op, Tensor
from triodnn.graph._shape_inference import infer_output_shapes
from triodnn.testing import run_case

BENCHDNN = GRAPHS / "benchdnn" / "op" / "f32"

# (graph, op attributes set as the harness's --op-attrs, data type, shapes by tensor id or None):
# every run of these kinds in op/harness_{f32,f16,bf16}_ci.
SMALL_SOFTMAX = {i: [2, 16, 3, 4] for i in range(3)}
CI_RUNS = [
    ("softmax_bwd.json", {}, None, SMALL_SOFTMAX),
    ("logsoftmax_bwd.json", {}, None, SMALL_SOFTMAX),
    ("prelu_bwd.json", {"data_format": "NXC"}, "f16", None),
    ("prelu_bwd.json", {"data_format": "NXC"}, "bf16", None),
    ("interpolate_bwd.json", {"mode": "linear"}, None, None),
]


def _edited(document: dict, attrs: dict, shapes: dict | None) -> dict:
    for op in document["graph"]:
        for name, value in attrs.items():
            op["attrs"][name]["value"] = value
        for t in op["inputs"] + op["outputs"]:
            if shapes is not None and t["id"] in shapes:
                t["shape"] = shapes[t["id"]]
                t["stride"] = [int(np.prod(t["shape"][i + 1:])) for i in range(len(t["shape"]))]
    return document


@pytest.mark.parametrize(("case", "attrs", "dt", "shapes"), CI_RUNS)
async def test_the_ci_runs_pass_with_benchdnn_verdicts(engine, tmp_path, case, attrs, dt, shapes):
    require(BENCHDNN / case)
    path = tmp_path / case
    path.write_text(json.dumps(_edited(json.loads((BENCHDNN / case).read_text()), attrs, shapes)))
    result = await run_case(path, engine=engine, dt=dt, expected_n_partitions=1)
    assert result.status == "PASSED", result.message


def _lt(lt_id: int, shape, dtype: str = "f32") -> LogicalTensor:
    return LogicalTensor(lt_id, dtype, list(shape))


async def _run_op(engine, op: Op, arrays: dict[int, np.ndarray]) -> list[np.ndarray]:
    g = Graph("cpu")
    g.add_op(op)
    (p,) = g.get_partitions()
    assert p.is_supported
    cp = await p.compile(engine)
    ins = [await Tensor.from_numpy(lt, engine, arrays[lt.id]) for lt in cp.inputs]
    outs = [Tensor(lt, engine) for lt in cp.outputs]
    await cp.execute(await engine.stream(), ins, outs)
    return [await out.to_numpy() for out in outs]


@pytest.mark.parametrize("kind", ["SoftMaxBackward", "LogSoftmaxBackward"])
async def test_softmax_backward_on_the_default_axis(engine, rng, kind):
    """SoftMaxBackward's axis defaults to 1, LogSoftmaxBackward's to -1 (oneDNN's op_def);
    input 0 is diff_dst, input 1 dst."""
    shape = (2, 5, 3)
    dd = rng.uniform(-1, 1, shape).astype(np.float32)
    dst = rng.uniform(0, 1, shape).astype(np.float32)
    (got,) = await _run_op(engine, Op(0, kind, [_lt(0, shape), _lt(1, shape)], [_lt(2, shape)]), {0: dd, 1: dst})
    d, y = dd.astype(np.float64), dst.astype(np.float64)
    if kind == "SoftMaxBackward":
        want = y * (d - np.sum(d * y, axis=1, keepdims=True))
    else:
        want = d - np.exp(y) * np.sum(d, axis=-1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("data_format", "dtype"), [("NCX", "f32"), ("NXC", "bf16")])
async def test_prelu_backward_sums_a_per_channel_slope_gradient(engine, rng, data_format, dtype):
    shape = (2, 3, 4) if data_format == "NCX" else (2, 4, 3)
    channel = 1 if data_format == "NCX" else -1
    x = rng.integers(-4, 5, shape).astype(np.float32)
    slope = np.array([0.5, -1.0, 2.0], np.float32)
    dd = rng.integers(-4, 5, shape).astype(np.float32)
    op = Op(0, "PReLUBackward", [_lt(0, shape, dtype), _lt(1, (3,), dtype), _lt(2, shape, dtype)],
            [_lt(3, shape, dtype), _lt(4, (3,), dtype)], {"data_format": data_format})
    diff_src, diff_slope = await _run_op(engine, op, {0: x, 1: slope, 2: dd})
    placed = slope.reshape((1, 3, 1) if data_format == "NCX" else (1, 1, 3))
    np.testing.assert_array_equal(diff_src, np.where(x > 0, dd, placed * dd))
    axes = tuple(i for i in range(3) if i != channel % 3)
    np.testing.assert_array_equal(diff_slope, np.sum(np.where(x > 0, 0.0, dd * x), axis=axes))


@pytest.mark.parametrize(("data_format", "shape", "dtype"), [
    ("NXC", (2, 3, 4, 5), "f32"), ("NCX", (2, 3, 4, 5), "f32"), ("NXC", (7, 6), "bf16"), ("NCX", (4, 8, 16), "f16")])
async def test_bias_add_backward_sums_all_but_the_channels(engine, rng, data_format, shape, dtype):
    """BiasAdd's gradient: output_delta summed over the batch and spatial axes, one value per channel."""
    channel = 1 if data_format == "NCX" else len(shape) - 1
    dd = rng.integers(-4, 5, shape).astype(np.float32)
    op = Op(0, "BiasAddBackward", [_lt(0, shape, dtype)], [_lt(1, (shape[channel],), dtype)],
            {"data_format": data_format})
    (got,) = await _run_op(engine, op, {0: dd})
    np.testing.assert_array_equal(got, dd.sum(axis=tuple(i for i in range(len(shape)) if i != channel)))


async def test_interpolate_backward_nearest_nxc_with_a_sizes_input(engine, rng):
    """Nearest 2x upsampling: each diff_src element sums its 2x2 block of diff_dst; the sizes
    input is accepted (diff_dst's shape says the same)."""
    dd = rng.integers(-4, 5, (1, 4, 6, 3)).astype(np.float32)  # NXC
    op = Op(0, "InterpolateBackward", [_lt(0, (1, 2, 3, 3)), _lt(1, dd.shape), _lt(2, (2,), "s32")],
            [_lt(3, (1, 2, 3, 3))], {"mode": "nearest", "sizes": [4, 6], "data_format": "NXC"})
    (got,) = await _run_op(engine, op, {0: np.zeros((1, 2, 3, 3), np.float32), 1: dd,
                                        2: np.array([4, 6], np.int32)})
    np.testing.assert_array_equal(got, dd.reshape(1, 2, 2, 3, 2, 3).sum(axis=(2, 4)))


def test_output_shapes():
    assert infer_output_shapes("SoftMaxBackward", {}, [[2, 3], [2, 3]]) == [(2, 3)]
    assert infer_output_shapes("BiasAddBackward", {}, [[2, 3, 5]]) == [(5,)]
    assert infer_output_shapes("BiasAddBackward", {"data_format": "NCX"}, [[2, 3, 5]]) == [(3,)]
    with pytest.raises(ShapeInferenceError, match=r"BiasAddBackward.*output_delta \[4\] needs at least 2 dims"):
        infer_output_shapes("BiasAddBackward", {}, [[4]])
    assert infer_output_shapes("PReLUBackward", {"data_format": "NCX"}, [[2, 3, 4], [3], [2, 3, 4]], 2) == [
        (2, 3, 4), (3,)]
    assert infer_output_shapes("InterpolateBackward", {"mode": "linear", "scales": [2.0], "data_format": "NCX"},
                               [[1, 2, 3], [1, 2, 6]]) == [(1, 2, 3)]
    # As oneDNN: diff_dst's spatial dims are read, whatever sizes or scales give src.
    assert infer_output_shapes("InterpolateBackward", {"mode": "linear", "sizes": [4], "data_format": "NCX"},
                               [[1, 2, 3], [1, 2, 5]]) == [(1, 2, 3)]
    assert infer_output_shapes("InterpolateBackward", {"mode": "linear", "scales": [1.7], "data_format": "NXC"},
                               [[1, 3, 2], [1, 6, 2]]) == [(1, 3, 2)]


def test_bad_graphs_raise_typed_errors():
    with pytest.raises(ShapeInferenceError, match="SoftMaxBackward.*diff_dst"):
        infer_output_shapes("SoftMaxBackward", {}, [[2, 3], [3, 2]])
    with pytest.raises(ShapeInferenceError, match="LogSoftmaxBackward"):
        infer_output_shapes("LogSoftmaxBackward", {"axis": 2}, [[2, 3], [2, 3]])
    with pytest.raises(ShapeInferenceError, match="PReLUBackward.*slope"):
        infer_output_shapes("PReLUBackward", {"data_format": "NCX"}, [[2, 3, 4], [5], [2, 3, 4]], 2)
    with pytest.raises(ShapeInferenceError, match="PReLUBackward.*diff_dst"):
        infer_output_shapes("PReLUBackward", {}, [[2, 3, 4], [4], [2, 3, 5]], 2)
    with pytest.raises(ShapeInferenceError, match="InterpolateBackward.*diff_dst"):
        infer_output_shapes("InterpolateBackward", {"mode": "linear", "sizes": [4], "data_format": "NCX"},
                            [[1, 2, 3], [1, 3, 4]])
    with pytest.raises(ShapeInferenceError, match="InterpolateBackward.*sizes"):
        infer_output_shapes("InterpolateBackward", {"mode": "linear", "sizes": [4, 4], "data_format": "NCX"},
                            [[1, 2, 3], [1, 2, 4]])
    with pytest.raises(InvalidGraphError, match="exactly one of the attributes 'sizes' and 'scales'"):
        infer_output_shapes("InterpolateBackward", {"mode": "linear"}, [[1, 2, 3], [1, 2, 6]])


def test_nearest_align_corners_backward_is_an_unsupported_partition():
    g = Graph("cpu")
    g.add_op(Op(0, "InterpolateBackward", [_lt(0, (1, 1, 4)), _lt(1, (1, 1, 8))], [_lt(2, (1, 1, 4))],
                {"mode": "nearest", "sizes": [8], "coordinate_transformation_mode": "align_corners",
                 "data_format": "NCX"}))
    (p,) = g.get_partitions()
    assert not p.is_supported
