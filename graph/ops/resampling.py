"""Interpolate (nearest and linear resampling) and its backward op.

The schema, shape rule, lowering and numpy reference of each kind, registered in
``triodnn.graph._op_registry`` (see there)."""

from __future__ import annotations

import math

import numpy as np

from ..._values import (
    ResamplingBackwardDesc,
    ResamplingDesc,
)
from ...kernels import resampling as kernel_resampling
from ...kernels import resampling_bwd as kernel_resampling_bwd
from ...kernels import tolerance as kt
from .._lowering import (
    Builder,
    channels_first,
)
from .._op import Op
from .._op_registry import GraphOp, Numbers, numbered, register
from .._op_schema import (
    COORDINATE_TRANSFORMATION_MODES,
    INTERPOLATE_MODES,
    AttrSpec,
    OpSchema,
    attr_error,
    attr_map,
    data_format_attr,
)
from .._shape_inference import (
    UNKNOWN,
    Shape,
    check_same_known,
    fmt_shape,
    infer_output_shapes,
    one_output,
    shape_error,
)
from ._float64 import f64


def _interpolate_shape(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    """oneDNN's infer_interpolate_output_shape: the spatial dims become ``sizes``, or
    ``in * scale`` computed in float32 and truncated (C's ``int64 *= float``)."""
    src = shapes[0]
    nsp = len(src) - 2
    if not 1 <= nsp <= 3:
        raise shape_error(kind, f"src {fmt_shape(src)} needs a batch, a channel and 1 to 3 spatial dims")
    start = 2 if a["data_format"] == "NCX" else 1
    given = "sizes" if a.get("sizes") else "scales"
    values = a[given]
    if len(values) != nsp:
        raise shape_error(kind, f"{given} {values} has {len(values)} entries for the {nsp} spatial dims of "
                                f"src {fmt_shape(src)} ({a['data_format']})")
    out = list(src)
    for i, value in enumerate(values):
        d = src[start + i]
        if given == "sizes":
            out[start + i] = value
        elif d != UNKNOWN:
            with np.errstate(all="ignore"):
                scaled = float(np.float32(d) * np.float32(value))
            out[start + i] = int(scaled) if math.isfinite(scaled) else 0
        if out[start + i] != UNKNOWN and out[start + i] < 1:
            raise shape_error(kind, f"spatial dim {i} of src {fmt_shape(src)} becomes {out[start + i]} with {given} {values}")
    return tuple(out)


def _lower_interpolate(b: Builder, op: Op) -> None:
    a = op.attrs
    src, dst = b.view(op.inputs[0]), b.output(op.outputs[0])  # a sizes input: dst's shape says it
    if a.get("data_format", "NXC") == "NXC":
        src, dst = channels_first(src), channels_first(dst)
    alg = "nearest" if a["mode"] == "nearest" else "linear"  # bilinear, trilinear: linear by rank
    align = a.get("coordinate_transformation_mode", "half_pixel") == "align_corners"
    b.run(op, lambda src, dst: ResamplingDesc(alg, src, dst, align_corners=align), {"src": src}, {"dst": dst})


def _lower_interpolate_backward(b: Builder, op: Op) -> None:
    a = op.attrs
    diff_dst, diff_src = b.view(op.inputs[1]), b.output(op.outputs[0])  # src: diff_src's shape only
    if a.get("data_format", "NXC") == "NXC":
        diff_dst, diff_src = channels_first(diff_dst), channels_first(diff_src)
    alg = "nearest" if a["mode"] == "nearest" else "linear"
    align = a.get("coordinate_transformation_mode", "half_pixel") == "align_corners"
    b.run(op, lambda diff_dst, diff_src: ResamplingBackwardDesc(alg, diff_dst, diff_src, align_corners=align),
          {"diff_dst": diff_dst}, {"diff_src": diff_src})


def _interpolate_reference(a: dict, x: np.ndarray) -> np.ndarray:
    """oneDNN's resampling (its float32 coordinates and roundf) through the kernels' reference."""
    out = infer_output_shapes("Interpolate", a, [x.shape])[0]
    nxc = a["data_format"] == "NXC"
    if nxc:
        x, out = np.moveaxis(x, -1, 1), (out[0], out[-1], *out[1:-1])
    alg = "nearest" if a["mode"] == "nearest" else "linear"
    y = kernel_resampling.reference(alg, x, tuple(out[2:]),
                                    align_corners=a["coordinate_transformation_mode"] == "align_corners")
    y = f64(y)
    return np.moveaxis(y, 1, -1) if nxc else y


def _interpolate_backward_reference(a: dict, src: np.ndarray, diff_dst: np.ndarray) -> np.ndarray:
    """The transpose of ``_interpolate_reference``'s resampling, src giving the shape only."""
    nxc = a["data_format"] == "NXC"
    if nxc:
        src, diff_dst = np.moveaxis(src, -1, 1), np.moveaxis(diff_dst, -1, 1)
    alg = "nearest" if a["mode"] == "nearest" else "linear"
    g = f64(kernel_resampling_bwd.reference(alg, diff_dst, src.shape[2:],
                                            align_corners=a["coordinate_transformation_mode"] == "align_corners"))
    return np.moveaxis(g, 1, -1) if nxc else g


# The forward's and the backward op's attributes alike.
_INTERPOLATE_ATTRS = [
    AttrSpec("mode", "string", required=True, choices=INTERPOLATE_MODES),
    AttrSpec("sizes", "s64[]", minimum=1),
    AttrSpec("scales", "f32[]"),
    AttrSpec("coordinate_transformation_mode", "string", default="half_pixel", choices=COORDINATE_TRANSFORMATION_MODES),
    data_format_attr(),
]
_SCHEMAS = [
    # Exactly one of sizes and scales (op_def_constraint's check_interpolate_sizes_scales);
    # the optional input 1 is the sizes as an s32 tensor, the output shape then given.
    OpSchema("Interpolate", (1, 2), (1, 1), attr_map(_INTERPOLATE_ATTRS), "resampling", None, ("src", "sizes")),
    # The forward's src gives diff_src's shape only; the optional sizes input is accepted as
    # oneDNN's op_def does, diff_dst's shape saying the same.
    OpSchema("InterpolateBackward", (2, 3), (1, 1), attr_map(_INTERPOLATE_ATTRS), "resampling_backward", None,
             ("src", "diff_dst", "sizes"), ("diff_src",)),
]
_BY_KIND = {schema.kind: schema for schema in _SCHEMAS}


def _sizes_or_scales(kind: str, a: dict) -> None:
    # Exactly one of sizes and scales (op_def_constraint's check_interpolate_sizes_scales).
    if bool(a.get("sizes")) == bool(a.get("scales")):
        raise attr_error(kind, "exactly one of the attributes 'sizes' and 'scales' must be given "
                                    f"(sizes {a.get('sizes')}, scales {a.get('scales')})")


def _backward_shape(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    """diff_src takes src's shape. diff_dst's spatial dims are what the resampling reads: as in
    oneDNN, whose InterpolateBackward infers diff_src alone and builds the primitive from the two
    tensors, they need not be what ``sizes`` or ``scales`` give src (benchdnn's --op-attrs may set
    fractional scales, or sizes, without touching diff_dst). Its batch and channels must be src's."""
    forward = _interpolate_shape(kind, a, shapes[:1])  # sizes/scales well formed for src
    src, diff_dst = shapes[0], shapes[1]
    if len(diff_dst) != len(src):
        raise shape_error(kind, f"diff_dst {fmt_shape(diff_dst)} and src {fmt_shape(src)} differ in rank")
    spatial = range(2, len(src)) if a["data_format"] == "NCX" else range(1, len(src) - 1)
    expected = tuple(diff_dst[i] if i in spatial else d for i, d in enumerate(forward))
    check_same_known(kind, diff_dst, expected, "diff_dst", "src's batch and channels")
    return [src]


def _lowers(op: Op) -> bool:
    # Nearest with align_corners has no rounding rule (oneDNN runs no align_corners at all).
    return not (op.attrs.get("mode") == "nearest" and op.attrs.get("coordinate_transformation_mode") == "align_corners")


# Linear interpolation: 2^d products of float32 weights summed (kernels.resampling); its
# backward sums up to 4 weighted terms a dim.
_NUMBERS = {
    "Interpolate": Numbers(4 * 2**3 * kt.BINARY),
    "InterpolateBackward": Numbers(4 * 4**3 * kt.BINARY, inexact=True, accumulates=True),
}


register(*numbered([
    GraphOp(_BY_KIND["Interpolate"], shapes=one_output(_interpolate_shape),
            lower=_lower_interpolate, check_attrs=_sizes_or_scales, lowers=_lowers,
            reference=lambda kind, a, inputs, n: [_interpolate_reference(a, f64(inputs[0]))]),
    GraphOp(_BY_KIND["InterpolateBackward"], shapes=_backward_shape, lower=_lower_interpolate_backward,
            check_attrs=_sizes_or_scales, lowers=_lowers,
            reference=lambda kind, a, inputs, n: [_interpolate_backward_reference(a, f64(inputs[0]), f64(inputs[1]))]),
], _NUMBERS))
