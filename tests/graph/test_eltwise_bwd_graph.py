"""The eltwise backward ops of oneDNN's Graph API through the ``triodnn graph`` driver
(``run_case``): the graphs of benchdnn's CI set (../shared/graphs/benchdnn/op/f32/*_bwd.json, the
op kind swapped as the harness's ``--op-kind`` does), checked with benchdnn's verdict; and the
ops' shapes, attributes and lowering on small graphs written here."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _shared import GRAPHS, require

from triodnn import InvalidGraphError, ShapeInferenceError
from triodnn.graph import Graph, LogicalTensor, Op, Tensor
from triodnn.graph._shape_inference import infer_output_shapes
from triodnn.graph.ops.eltwise import ELTWISE_BACKWARD_KINDS, eltwise_backward_parameters
from triodnn.testing import run_case

BENCHDNN = GRAPHS / "benchdnn" / "op" / "f32"

# (graph, op kind it is run as, data type): the eltwise backward runs of op/harness_{f32,f16,bf16}_ci.
CI_RUNS = [
    ("elu_bwd.json", None, None),
    ("hardsigmoid_bwd.json", None, None),
    ("relu_bwd.json", "ReLUBackward", None),
    ("relu_bwd.json", "SigmoidBackward", None),
    ("relu_bwd.json", "SqrtBackward", None),
    ("relu_bwd.json", "TanhBackward", None),
    ("abs_bwd.json", "AbsBackward", "f16"),
    ("abs_bwd.json", "GELUBackward", "bf16"),
    ("abs_bwd.json", "MishBackward", "f16"),
    ("clamp_bwd.json", None, "bf16"),
]


def _small(document: dict, kind: str | None) -> dict:
    """The graph with its op run as ``kind`` and its tensors cut to 1x4x5x6 (the CI shapes add
    compile-free seconds on 2 cores and nothing to coverage)."""
    for op in document["graph"]:
        if kind is not None:
            op["kind"] = kind
        for lt in op["inputs"] + op["outputs"]:
            lt["shape"], lt["stride"] = [1, 4, 5, 6], [120, 30, 6, 1]
    return document


@pytest.mark.parametrize(("case", "kind", "dt"), CI_RUNS)
async def test_the_ci_graphs_pass_with_benchdnn_verdicts(engine, tmp_path, case, kind, dt):
    require(BENCHDNN / case)
    path = tmp_path / case
    path.write_text(json.dumps(_small(json.loads((BENCHDNN / case).read_text()), kind)))
    result = await run_case(path, engine=engine, dt=dt, expected_n_partitions=1)
    assert result.status == "PASSED", result.message


def test_every_eltwise_backward_op_of_onednn_has_a_schema():
    assert ELTWISE_BACKWARD_KINDS == {
        "AbsBackward", "ClampBackward", "EluBackward", "GELUBackward", "HardSigmoidBackward",
        "HardSwishBackward", "MishBackward", "ReLUBackward", "SigmoidBackward", "SoftPlusBackward",
        "SqrtBackward", "TanhBackward"}


def test_parameters_follow_the_attributes():
    assert eltwise_backward_parameters("ClampBackward", {"min": -1.0, "max": 2.0, "use_dst": True}) == (
        "clip", -1.0, 2.0, True)
    assert eltwise_backward_parameters("GELUBackward", {"mode": "gelu_tanh"}) == ("gelu_tanh", None, None, False)
    assert eltwise_backward_parameters("SoftPlusBackward", {"beta": 2.0}) == ("soft_relu", 2.0, None, False)
    assert eltwise_backward_parameters("TanhBackward", {"use_dst": False}) == ("tanh", None, None, False)
    with pytest.raises(InvalidGraphError, match="Tanh is not an eltwise backward op"):
        eltwise_backward_parameters("Tanh", {})


def test_diff_src_is_shaped_like_src_and_diff_dst_must_match():
    assert [tuple(s) for s in infer_output_shapes("TanhBackward", {}, [[2, 3], [2, 3]])] == [(2, 3)]
    with pytest.raises(ShapeInferenceError, match="TanhBackward.*diff_dst"):
        infer_output_shapes("TanhBackward", {}, [[2, 3], [3, 2]])


def _lt(lt_id: int, shape) -> LogicalTensor:
    return LogicalTensor(lt_id, "f32", list(shape))


async def _run_one_op(engine, kind: str, attrs: dict, x: np.ndarray, dd: np.ndarray) -> np.ndarray:
    g = Graph("cpu")
    g.add_op(Op(0, kind, [_lt(0, x.shape), _lt(1, x.shape)], [_lt(2, x.shape)], attrs))
    (p,) = g.get_partitions()
    assert p.is_supported
    cp = await p.compile(engine)
    ins = [await Tensor.from_numpy(lt, engine, {0: x, 1: dd}[lt.id]) for lt in cp.inputs]
    (out,) = [Tensor(lt, engine) for lt in cp.outputs]
    await cp.execute(await engine.stream(), ins, [out])
    return await out.to_numpy()


async def test_clamp_backward_on_dst_passes_the_gradient_strictly_inside_the_bounds(engine):
    """use_dst (the default): dst at a bound was clipped, so nothing flows there (clip_v2)."""
    x = np.array([-2.0, -1.0, -0.5, 0.0, 1.5, 2.0, 3.0], np.float32)
    dd = np.arange(1, 8, dtype=np.float32)
    got = await _run_one_op(engine, "ClampBackward", {"min": -1.0, "max": 2.0}, x, dd)
    np.testing.assert_array_equal(got, [0, 0, 3, 4, 5, 0, 0])


async def test_tanh_backward_takes_src_or_dst_by_use_dst(engine, rng):
    x = rng.uniform(-2, 2, (3, 8)).astype(np.float32)
    dd = rng.uniform(-2, 2, (3, 8)).astype(np.float32)
    on_src = await _run_one_op(engine, "TanhBackward", {"use_dst": False}, x, dd)
    np.testing.assert_allclose(on_src, dd * (1 - np.tanh(x.astype(np.float64)) ** 2), rtol=1e-5, atol=1e-6)
    y = np.tanh(x)
    on_dst = await _run_one_op(engine, "TanhBackward", {}, y, dd)  # use_dst defaults to true
    np.testing.assert_allclose(on_dst, dd * (1 - y.astype(np.float64) ** 2), rtol=1e-5, atol=1e-6)
