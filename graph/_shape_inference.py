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

from .._values._errors import ShapeInferenceError
from ._op_registry import graph_op
from ._op_schema import normalize_attrs

UNKNOWN = -1
Shape = tuple[int, ...]


def shape_error(kind: str, message: str) -> ShapeInferenceError:
    return ShapeInferenceError(f"{kind}: {message}")


def fmt_shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join("?" if d == UNKNOWN else str(d) for d in shape) + "]"


def _to_shapes(kind: str, input_shapes) -> list[Shape]:
    shapes = []
    for i, shape in enumerate(input_shapes):
        if shape is None:
            raise shape_error(kind, f"input {i} has an unknown rank; shapes cannot be inferred")
        try:
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise shape_error(kind, f"input {i} shape {shape!r} is not a sequence of integers") from None
        if any(d < UNKNOWN for d in dims):
            raise shape_error(kind, f"input {i} shape {list(dims)} has a negative dim")
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
            raise shape_error(kind, f"per_tensor takes one scale, scales have shape {fmt_shape(scales)}")
        return src
    if a["qtype"] == "per_channel":
        axis = normal_axis(kind, a["axis"], len(src))
        if math.prod(scales) != src[axis]:
            raise shape_error(kind, f"per_channel along axis {a['axis']} of {fmt_shape(src)} takes {src[axis]} scales, "
                                    f"got shape {fmt_shape(scales)}")
        return tuple(1 if i == axis else d for i, d in enumerate(src))
    group = tuple(a.get("group_shape") or ())
    if len(scales) != len(src) or (group and len(group) != len(src)):
        raise shape_error(kind, f"per_group scales {fmt_shape(scales)} and group_shape {list(group)} need src's rank {len(src)}")
    if not group:
        group = tuple(d // max(s, 1) for d, s in zip(src, scales))
    if any(g < 1 or d % g or d // g != s for d, g, s in zip(src, group, scales)):
        raise shape_error(kind, f"scales {fmt_shape(scales)} are not src {fmt_shape(src)} in groups of {list(group)}")
    return group


def normal_axis(kind: str, axis: int, ndim: int, what: str = "axis") -> int:
    if not -ndim <= axis < max(ndim, 1) or ndim == 0:
        raise shape_error(kind, f"{what} {axis} is out of range for rank {ndim} (expected [{-ndim}, {ndim - 1}])")
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
                raise shape_error(kind, "shapes " + ", ".join(fmt_shape(s) for s in shapes)
                                       + f" do not broadcast (numpy rules): dim {i - rank} is {out[i]} vs {d}")
            out[i] = merged
    return tuple(out)


def check_one_way(kind: str, target: Shape, shape: Shape, what: str) -> None:
    """``shape`` must broadcast to ``target`` without changing it."""
    ok = len(shape) <= len(target) and all(
        d in (1, t) or UNKNOWN in (d, t) for d, t in zip(reversed(shape), reversed(target))
    )
    if not ok:
        raise shape_error(kind, f"{what} shape {fmt_shape(shape)} does not broadcast to {fmt_shape(target)}")


def same_shapes(kind: str, shapes: Sequence[Shape]) -> Shape:
    first = shapes[0]
    for shape in shapes[1:]:
        if len(shape) != len(first) or any(
            a != b and UNKNOWN not in (a, b) for a, b in zip(shape, first)
        ):
            raise shape_error(kind, "auto_broadcast='none' needs equal shapes, got "
                                   + ", ".join(fmt_shape(s) for s in shapes))
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


def ncx_to_nxc(shape: Shape) -> Shape:
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
        raise shape_error(kind, f"src shape {fmt_shape(src)} needs a batch, a channel and at least one "
                                f"spatial dim")
    src_ncx = _nxc_to_ncx(src) if fmt == "NXC" else src
    nsp = len(src) - 2
    strides = tuple(a["strides"])
    if len(strides) != nsp:
        raise shape_error(kind, f"strides {list(strides)} has {len(strides)} entries for src "
                                f"{fmt_shape(src)} ({fmt}) with {nsp} spatial dims")
    dilations = tuple(a.get("dilations", [1] * nsp))
    if kind == "Convolution":
        assert weights_shape is not None, "a Convolution's geometry is asked with its weights' shape"
        wei = tuple(weights_shape)
        if len(wei) != len(src):
            raise shape_error(kind, f"weights shape {fmt_shape(wei)} rank differs from src {fmt_shape(src)}")
        wei_oix = _xio_to_oix(wei) if a["weights_format"] == "XIO" else wei
        kernel = wei_oix[2:]
        groups = a["groups"]
        in_channels, out_channels = src_ncx[1], wei_oix[0]
        known = UNKNOWN not in (in_channels, wei_oix[1])
        if known and in_channels != wei_oix[1] * groups:
            raise shape_error(kind, f"src channels {in_channels} (src {fmt_shape(src)}, {fmt}) divided by "
                                    f"groups {groups} must equal the weights' input channels "
                                    f"{wei_oix[1]} (weights {fmt_shape(wei)}, {a['weights_format']})")
        if out_channels != UNKNOWN and out_channels % groups:
            raise shape_error(kind, f"weights output channels {out_channels} are not divisible by "
                                    f"groups {groups}")
    else:
        kernel = tuple(a["kernel"])
        if len(kernel) != nsp:
            raise shape_error(kind, f"kernel {list(kernel)} has {len(kernel)} entries for src "
                                    f"{fmt_shape(src)} ({fmt}) with {nsp} spatial dims")
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
            raise shape_error(kind, f"spatial dim {i}: input {in_spatial[i]} with pads {pb}+{pe}, "
                                    f"kernel {kernel[i]}, dilation {dilations[i]} and stride "
                                    f"{strides[i]} leaves no output (src {fmt_shape(src)}, {fmt})")
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
        raise shape_error(kind, f"src shape {fmt_shape(src)} needs a batch, a channel and 1 to 3 spatial dims")
    if len(wei) != len(src):
        raise shape_error(kind, f"weights shape {fmt_shape(wei)} rank differs from src {fmt_shape(src)}")
    nsp = len(src) - 2
    src_ncx = _nxc_to_ncx(src) if fmt == "NXC" else src
    i_axis, o_axis, *k_axes = conv_transpose_weights_order(wfmt, len(wei))
    kernel = tuple(wei[k] for k in k_axes)
    groups = a["groups"]
    in_channels, w_in = src_ncx[1], wei[i_axis]
    if UNKNOWN not in (in_channels, w_in) and (in_channels != w_in or in_channels % groups):
        raise shape_error(kind, f"src channels {in_channels} (src {fmt_shape(src)}, {fmt}) must equal the weights' input "
                                f"channels {w_in} (weights {fmt_shape(wei)}, {wfmt}) and divide by groups {groups}")
    strides, dilations = tuple(a["strides"]), tuple(a["dilations"])
    if len(strides) != nsp:
        raise shape_error(kind, f"strides {list(strides)} has {len(strides)} entries for src {fmt_shape(src)} ({fmt}) "
                                f"with {nsp} spatial dims")
    output_padding = tuple(a.get("output_padding") or [0] * nsp)
    if len(output_padding) < nsp:
        raise shape_error(kind, f"output_padding {list(output_padding)} has fewer entries than the {nsp} spatial dims")
    output_padding = output_padding[:nsp]
    begin, end, out = [], [], []
    for i in range(nsp):
        pb, pe = a["pads_begin"][i], a["pads_end"][i]
        if a["auto_pad"] == "VALID":
            pb = pe = 0
        elif a["auto_pad"] in ("SAME_UPPER", "SAME_LOWER"):
            if dilations[i] != 1:
                raise shape_error(kind, f"auto_pad {a['auto_pad']} needs dilations of 1, got {list(dilations)}")
            needed = kernel[i] - strides[i]
            if needed < 0:
                raise shape_error(kind, f"auto_pad {a['auto_pad']}: kernel {kernel[i]} is smaller than stride "
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
            raise shape_error(kind, f"spatial dim {i}: input {size}, kernel {kernel[i]}, stride {strides[i]}, pads "
                                    f"{pb}+{pe} leave no output (src {fmt_shape(src)})")
        out.append(o)
    out_channels = UNKNOWN if wei[o_axis] == UNKNOWN else wei[o_axis] * groups
    return ConvTransposeGeometry(
        batch=src_ncx[0], in_channels=in_channels, out_channels=out_channels, groups=groups, kernel=kernel,
        strides=strides, dilations=dilations, pads_begin=tuple(begin), pads_end=tuple(end),
        output_padding=output_padding, out_spatial=tuple(out),
    )


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
            raise shape_error(kind, "needs the attribute weights_shape (the shape of diff_weights); a shape "
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
                raise shape_error(kind, "needs the attribute dst_shape (the shape of diff_src); a shape input "
                                        "alone is not read")
            conv_src, conv_dst = ncx(dst_shape), ncx(shapes[0])
    if not 3 <= len(conv_src) <= 5 or UNKNOWN in conv_src:
        raise shape_error(kind, f"the convolution's src {fmt_shape(conv_src)} (NCX) needs a batch, a channel and 1 to 3 "
                                "known spatial dims")
    if len(wei) != len(conv_src):
        raise shape_error(kind, f"weights shape {fmt_shape(wei)} rank differs from the data's {fmt_shape(conv_src)}")
    order = conv_transpose_weights_order(wfmt, len(wei)) if transpose else _conv_weights_order(wfmt, len(wei))
    weights = tuple(wei[axis] for axis in order)
    nsp = len(conv_src) - 2
    strides, dilations, groups = tuple(a["strides"]), tuple(a["dilations"]), a["groups"]
    if len(strides) != nsp or len(dilations) != nsp:
        raise shape_error(kind, f"strides {list(strides)} and dilations {list(dilations)} need {nsp} entries "
                                f"for {nsp} spatial dims")
    oc, icg, kernel = weights[0], weights[1], weights[2:]
    if conv_src[1] != icg * groups or oc % groups:
        raise shape_error(kind, f"channels disagree: the convolution's src {fmt_shape(conv_src)} (NCX) has "
                                f"{conv_src[1]}, weights {fmt_shape(wei)} ({wfmt}) take {icg} per group in {groups} "
                                f"groups and give {oc} outputs")
    begin, end, out = [], [], []
    for i in range(nsp):
        pb, pe = auto_pads(conv_src[2 + i], strides[i], kernel[i], dilations[i], a["auto_pad"],
                           a["pads_begin"][i], a["pads_end"][i])
        begin.append(pb)
        end.append(pe)
        size = (conv_src[2 + i] + pb + pe - ((kernel[i] - 1) * dilations[i] + 1)) // strides[i] + 1
        if size < 1:
            raise shape_error(kind, f"spatial dim {i}: the convolution's src {fmt_shape(conv_src)}, kernel {kernel[i]}, "
                                    f"stride {strides[i]} and pads {pb}+{pe} leave no output")
        out.append(size)
    expected = (conv_src[0], oc, *out)
    if conv_dst is None:
        conv_dst = expected
    elif UNKNOWN not in conv_dst and tuple(conv_dst) != expected:
        raise shape_error(kind, f"the convolution's dst {fmt_shape(conv_dst)} (NCX) differs from {fmt_shape(expected)}, "
                                f"what its src {fmt_shape(conv_src)}, weights {fmt_shape(wei)} and pads {begin}+{end} give")
    if weights_from_attr:
        output = wei
    else:
        data = conv_dst if transpose else conv_src
        output = ncx_to_nxc(data) if fmt == "NXC" else data
    return ConvBackwardGeometry(
        conv_src=tuple(conv_src), conv_dst=tuple(conv_dst), weights=weights, weights_order=order,
        strides=strides, dilations=dilations, pads_begin=tuple(begin), pads_end=tuple(end), groups=groups,
        output=tuple(output),
    )


# -- helpers the families' rules share (the rules themselves: triodnn.graph.ops) --------------


def prelu_slope_shape(kind: str, attrs_: Mapping, src: Shape, slope: Shape) -> Shape:
    """PReLU's slope shape as it broadcasts to ``src``, padded with 1s to src's rank (oneDNN's
    PReLU.md rules): a 1-D slope as long as the channels sits on the channel dim (1 for NCX,
    the last for NXC) under ``per_channel_broadcast``; otherwise numpy's right alignment, one
    way (each slope dim 1 or src's)."""
    a = normalize_attrs(kind, attrs_)
    src, slope = tuple(src), tuple(slope)
    if len(slope) > len(src):
        raise shape_error(kind, f"slope {fmt_shape(slope)} has more dims than src {fmt_shape(src)}")
    # PReLUBackward has no per_channel_broadcast: its 1-D slope is always per channel.
    if len(slope) == 1 and len(src) >= 2 and a.get("per_channel_broadcast", True) and slope[0] != 1:
        channel = 1 if a["data_format"] == "NCX" else len(src) - 1
        if UNKNOWN not in (slope[0], src[channel]) and slope[0] != src[channel]:
            raise shape_error(kind, f"slope {fmt_shape(slope)} must have the {src[channel]} channels of src "
                                    f"{fmt_shape(src)} ({a['data_format']}, per_channel_broadcast)")
        return tuple(slope[0] if i == channel else 1 for i in range(len(src)))
    check_one_way(kind, src, slope, "slope")
    return (1,) * (len(src) - len(slope)) + slope


def one_output(rule):
    """A shape rule (``GraphOp.shapes``) from ``rule(kind, attrs, shapes) -> shape``, for an op
    with one output."""
    return lambda kind, a, shapes, num_outputs: [rule(kind, a, shapes)]


def shaped_as_input(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    """The shape rule of an op whose one output has its first input's shape (unary eltwise,
    Reorder, TypeCast)."""
    return [shapes[0]]


def check_same_known(kind: str, shape: Shape, want: Shape, name: str, other: str) -> None:
    """ShapeInferenceError unless ``shape`` is ``want`` wherever both dims are known (the
    backward ops: a gradient has the shape of the tensor it is the gradient of)."""
    if len(shape) != len(want) or any(UNKNOWN not in (d, w) and d != w for d, w in zip(shape, want)):
        raise shape_error(kind, f"{name} shape {fmt_shape(shape)} differs from {other} shape {fmt_shape(want)}")


def infer_output_shapes(kind: str, attrs: Mapping, input_shapes: Sequence[Sequence[int]],
                        num_outputs: int | None = None) -> list[Shape]:
    """The output shapes of an op of ``kind`` with ``attrs`` and inputs of ``input_shapes``.

    ``num_outputs`` picks how many outputs the op has where that varies (LayerNorm: 1, or 3 with
    mean and variance; SoftMax: 1, or 2 with stats; RMSNorm: 1, or 2 with rrms). None takes
    LayerNorm's from ``keep_stats`` and one output for the others. End has none. Wildcard's
    outputs cannot be inferred (ShapeInferenceError), as in oneDNN.
    """
    op = graph_op(kind)
    schema = op.schema
    a = normalize_attrs(kind, attrs)
    shapes = _to_shapes(kind, input_shapes)
    low, high = schema.num_inputs
    if not low <= len(shapes) <= high:
        raise shape_error(kind, f"takes {low if low == high else f'{low} to {high}'} inputs, got "
                                     f"{len(shapes)}")
    if num_outputs is None:
        # keep_stats (LayerNorm, GroupNorm): every output; otherwise the first alone, or all the
        # outputs an op always has (BatchNormForwardTraining: 5).
        num_outputs = schema.num_outputs[1] if a.get("keep_stats") else min(1, schema.num_outputs[1])
        num_outputs = max(num_outputs, schema.num_outputs[0])
    if not schema.num_outputs[0] <= num_outputs <= schema.num_outputs[1]:
        raise shape_error(kind, f"cannot have {num_outputs} outputs (schema: {schema.num_outputs})")
    if op.shapes is None:
        raise shape_error(kind, f"{op.not_run}: there is no shape rule; give the output shapes")
    return op.shapes(kind, a, shapes, num_outputs)


__all__ = [
    "UNKNOWN", "ConvBackwardGeometry", "conv_backward_geometry",
    "UNKNOWN", "ConvTransposeGeometry", "SpatialGeometry", "auto_pads", "conv_transpose_geometry",
    "conv_transpose_weights_order", "broadcast_shapes", "infer_output_shapes",
    "prelu_slope_shape", "spatial_geometry",
]
