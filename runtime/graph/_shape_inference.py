"""Output shapes of oneDNN Graph ops from their input shapes and attributes.

The rules are oneDNN's (``src/graph/interface/shape_infer.cpp``): numpy broadcasting for
``auto_broadcast="numpy"`` and equal shapes for ``"none"``; MatMul swaps the last two dims of a
transposed operand, treats a 1-D ``src`` as ``[1, K]`` and 1-D ``weights`` as ``[K, 1]`` (the
added dim dropped from the result) and broadcasts batch dims; convolution and pooling compute
``(in + pads - ((k - 1) * dilation + 1)) / stride + 1`` (floor, or ceil for pooling's
``rounding_type="ceil"``) with ``auto_pad`` deriving the pads (``SAME_*`` pads so that
``out = ceil(in / stride)``, the odd pad going to the end for ``SAME_UPPER`` and to the begin
for ``SAME_LOWER``); ``StaticReshape`` takes one ``-1`` and ``special_zero``; ``StaticTranspose``
takes negative order entries; reductions drop or keep (as 1) the reduced axes.

Shapes are tuples of ints; ``-1`` is an unknown dim (``triodnn.graph`` logical tensors use it).
Unknown dims flow through where the rule allows and make the dims they feed unknown; they never
raise on their own. Inconsistent shapes raise ShapeInferenceError naming the op kind, the
shapes and the attributes involved.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs
import numpy as np

from .._values._errors import ShapeInferenceError
from ._op_schema import normalize_attrs, schema_of

UNKNOWN = -1
Shape = tuple[int, ...]


def _error(kind: str, message: str) -> ShapeInferenceError:
    return ShapeInferenceError(f"{kind}: {message}")


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join("?" if d == UNKNOWN else str(d) for d in shape) + "]"


def _to_shapes(kind: str, input_shapes) -> list[Shape]:
    shapes = []
    for i, shape in enumerate(input_shapes):
        if shape is None:
            raise _error(kind, f"input {i} has an unknown rank; shapes cannot be inferred")
        try:
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise _error(kind, f"input {i} shape {shape!r} is not a sequence of integers") from None
        if any(d < UNKNOWN for d in dims):
            raise _error(kind, f"input {i} shape {list(dims)} has a negative dim")
        shapes.append(dims)
    return shapes


def quantization_groups(kind: str, a: Mapping, src: Sequence[int], scales: Sequence[int]) -> tuple[int, ...]:
    """The group shape of a dynamic (de)quantization (``DynamicQuantizeDesc.group_shape``: how
    many src elements share a scale on each dim), from ``qtype``, ``axis`` and ``group_shape``,
    checking the scales' shape: one element per tensor, one per channel along ``axis``, or src's
    rank with each dim src's divided by the group's (DynamicDequantize.md)."""
    src = tuple(int(d) for d in src)
    scales = tuple(int(d) for d in scales)
    if a["qtype"] == "per_tensor":
        if math.prod(scales) != 1:
            raise _error(kind, f"per_tensor takes one scale, scales have shape {_fmt(scales)}")
        return src
    if a["qtype"] == "per_channel":
        axis = _normal_axis(kind, a["axis"], len(src))
        if math.prod(scales) != src[axis]:
            raise _error(kind, f"per_channel along axis {a['axis']} of {_fmt(src)} takes {src[axis]} scales, "
                               f"got shape {_fmt(scales)}")
        return tuple(1 if i == axis else d for i, d in enumerate(src))
    group = tuple(a.get("group_shape") or ())
    if len(scales) != len(src) or (group and len(group) != len(src)):
        raise _error(kind, f"per_group scales {_fmt(scales)} and group_shape {list(group)} need src's rank {len(src)}")
    if not group:
        group = tuple(d // max(s, 1) for d, s in zip(src, scales))
    if any(g < 1 or d % g or d // g != s for d, g, s in zip(src, group, scales)):
        raise _error(kind, f"scales {_fmt(scales)} are not src {_fmt(src)} in groups of {list(group)}")
    return group


def _normal_axis(kind: str, axis: int, ndim: int, what: str = "axis") -> int:
    if not -ndim <= axis < max(ndim, 1) or ndim == 0:
        raise _error(kind, f"{what} {axis} is out of range for rank {ndim} (expected [{-ndim}, {ndim - 1}])")
    return axis % ndim


# -- broadcasting ---------------------------------------------------------------------------


def _broadcast_dim(a: int, b: int) -> int | None:
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if a == UNKNOWN or b == UNKNOWN:
        return b if a == UNKNOWN else a  # the known one (not 1) wins; both unknown is handled above
    return None


def broadcast_shapes(kind: str, *shapes: Shape) -> Shape:
    """Numpy broadcasting of ``shapes`` (right-aligned), or ShapeInferenceError."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for shape in shapes:
        padded = (1,) * (rank - len(shape)) + tuple(shape)
        for i, d in enumerate(padded):
            merged = _broadcast_dim(out[i], d)
            if merged is None:
                raise _error(kind, "shapes " + ", ".join(_fmt(s) for s in shapes)
                             + f" do not broadcast (numpy rules): dim {i - rank} is {out[i]} vs {d}")
            out[i] = merged
    return tuple(out)


def _one_way(kind: str, target: Shape, shape: Shape, what: str) -> None:
    """``shape`` must broadcast to ``target`` without changing it."""
    ok = len(shape) <= len(target) and all(
        d in (1, t) or UNKNOWN in (d, t) for d, t in zip(reversed(shape), reversed(target))
    )
    if not ok:
        raise _error(kind, f"{what} shape {_fmt(shape)} does not broadcast to {_fmt(target)}")


def _same_shapes(kind: str, shapes: Sequence[Shape]) -> Shape:
    first = shapes[0]
    for shape in shapes[1:]:
        if len(shape) != len(first) or any(
            a != b and UNKNOWN not in (a, b) for a, b in zip(shape, first)
        ):
            raise _error(kind, "auto_broadcast='none' needs equal shapes, got "
                         + ", ".join(_fmt(s) for s in shapes))
    return tuple(max(dims) if UNKNOWN in dims else dims[0] for dims in zip(*shapes))


# -- convolution and pooling geometry -------------------------------------------------------


@attrs.frozen(slots=True)
class SpatialGeometry:
    """The per-spatial-dim geometry of a Convolution, MaxPool or AvgPool, channels first.

    ``pads_begin``/``pads_end`` are the pads the op uses after ``auto_pad``; ``pads_end_ceil``
    additionally covers the windows ``rounding_type="ceil"`` adds (so that the floor formula with
    it gives ``out_spatial``). ``dilations`` are plain factors (1: none), as oneDNN Graph's.
    """

    batch: int
    in_channels: int
    out_channels: int
    groups: int
    in_spatial: Shape
    kernel: Shape
    strides: Shape
    dilations: Shape
    pads_begin: Shape
    pads_end: Shape
    pads_end_ceil: Shape
    out_spatial: Shape


def _nxc_to_ncx(shape: Shape) -> Shape:
    return (shape[0], shape[-1], *shape[1:-1]) if len(shape) > 2 else shape


def _ncx_to_nxc(shape: Shape) -> Shape:
    return (shape[0], *shape[2:], shape[1]) if len(shape) > 2 else shape


def _xio_to_oix(shape: Shape) -> Shape:
    return (shape[-1], shape[-2], *shape[:-2]) if len(shape) > 2 else shape


def auto_pads(in_size: int, stride: int, kernel: int, dilation: int, auto_pad: str,
              pad_begin: int, pad_end: int) -> tuple[int, int]:
    """oneDNN's ``infer_auto_pad`` for one spatial dim (forward ops)."""
    if auto_pad == "None":
        return pad_begin, pad_end
    if auto_pad == "VALID":
        return 0, 0
    effective = (kernel - 1) * dilation + 1
    if in_size == UNKNOWN:
        total = effective - stride  # the in % stride == 0 case; the output is unknown anyway
    elif in_size % stride == 0:
        total = effective - stride
    else:
        total = effective - in_size % stride
    total = max(total, 0)
    begin = (total + 1) // 2 if auto_pad == "SAME_LOWER" else total // 2
    return begin, total - begin


def spatial_geometry(kind: str, attrs_: Mapping, src_shape: Shape,
                     weights_shape: Shape | None = None) -> SpatialGeometry:
    """Geometry of a Convolution (``weights_shape`` given) or a MaxPool/AvgPool, or
    ShapeInferenceError for inconsistent shapes and attributes."""
    a = normalize_attrs(kind, attrs_)
    src = tuple(src_shape)
    fmt = a["data_format"]
    if len(src) < 3:
        raise _error(kind, f"src shape {_fmt(src)} needs a batch, a channel and at least one "
                           f"spatial dim")
    src_ncx = _nxc_to_ncx(src) if fmt == "NXC" else src
    nsp = len(src) - 2
    strides = tuple(a["strides"])
    if len(strides) != nsp:
        raise _error(kind, f"strides {list(strides)} has {len(strides)} entries for src "
                           f"{_fmt(src)} ({fmt}) with {nsp} spatial dims")
    dilations = tuple(a.get("dilations", [1] * nsp))
    if kind == "Convolution":
        assert weights_shape is not None, "a Convolution's geometry is asked with its weights' shape"
        wei = tuple(weights_shape)
        if len(wei) != len(src):
            raise _error(kind, f"weights shape {_fmt(wei)} rank differs from src {_fmt(src)}")
        wei_oix = _xio_to_oix(wei) if a["weights_format"] == "XIO" else wei
        kernel = wei_oix[2:]
        groups = a["groups"]
        in_channels, out_channels = src_ncx[1], wei_oix[0]
        known = UNKNOWN not in (in_channels, wei_oix[1])
        if known and in_channels != wei_oix[1] * groups:
            raise _error(kind, f"src channels {in_channels} (src {_fmt(src)}, {fmt}) divided by "
                               f"groups {groups} must equal the weights' input channels "
                               f"{wei_oix[1]} (weights {_fmt(wei)}, {a['weights_format']})")
        if out_channels != UNKNOWN and out_channels % groups:
            raise _error(kind, f"weights output channels {out_channels} are not divisible by "
                               f"groups {groups}")
    else:
        kernel = tuple(a["kernel"])
        if len(kernel) != nsp:
            raise _error(kind, f"kernel {list(kernel)} has {len(kernel)} entries for src "
                               f"{_fmt(src)} ({fmt}) with {nsp} spatial dims")
        groups = 1
        in_channels = out_channels = src_ncx[1]
    in_spatial = src_ncx[2:]
    pads_begin, pads_end, pads_end_ceil, out = [], [], [], []
    ceil = a.get("rounding_type", "floor") == "ceil"
    for i in range(nsp):
        pb, pe = auto_pads(in_spatial[i], strides[i], kernel[i], dilations[i], a["auto_pad"],
                           a["pads_begin"][i], a["pads_end"][i])
        pads_begin.append(pb)
        pads_end.append(pe)
        effective = (kernel[i] - 1) * dilations[i] + 1
        if UNKNOWN in (in_spatial[i], kernel[i]):
            out.append(UNKNOWN)
            pads_end_ceil.append(pe)
            continue
        span = in_spatial[i] + pb + pe - effective
        size = (-(-span // strides[i]) if ceil else span // strides[i]) + 1
        if size < 1:
            raise _error(kind, f"spatial dim {i}: input {in_spatial[i]} with pads {pb}+{pe}, "
                               f"kernel {kernel[i]}, dilation {dilations[i]} and stride "
                               f"{strides[i]} leaves no output (src {_fmt(src)}, {fmt})")
        out.append(size)
        pads_end_ceil.append(max(pe, (size - 1) * strides[i] + effective - in_spatial[i] - pb))
    return SpatialGeometry(
        batch=src_ncx[0], in_channels=in_channels, out_channels=out_channels, groups=groups,
        in_spatial=tuple(in_spatial), kernel=tuple(kernel), strides=strides, dilations=dilations,
        pads_begin=tuple(pads_begin), pads_end=tuple(pads_end),
        pads_end_ceil=tuple(pads_end_ceil), out_spatial=tuple(out),
    )


# Where each ConvTranspose weights format keeps (I, O, spatial...): axis indices into the shape.
_CONV_TRANSPOSE_AXES = {"IOX": lambda n: (0, 1, *range(2, n)), "OIX": lambda n: (1, 0, *range(2, n)),
                        "XIO": lambda n: (n - 2, n - 1, *range(n - 2)), "XOI": lambda n: (n - 1, n - 2, *range(n - 2))}


def conv_transpose_weights_order(weights_format: str, ndims: int) -> tuple[int, ...]:
    """The axes of ConvTranspose weights in ``weights_format`` that give (I, O/groups, k...)."""
    return tuple(_CONV_TRANSPOSE_AXES[weights_format](ndims))


@attrs.frozen(slots=True)
class ConvTransposeGeometry:
    """A ConvTranspose's geometry, channels first: pads after ``auto_pad``, the output padding's
    entries for the spatial dims, the output spatial sizes."""

    batch: int
    in_channels: int
    out_channels: int
    groups: int
    kernel: Shape
    strides: Shape
    dilations: Shape
    pads_begin: Shape
    pads_end: Shape
    output_padding: Shape
    out_spatial: Shape


def conv_transpose_geometry(kind: str, attrs_: Mapping, src_shape: Shape, weights_shape: Shape) -> ConvTransposeGeometry:
    """oneDNN's infer_convtranspose_output_shape: ``out = s * (in - 1) + dil * (k - 1) + 1 +
    output_padding - pads_begin - pads_end`` and ``weights O * groups`` channels; ``auto_pad``
    SAME_* pads ``k - s`` in all (dilation 1 only), the odd one at the end for SAME_UPPER."""
    a = normalize_attrs(kind, attrs_)
    src, wei = tuple(src_shape), tuple(weights_shape)
    fmt, wfmt = a["data_format"], a["weights_format"]
    if not 3 <= len(src) <= 5:
        raise _error(kind, f"src shape {_fmt(src)} needs a batch, a channel and 1 to 3 spatial dims")
    if len(wei) != len(src):
        raise _error(kind, f"weights shape {_fmt(wei)} rank differs from src {_fmt(src)}")
    nsp = len(src) - 2
    src_ncx = _nxc_to_ncx(src) if fmt == "NXC" else src
    i_axis, o_axis, *k_axes = conv_transpose_weights_order(wfmt, len(wei))
    kernel = tuple(wei[k] for k in k_axes)
    groups = a["groups"]
    in_channels, w_in = src_ncx[1], wei[i_axis]
    if UNKNOWN not in (in_channels, w_in) and (in_channels != w_in or in_channels % groups):
        raise _error(kind, f"src channels {in_channels} (src {_fmt(src)}, {fmt}) must equal the weights' input "
                           f"channels {w_in} (weights {_fmt(wei)}, {wfmt}) and divide by groups {groups}")
    strides, dilations = tuple(a["strides"]), tuple(a["dilations"])
    if len(strides) != nsp:
        raise _error(kind, f"strides {list(strides)} has {len(strides)} entries for src {_fmt(src)} ({fmt}) "
                           f"with {nsp} spatial dims")
    output_padding = tuple(a.get("output_padding") or [0] * nsp)
    if len(output_padding) < nsp:
        raise _error(kind, f"output_padding {list(output_padding)} has fewer entries than the {nsp} spatial dims")
    output_padding = output_padding[:nsp]
    begin, end, out = [], [], []
    for i in range(nsp):
        pb, pe = a["pads_begin"][i], a["pads_end"][i]
        if a["auto_pad"] == "VALID":
            pb = pe = 0
        elif a["auto_pad"] in ("SAME_UPPER", "SAME_LOWER"):
            if dilations[i] != 1:
                raise _error(kind, f"auto_pad {a['auto_pad']} needs dilations of 1, got {list(dilations)}")
            needed = kernel[i] - strides[i]
            if needed < 0:
                raise _error(kind, f"auto_pad {a['auto_pad']}: kernel {kernel[i]} is smaller than stride "
                                   f"{strides[i]} on spatial dim {i} (a negative pad)")
            pb = (needed + 1) // 2 if a["auto_pad"] == "SAME_LOWER" else needed // 2
            pe = needed - pb
        begin.append(pb)
        end.append(pe)
        size = src_ncx[2 + i]
        if UNKNOWN in (size, kernel[i]):
            out.append(UNKNOWN)
            continue
        o = strides[i] * (size - 1) + dilations[i] * (kernel[i] - 1) + 1 + output_padding[i] - pb - pe
        if o < 1:
            raise _error(kind, f"spatial dim {i}: input {size}, kernel {kernel[i]}, stride {strides[i]}, pads "
                               f"{pb}+{pe} leave no output (src {_fmt(src)})")
        out.append(o)
    out_channels = UNKNOWN if wei[o_axis] == UNKNOWN else wei[o_axis] * groups
    return ConvTransposeGeometry(
        batch=src_ncx[0], in_channels=in_channels, out_channels=out_channels, groups=groups, kernel=kernel,
        strides=strides, dilations=dilations, pads_begin=tuple(begin), pads_end=tuple(end),
        output_padding=output_padding, out_spatial=tuple(out),
    )


def _conv_transpose(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    geometry = conv_transpose_geometry(kind, a, shapes[0], shapes[1])
    if len(shapes) == 3:
        bias = shapes[2]
        if len(bias) != 1 or UNKNOWN not in (bias[0], geometry.out_channels) and bias[0] != geometry.out_channels:
            raise _error(kind, f"bias {_fmt(bias)} must be 1-D with the {geometry.out_channels} output channels")
    out = (geometry.batch, geometry.out_channels, *geometry.out_spatial)
    return _ncx_to_nxc(out) if a["data_format"] == "NXC" else out

# -- convolution backward (training): ConvolutionBackwardData/Weights, ConvTransposeBackwardData/Weights --


@attrs.frozen(slots=True)
class ConvBackwardGeometry:
    """The convolution each of the four backward ops works on, channels first: for the
    Convolution ops the forward one, for the ConvTranspose ops the one the transposed convolution
    transposes (its src is ConvTranspose's dst). ``weights`` is that convolution's (OC, C/groups,
    k...) shape, ``weights_order`` the axes of the op's weights tensor (in ``weights_format``)
    that give it; pads are after ``auto_pad``; ``output`` is the op's output shape, in its format."""

    conv_src: Shape
    conv_dst: Shape
    weights: Shape
    weights_order: tuple[int, ...]
    strides: Shape
    dilations: Shape
    pads_begin: Shape
    pads_end: Shape
    groups: int
    output: Shape


def _conv_weights_order(weights_format: str, ndims: int) -> tuple[int, ...]:
    """Axes of Convolution weights in ``weights_format`` (XIO or OIX) that give (O, I, k...)."""
    if weights_format == "XIO":
        return (ndims - 1, ndims - 2, *range(ndims - 2))
    return tuple(range(ndims))


def _shape_attr(a: Mapping, name: str) -> Shape | None:
    # oneDNN's default for dst_shape / weights_shape is DNNL_MAX_NDIMS zeros: unset.
    value = a.get(name)
    return tuple(value) if value and any(value) else None


def conv_backward_geometry(kind: str, attrs_: Mapping, input_shapes: Sequence[Sequence[int]]) -> ConvBackwardGeometry:
    """The geometry of a convolution backward op from its input shapes and attributes (the
    output's shape from ``dst_shape`` / ``weights_shape`` where the inputs do not give it), or
    ShapeInferenceError. Pads after ``auto_pad`` are oneDNN's forward rule on the convolution's
    src spatial dims (shape_infer.cpp's bprop rules call infer_auto_pad so)."""
    a = normalize_attrs(kind, attrs_)
    shapes = [tuple(s) for s in input_shapes]
    fmt, wfmt = a["data_format"], a["weights_format"]
    transpose = kind.startswith("ConvTranspose")
    weights_from_attr = kind.endswith("Weights")
    conv_dst: Shape | None

    def ncx(shape: Shape) -> Shape:
        return _nxc_to_ncx(shape) if fmt == "NXC" else shape

    if weights_from_attr:
        wei = _shape_attr(a, "weights_shape")
        if wei is None:
            raise _error(kind, "needs the attribute weights_shape (the shape of diff_weights); a shape "
                               "input alone is not read")
        src, diff_dst = shapes[0], shapes[1]
        # ConvTranspose's src is its convolution's dst.
        conv_src, conv_dst = (ncx(diff_dst), ncx(src)) if transpose else (ncx(src), ncx(diff_dst))
    else:
        wei = shapes[1]
        if transpose:
            conv_src, conv_dst = ncx(shapes[0]), None
        else:
            dst_shape = _shape_attr(a, "dst_shape")
            if dst_shape is None:
                raise _error(kind, "needs the attribute dst_shape (the shape of diff_src); a shape input "
                                   "alone is not read")
            conv_src, conv_dst = ncx(dst_shape), ncx(shapes[0])
    if not 3 <= len(conv_src) <= 5 or UNKNOWN in conv_src:
        raise _error(kind, f"the convolution's src {_fmt(conv_src)} (NCX) needs a batch, a channel and 1 to 3 "
                           "known spatial dims")
    if len(wei) != len(conv_src):
        raise _error(kind, f"weights shape {_fmt(wei)} rank differs from the data's {_fmt(conv_src)}")
    order = conv_transpose_weights_order(wfmt, len(wei)) if transpose else _conv_weights_order(wfmt, len(wei))
    weights = tuple(wei[axis] for axis in order)
    nsp = len(conv_src) - 2
    strides, dilations, groups = tuple(a["strides"]), tuple(a["dilations"]), a["groups"]
    if len(strides) != nsp or len(dilations) != nsp:
        raise _error(kind, f"strides {list(strides)} and dilations {list(dilations)} need {nsp} entries "
                           f"for {nsp} spatial dims")
    oc, icg, kernel = weights[0], weights[1], weights[2:]
    if conv_src[1] != icg * groups or oc % groups:
        raise _error(kind, f"channels disagree: the convolution's src {_fmt(conv_src)} (NCX) has "
                           f"{conv_src[1]}, weights {_fmt(wei)} ({wfmt}) take {icg} per group in {groups} "
                           f"groups and give {oc} outputs")
    begin, end, out = [], [], []
    for i in range(nsp):
        pb, pe = auto_pads(conv_src[2 + i], strides[i], kernel[i], dilations[i], a["auto_pad"],
                           a["pads_begin"][i], a["pads_end"][i])
        begin.append(pb)
        end.append(pe)
        size = (conv_src[2 + i] + pb + pe - ((kernel[i] - 1) * dilations[i] + 1)) // strides[i] + 1
        if size < 1:
            raise _error(kind, f"spatial dim {i}: the convolution's src {_fmt(conv_src)}, kernel {kernel[i]}, "
                               f"stride {strides[i]} and pads {pb}+{pe} leave no output")
        out.append(size)
    expected = (conv_src[0], oc, *out)
    if conv_dst is None:
        conv_dst = expected
    elif UNKNOWN not in conv_dst and tuple(conv_dst) != expected:
        raise _error(kind, f"the convolution's dst {_fmt(conv_dst)} (NCX) differs from {_fmt(expected)}, "
                           f"what its src {_fmt(conv_src)}, weights {_fmt(wei)} and pads {begin}+{end} give")
    if weights_from_attr:
        output = wei
    else:
        data = conv_dst if transpose else conv_src
        output = _ncx_to_nxc(data) if fmt == "NXC" else data
    return ConvBackwardGeometry(
        conv_src=tuple(conv_src), conv_dst=tuple(conv_dst), weights=weights, weights_order=order,
        strides=strides, dilations=dilations, pads_begin=tuple(begin), pads_end=tuple(end), groups=groups,
        output=tuple(output),
    )


# -- per-kind rules -------------------------------------------------------------------------


def _matmul(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    src, wei = list(shapes[0]), list(shapes[1])
    if not src or not wei:
        raise _error(kind, f"operands must have rank >= 1, got src {_fmt(src)} and weights {_fmt(wei)}")
    if a["transpose_a"] and len(src) > 1:
        src[-2], src[-1] = src[-1], src[-2]
    if a["transpose_b"] and len(wei) > 1:
        wei[-2], wei[-1] = wei[-1], wei[-2]
    k_src = src[-1]
    k_wei = wei[0] if len(wei) == 1 else wei[-2]
    if k_src != k_wei and UNKNOWN not in (k_src, k_wei):
        raise _error(kind, f"src {_fmt(shapes[0])} and weights {_fmt(shapes[1])} (transpose_a="
                           f"{a['transpose_a']}, transpose_b={a['transpose_b']}) disagree on K: "
                           f"{k_src} vs {k_wei}")
    if len(src) == 1 and len(wei) == 1:
        out: Shape = ()
    elif len(src) == 1:
        out = tuple(wei[:-2]) + (wei[-1],)
    elif len(wei) == 1:
        out = tuple(src[:-1])
    else:
        batch = broadcast_shapes(kind, tuple(src[:-2]), tuple(wei[:-2]))
        out = batch + (src[-2], wei[-1])
    if len(shapes) == 3:
        _one_way(kind, out, shapes[2], "bias")
    return out


def _bias_add(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    src, bias = shapes
    if len(src) < 2:
        raise _error(kind, f"src {_fmt(src)} needs at least 2 dims")
    if len(bias) != 1:
        raise _error(kind, f"bias {_fmt(bias)} must be 1-D")
    channels = src[1] if a["data_format"] == "NCX" else src[-1]
    if UNKNOWN not in (channels, bias[0]) and bias[0] != channels:
        raise _error(kind, f"bias {_fmt(bias)} does not match the {channels} channels of src "
                           f"{_fmt(src)} ({a['data_format']})")
    return src


def _convolution(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    geometry = spatial_geometry(kind, a, shapes[0], shapes[1])
    if len(shapes) == 3:
        bias = shapes[2]
        if len(bias) != 1 or UNKNOWN not in (bias[0], geometry.out_channels) and bias[0] != geometry.out_channels:
            raise _error(kind, f"bias {_fmt(bias)} must be 1-D with the {geometry.out_channels} "
                               f"output channels")
    out = (geometry.batch, geometry.out_channels, *geometry.out_spatial)
    return _ncx_to_nxc(out) if a["data_format"] == "NXC" else out


def _pool(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    geometry = spatial_geometry(kind, a, shapes[0])
    out = (geometry.batch, geometry.in_channels, *geometry.out_spatial)
    return _ncx_to_nxc(out) if a["data_format"] == "NXC" else out


# -- pooling backward (issue 21) --
def pool_backward_src_shape(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    """The forward's src shape of a MaxPoolBackward (its input 0) or AvgPoolBackward (its
    ``src_shape`` attribute: a src_shape input's values are not known here), which is diff_src's."""
    if kind == "MaxPoolBackward":
        return tuple(shapes[0])
    src = tuple(a.get("src_shape") or ())
    if not any(src):  # oneDNN's unset value: empty, or zeros
        raise _error(kind, "the src_shape attribute is not set; give it, or diff_src's shape")
    if len(src) != len(shapes[0]):
        raise _error(kind, f"src_shape {list(src)} and diff_dst {_fmt(shapes[0])} differ in rank")
    return src


def _pool_backward(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    src = pool_backward_src_shape(kind, a, shapes)
    diff_dst = tuple(shapes[1] if kind == "MaxPoolBackward" else shapes[0])
    pooled = _pool(kind, a, [src])
    if len(diff_dst) != len(pooled) or any(
        d != p and UNKNOWN not in (d, p) for d, p in zip(diff_dst, pooled)
    ):
        raise _error(kind, f"diff_dst shape {_fmt(diff_dst)} differs from {_fmt(pooled)}, the pooled "
                           f"shape of src {_fmt(src)} ({a['data_format']})")
    return src


def norm_axes(kind: str, begin_norm_axis: int, ndim: int) -> tuple[int, ...]:
    """The axes LayerNorm/RMSNorm normalise over: ``begin_norm_axis`` to the last."""
    begin = _normal_axis(kind, begin_norm_axis, ndim, "begin_norm_axis")
    return tuple(range(begin, ndim))


def _layer_norm(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    src = shapes[0]
    axes = norm_axes(kind, a["begin_norm_axis"], len(src))
    normalized = src[axes[0]:]
    for name, shape in zip(("gamma", "beta"), shapes[1:]):
        count = math.prod(normalized) if UNKNOWN not in normalized else UNKNOWN
        size = math.prod(shape) if UNKNOWN not in shape else UNKNOWN
        # The normalized dims themselves, or flattened to one dim of the same size.
        flattened = len(shape) == 1 and (size == count or UNKNOWN in (size, count))
        if tuple(shape) != normalized and not flattened:
            raise _error(kind, f"{name} shape {_fmt(shape)} must be the normalized dims "
                               f"{_fmt(normalized)} of src {_fmt(src)} (begin_norm_axis="
                               f"{a['begin_norm_axis']})")
    stats = src[:axes[0]]
    return [src] + [stats] * (num_outputs - 1)


def _rms_norm(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    src = shapes[0]
    axes = norm_axes(kind, a["begin_norm_axis"], len(src))
    if len(shapes) == 2:
        _one_way(kind, src, shapes[1], "gamma")
    return [src] + [src[:axes[0]]] * (num_outputs - 1)


def _batch_norm(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    src = shapes[0]
    if len(src) < 2:
        raise _error(kind, f"src {_fmt(src)} needs at least 2 dims")
    channels = src[1] if a["data_format"] == "NCX" else src[-1]
    for name, shape in zip(("gamma", "beta", "mean", "variance"), shapes[1:]):
        if len(shape) != 1 or UNKNOWN not in (shape[0], channels) and shape[0] != channels:
            raise _error(kind, f"{name} shape {_fmt(shape)} must be [{channels}], the channels of "
                               f"src {_fmt(src)} ({a['data_format']})")
    return src


# -- normalization training (issue 21) --


def _norm_training(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    """BatchNormForwardTraining, BatchNormTrainingBackward, LayerNormBackward: the data inputs
    (src, and diff_dst for the backward ops) alike; the rest per channel (batch) or per row and
    per normalised element (layer)."""
    src = shapes[0]
    if len(src) < 2:
        raise _error(kind, f"src {_fmt(src)} needs at least 2 dims")
    data = 1 if kind == "BatchNormForwardTraining" else 2
    for shape in shapes[1:data]:
        if len(shape) != len(src) or any(UNKNOWN not in (d, e) and d != e for d, e in zip(shape, src)):
            raise _error(kind, f"diff_dst shape {_fmt(shape)} differs from src shape {_fmt(src)}")
    names = schema_of(kind).input_names[data:]
    if kind == "LayerNormBackward":
        begin = norm_axes(kind, a["begin_norm_axis"], len(src))[0]
        rows, normalized = tuple(src[:begin]), tuple(src[begin:])
        count = math.prod(normalized) if UNKNOWN not in normalized else UNKNOWN
        for name, shape in zip(names, shapes[data:]):
            if name in ("mean", "variance"):
                ok = len(shape) == len(rows) and all(UNKNOWN in (d, e) or d == e for d, e in zip(shape, rows))
                want = _fmt(rows)
            else:
                size = math.prod(shape) if UNKNOWN not in shape else UNKNOWN
                ok = tuple(shape) == normalized or len(shape) == 1 and UNKNOWN in (size, count) or size == count
                want = f"{_fmt(normalized)} (or flattened)"
            if not ok:
                raise _error(kind, f"{name} shape {_fmt(shape)} must be {want} for src {_fmt(src)} and "
                                   f"begin_norm_axis {a['begin_norm_axis']}")
        element = tuple(shapes[4]) if len(shapes) > 4 else normalized
        return [src, element, element][:num_outputs]
    channels = src[1] if a["data_format"] == "NCX" else src[-1]
    for name, shape in zip(names, shapes[data:]):
        if len(shape) != 1 or UNKNOWN not in (shape[0], channels) and shape[0] != channels:
            raise _error(kind, f"{name} shape {_fmt(shape)} must be [{channels}], the channels of "
                               f"src {_fmt(src)} ({a['data_format']})")
    return [src, *[(channels,)] * 4][:num_outputs]


def reshape_target(kind: str, attrs_: Mapping, src: Shape) -> Shape:
    """StaticReshape's output shape: ``special_zero`` copies the input dim for a 0, one ``-1``
    takes what is left."""
    a = normalize_attrs(kind, attrs_)
    target = list(a["shape"])
    for i, d in enumerate(target):
        if d == 0 and a["special_zero"]:
            if i >= len(src):
                raise _error(kind, f"shape {a['shape']} has a 0 at position {i} with special_zero, "
                                   f"but src {_fmt(src)} has only {len(src)} dims")
            target[i] = src[i]
    if UNKNOWN in src:
        # Unknown input dims leave the -1 unknown and the sizes uncheckable.
        return tuple(target)
    in_size = math.prod(src)
    if target.count(-1) == 1:
        rest = math.prod(d for d in target if d != -1)
        if rest == 0 or in_size % rest:
            raise _error(kind, f"shape {a['shape']} (special_zero={a['special_zero']}) cannot "
                               f"hold the {in_size} elements of src {_fmt(src)}")
        target[target.index(-1)] = in_size // rest
    if math.prod(target) != in_size:
        raise _error(kind, f"shape {a['shape']} (special_zero={a['special_zero']}) has "
                           f"{math.prod(target)} elements, src {_fmt(src)} has {in_size}")
    return tuple(target)


def transpose_order(kind: str, attrs_: Mapping, ndim: int) -> tuple[int, ...]:
    """StaticTranspose's order with negative entries made positive (empty: reversed axes)."""
    order = normalize_attrs(kind, attrs_)["order"]
    if not order:
        return tuple(reversed(range(ndim)))
    if len(order) != ndim:
        raise _error(kind, f"order {order} has {len(order)} entries for a rank-{ndim} src")
    normal = tuple(_normal_axis(kind, axis, ndim, "order entry") for axis in order)
    if len(set(normal)) != ndim:
        raise _error(kind, f"order {order} is not a permutation of the {ndim} axes")
    return normal


def _concat(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    first = shapes[0]
    axis = _normal_axis(kind, a["axis"], len(first))
    total = 0
    for i, shape in enumerate(shapes):
        if len(shape) != len(first):
            raise _error(kind, f"input {i} shape {_fmt(shape)} rank differs from input 0 {_fmt(first)}")
        for d, (x, y) in enumerate(zip(shape, first)):
            if d != axis and x != y and UNKNOWN not in (x, y):
                raise _error(kind, f"input {i} shape {_fmt(shape)} differs from input 0 "
                                   f"{_fmt(first)} at dim {d} (concat axis {a['axis']})")
        total = UNKNOWN if UNKNOWN in (total, shape[axis]) else total + shape[axis]
    out = list(first)
    out[axis] = total
    for d in range(len(out)):
        if d != axis and out[d] == UNKNOWN:
            out[d] = max(shape[d] for shape in shapes)
    return tuple(out)


def reduce_axes(kind: str, attrs_: Mapping, ndim: int) -> tuple[int, ...]:
    """A reduction's axes from its ``axes`` attribute, made positive and sorted."""
    a = normalize_attrs(kind, attrs_)
    if "axes" not in a:
        raise _error(kind, "the axes come as the second input; output shapes cannot be inferred "
                           "without its values")
    axes = a["axes"]
    if not axes:
        raise _error(kind, "axes is empty (oneDNN does not implement an empty reduction)")
    normal = [_normal_axis(kind, axis, ndim, "axes entry") for axis in axes]
    if len(set(normal)) != len(normal):
        raise _error(kind, f"axes {axes} name an axis twice for a rank-{ndim} src")
    return tuple(sorted(normal))


def _reduce(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    src = shapes[0]
    axes = reduce_axes(kind, a, len(src))
    if a["keep_dims"]:
        return tuple(1 if i in axes else d for i, d in enumerate(src))
    return tuple(d for i, d in enumerate(src) if i not in axes)


def prelu_slope_shape(kind: str, attrs_: Mapping, src: Shape, slope: Shape) -> Shape:
    """PReLU's slope shape as it broadcasts to ``src``, padded with 1s to src's rank (oneDNN's
    PReLU.md rules): a 1-D slope as long as the channels sits on the channel dim (1 for NCX,
    the last for NXC) under ``per_channel_broadcast``; otherwise numpy's right alignment, one
    way (each slope dim 1 or src's)."""
    a = normalize_attrs(kind, attrs_)
    src, slope = tuple(src), tuple(slope)
    if len(slope) > len(src):
        raise _error(kind, f"slope {_fmt(slope)} has more dims than src {_fmt(src)}")
    # PReLUBackward has no per_channel_broadcast: its 1-D slope is always per channel.
    if len(slope) == 1 and len(src) >= 2 and a.get("per_channel_broadcast", True) and slope[0] != 1:
        channel = 1 if a["data_format"] == "NCX" else len(src) - 1
        if UNKNOWN not in (slope[0], src[channel]) and slope[0] != src[channel]:
            raise _error(kind, f"slope {_fmt(slope)} must have the {src[channel]} channels of src "
                               f"{_fmt(src)} ({a['data_format']}, per_channel_broadcast)")
        return tuple(slope[0] if i == channel else 1 for i in range(len(src)))
    _one_way(kind, src, slope, "slope")
    return (1,) * (len(src) - len(slope)) + slope


def _interpolate(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    """oneDNN's infer_interpolate_output_shape: the spatial dims become ``sizes``, or
    ``in * scale`` computed in float32 and truncated (C's ``int64 *= float``)."""
    src = shapes[0]
    nsp = len(src) - 2
    if not 1 <= nsp <= 3:
        raise _error(kind, f"src {_fmt(src)} needs a batch, a channel and 1 to 3 spatial dims")
    start = 2 if a["data_format"] == "NCX" else 1
    given = "sizes" if a.get("sizes") else "scales"
    values = a[given]
    if len(values) != nsp:
        raise _error(kind, f"{given} {values} has {len(values)} entries for the {nsp} spatial dims of "
                           f"src {_fmt(src)} ({a['data_format']})")
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
            raise _error(kind, f"spatial dim {i} of src {_fmt(src)} becomes {out[start + i]} with {given} {values}")
    return tuple(out)


def _same_known(kind: str, shape: Shape, want: Shape, name: str, other: str) -> None:
    """ShapeInferenceError unless ``shape`` is ``want`` wherever both dims are known (issue 21's
    backward ops: a gradient has the shape of the tensor it is the gradient of)."""
    if len(shape) != len(want) or any(UNKNOWN not in (d, w) and d != w for d, w in zip(shape, want)):
        raise _error(kind, f"{name} shape {_fmt(shape)} differs from {other} shape {_fmt(want)}")


def _select(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    cond, src0, src1 = shapes
    if a["auto_broadcast"] == "none":
        return _same_shapes(kind, shapes)
    out = broadcast_shapes(kind, src0, src1)
    # oneDNN broadcasts cond one way (to the broadcast of the two sources).
    _one_way(kind, out, cond, "cond")
    return out


def infer_output_shapes(kind: str, attrs: Mapping, input_shapes: Sequence[Sequence[int]],
                        num_outputs: int | None = None) -> list[Shape]:
    """The output shapes of an op of ``kind`` with ``attrs`` and inputs of ``input_shapes``.

    ``num_outputs`` picks how many outputs the op has where that varies (LayerNorm: 1, or 3 with
    mean and variance; SoftMax: 1, or 2 with stats; RMSNorm: 1, or 2 with rrms). None takes
    LayerNorm's from ``keep_stats`` and one output for the others. End has none. Wildcard's
    outputs cannot be inferred (ShapeInferenceError), as in oneDNN.
    """
    schema = schema_of(kind)
    a = normalize_attrs(kind, attrs)
    shapes = _to_shapes(kind, input_shapes)
    low, high = schema.num_inputs
    if not low <= len(shapes) <= high:
        raise _error(kind, f"takes {low if low == high else f'{low} to {high}'} inputs, got "
                           f"{len(shapes)}")
    if num_outputs is None:
        num_outputs = 3 if kind in ("LayerNorm", "GroupNorm") and a["keep_stats"] else min(1, schema.num_outputs[1])
        num_outputs = max(num_outputs, schema.num_outputs[0])  # BatchNormForwardTraining: all 5
    if not schema.num_outputs[0] <= num_outputs <= schema.num_outputs[1]:
        raise _error(kind, f"cannot have {num_outputs} outputs (schema: {schema.num_outputs})")
    category = schema.category
    if kind == "Wildcard":
        raise _error(kind, "Wildcard ops have no shape rule; give their output shapes")
    if kind == "End":
        return []
    if category == "eltwise" or kind in ("Reorder", "TypeCast"):
        return [shapes[0]]
    if category == "eltwise_backward":
        # diff_src is shaped like src (or dst); diff_dst must be too (no broadcasting).
        if tuple(shapes[1]) != tuple(shapes[0]) and all(d >= 0 for d in (*shapes[0], *shapes[1])):
            raise _error(kind, f"diff_dst shape {_fmt(shapes[1])} differs from src shape {_fmt(shapes[0])}")
        return [shapes[0]]
    if kind == "GenIndex":
        _normal_axis(kind, a["axis"], len(shapes[0]))
        return [shapes[0]]
    if kind == "Dropout":  # Dropout (issue 21): dst and mask shaped as src; scalars hold one value
        for name, shape in zip(("seed", "offset", "probability"), shapes[1:]):
            if all(d >= 0 for d in shape) and math.prod(shape) != 1:
                raise _error(kind, f"{name} holds one value; its shape {_fmt(shape)} holds {math.prod(shape)}")
        return [shapes[0]] * num_outputs
    if kind in ("DynamicQuantize", "DynamicDequantize"):
        quantization_groups(kind, a, shapes[0], shapes[1])
        if len(shapes) > 2 and tuple(shapes[2]) != tuple(shapes[1]) and math.prod(shapes[2]) != 1:
            raise _error(kind, f"zps shape {_fmt(shapes[2])} differs from scales shape {_fmt(shapes[1])}")
        return [shapes[0]]
    if kind in ("Quantize", "Dequantize"):
        if a["qtype"] == "per_channel":
            axis = _normal_axis(kind, a["axis"], len(shapes[0]))
            if shapes[0][axis] >= 0 and len(a["scales"]) != shapes[0][axis]:
                raise _error(kind, f"{len(a['scales'])} scales for axis {a['axis']} of shape "
                                   f"{_fmt(shapes[0])}: one per channel expected")
        return [shapes[0]]
    if category == "binary":
        if a["auto_broadcast"] == "none":
            return [_same_shapes(kind, shapes)]
        return [broadcast_shapes(kind, *shapes)]
    if kind == "Select":
        return [_select(kind, a, shapes)]
    if kind == "Interpolate":
        return [_interpolate(kind, a, shapes)]
    if kind == "PReLU":
        prelu_slope_shape(kind, a, shapes[0], shapes[1])
        return [shapes[0]]
    # -- softmax, PReLU and Interpolate backward (issue 21) --
    if category == "softmax_backward":
        _normal_axis(kind, a["axis"], len(shapes[1]))
        _same_known(kind, shapes[0], shapes[1], "diff_dst", "dst")
        return [shapes[1]]
    if kind == "PReLUBackward":
        prelu_slope_shape(kind, a, shapes[0], shapes[1])
        _same_known(kind, shapes[2], shapes[0], "diff_dst", "src")
        return [shapes[0], shapes[1]][:num_outputs]
    if kind == "InterpolateBackward":
        _same_known(kind, shapes[1], _interpolate(kind, a, shapes[:1]), "diff_dst", "the forward's dst")
        return [shapes[0]]
    if kind == "MatMul":
        return [_matmul(kind, a, shapes)]
    if kind == "BiasAdd":
        return [_bias_add(kind, a, shapes)]
    if kind == "Convolution":
        return [_convolution(kind, a, shapes)]
    if kind == "ConvTranspose":
        return [_conv_transpose(kind, a, shapes)]
    if category == "convolution_backward":
        return [conv_backward_geometry(kind, a, shapes).output]
    if category == "pooling":
        return [_pool(kind, a, shapes)]
    if category == "pooling_backward":
        return [_pool_backward(kind, a, shapes)]
    if kind in ("SoftMax", "LogSoftmax"):
        src = shapes[0]
        axis = _normal_axis(kind, a["axis"], len(src))
        stats = tuple(1 if i == axis else d for i, d in enumerate(src))
        return [src, stats][:num_outputs]
    if kind == "LayerNorm":
        return _layer_norm(kind, a, shapes, num_outputs)
    if kind == "RMSNorm":
        return _rms_norm(kind, a, shapes, num_outputs)
    if kind == "BatchNormInference":
        return [_batch_norm(kind, a, shapes)]
    if kind in ("BatchNormForwardTraining", "BatchNormTrainingBackward", "LayerNormBackward"):  # issue 21
        return _norm_training(kind, a, shapes, num_outputs)
    if kind == "GroupNorm":
        src = shapes[0]
        channel = 1 if a["data_format"] == "NCX" else len(src) - 1
        if len(src) < 2 or (src[channel] != UNKNOWN and src[channel] % a["groups"]):
            raise _error(kind, f"src {list(src)} has channels not divisible by groups {a['groups']}")
        return [src, (src[0], a["groups"]), (src[0], a["groups"])][:num_outputs]
    if schema.category == "unsupported":
        raise _error(kind, "triodnn does not run this op; give its output shapes")
    if kind == "StaticReshape":
        return [reshape_target(kind, a, shapes[0])]
    if kind == "StaticTranspose":
        order = transpose_order(kind, a, len(shapes[0]))
        return [tuple(shapes[0][axis] for axis in order)]
    if kind == "Concat":
        return [_concat(kind, a, shapes)]
    if category == "reduction":
        return [_reduce(kind, a, shapes)]
    raise _error(kind, "no shape rule")  # not reached: every kind of OP_SCHEMAS is handled above


__all__ = [
    "UNKNOWN", "ConvBackwardGeometry", "conv_backward_geometry",
    "UNKNOWN", "ConvTransposeGeometry", "SpatialGeometry", "auto_pads", "conv_transpose_geometry",
    "conv_transpose_weights_order", "broadcast_shapes", "infer_output_shapes",
    "norm_axes", "prelu_slope_shape", "reduce_axes", "reshape_target", "spatial_geometry", "transpose_order",
]
