"""BatchNormForwardTraining, BatchNormTrainingBackward and LayerNormBackward as graph ops: oneDNN's
CI graphs (../shared/graphs/benchdnn/op/f32/bnorm_fwd_d.json, bnorm_bwd.json, lnorm_bwd.json) cut to
small shapes, in both data formats, with and without gamma, in f32 and bf16, through the ``triodnn
graph`` driver with benchdnn's verdict; the schemas' pairings, shape inference, and the running
statistics' momentum against numbers worked by hand."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from _graph_helpers import graph_of, lt, run
from _shared import GRAPHS, require

from triodnn import InvalidGraphError, ShapeInferenceError
from triodnn.graph import Graph, LogicalTensor, Op, to_dict
from triodnn.graph._op_schema import check_op
from triodnn.graph._shape_inference import infer_output_shapes
from triodnn.testing import run_case
from triodnn.testing._reference import magnitudes

BENCHDNN = GRAPHS / "benchdnn" / "op" / "f32"

N, C, H, W = 2, 6, 5, 7


def _resized(document: dict, data_format: str | None) -> dict:
    """The graph with its data tensors cut to N x C x H x W (NCX) or N x H x W x C (NXC), the
    per-channel ones to [C]; LayerNorm's statistics to the data's leading dims."""
    document = copy.deepcopy(document)
    (op,) = document["graph"]
    if data_format is not None:
        op["attrs"]["data_format"]["value"] = data_format
    data = [N, C, H, W] if data_format != "NXC" else [N, H, W, C]
    strides = [data[1] * data[2] * data[3], data[2] * data[3], data[3], 1]
    for t in op["inputs"] + op["outputs"]:
        if len(t["shape"]) == 4:
            t["shape"], t["stride"] = data, strides
        elif len(t["shape"]) == 3:
            t["shape"], t["stride"] = data[:3], [data[1] * data[2], data[2], 1]
        else:
            t["shape"], t["stride"] = [C], [1]
    return document


def _without_gamma(document: dict) -> dict:
    """The BatchNorm graph without gamma/beta inputs (training) or without gamma and the parameter
    gradients (backward)."""
    (op,) = document["graph"]
    if op["kind"] == "BatchNormForwardTraining":
        op["inputs"] = op["inputs"][:3]
    else:
        op["inputs"], op["outputs"] = op["inputs"][:4], op["outputs"][:1]
    return document


def _affine_layer_norm(document: dict) -> dict:
    """lnorm_bwd.json with use_affine: gamma and beta in, diff_gamma and diff_beta out; the
    normalised dims the last two (begin_norm_axis -2, collapsed into one by the lowering)."""
    (op,) = document["graph"]
    op["attrs"]["use_affine"]["value"] = 1
    op["attrs"]["begin_norm_axis"]["value"] = -2
    for t in op["inputs"][2:4]:
        t["shape"], t["stride"] = [N, C], [C, 1]
    per_element = [{"id": 10 + i, "dtype": "f32", "shape": [H, W], "stride": [W, 1], "layout_type": "strided",
                    "property_type": "undef"} for i in range(4)]
    op["inputs"] += per_element[:2]
    op["outputs"] += per_element[2:]
    return document


def _load(name: str) -> dict:
    require(BENCHDNN / name)
    return json.loads((BENCHDNN / name).read_text())


CASES = [
    ("bnorm_fwd_d.json", "NXC", False, None),
    ("bnorm_fwd_d.json", "NCX", True, "bf16"),
    ("bnorm_bwd.json", "NXC", False, None),
    ("bnorm_bwd.json", "NCX", True, None),
    ("bnorm_bwd.json", "NXC", False, "bf16"),
    ("lnorm_bwd.json", None, False, None),
    ("lnorm_bwd.json", None, True, "f16"),
]


@pytest.mark.parametrize(("case", "data_format", "no_gamma", "dt"), CASES)
async def test_the_ci_graphs_pass_with_benchdnn_verdicts(engine, tmp_path, case, data_format, no_gamma, dt):
    document = _resized(_load(case), data_format)
    if case == "lnorm_bwd.json":
        document = _affine_layer_norm(document) if no_gamma else document  # here: the affine variant
    elif no_gamma:
        document = _without_gamma(document)
    path = tmp_path / case
    path.write_text(json.dumps(document))
    result = await run_case(path, engine=engine, dt=dt, expected_n_partitions=1)
    assert result.status == "PASSED", result.message


async def test_batch_norm_training_running_statistics_follow_momentum(engine):
    """NXC: channels last. running = momentum * old + (1 - momentum) * batch (oneDNN's backend)."""
    x = np.array([[[1, 0]], [[2, 0]], [[3, 4]], [[6, 4]]], np.float32)  # (N=4, X=1, C=2): means 3, 2
    op = Op(0, "BatchNormForwardTraining", [lt(0, [4, 1, 2]), lt(1, [2]), lt(2, [2])],
            [lt(3, [4, 1, 2]), lt(4, [2]), lt(5, [2]), lt(6, [2]), lt(7, [2])],
            {"epsilon": 0.0, "momentum": 0.25, "data_format": "NXC"})
    out = await run(engine, graph_of(op), {0: x, 1: np.array([1, 6], np.float32), 2: np.array([0.5, 8], np.float32)})
    np.testing.assert_allclose(out[6], [3, 2], rtol=1e-6)
    np.testing.assert_allclose(out[7], [3.5, 4], rtol=1e-6)
    np.testing.assert_allclose(out[4], [0.25 * 1 + 0.75 * 3, 0.25 * 6 + 0.75 * 2], rtol=1e-6)
    np.testing.assert_allclose(out[5], [0.25 * 0.5 + 0.75 * 3.5, 0.25 * 8 + 0.75 * 4], rtol=1e-6)
    want = (x - [3, 2]) / np.sqrt([3.5, 4])
    np.testing.assert_allclose(out[3], want, rtol=1e-6, atol=1e-6)


def test_shapes_follow_the_data_format_and_begin_norm_axis():
    nxc = {"epsilon": 1e-3, "data_format": "NXC"}
    assert [tuple(s) for s in infer_output_shapes("BatchNormForwardTraining", nxc, [[2, 5, 3], [3], [3]])] == [
        (2, 5, 3), (3,), (3,), (3,), (3,)]
    assert [tuple(s) for s in infer_output_shapes("BatchNormTrainingBackward", {"epsilon": 1e-3, "data_format": "NCX"},
                                                  [[2, 4, 3], [2, 4, 3], [4], [4], [4]], 3)] == [(2, 4, 3), (4,), (4,)]
    assert [tuple(s) for s in infer_output_shapes("LayerNormBackward", {"begin_norm_axis": 1},
                                                  [[2, 4, 3], [2, 4, 3], [2], [2], [4, 3], [4, 3]], 3)] == [
        (2, 4, 3), (4, 3), (4, 3)]
    with pytest.raises(ShapeInferenceError, match="mean shape"):
        infer_output_shapes("BatchNormTrainingBackward", {"epsilon": 1e-3}, [[2, 4, 3], [2, 4, 3], [4], [3]])
    with pytest.raises(ShapeInferenceError, match="diff_dst shape"):
        infer_output_shapes("LayerNormBackward", {}, [[2, 4], [2, 3], [2], [2]])


def test_optional_arguments_pair_as_onednn_says():
    with pytest.raises(InvalidGraphError, match="gamma and beta go together"):
        check_op("BatchNormForwardTraining", {"epsilon": 1e-3}, 4, 5)
    with pytest.raises(InvalidGraphError, match="diff_gamma and diff_beta go together"):
        check_op("BatchNormTrainingBackward", {"epsilon": 1e-3}, 5, 2)
    with pytest.raises(InvalidGraphError, match="use_affine=True needs gamma"):
        check_op("LayerNormBackward", {}, 4, 1)
    with pytest.raises(InvalidGraphError, match="epsilon"):
        check_op("BatchNormTrainingBackward", {}, 4, 1)  # required, as in oneDNN's op_def
    assert check_op("BatchNormForwardTraining", {"epsilon": 1e-3}, 3, 5)["momentum"] == 0.5


async def test_layer_norm_backward_gamma_gradient_is_measured_against_its_terms(engine, tmp_path):
    """diff_gamma sums dd * x_hat over every row (3072 here): cancellation leaves some sums far
    below their terms, and their f32 rounding was judged against the small result (3 of 128
    elements failed the check). GraphOp.magnitude gives the sums of |dd| * |x_hat| to judge by."""
    rows, c = (8, 384), 128
    tensor = lambda i, s: LogicalTensor(i, "f32", s)  # noqa: E731
    graph = Graph("cpu")
    graph.add_op(Op(0, "LayerNormBackward", [tensor(0, (*rows, c)), tensor(1, (*rows, c)), tensor(2, rows),
                                             tensor(3, rows), tensor(4, (c,)), tensor(5, (c,))],
                    [tensor(6, (*rows, c)), tensor(7, (c,)), tensor(8, (c,))], {}))
    graph.finalize()
    path = tmp_path / "layer_norm_backward.json"
    path.write_text(json.dumps(to_dict(graph)))
    result = await run_case(path, engine=engine)
    assert result.status == "PASSED", result.summary()
    assert [check.mismatches for check in result.checks] == [0, 0, 0]
    rng = np.random.default_rng(0)
    x, dd = rng.standard_normal((4, 8)), rng.standard_normal((4, 8))
    mean, var = x.mean(axis=1), x.var(axis=1)
    diff_src, gamma, beta = magnitudes("LayerNormBackward", {}, [x, dd, mean, var, np.ones(8)], 3)
    x_hat = (x - mean[:, None]) / np.sqrt(var[:, None] + 1e-5)
    assert diff_src is None
    np.testing.assert_allclose(gamma, np.abs(dd * x_hat).sum(axis=0))
    np.testing.assert_allclose(beta, np.abs(dd).sum(axis=0))
