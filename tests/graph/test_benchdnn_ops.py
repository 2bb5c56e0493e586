"""The graph ops PReLU, SoftMax with stats, Interpolate and ConvTranspose end to end: oneDNN's
benchdnn CI graphs (../shared/graphs/benchdnn/op; see tests/_shared.py where absent) and small
graphs written here, through the ``triodnn graph`` driver (``run_case``) in correctness mode,
each one partition.

The driver checks them against its op-by-op float64 reference (``triodnn.testing._reference``,
built on the kernels' references) with the thresholds of ``triodnn.testing._filling``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _shared import GRAPHS, require

from triodnn import InvalidGraphError, ShapeInferenceError
from triodnn.graph import from_dict
from triodnn.graph._json import _attr_entry
from triodnn.graph._op_schema import check_op
from triodnn.graph._shape_inference import (
    conv_transpose_geometry,
    infer_output_shapes,
    prelu_slope_shape,
)
from triodnn.testing import run_case

BENCHDNN = GRAPHS / "benchdnn" / "op" / "f32"


@pytest.fixture
def driver():
    return run_case


def _tensor(lt_id: int, shape, dtype: str = "f32") -> dict:
    strides = [int(np.prod(shape[i + 1:])) for i in range(len(shape))]
    return {"id": lt_id, "dtype": dtype, "shape": list(shape), "stride": strides,
            "layout_type": "strided", "property_type": "undef"}


def _write_op(tmp_path: Path, kind: str, attrs: dict, inputs, outputs, dtype: str = "f32") -> Path:
    """A one-op graph file: ``inputs`` and ``outputs`` are shapes, numbered in that order."""
    tensors = [_tensor(i, shape, dtype) for i, shape in enumerate([*inputs, *outputs])]
    document = {"version": "3.0.0", "engine_kind": "cpu", "fpmath_mode": "strict", "graph": [{
        "id": 0, "name": kind.lower(), "kind": kind, "attrs": {k: _attr_entry(v) for k, v in attrs.items()},
        "inputs": tensors[:len(inputs)], "outputs": tensors[len(inputs):]}]}
    path = tmp_path / f"{kind.lower()}.json"
    path.write_text(json.dumps(document))
    return path


def _benchdnn(name: str) -> Path:
    path = BENCHDNN / name
    require(path)
    return path


async def _passes(driver, engine, path, **options):
    result = await driver(path, engine=engine, expected_n_partitions=1, **options)
    assert result.status == "PASSED", result.summary()
    assert len(result.partitions) == 1
    return result


# == PReLU ======================================================================================


async def test_benchdnn_prelu(driver, engine):
    result = await _passes(driver, engine, _benchdnn("prelu.json"))
    assert result.partitions == ("PReLU",)


@pytest.mark.parametrize("fmt, per_channel, src, slope", [
    ("NCX", True, (2, 5, 3, 4), (5,)),     # a 1-D slope on NCX's channel dim
    ("NXC", True, (2, 3, 4, 5), (5,)),     # ... on NXC's, the last
    ("NCX", False, (2, 5, 3, 4), (4,)),    # not per channel: the last dim
    ("NCX", True, (2, 5, 3, 4), (1,)),     # one slope for all
    ("NXC", False, (2, 3, 4, 5), (3, 1, 5)),  # n-D: numpy's right alignment
])
async def test_prelu_broadcasts(driver, engine, tmp_path, fmt, per_channel, src, slope):
    attrs = {"data_format": fmt, "per_channel_broadcast": per_channel}
    await _passes(driver, engine, _write_op(tmp_path, "PReLU", attrs, [src, slope], [src]))


@pytest.mark.parametrize("dt", ["f16", "bf16"])
async def test_prelu_low_precision(driver, engine, tmp_path, dt):
    path = _write_op(tmp_path, "PReLU", {"data_format": "NCX"}, [(2, 6, 5), (6,)], [(2, 6, 5)], dt)
    await _passes(driver, engine, path)


def test_prelu_shapes():
    ncx = {"data_format": "NCX"}
    assert infer_output_shapes("PReLU", ncx, [(2, 5, 3), (5,)]) == [(2, 5, 3)]
    assert prelu_slope_shape("PReLU", ncx, (2, 5, 3), (5,)) == (1, 5, 1)
    assert prelu_slope_shape("PReLU", {}, (2, 3, 5), (5,)) == (1, 1, 5)  # NXC, the default
    assert prelu_slope_shape("PReLU", {**ncx, "per_channel_broadcast": False}, (2, 5, 3), (3,)) == (1, 1, 3)
    with pytest.raises(ShapeInferenceError, match=r"PReLU: slope \[4\] must have the 5 channels"):
        infer_output_shapes("PReLU", ncx, [(2, 5, 3), (4,)])
    with pytest.raises(ShapeInferenceError, match=r"slope shape \[2, 3\] does not broadcast"):
        infer_output_shapes("PReLU", ncx, [(2, 5, 3), (2, 3)])
    with pytest.raises(ShapeInferenceError, match="more dims"):
        infer_output_shapes("PReLU", ncx, [(5, 3), (1, 5, 3)])


# == SoftMax with stats ===========================================================================


async def test_benchdnn_softmax_w_stats(driver, engine):
    # The file's [32, 16, 384, 384] (75M elements) at a size the suite affords; same rows of 384.
    result = await _passes(driver, engine, _benchdnn("softmax_w_stats.json"), in_shapes="1:2x3x4x384")
    assert sorted(c.id for c in result.checks) == [2, 3]  # dst and stats both compared


@pytest.mark.parametrize("axis, dt", [(1, "f32"), (-1, "f32"), (2, "bf16"), (-1, "f16")])
async def test_softmax_stats_axes(driver, engine, tmp_path, axis, dt):
    src = (2, 5, 7, 3)
    stats = tuple(1 if i == axis % 4 else d for i, d in enumerate(src))
    path = _write_op(tmp_path, "SoftMax", {"axis": axis, "mode": "inf_as_zero"}, [src], [src, stats], dt)
    result = await _passes(driver, engine, path)
    assert len(result.checks) == 2


# == Interpolate ==================================================================================


async def test_benchdnn_interpolate(driver, engine):
    result = await _passes(driver, engine, _benchdnn("interpolate.json"))
    assert result.partitions == ("Interpolate",)


@pytest.mark.parametrize("dt", ["f16", "bf16"])
async def test_benchdnn_interpolate_low_precision(driver, engine, tmp_path, dt):
    """harness_{f16,bf16}_ci: ``--dt=DT --op-attrs=0:mode:trilinear --case=op/f32/interpolate.json``."""
    document = json.loads(_benchdnn("interpolate.json").read_text())
    document["graph"][0]["attrs"]["mode"]["value"] = "trilinear"
    path = tmp_path / "interpolate_trilinear.json"
    path.write_text(json.dumps(document))
    await _passes(driver, engine, path, dt=dt)


@pytest.mark.parametrize("attrs, src, dst", [
    ({"mode": "nearest", "sizes": [6, 12], "data_format": "NCX"}, (2, 3, 7, 14), (2, 3, 6, 12)),
    ({"mode": "nearest", "scales": [2.0, 1.5]}, (1, 3, 5, 4), (1, 6, 7, 4)),  # NXC, the default
    ({"mode": "linear", "sizes": [9], "data_format": "NCX"}, (2, 3, 5), (2, 3, 9)),
    ({"mode": "bilinear", "scales": [0.5, 2.0], "data_format": "NXC"}, (1, 7, 4, 3), (1, 3, 8, 3)),
    ({"mode": "trilinear", "sizes": [3, 5, 2], "data_format": "NCX"}, (1, 2, 2, 3, 4), (1, 2, 3, 5, 2)),
    ({"mode": "bilinear", "sizes": [7, 9], "data_format": "NCX",
      "coordinate_transformation_mode": "align_corners"}, (1, 2, 4, 5), (1, 2, 7, 9)),
])
async def test_interpolate_modes(driver, engine, tmp_path, attrs, src, dst):
    assert infer_output_shapes("Interpolate", attrs, [src]) == [dst]
    await _passes(driver, engine, _write_op(tmp_path, "Interpolate", attrs, [src], [dst]))


def test_interpolate_shapes_and_attributes():
    ncx = {"mode": "linear", "data_format": "NCX"}
    # oneDNN's int64 *= float: 7 * 0.3f is 2.1000001, truncated to 2.
    assert infer_output_shapes("Interpolate", {**ncx, "scales": [0.3]}, [(1, 2, 7)]) == [(1, 2, 2)]
    assert infer_output_shapes("Interpolate", {**ncx, "sizes": [4, 4]}, [(1, 2, -1, 3)]) == [(1, 2, 4, 4)]
    with pytest.raises(InvalidGraphError, match="exactly one of the attributes 'sizes' and 'scales'"):
        check_op("Interpolate", {**ncx, "sizes": [4], "scales": [2.0]}, 1, 1)
    with pytest.raises(InvalidGraphError, match="exactly one of"):
        check_op("Interpolate", ncx, 1, 1)
    with pytest.raises(InvalidGraphError, match="'mode' value 'cubic'"):
        check_op("Interpolate", {**ncx, "mode": "cubic", "sizes": [4]}, 1, 1)
    with pytest.raises(ShapeInferenceError, match=r"sizes \[4\] has 1 entries for the 2 spatial dims"):
        infer_output_shapes("Interpolate", {**ncx, "sizes": [4]}, [(1, 2, 3, 3)])
    with pytest.raises(ShapeInferenceError, match="becomes 0"):
        infer_output_shapes("Interpolate", {**ncx, "scales": [0.1]}, [(1, 2, 3)])
    with pytest.raises(ShapeInferenceError, match="1 to 3 spatial dims"):
        infer_output_shapes("Interpolate", {**ncx, "sizes": [4]}, [(1, 2)])


async def test_interpolate_nearest_align_corners_is_unsupported(tmp_path):
    attrs = {"mode": "nearest", "sizes": [4], "data_format": "NCX", "coordinate_transformation_mode": "align_corners"}
    graph = from_dict(json.loads(_write_op(tmp_path, "Interpolate", attrs, [(1, 2, 3)], [(1, 2, 4)]).read_text()))
    partitions = graph.get_partitions()
    assert [p.is_supported for p in partitions] == [False]


# == ConvTranspose ================================================================================


async def test_benchdnn_deconv(driver, engine):
    """harness_f32_ci: ``--reset --case=op/f32/deconv.json`` (IOX weights, pads_end 41, 12 output_padding entries)."""
    result = await _passes(driver, engine, _benchdnn("deconv.json"))
    assert result.partitions == ("ConvTranspose",)


@pytest.mark.parametrize("dt", ["f16", "bf16"])
async def test_benchdnn_deconv_low_precision(driver, engine, dt):
    await _passes(driver, engine, _benchdnn("deconv.json"), dt=dt)


CONV_TRANSPOSE_BASE = {"strides": [2, 2], "pads_begin": [1, 0], "pads_end": [0, 1], "dilations": [1, 1]}


@pytest.mark.parametrize("attrs, shapes", [
    # NXC src, XOI weights (k, k, O/g, I): both defaults.
    ({}, [(1, 4, 5, 6), (3, 3, 5, 6)]),
    ({"data_format": "NCX", "weights_format": "IOX", "groups": 2}, [(2, 6, 4, 3), (6, 2, 3, 2)]),
    ({"data_format": "NCX", "weights_format": "OIX", "output_padding": [1, 0]}, [(1, 3, 4, 4), (2, 3, 3, 3), (2,)]),
    ({"data_format": "NXC", "weights_format": "XIO", "dilations": [2, 1]}, [(1, 4, 4, 3), (2, 3, 3, 5), (5,)]),
    ({"data_format": "NCX", "weights_format": "IOX", "auto_pad": "SAME_UPPER"}, [(1, 2, 5, 5), (2, 3, 3, 3)]),
    ({"data_format": "NCX", "weights_format": "IOX", "auto_pad": "VALID", "strides": [1, 3]}, [(1, 2, 3, 3), (2, 2, 2, 4)]),
])
async def test_conv_transpose_attributes(driver, engine, tmp_path, attrs, shapes):
    attrs = {**CONV_TRANSPOSE_BASE, **attrs}
    dst = infer_output_shapes("ConvTranspose", attrs, shapes)[0]
    await _passes(driver, engine, _write_op(tmp_path, "ConvTranspose", attrs, shapes, [dst]))


def test_conv_transpose_shapes():
    ncx = {**CONV_TRANSPOSE_BASE, "data_format": "NCX", "weights_format": "IOX", "pads_begin": [0, 0],
           "pads_end": [41, 41], "output_padding": [0] * 12}
    assert infer_output_shapes("ConvTranspose", ncx, [(1, 32, 28, 28), (32, 128, 3, 3)]) == [(1, 128, 16, 16)]
    # groups multiply the weights' O: (IC, OC/g, k).
    grouped = {**ncx, "pads_end": [0, 0], "groups": 4}
    assert infer_output_shapes("ConvTranspose", grouped, [(1, 8, 3, 3), (8, 5, 2, 2)]) == [(1, 20, 6, 6)]
    same = {**ncx, "auto_pad": "SAME_LOWER"}  # pads k - s = 1 in all, the odd one at the begin
    g = conv_transpose_geometry("ConvTranspose", same, (1, 2, 4, 4), (2, 2, 3, 3))
    assert (g.pads_begin, g.pads_end, g.out_spatial) == ((1, 1), (0, 0), (8, 8))
    with pytest.raises(ShapeInferenceError, match="must equal the weights' input channels 4"):
        infer_output_shapes("ConvTranspose", ncx, [(1, 3, 4, 4), (4, 2, 3, 3)])
    with pytest.raises(ShapeInferenceError, match="leave no output"):
        infer_output_shapes("ConvTranspose", ncx, [(1, 4, 2, 2), (4, 2, 3, 3)])
    with pytest.raises(ShapeInferenceError, match=r"bias \[3\] must be 1-D with the 2 output channels"):
        infer_output_shapes("ConvTranspose", {**ncx, "pads_end": [0, 0]}, [(1, 4, 2, 2), (4, 2, 3, 3), (3,)])
    with pytest.raises(ShapeInferenceError, match="needs dilations of 1"):
        infer_output_shapes("ConvTranspose", {**same, "dilations": [2, 2]}, [(1, 2, 4, 4), (2, 2, 3, 3)])
    with pytest.raises(ShapeInferenceError, match="fewer entries"):
        infer_output_shapes("ConvTranspose", {**ncx, "output_padding": [0]}, [(1, 4, 9, 9), (4, 2, 3, 3)])
    with pytest.raises(InvalidGraphError, match="'weights_format' value 'OXI'"):
        check_op("ConvTranspose", {**ncx, "weights_format": "OXI"}, 2, 1)
    with pytest.raises(InvalidGraphError, match="'dilations' \\[1\\] has 1 entries"):
        check_op("ConvTranspose", {**ncx, "dilations": [1]}, 2, 1)
