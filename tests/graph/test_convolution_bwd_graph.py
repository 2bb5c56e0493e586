"""The convolution backward ops of oneDNN's Graph API (ConvolutionBackwardData/Weights,
ConvTransposeBackwardData/Weights): the runs of benchdnn's op/harness_f32_ci with benchdnn's
verdict, each op against the adjoint identity of its forward op (strided, padded, dilated, grouped,
NXC and NCX, every weights format), low-precision storage, shape inference and the typed errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _graph_helpers import graph_of, lt, run
from _shared import GRAPHS, require

from triodnn import InvalidGraphError, ShapeInferenceError
from triodnn.graph import Op
from triodnn.graph._shape_inference import infer_output_shapes
from triodnn.kernels import convolution, deconvolution
from triodnn.testing import parse_harness, run_benchdnn

SHARED = GRAPHS / "benchdnn"
BWD_CASES = ("conv_bwd_d", "conv_bwd_w", "deconv_bwd_d", "deconv_bwd_w")


async def test_the_ci_runs_pass_with_benchdnn_verdicts(engine, monkeypatch):
    harness = SHARED / "op" / "harness_f32_ci"
    require(harness)
    monkeypatch.chdir(SHARED)
    runs = [r for r in parse_harness(harness) if any(Path(r.case).name.startswith(c) for c in BWD_CASES)]
    assert len(runs) == 4
    verdicts = [(await run_benchdnn(r, engine=engine)) for r in runs]
    assert [(v.status, v.message) for v in verdicts] == [("PASSED", v.message) for v in verdicts]


# Geometry of the forward op, oneDNN's attributes; spatial dims of the forward src (7, 6).
GEOMETRIES = {
    "strided_padded": {"strides": [2, 1], "pads_begin": [1, 0], "pads_end": [0, 1], "dilations": [1, 1], "groups": 1},
    "grouped_dilated": {"strides": [1, 2], "pads_begin": [0, 1], "pads_end": [1, 0], "dilations": [2, 1], "groups": 2},
}
# (data_format, Convolution weights_format, ConvTranspose weights_format)
LAYOUTS = [("NCX", "OIX", "IOX"), ("NXC", "XIO", "XOI")]


def _data(x: np.ndarray, fmt: str) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(x, 1, -1) if fmt == "NXC" else x)


def _from_data(x: np.ndarray, fmt: str) -> np.ndarray:
    return np.moveaxis(x, -1, 1) if fmt == "NXC" else x


def _weights(w: np.ndarray, fmt: str) -> np.ndarray:
    """(A, B, k...) -> the format's order: AB-first formats (OIX, IOX) as they are, X-first
    (XIO, XOI) as (k..., B, A)."""
    return np.ascontiguousarray(w if fmt in ("OIX", "IOX") else np.transpose(w, (2, 3, 1, 0)))


def _from_weights(w: np.ndarray, fmt: str) -> np.ndarray:
    return w if fmt in ("OIX", "IOX") else np.transpose(w, (3, 2, 0, 1))


async def _one_op(engine, kind, attrs, inputs, out_shape, dtype="f32"):
    op = Op(0, kind, [lt(i, a.shape, dtype) for i, a in enumerate(inputs)], [lt(9, out_shape, dtype)], attrs)
    out = await run(engine, graph_of(op), dict(enumerate(inputs)))
    return np.asarray(out[9], np.float64)


def _forward_geometry(geometry):
    return {"strides": tuple(geometry["strides"]), "padding_l": tuple(geometry["pads_begin"]),
            "padding_r": tuple(geometry["pads_end"]), "dilation": tuple(geometry["dilations"]),
            "groups": geometry["groups"]}


@pytest.mark.parametrize("layout", LAYOUTS, ids=["ncx", "nxc"])
@pytest.mark.parametrize("name", GEOMETRIES)
async def test_convolution_gradients_are_the_adjoints_of_convolution(engine, rng, name, layout):
    """<conv(x, w), dy> = <x, diff_src(dy, w)> = <w, diff_weights(x, dy)>."""
    geometry, (fmt, wfmt, _) = GEOMETRIES[name], layout
    g = geometry["groups"]
    x = rng.integers(-3, 4, (2, 4, 7, 6)).astype(np.float32)
    w = rng.integers(-3, 4, (6, 4 // g, 3, 2)).astype(np.float32)
    y = convolution.reference(x, w, **_forward_geometry(geometry)).astype(np.float64)
    dy = rng.integers(-3, 4, y.shape).astype(np.float32)
    attrs = {**geometry, "data_format": fmt, "weights_format": wfmt}
    dx = await _one_op(engine, "ConvolutionBackwardData", {**attrs, "dst_shape": list(_data(x, fmt).shape)},
                       [_data(dy, fmt), _weights(w, wfmt)], _data(x, fmt).shape)
    dw = await _one_op(engine, "ConvolutionBackwardWeights", {**attrs, "weights_shape": list(_weights(w, wfmt).shape)},
                       [_data(x, fmt), _data(dy, fmt)], _weights(w, wfmt).shape)
    want = float(np.sum(y * dy))
    assert float(np.sum(_from_data(dx, fmt) * x)) == want
    assert float(np.sum(_from_weights(dw, wfmt) * w)) == want


@pytest.mark.parametrize("layout", LAYOUTS, ids=["ncx", "nxc"])
@pytest.mark.parametrize("name", GEOMETRIES)
async def test_conv_transpose_gradients_are_the_adjoints_of_conv_transpose(engine, rng, name, layout):
    """<deconv(x, w), dz> = <x, diff_src(dz, w)> = <w, diff_weights(x, dz)>, w as (I, O/groups, k)."""
    geometry, (fmt, _, wfmt) = GEOMETRIES[name], layout
    g = geometry["groups"]
    x = rng.integers(-3, 4, (2, 4, 4, 3)).astype(np.float32)
    w = rng.integers(-3, 4, (4, 3, 3, 2)).astype(np.float32)
    z = deconvolution.reference(x, w, **_forward_geometry(geometry)).astype(np.float64)
    assert z.shape[1] == 3 * g
    dz = rng.integers(-3, 4, z.shape).astype(np.float32)
    attrs = {**geometry, "data_format": fmt, "weights_format": wfmt}
    dx = await _one_op(engine, "ConvTransposeBackwardData", attrs, [_data(dz, fmt), _weights(w, wfmt)],
                       _data(x, fmt).shape)
    dw = await _one_op(engine, "ConvTransposeBackwardWeights", {**attrs, "weights_shape": list(_weights(w, wfmt).shape)},
                       [_data(x, fmt), _data(dz, fmt)], _weights(w, wfmt).shape)
    want = float(np.sum(z * dz))
    assert float(np.sum(_from_data(dx, fmt) * x)) == want
    assert float(np.sum(_from_weights(dw, wfmt) * w)) == want


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
async def test_low_precision_storage_rounds_the_f32_sums_once(engine, rng, dtype):
    geometry = GEOMETRIES["strided_padded"]
    x = rng.integers(-2, 3, (1, 4, 7, 6)).astype(np.float32)
    w = rng.integers(-2, 3, (6, 4, 3, 2)).astype(np.float32)
    y = convolution.reference(x, w, **_forward_geometry(geometry))
    dy = rng.integers(-2, 3, y.shape).astype(np.float32)
    attrs = {**geometry, "data_format": "NCX", "weights_format": "OIX"}
    dx = await _one_op(engine, "ConvolutionBackwardData", {**attrs, "dst_shape": list(x.shape)}, [dy, w], x.shape,
                       dtype)
    want = deconvolution.reference(dy, w, strides=(2, 1), padding_l=(1, 0), padding_r=(0, 1), output_padding=(1, 0))
    np.testing.assert_allclose(dx, want, rtol=2.0**-7 if dtype == "bf16" else 2.0**-10)


def test_shape_inference_follows_onednns_rules():
    conv = {"strides": [2, 2], "pads_begin": [0, 0], "pads_end": [0, 0], "dilations": [1, 1],
            "data_format": "NXC", "weights_format": "OIX"}
    # diff_src from dst_shape; diff_weights from weights_shape; ConvTranspose diff_src by the
    # convolution's rule on diff_dst.
    assert infer_output_shapes("ConvolutionBackwardData", {**conv, "dst_shape": [1, 28, 28, 32]},
                               [[1, 14, 14, 128], [128, 32, 1, 1]]) == [(1, 28, 28, 32)]
    assert infer_output_shapes("ConvolutionBackwardWeights", {**conv, "weights_shape": [128, 32, 1, 1]},
                               [[1, 28, 28, 32], [1, 14, 14, 128]]) == [(128, 32, 1, 1)]
    deconv = {**conv, "data_format": "NCX", "weights_format": "IOX", "pads_end": [41, 41]}
    assert infer_output_shapes("ConvTransposeBackwardData", deconv,
                               [[1, 128, 16, 16], [32, 128, 3, 3]]) == [(1, 32, 28, 28)]
    # SAME_LOWER: oneDNN's forward auto_pad on diff_dst (16: pads 1+0), so diff_src is 8x8.
    assert infer_output_shapes("ConvTransposeBackwardData", {**deconv, "auto_pad": "SAME_LOWER"},
                               [[1, 128, 16, 16], [32, 128, 3, 3]]) == [(1, 32, 8, 8)]


def test_bad_graphs_raise_typed_errors():
    conv = {"strides": [1, 1], "pads_begin": [0, 0], "pads_end": [0, 0], "dilations": [1, 1],
            "data_format": "NCX", "weights_format": "OIX"}
    with pytest.raises(ShapeInferenceError, match="dst_shape"):
        infer_output_shapes("ConvolutionBackwardData", conv, [[1, 4, 3, 3], [4, 2, 3, 3]])
    with pytest.raises(ShapeInferenceError, match="weights_shape"):
        infer_output_shapes("ConvolutionBackwardWeights", conv, [[1, 2, 5, 5], [1, 4, 3, 3]])
    with pytest.raises(ShapeInferenceError, match="channels disagree"):
        infer_output_shapes("ConvolutionBackwardData", {**conv, "dst_shape": [1, 3, 5, 5]},
                            [[1, 4, 3, 3], [4, 2, 3, 3]])
    with pytest.raises(ShapeInferenceError, match="differs from"):
        infer_output_shapes("ConvolutionBackwardWeights", {**conv, "weights_shape": [4, 2, 3, 3]},
                            [[1, 2, 5, 5], [1, 4, 4, 4]])
    with pytest.raises(InvalidGraphError, match="weights_format"):
        infer_output_shapes("ConvTransposeBackwardData", {**conv, "weights_format": "OXI"},
                            [[1, 4, 3, 3], [2, 4, 3, 3]])
