"""MaxPoolBackward and AvgPoolBackward of oneDNN's Graph API: the graphs of benchdnn's CI set
(../shared/graphs/benchdnn/op/f32/{max,avg}pool_bwd.json, with the harness's attribute changes, cut
to small shapes) checked with benchdnn's verdict; and the ops' shapes, attributes, tie rule and the
src_shape input on small graphs written here."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _shared import GRAPHS, require

from triodnn import InvalidGraphError, ShapeInferenceError
from triodnn.graph import Graph, LogicalTensor, Op, Tensor
from triodnn.graph._op_schema import check_op
from triodnn.graph._shape_inference import infer_output_shapes
from triodnn.graph.ops.special import RECOGNISED_NOT_RUN
from triodnn.testing import reference, run_case

BENCHDNN = GRAPHS / "benchdnn" / "op" / "f32"


def _dense(shape):
    strides, step = [], 1
    for d in reversed(shape):
        strides.insert(0, step)
        step *= d
    return strides


def _small(document: dict, attrs: dict, shapes: list[list[int]]) -> dict:
    """The graph's op with ``attrs`` changed (as ``--op-attrs``) and its tensors, inputs then
    outputs, given ``shapes`` (dense)."""
    (op,) = document["graph"]
    for name, value in attrs.items():
        op["attrs"][name]["value"] = value
    for lt, shape in zip(op["inputs"] + op["outputs"], shapes):
        lt["shape"], lt["stride"] = shape, _dense(shape)
    return document


NXC_AVG = {"data_format": "NXC", "src_shape": [1, 8, 6, 4]}
# (graph, attribute changes, shapes, data type): the pool backward runs of
# op/harness_{f32,f16,bf16}_ci, then the graphs as written and exclude_pad set.
RUNS = [
    ("maxpool_bwd.json", {"auto_pad": "VALID", "kernel": [2, 2]}, [[1, 4, 8, 6], [1, 4, 4, 3], [1, 4, 8, 6]], None),
    ("avgpool_bwd.json", NXC_AVG, [[1, 4, 3, 4], [1, 8, 6, 4]], "f16"),
    ("avgpool_bwd.json", NXC_AVG, [[1, 4, 3, 4], [1, 8, 6, 4]], "bf16"),
    ("maxpool_bwd.json", {}, [[1, 4, 8, 6], [1, 4, 4, 3], [1, 4, 8, 6]], None),
    ("maxpool_bwd.json", {"data_format": "NXC"}, [[1, 8, 6, 4], [1, 4, 3, 4], [1, 8, 6, 4]], "bf16"),
    ("avgpool_bwd.json", {"src_shape": [1, 4, 8, 6]}, [[1, 4, 4, 3], [1, 4, 8, 6]], None),
    ("avgpool_bwd.json", {"src_shape": [1, 4, 8, 6], "exclude_pad": 1}, [[1, 4, 4, 3], [1, 4, 8, 6]], None),
    ("avgpool_bwd.json", {**NXC_AVG, "exclude_pad": 1}, [[1, 4, 3, 4], [1, 8, 6, 4]], "f16"),
]


@pytest.mark.parametrize(("case", "attrs", "shapes", "dt"), RUNS)
async def test_the_ci_graphs_pass_with_benchdnn_verdicts(engine, tmp_path, case, attrs, shapes, dt):
    require(BENCHDNN / case)
    path = tmp_path / case
    path.write_text(json.dumps(_small(json.loads((BENCHDNN / case).read_text()), attrs, shapes)))
    result = await run_case(path, engine=engine, dt=dt, expected_n_partitions=1)
    assert result.status == "PASSED", result.message


POOL = {"strides": [2, 2], "kernel": [3, 3], "pads_begin": [1, 1], "pads_end": [0, 0]}


def test_both_ops_run_now():
    assert "MaxPoolBackward" not in RECOGNISED_NOT_RUN and "AvgPoolBackward" not in RECOGNISED_NOT_RUN


def test_shapes_come_from_src_or_src_shape_and_diff_dst_must_be_the_pooled_one():
    assert infer_output_shapes("MaxPoolBackward", {**POOL, "data_format": "NCX"},
                               [[2, 3, 8, 6], [2, 3, 4, 3]]) == [(2, 3, 8, 6)]
    assert infer_output_shapes("AvgPoolBackward", {**POOL, "exclude_pad": False, "src_shape": [2, 8, 6, 3]},
                               [[2, 4, 3, 3]]) == [(2, 8, 6, 3)]  # NXC, the default
    with pytest.raises(ShapeInferenceError, match="MaxPoolBackward.*diff_dst shape"):
        infer_output_shapes("MaxPoolBackward", {**POOL, "data_format": "NCX"}, [[2, 3, 8, 6], [2, 3, 4, 4]])
    with pytest.raises(ShapeInferenceError, match="AvgPoolBackward.*src_shape attribute is not set"):
        infer_output_shapes("AvgPoolBackward", {**POOL, "exclude_pad": False}, [[2, 4, 3, 3]])


def test_attributes_are_onednns():
    a = check_op("MaxPoolBackward", POOL, 2, 1)
    assert a["dilations"] == [1, 1] and a["data_format"] == "NXC" and a["auto_pad"] == "None"
    with pytest.raises(InvalidGraphError, match="missing required attribute 'exclude_pad'"):
        check_op("AvgPoolBackward", POOL, 1, 1)
    with pytest.raises(InvalidGraphError, match="MaxPoolBackward: takes 2 inputs"):
        check_op("MaxPoolBackward", POOL, 1, 1)
    with pytest.raises(InvalidGraphError, match="'dilations'"):
        check_op("MaxPoolBackward", {**POOL, "dilations": [1, 1, 1]}, 2, 1)


def _lt(lt_id: int, shape, dtype: str = "f32") -> LogicalTensor:
    return LogicalTensor(lt_id, dtype, list(shape))


async def _run(engine, op: Op, arrays: dict[int, np.ndarray]) -> np.ndarray:
    g = Graph("cpu")
    g.add_op(op)
    (p,) = g.get_partitions()
    assert p.is_supported
    cp = await p.compile(engine)
    ins = [await Tensor.from_numpy(lt, engine, arrays[lt.id]) for lt in cp.inputs]
    (out,) = [Tensor(lt, engine) for lt in cp.outputs]
    await cp.execute(await engine.stream(), ins, [out])
    return await out.to_numpy()


async def test_max_ties_go_to_the_first_element_of_each_window(engine):
    attrs = {"strides": [1, 1], "kernel": [2, 2], "pads_begin": [0, 0], "pads_end": [0, 0], "data_format": "NCX"}
    op = Op(0, "MaxPoolBackward", [_lt(0, (1, 1, 4, 4)), _lt(1, (1, 1, 3, 3))], [_lt(2, (1, 1, 4, 4))], attrs)
    src, dd = np.ones((1, 1, 4, 4), np.float32), np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3)
    got = await _run(engine, op, {0: src, 1: dd})
    want = np.zeros((1, 1, 4, 4), np.float32)
    want[0, 0, :3, :3] = dd[0, 0]
    np.testing.assert_array_equal(got, want)
    (ref,) = reference("MaxPoolBackward", attrs, [src, dd], ["f32"])
    np.testing.assert_array_equal(ref, want)


async def test_avg_backward_takes_its_src_shape_from_either_place(engine, rng):
    attrs = {**POOL, "exclude_pad": True, "data_format": "NCX"}
    dd = rng.integers(-4, 5, (1, 2, 4, 3)).astype(np.float32)
    (want,) = reference("AvgPoolBackward", {**attrs, "src_shape": [1, 2, 8, 6]}, [dd], ["f32"])
    (from_input,) = reference("AvgPoolBackward", attrs, [dd, np.array([1, 2, 8, 6], np.int64)], ["f32"])
    np.testing.assert_array_equal(from_input, want)
    op = Op(0, "AvgPoolBackward", [_lt(0, dd.shape)], [_lt(1, (1, 2, 8, 6))], {**attrs, "src_shape": [1, 2, 8, 6]})
    got = await _run(engine, op, {0: dd})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # The corner element lies in one window (rows 0-1, cols 0-1 of it inside): 4 taps.
    assert want[0, 0, 0, 0] == pytest.approx(dd[0, 0, 0, 0] / 4)
