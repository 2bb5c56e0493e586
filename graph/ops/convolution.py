"""Convolution and ConvTranspose, and the four convolution backward ops of training.

The schema, shape rule, lowering and numpy reference of each kind, registered in
``triodnn.graph._op_registry`` (see there)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from ..._values import (
    ConvolutionBackwardWeightsDesc,
    ConvolutionDesc,
    DeconvolutionDesc,
)
from ..._values._deconvolution_desc import deconv_out_size
from ...kernels import convolution as kernel_convolution
from ...kernels import convolution_bwd_weights as kernel_convolution_bwd_weights
from ...kernels import deconvolution as kernel_deconvolution
from .._logical_tensor import known_shape
from .._lowering import (
    Builder,
    View,
    channels_first,
    explicit_pads,
    permuted,
    weights_oix,
)
from .._op import Op
from .._op_registry import GraphOp, Numbers, any_op, numbered, of_absolute_inputs, register
from .._op_schema import (
    AUTO_PADS,
    CONV_TRANSPOSE_WEIGHTS_FORMATS,
    CONV_WEIGHTS_FORMATS,
    AttrSpec,
    OpSchema,
    accumulation_mode_attr,
    attr_map,
    check_spatial_attrs,
    data_format_attr,
)
from .._shape_inference import (
    UNKNOWN,
    Shape,
    conv_backward_geometry,
    conv_transpose_geometry,
    conv_transpose_weights_order,
    fmt_shape,
    ncx_to_nxc,
    one_output,
    shape_error,
    spatial_geometry,
)
from ._float64 import f64

_CONV_ATTRS = [
    AttrSpec("strides", "s64[]", required=True, minimum=1),
    AttrSpec("pads_begin", "s64[]", required=True, minimum=0),
    AttrSpec("pads_end", "s64[]", required=True, minimum=0),
    AttrSpec("dilations", "s64[]", required=True, minimum=1),
    AttrSpec("auto_pad", "string", default="None", choices=AUTO_PADS),
    AttrSpec("groups", "s64", default=1, minimum=1),
    data_format_attr(),
    AttrSpec("weights_format", "string", default="XIO", choices=CONV_WEIGHTS_FORMATS),
    accumulation_mode_attr(),
]


def _convolution_shape(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    geometry = spatial_geometry(kind, a, shapes[0], shapes[1])
    if len(shapes) == 3:
        bias = shapes[2]
        if len(bias) != 1 or UNKNOWN not in (bias[0], geometry.out_channels) and bias[0] != geometry.out_channels:
            raise shape_error(kind, f"bias {fmt_shape(bias)} must be 1-D with the {geometry.out_channels} "
                                    f"output channels")
    out = (geometry.batch, geometry.out_channels, *geometry.out_spatial)
    return ncx_to_nxc(out) if a["data_format"] == "NXC" else out


def _conv_transpose_shape(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    geometry = conv_transpose_geometry(kind, a, shapes[0], shapes[1])
    if len(shapes) == 3:
        bias = shapes[2]
        if len(bias) != 1 or UNKNOWN not in (bias[0], geometry.out_channels) and bias[0] != geometry.out_channels:
            raise shape_error(kind, f"bias {fmt_shape(bias)} must be 1-D with the {geometry.out_channels} output channels")
    out = (geometry.batch, geometry.out_channels, *geometry.out_spatial)
    return ncx_to_nxc(out) if a["data_format"] == "NXC" else out


def lower_convolution(b: Builder, op: Op, **quantization) -> None:
    """``quantization``: ConvolutionDesc's src_quant/weights_quant/dst_quant (the int8 fusion)."""
    a = op.attrs
    src, wei = b.view(op.inputs[0]), b.view(op.inputs[1])
    dst = b.output(op.outputs[0])
    if a.get("data_format", "NXC") == "NXC":
        src, dst = channels_first(src), channels_first(dst)
    wei = weights_oix(wei, a.get("weights_format", "XIO"))
    nsp = src.desc.ndims - 2
    kernel = wei.desc.dims[2:]
    strides = tuple(a.get("strides", [1] * nsp))
    dilations = tuple(a.get("dilations", [1] * nsp))
    begin, end = explicit_pads(a, src.desc.dims[2:], kernel, strides, dilations, dst.desc.dims[2:])
    inputs = {"src": src, "weights": wei}
    if len(op.inputs) > 2:
        inputs["bias"] = b.view(op.inputs[2])
    groups = a.get("groups", 1)

    def make(src, weights, dst, bias=None):
        return ConvolutionDesc(src, weights, dst, bias, strides=strides, padding_l=begin,
                               padding_r=end, dilation=dilations, groups=groups, **quantization)

    b.run(op, make, inputs, {"dst": dst})


def _lower_conv_transpose(b: Builder, op: Op) -> None:
    a = op.attrs
    geometry = conv_transpose_geometry(op.kind, a, known_shape(op.inputs[0]), known_shape(op.inputs[1]))
    src, wei = b.view(op.inputs[0]), b.view(op.inputs[1])
    dst = b.output(op.outputs[0])
    if a.get("data_format", "NXC") == "NXC":
        src, dst = channels_first(src), channels_first(dst)
    wei = permuted(wei, conv_transpose_weights_order(a.get("weights_format", "XOI"), wei.desc.ndims))
    inputs = {"src": src, "weights": wei}
    if len(op.inputs) > 2:
        inputs["bias"] = b.view(op.inputs[2])

    def make(src, weights, dst, bias=None):
        return DeconvolutionDesc(src, weights, dst, bias, strides=geometry.strides, padding_l=geometry.pads_begin,
                                 padding_r=geometry.pads_end, dilation=geometry.dilations, groups=geometry.groups,
                                 output_padding=geometry.output_padding)

    b.run(op, make, inputs, {"dst": dst})


# Convolution backward (training): each of the four works on one convolution
# (conv_backward_geometry). ConvolutionBackwardData is that convolution transposed (a
# DeconvolutionDesc with the same weights), ConvTransposeBackwardData is it forward (a
# ConvolutionDesc), and both weights gradients are ConvolutionBackwardWeightsDesc,
# the ConvTranspose one with src and diff_dst swapped. The weights are views in (OC, C/groups, k...)
# order, so no copy is made for any weights_format.


def _lower_conv_backward(b: Builder, op: Op) -> None:
    a = op.attrs
    geometry = conv_backward_geometry(op.kind, a, [known_shape(lt) for lt in op.inputs])
    nxc = a.get("data_format", "NXC") == "NXC"

    def data(view: View) -> View:
        return channels_first(view) if nxc else view

    s, pl, pr, dil, groups = (geometry.strides, geometry.pads_begin, geometry.pads_end, geometry.dilations,
                              geometry.groups)
    if op.kind.endswith("Weights"):
        src, diff_dst = data(b.view(op.inputs[0])), data(b.view(op.inputs[1]))
        if op.kind == "ConvTransposeBackwardWeights":
            src, diff_dst = diff_dst, src
        diff_weights = permuted(b.output(op.outputs[0]), geometry.weights_order)
        b.run(op, lambda src, diff_dst, diff_weights: ConvolutionBackwardWeightsDesc(
                  src, diff_dst, diff_weights, strides=s, padding_l=pl, padding_r=pr, dilation=dil, groups=groups),
              {"src": src, "diff_dst": diff_dst}, {"diff_weights": diff_weights})
        return
    diff_dst = data(b.view(op.inputs[0]))
    weights = permuted(b.view(op.inputs[1]), geometry.weights_order)
    diff_src = data(b.output(op.outputs[0]))
    if op.kind == "ConvTransposeBackwardData":
        b.run(op, lambda src, weights, dst: ConvolutionDesc(src, weights, dst, strides=s, padding_l=pl, padding_r=pr,
                                                            dilation=dil, groups=groups),
              {"src": diff_dst, "weights": weights}, {"dst": diff_src})
        return
    # The stride may leave trailing rows of the convolution's src that no output read: output_padding
    # adds them back, and their gradient (no tap reaches them) is zero.
    nsp = len(geometry.strides)
    output_padding = tuple(
        geometry.conv_src[2 + i] - deconv_out_size(geometry.conv_dst[2 + i], geometry.weights[2 + i],
                                                   geometry.strides[i], geometry.pads_begin[i],
                                                   geometry.pads_end[i], geometry.dilations[i])
        for i in range(nsp))
    b.run(op, lambda src, weights, dst: DeconvolutionDesc(src, weights, dst, strides=s, padding_l=pl, padding_r=pr,
                                                          dilation=dil, groups=groups, output_padding=output_padding),
          {"src": diff_dst, "weights": weights}, {"dst": diff_src})


def _convolution_reference(a: dict, src: np.ndarray, wei: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """Channels-last float64 convolution: one batched matmul per kernel offset, over windows
    taken as strided views of the padded input (no loop over output pixels)."""
    geometry = spatial_geometry("Convolution", a, src.shape, wei.shape)
    nsp = src.ndim - 2
    x = src if a["data_format"] == "NXC" else np.moveaxis(src, 1, -1)  # N, X..., C
    w = wei if a["weights_format"] == "XIO" else np.moveaxis(wei, (0, 1), (-1, -2))  # X..., I/g, O
    groups = geometry.groups
    icg = geometry.in_channels // groups
    ocg = geometry.out_channels // groups
    widths = [(0, 0)] + list(zip(geometry.pads_begin, geometry.pads_end)) + [(0, 0)]
    xp = np.pad(x, widths)
    # (X..., I/g, O) -> (X..., g, I/g, O/g): output channel g*ocg + j belongs to group g.
    wg = w.reshape(w.shape[:-1] + (groups, ocg))
    wg = np.moveaxis(wg, -2, nsp)  # X..., g, I/g, O/g
    out = geometry.out_spatial
    n = x.shape[0]
    y = np.zeros((groups, n * int(np.prod(out)), ocg))
    for taps in itertools.product(*(range(k) for k in geometry.kernel)):
        window = (slice(None),) + tuple(
            slice(t * d, t * d + (o - 1) * s + 1, s)
            for t, d, o, s in zip(taps, geometry.dilations, out, geometry.strides)
        )
        patch = xp[window]  # N, OX..., C
        patch = patch.reshape(-1, groups, icg).transpose(1, 0, 2)  # g, N*OX, I/g
        y += np.matmul(patch, wg[taps])  # (g, M, I/g) @ (g, I/g, O/g)
    y = y.transpose(1, 0, 2).reshape((n, *out, groups * ocg))
    if bias is not None:
        y = y + bias
    return y if a["data_format"] == "NXC" else np.moveaxis(y, -1, 1)


def _conv_transpose_reference(a: dict, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    g = conv_transpose_geometry("ConvTranspose", a, x.shape, w.shape)
    nxc = a["data_format"] == "NXC"
    if nxc:
        x = np.moveaxis(x, -1, 1)
    w = np.transpose(w, conv_transpose_weights_order(a["weights_format"], w.ndim))
    y = f64(kernel_deconvolution.reference(
        x, w, bias, strides=g.strides, padding_l=g.pads_begin, padding_r=g.pads_end, dilation=g.dilations,
        groups=g.groups, output_padding=g.output_padding))
    return np.moveaxis(y, 1, -1) if nxc else y


def _conv_backward_reference(kind: str, a: dict, values: list[np.ndarray]) -> np.ndarray:
    """The four ops on the convolution of conv_backward_geometry, with the kernels' float64
    references: the data gradients as that convolution transposed (ConvolutionBackwardData) or
    forward (ConvTransposeBackwardData), the weights gradients as its weights gradient, src and
    diff_dst swapped for ConvTranspose."""
    g = conv_backward_geometry(kind, a, [v.shape for v in values])
    nxc = a["data_format"] == "NXC"

    def ncx(x: np.ndarray) -> np.ndarray:
        return np.moveaxis(x, -1, 1) if nxc else x

    geo: dict[str, Any] = {"strides": g.strides, "padding_l": g.pads_begin, "dilation": g.dilations,
                           "groups": g.groups}
    if kind.endswith("Weights"):
        src, diff_dst = ncx(values[0]), ncx(values[1])
        if kind == "ConvTransposeBackwardWeights":
            src, diff_dst = diff_dst, src
        w = kernel_convolution_bwd_weights.reference(src, diff_dst, g.weights[2:], **geo)
        return f64(np.transpose(w, np.argsort(g.weights_order)))
    diff_dst, w = ncx(values[0]), np.transpose(values[1], g.weights_order)
    if kind == "ConvTransposeBackwardData":
        y = kernel_convolution.reference(diff_dst, w, padding_r=g.pads_end, **geo)
    else:
        nsp = len(g.strides)
        output_padding = tuple(g.conv_src[2 + i] - ((g.conv_dst[2 + i] - 1) * g.strides[i] + (g.weights[2 + i] - 1)
                                                    * g.dilations[i] + 1 - g.pads_begin[i] - g.pads_end[i])
                               for i in range(nsp))
        y = kernel_deconvolution.reference(diff_dst, w, padding_r=g.pads_end, output_padding=output_padding, **geo)
    y = f64(y)
    return np.moveaxis(y, 1, -1) if nxc else y


_SCHEMAS = [
    OpSchema("Convolution", (2, 3), (1, 1), attr_map(_CONV_ATTRS), "convolution", None,
             ("src", "weights", "bias")),
    # output_padding: oneDNN's default is DNNL_MAX_NDIMS zeros, so serialized graphs carry
    # 12 entries; the first one per spatial dim counts.
    OpSchema("ConvTranspose", (2, 3), (1, 1), attr_map([
        *(spec for spec in _CONV_ATTRS if spec.name != "weights_format"),
        AttrSpec("weights_format", "string", default="XOI", choices=CONV_TRANSPOSE_WEIGHTS_FORMATS),
        AttrSpec("output_padding", "s64[]", minimum=0),
    ]), "deconvolution", None, ("src", "weights", "bias")),
    # -- convolution backward (training) --
    # dst_shape / weights_shape: the output's shape in data_format / weights_format; oneDNN's
    # default is DNNL_MAX_NDIMS zeros, read as unset. The optional third input (the shape as a
    # tensor) is accepted as oneDNN's op_def does; the shape still comes from the attribute.
    OpSchema("ConvolutionBackwardData", (2, 3), (1, 1), attr_map([
        *_CONV_ATTRS,
        AttrSpec("output_padding", "s64[]", minimum=0),
        AttrSpec("dst_shape", "s64[]", minimum=0),
    ]), "convolution_backward", None, ("diff_dst", "weights", "dst_shape"), ("diff_src",)),
    OpSchema("ConvolutionBackwardWeights", (2, 3), (1, 1), attr_map([
        *_CONV_ATTRS,
        AttrSpec("weights_shape", "s64[]", minimum=0),
    ]), "convolution_backward", None, ("src", "diff_dst", "weights_shape"), ("diff_weights",)),
    OpSchema("ConvTransposeBackwardData", (2, 2), (1, 1), attr_map([
        *(spec for spec in _CONV_ATTRS if spec.name != "weights_format"),
        AttrSpec("weights_format", "string", default="XOI", choices=CONV_TRANSPOSE_WEIGHTS_FORMATS),
    ]), "convolution_backward", None, ("diff_dst", "weights"), ("diff_src",)),
    OpSchema("ConvTransposeBackwardWeights", (2, 3), (1, 1), attr_map([
        *(spec for spec in _CONV_ATTRS if spec.name != "weights_format"),
        AttrSpec("weights_format", "string", default="XOI", choices=CONV_TRANSPOSE_WEIGHTS_FORMATS),
        AttrSpec("weights_shape", "s64[]", minimum=0),
    ]), "convolution_backward", None, ("src", "diff_dst", "weights_shape"), ("diff_weights",)),
]
_BY_KIND = {schema.kind: schema for schema in _SCHEMAS}


def _convolution_op_reference(kind: str, a: dict, inputs: list, num_outputs: int) -> list:
    values = [f64(x) for x in inputs]
    bias = values[2] if len(values) > 2 else None
    if kind == "Convolution":
        return [_convolution_reference(a, values[0], values[1], bias)]
    return [_conv_transpose_reference(a, values[0], values[1], bias)]


def _conv_backward_op_reference(kind: str, a: dict, inputs: list, num_outputs: int) -> list:
    return [_conv_backward_reference(kind, a, [f64(x) for x in inputs])]


def _spatial_attrs(kind: str, a: dict) -> None:
    check_spatial_attrs(kind, a, "strides")


# As MatMul: sums of integer products, exact on the integer filling in any order.
_NUMBERS = dict.fromkeys(("Convolution", "ConvolutionBackwardData", "ConvolutionBackwardWeights",
                          "ConvTransposeBackwardData", "ConvTransposeBackwardWeights"), Numbers(accumulates=True))
_NUMBERS["Convolution"] = Numbers(accumulates=True, filling="integer_sum")


register(*numbered([
    GraphOp(_BY_KIND["Convolution"], shapes=one_output(_convolution_shape),
            lower=lower_convolution, reference=_convolution_op_reference, check_attrs=_spatial_attrs,
            post_op_anchor=any_op, magnitude=of_absolute_inputs(_convolution_op_reference, 3)),
    GraphOp(_BY_KIND["ConvTranspose"], shapes=one_output(_conv_transpose_shape),
            lower=_lower_conv_transpose, reference=_convolution_op_reference, check_attrs=_spatial_attrs),
    *(GraphOp(_BY_KIND[kind], shapes=lambda kind, a, shapes, n: [conv_backward_geometry(kind, a, shapes).output],
              lower=_lower_conv_backward, reference=_conv_backward_op_reference, check_attrs=_spatial_attrs)
      for kind in ("ConvolutionBackwardData", "ConvolutionBackwardWeights", "ConvTransposeBackwardData",
                   "ConvTransposeBackwardWeights")),
], _NUMBERS))
