"""MaxPool and AvgPool, and their backward ops.

The schema, shape rule, lowering and numpy reference of each kind, registered in
``triodnn.graph._op_registry`` (see there)."""

from __future__ import annotations

import numpy as np

from ..._values import (
    PoolingBackwardDesc,
    PoolingDesc,
)
from ...kernels import pooling as kernel_pooling
from ...kernels import pooling_bwd as kernel_pooling_bwd
from ...kernels import tolerance as kt
from .._lowering import (
    Builder,
    channels_first,
    explicit_pads,
)
from .._op import Op
from .._op_registry import GraphOp, Numbers, numbered, register
from .._op_schema import (
    AUTO_PADS,
    ROUNDING_TYPES,
    AttrSpec,
    OpSchema,
    attr_map,
    check_spatial_attrs,
    data_format_attr,
)
from .._shape_inference import (
    UNKNOWN,
    Shape,
    fmt_shape,
    ncx_to_nxc,
    one_output,
    shape_error,
    spatial_geometry,
)
from ._float64 import f64


def _pool_schema(kind: str, algorithm: str | None) -> OpSchema:
    specs = [
        AttrSpec("strides", "s64[]", required=True, minimum=1),
        AttrSpec("kernel", "s64[]", required=True, minimum=1),
        AttrSpec("pads_begin", "s64[]", required=True, minimum=0),
        AttrSpec("pads_end", "s64[]", required=True, minimum=0),
        data_format_attr(),
        AttrSpec("rounding_type", "string", default="floor", choices=ROUNDING_TYPES),
        AttrSpec("auto_pad", "string", default="None", choices=AUTO_PADS),
    ]
    if kind == "MaxPool":
        # Default: ones, as many as kernel entries (oneDNN: a vector of ones; _pool_attrs fills them in).
        specs.append(AttrSpec("dilations", "s64[]", minimum=1))
    else:
        specs.append(AttrSpec("exclude_pad", "bool", required=True))
    return OpSchema(kind, (1, 1), (1, 1), attr_map(specs), "pooling", algorithm, ("src",))


def _pool_backward_schema(kind: str) -> OpSchema:
    # The forward's attributes, with rounding_type kept (oneDNN's backward op_def omits it; a graph
    # setting it still says how diff_dst was shaped). MaxPoolBackward reads the maxima from the
    # forward's src; AvgPoolBackward gets the forward's src shape as an attribute or as input 1
    # (the attribute rules here: the input's values are not known when shapes are inferred).
    forward = _pool_schema(kind[:-len("Backward")], None)
    specs = list(forward.attrs.values())
    if kind == "MaxPoolBackward":
        return OpSchema(kind, (2, 2), (1, 1), attr_map(specs), "pooling_backward", "max",
                        ("src", "diff_dst"), ("diff_src",))
    specs.append(AttrSpec("src_shape", "s64[]", minimum=0))
    return OpSchema(kind, (1, 2), (1, 1), attr_map(specs), "pooling_backward", None,
                    ("diff_dst", "src_shape"), ("diff_src",))


def _pool_shape(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    geometry = spatial_geometry(kind, a, shapes[0])
    out = (geometry.batch, geometry.in_channels, *geometry.out_spatial)
    return ncx_to_nxc(out) if a["data_format"] == "NXC" else out


def pool_backward_src_shape(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    """The forward's src shape of a MaxPoolBackward (its input 0) or AvgPoolBackward (its
    ``src_shape`` attribute: a src_shape input's values are not known here), which is diff_src's."""
    if kind == "MaxPoolBackward":
        return tuple(shapes[0])
    src = tuple(a.get("src_shape") or ())
    if not any(src):  # oneDNN's unset value: empty, or zeros
        raise shape_error(kind, "the src_shape attribute is not set; give it, or diff_src's shape")
    if len(src) != len(shapes[0]):
        raise shape_error(kind, f"src_shape {list(src)} and diff_dst {fmt_shape(shapes[0])} differ in rank")
    return src


def _pool_backward_shape(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    src = pool_backward_src_shape(kind, a, shapes)
    diff_dst = tuple(shapes[1] if kind == "MaxPoolBackward" else shapes[0])
    pooled = _pool_shape(kind, a, [src])
    if len(diff_dst) != len(pooled) or any(
        d != p and UNKNOWN not in (d, p) for d, p in zip(diff_dst, pooled)
    ):
        raise shape_error(kind, f"diff_dst shape {fmt_shape(diff_dst)} differs from {fmt_shape(pooled)}, the pooled "
                                f"shape of src {fmt_shape(src)} ({a['data_format']})")
    return src


def _lower_pool(b: Builder, op: Op) -> None:
    a = op.attrs
    src, dst = b.view(op.inputs[0]), b.output(op.outputs[0])
    if a.get("data_format", "NXC") == "NXC":
        src, dst = channels_first(src), channels_first(dst)
    nsp = src.desc.ndims - 2
    kernel = tuple(a["kernel"])
    strides = tuple(a.get("strides", [1] * nsp))
    dilations = tuple(a.get("dilations", [1] * nsp)) if op.kind == "MaxPool" else (1,) * nsp
    begin, end = explicit_pads(a, src.desc.dims[2:], kernel, strides, dilations, dst.desc.dims[2:])
    if op.kind == "MaxPool":
        alg = "max"
    else:
        alg = "avg_exclude_padding" if a.get("exclude_pad", False) else "avg_include_padding"
    b.run(op, lambda src, dst: PoolingDesc(alg, src, dst, kernel=kernel, strides=strides,
                                           padding_l=begin, padding_r=end, dilation=dilations),
          {"src": src}, {"dst": dst})


def _lower_pool_backward(b: Builder, op: Op) -> None:
    # The geometry as _lower_pool's, taken on diff_src (the forward's src); AvgPoolBackward's
    # optional src_shape input adds nothing diff_src's shape does not say.
    a = op.attrs
    is_max = op.kind == "MaxPoolBackward"
    inputs = {"diff_dst": b.view(op.inputs[1] if is_max else op.inputs[0])}
    if is_max:
        inputs["src"] = b.view(op.inputs[0])
    diff_src = b.output(op.outputs[0])
    if a.get("data_format", "NXC") == "NXC":
        inputs = {name: channels_first(view) for name, view in inputs.items()}
        diff_src = channels_first(diff_src)
    nsp = diff_src.desc.ndims - 2
    kernel = tuple(a["kernel"])
    strides = tuple(a.get("strides", [1] * nsp))
    dilations = tuple(a.get("dilations", [1] * nsp)) if is_max else (1,) * nsp
    begin, end = explicit_pads(a, diff_src.desc.dims[2:], kernel, strides, dilations, inputs["diff_dst"].desc.dims[2:])
    if is_max:
        alg = "max"
    else:
        alg = "avg_exclude_padding" if a.get("exclude_pad", False) else "avg_include_padding"

    def make(diff_dst, diff_src, src=None):
        return PoolingBackwardDesc(alg, diff_dst, diff_src, src, kernel=kernel, strides=strides,
                                   padding_l=begin, padding_r=end, dilation=dilations)

    b.run(op, make, inputs, {"diff_src": diff_src})


def _pool_reference(kind: str, a: dict, src: np.ndarray) -> np.ndarray:
    geometry = spatial_geometry(kind, a, src.shape)
    x = np.moveaxis(src, -1, 1) if a["data_format"] == "NXC" else src
    if kind == "MaxPool":
        alg = "max"
    else:
        alg = "avg_exclude_padding" if a["exclude_pad"] else "avg_include_padding"
    # The windows rounding_type="ceil" adds count as right padding (zeros for
    # avg_include_padding, skipped by max and avg_exclude_padding).
    y = f64(kernel_pooling.reference(
        alg, x, kernel=geometry.kernel, strides=geometry.strides, padding_l=geometry.pads_begin,
        padding_r=geometry.pads_end_ceil, dilation=geometry.dilations,
    ))
    return np.moveaxis(y, 1, -1) if a["data_format"] == "NXC" else y


def _pool_backward_reference(kind: str, a: dict, values: list[np.ndarray]) -> np.ndarray:
    is_max = kind == "MaxPoolBackward"
    diff_dst = values[1] if is_max else values[0]
    src_shape = pool_backward_src_shape(kind, a, [x.shape for x in values])
    geometry = spatial_geometry(kind, a, src_shape)
    nxc = a["data_format"] == "NXC"

    def ncx(x: np.ndarray) -> np.ndarray:
        return np.moveaxis(x, -1, 1) if nxc else x

    src_dims = (geometry.batch, geometry.in_channels, *geometry.in_spatial)
    # As _pool_reference: the windows rounding_type="ceil" adds count as right padding.
    y = f64(kernel_pooling_bwd.reference(
        "max" if is_max else ("avg_exclude_padding" if a["exclude_pad"] else "avg_include_padding"),
        ncx(diff_dst), src_dims, src=ncx(values[0]) if is_max else None, kernel=geometry.kernel,
        strides=geometry.strides, padding_l=geometry.pads_begin, padding_r=geometry.pads_end_ceil,
        dilation=geometry.dilations,
    ))
    return np.moveaxis(y, 1, -1) if nxc else y


_SCHEMAS = [
    _pool_schema("MaxPool", "max"),
    _pool_schema("AvgPool", None),  # avg_include_padding or avg_exclude_padding by exclude_pad
    _pool_backward_schema("MaxPoolBackward"),
    _pool_backward_schema("AvgPoolBackward"),
]
_BY_KIND = {schema.kind: schema for schema in _SCHEMAS}


def _pool_attrs(kind: str, a: dict) -> None:
    if kind in ("MaxPool", "MaxPoolBackward") and "dilations" not in a:
        a["dilations"] = [1] * len(a["kernel"])  # oneDNN's default: ones, one per kernel entry
    check_spatial_attrs(kind, a, "kernel")


def _src_shape_input(a: dict, inputs: list) -> dict:
    """AvgPoolBackward's optional src_shape input wins over the attribute, as in oneDNN."""
    if len(inputs) == 2:
        return {**a, "src_shape": [int(v) for v in np.asarray(inputs[1]).reshape(-1)]}
    return a


# Max pooling picks an input, its backward adds integer diff_dst elements: exact. Average pooling
# is an exact integer window sum, then one division; its backward adds a few quotients, one
# rounding each, far inside the eltwise bound.
_NUMBERS = {
    "AvgPool": Numbers(kt.ELTWISE, inexact=True, accumulates=True),
    "AvgPoolBackward": Numbers(kt.ELTWISE, inexact=True),
}


register(*numbered([
    *(GraphOp(_BY_KIND[kind], shapes=one_output(_pool_shape), lower=_lower_pool,
              reference=lambda kind, a, inputs, n: [_pool_reference(kind, a, f64(inputs[0]))], check_attrs=_pool_attrs)
      for kind in ("MaxPool", "AvgPool")),
    GraphOp(_BY_KIND["MaxPoolBackward"], shapes=one_output(_pool_backward_shape),
            lower=_lower_pool_backward, check_attrs=_pool_attrs,
            reference=lambda kind, a, inputs, n: [_pool_backward_reference(kind, a, [f64(x) for x in inputs])]),
    GraphOp(_BY_KIND["AvgPoolBackward"], shapes=one_output(_pool_backward_shape),
            lower=_lower_pool_backward, check_attrs=_pool_attrs, attrs_from_inputs=_src_shape_input,
            reference=lambda kind, a, inputs, n: [_pool_backward_reference(kind, a, [f64(x) for x in inputs])]),
], _NUMBERS))
