"""Numpy references of oneDNN Graph ops, one op at a time.

``reference(kind, attrs, inputs, output_dtypes)`` computes an op the textbook way in float64 and
returns each output converted to its data type. Values are user-facing: f32, f16 and bf16
tensors are float32 arrays holding values of their type (bf16 and f16 already rounded), s32 is
int32, s8/u8 int8/uint8, ``boolean`` is ``np.bool_``. Outputs follow the same convention, so
one op's outputs feed the next op's inputs unchanged: an f16 or bf16 output is rounded to its
type (to nearest even) and returned as float32; integer outputs round to nearest and saturate.

Elementwise algorithms reuse ``triodnn.kernels.eltwise.reference`` (the formulas the kernels are
tested against); everything else is written here: MatMul and Convolution with float64 matmuls
(exact on integer data, so f32 results computed in any order agree), pooling through
``triodnn.kernels.pooling.reference`` after the graph's ``auto_pad``/``rounding_type`` are
turned into plain pads.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._values import _dtypes
from .._values._algorithms import eltwise_parameters as eltwise_defaults
from .._values._errors import InvalidGraphError, UnsupportedError
from ..graph._op_schema import check_op, eltwise_backward_parameters, eltwise_parameters, schema_of
from ..graph._shape_inference import (
    conv_backward_geometry,
    conv_transpose_geometry,
    conv_transpose_weights_order,
    infer_output_shapes,
    norm_axes,
    pool_backward_src_shape,
    prelu_slope_shape,
    quantization_groups,
    reduce_axes,
    reshape_target,
    spatial_geometry,
    transpose_order,
)
from ..kernels import convolution as kernel_convolution
from ..kernels import convolution_bwd_weights as kernel_convolution_bwd_weights
from ..kernels import deconvolution as kernel_deconvolution
from ..kernels import dropout as kernel_dropout  # Dropout (issue 21)
from ..kernels import eltwise as kernel_eltwise
from ..kernels import eltwise_bwd as kernel_eltwise_bwd
from ..kernels import normalization_bwd as kernel_normalization_bwd  # issue 21
from ..kernels import pooling as kernel_pooling
from ..kernels import pooling_bwd as kernel_pooling_bwd  # pooling backward (issue 21)
from ..kernels import prelu_bwd as kernel_prelu_bwd
from ..kernels import resampling as kernel_resampling
from ..kernels import resampling_bwd as kernel_resampling_bwd
from ..kernels import softmax_bwd as kernel_softmax_bwd

FLOAT_DTYPES = ("f32", "f16", "bf16")
_INT4: dict[str, tuple[type[np.integer], tuple[int, int]]] = {"s4": (np.int8, (-8, 7)), "u4": (np.uint8, (0, 15))}
_INTEGER_DTYPES: dict[str, type[np.integer]] = {"s32": np.int32, "s8": np.int8, "u8": np.uint8,
                                                 "s64": np.int64}


# -- dtype conversions ----------------------------------------------------------------------


def to_dtype_values(values, dtype: str) -> np.ndarray:
    """``values`` (any numeric array) as the user-facing values of ``dtype``: f32 and bf16/f16
    rounded to nearest even and returned as float32, integers rounded to nearest (half to even)
    and saturated, booleans as ``values != 0``."""
    x = np.asarray(values)
    if dtype == "boolean":
        return np.asarray(x != 0, dtype=np.bool_)
    if dtype == "s64" and x.dtype.kind in "iub":
        return x.astype(np.int64)  # exact: float64 would round beyond 2**53
    if dtype == "s64":  # 2**63 is past int64: saturate it to the top, as the kernels store
        with np.errstate(invalid="ignore"):
            y = np.clip(np.rint(np.asarray(x, np.float64)), -(2.0**63), 2.0**63)
        top = y >= 2.0**63
        y = np.where(np.isnan(y) | top, 0, y).astype(np.int64)
        return np.where(top, np.iinfo(np.int64).max, y)
    if dtype in _INTEGER_DTYPES or dtype in _INT4:
        numpy_type, (low, high) = _INT4[dtype] if dtype in _INT4 else (
            _INTEGER_DTYPES[dtype], (np.iinfo(_INTEGER_DTYPES[dtype]).min, np.iinfo(_INTEGER_DTYPES[dtype]).max))
        with np.errstate(invalid="ignore"):
            y = np.clip(np.rint(np.asarray(x, np.float64)), low, high)
        return np.where(np.isnan(y), 0, y).astype(numpy_type)
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "f32":
            return np.asarray(x, dtype=np.float32)
        if dtype == "f16":
            return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float32)
        if dtype == "bf16":
            single = np.asarray(x, dtype=np.float32)
            return _dtypes.from_storage(_dtypes.to_storage(single, "bf16"), "bf16").reshape(single.shape)
        if dtype in ("f8_e4m3", "f8_e5m2"):  # oneDNN's f32 -> f8 rounding (triodnn._values._float8)
            single = np.asarray(x, dtype=np.float32)
            return _dtypes.from_storage(_dtypes.to_storage(single, dtype), dtype).reshape(single.shape)
    raise InvalidGraphError(f"no reference conversion to data type {dtype!r}")


def _f64(array) -> np.ndarray:
    return np.asarray(array, dtype=np.float64)


# -- eltwise --------------------------------------------------------------------------------


def _eltwise(kind: str, a: dict, x: np.ndarray) -> np.ndarray:
    # The kernel algorithm the op schema maps the op to, as the lowering does.
    alg, alpha, beta = eltwise_parameters(kind, a)
    return _f64(kernel_eltwise.reference(alg, x, alpha=alpha, beta=beta))


def _eltwise_backward(kind: str, a: dict, x: np.ndarray, diff_dst: np.ndarray) -> np.ndarray:
    alg, alpha, beta, use_dst = eltwise_backward_parameters(kind, a)
    alpha_, beta_ = eltwise_defaults(alg, alpha, beta)
    return _f64(kernel_eltwise_bwd.reference(alg, x, diff_dst, alpha=alpha_, beta=beta_, use_dst=use_dst))


# -- binary and select ----------------------------------------------------------------------


def _binary(kind: str, a: dict, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        if kind == "Add":
            return x + y
        if kind == "Subtract":
            return x - y
        if kind == "Multiply":
            return x * y
        if kind == "Divide":
            return x / y
        if kind == "Maximum":
            return np.maximum(x, y)
        if kind == "Minimum":
            return np.minimum(x, y)
        if kind == "SquaredDifference":
            return (x - y) ** 2
        if kind == "GreaterEqual":
            return x >= y
    raise InvalidGraphError(f"{kind} is not a binary op")


# -- matmul and convolution -----------------------------------------------------------------


def _matmul(a: dict, src: np.ndarray, wei: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    if a["transpose_a"] and src.ndim > 1:
        src = np.swapaxes(src, -1, -2)
    if a["transpose_b"] and wei.ndim > 1:
        wei = np.swapaxes(wei, -1, -2)
    y = np.matmul(src, wei)  # numpy's 1-D rules are oneDNN's: [K] as [1, K] / [K, 1], squeezed
    if bias is not None:
        y = y + bias
    return y


def _convolution(a: dict, src: np.ndarray, wei: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
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


# -- pooling, normalization, softmax --------------------------------------------------------


def _pool(kind: str, a: dict, src: np.ndarray) -> np.ndarray:
    geometry = spatial_geometry(kind, a, src.shape)
    x = np.moveaxis(src, -1, 1) if a["data_format"] == "NXC" else src
    if kind == "MaxPool":
        alg = "max"
    else:
        alg = "avg_exclude_padding" if a["exclude_pad"] else "avg_include_padding"
    # The windows rounding_type="ceil" adds count as right padding (zeros for
    # avg_include_padding, skipped by max and avg_exclude_padding).
    y = _f64(kernel_pooling.reference(
        alg, x, kernel=geometry.kernel, strides=geometry.strides, padding_l=geometry.pads_begin,
        padding_r=geometry.pads_end_ceil, dilation=geometry.dilations,
    ))
    return np.moveaxis(y, 1, -1) if a["data_format"] == "NXC" else y


# -- pooling backward (issue 21) --
def _pool_backward(kind: str, a: dict, values: list[np.ndarray]) -> np.ndarray:
    is_max = kind == "MaxPoolBackward"
    diff_dst = values[1] if is_max else values[0]
    src_shape = pool_backward_src_shape(kind, a, [x.shape for x in values])
    geometry = spatial_geometry(kind, a, src_shape)
    nxc = a["data_format"] == "NXC"

    def ncx(x: np.ndarray) -> np.ndarray:
        return np.moveaxis(x, -1, 1) if nxc else x

    src_dims = (geometry.batch, geometry.in_channels, *geometry.in_spatial)
    # As _pool: the windows rounding_type="ceil" adds count as right padding.
    y = _f64(kernel_pooling_bwd.reference(
        "max" if is_max else ("avg_exclude_padding" if a["exclude_pad"] else "avg_include_padding"),
        ncx(diff_dst), src_dims, src=ncx(values[0]) if is_max else None, kernel=geometry.kernel,
        strides=geometry.strides, padding_l=geometry.pads_begin, padding_r=geometry.pads_end_ceil,
        dilation=geometry.dilations,
    ))
    return np.moveaxis(y, 1, -1) if nxc else y


# Softmax works on slices of at most this many elements: attention scores reach 75M elements
# (GQA-f32: [32, 2, 8, 384, 384]), whose float64 temporaries would take gigabytes at once.
_SOFTMAX_SLICE = 1 << 22


def _softmax(kind: str, a: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dst, stats) of SoftMax/LogSoftmax over ``axis``; stats = max + log(sum(exp(x - max)))."""
    axis = a["axis"] % x.ndim
    dst = np.empty(x.shape)
    stats = np.empty(tuple(1 if i == axis else d for i, d in enumerate(x.shape)))
    # Slice along the outermost other axis, in as few slices as keep each under _SOFTMAX_SLICE.
    outer = next((i for i in range(x.ndim) if i != axis), None)
    if outer is None or x.size <= _SOFTMAX_SLICE:
        slices = [(slice(None),) * x.ndim]
    else:
        step = max(1, x.shape[outer] * _SOFTMAX_SLICE // x.size)
        slices = [(slice(None),) * outer + (slice(start, start + step),)
                  for start in range(0, x.shape[outer], step)]
    for index in slices:
        part = x[index]
        row_max = np.max(part, axis=axis, keepdims=True)
        shifted = part - row_max
        exps = np.exp(shifted)
        total = np.sum(exps, axis=axis, keepdims=True)
        log_sum = np.log(total)
        if kind == "LogSoftmax":
            shifted -= log_sum
            dst[index] = shifted
        else:
            exps /= total
            dst[index] = exps
        stats[index] = row_max + log_sum
        if a.get("mode") == "inf_as_zero":
            # A row of -inf only (a fully masked attention row) gives zeros instead of NaN; its
            # statistic stays -inf (exp(x - stats) is then 0 everywhere, as the dst says).
            empty = np.isneginf(row_max)
            if empty.any():
                dst[index] = np.where(empty, 0.0, dst[index])
                stats[index] = np.where(empty, -np.inf, stats[index])
    return dst, stats


def _layer_norm(a: dict, inputs: list[np.ndarray], num_outputs: int) -> list[np.ndarray]:
    x = inputs[0]
    axes = norm_axes("LayerNorm", a["begin_norm_axis"], x.ndim)
    normalized = x.shape[axes[0]:]
    mean = x.mean(axis=axes, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(variance + a["epsilon"])
    if a["use_affine"]:
        if len(inputs) > 1:
            y = y * inputs[1].reshape(normalized)
        if len(inputs) > 2:
            y = y + inputs[2].reshape(normalized)
    stats_shape = x.shape[:axes[0]]
    return [y, mean.reshape(stats_shape), variance.reshape(stats_shape)][:num_outputs]


def _rms_norm(a: dict, inputs: list[np.ndarray], num_outputs: int) -> list[np.ndarray]:
    x = inputs[0]
    axes = norm_axes("RMSNorm", a["begin_norm_axis"], x.ndim)
    rrms = 1.0 / np.sqrt((x * x).mean(axis=axes, keepdims=True) + a["epsilon"])
    y = x * rrms
    if len(inputs) > 1:
        y = y * inputs[1]
    return [y, rrms.reshape(x.shape[:axes[0]])][:num_outputs]


def _batch_norm(a: dict, inputs: list[np.ndarray]) -> np.ndarray:
    x, gamma, beta, mean, variance = inputs
    shape = [1] * x.ndim
    shape[1 if a["data_format"] == "NCX" else -1] = -1
    gamma, beta, mean, variance = (v.reshape(shape) for v in (gamma, beta, mean, variance))
    return (x - mean) / np.sqrt(variance + a["epsilon"]) * gamma + beta


# -- normalization training (issue 21): the kernels' float64 references, channels moved to
# dim 1 (batch) or the normalised dims flattened into the last (layer).


def _channels_first(a: dict, x: np.ndarray) -> np.ndarray:
    return np.moveaxis(x, -1, 1) if a["data_format"] == "NXC" else x


def _channels_back(a: dict, x: np.ndarray) -> np.ndarray:
    return np.moveaxis(x, 1, -1) if a["data_format"] == "NXC" else x


def _batch_norm_training(a: dict, inputs: list[np.ndarray]) -> list[np.ndarray]:
    x, running_mean, running_variance = inputs[:3]
    gamma, beta = inputs[3:5] if len(inputs) == 5 else (None, None)
    out = kernel_normalization_bwd.batch_training_reference(
        _channels_first(a, x), epsilon=a["epsilon"], momentum=a["momentum"], scale=gamma, shift=beta,
        running_mean=running_mean, running_variance=running_variance)
    return [_channels_back(a, out["dst"]), out["running_mean_dst"], out["running_variance_dst"],
            out["mean"], out["variance"]]


def _batch_norm_backward(a: dict, inputs: list[np.ndarray], num_outputs: int) -> list[np.ndarray]:
    x, dd, mean, variance = inputs[:4]
    gamma = inputs[4] if len(inputs) == 5 and num_outputs == 3 else None  # as the lowering: see there
    out = kernel_normalization_bwd.batch_backward_reference(
        _channels_first(a, x), _channels_first(a, dd), mean, variance, epsilon=a["epsilon"], scale=gamma)
    return [_channels_back(a, out["diff_src"]), out["diff_scale"], out["diff_shift"]][:num_outputs]


def _layer_norm_backward(a: dict, inputs: list[np.ndarray], num_outputs: int) -> list[np.ndarray]:
    x, dd, mean, variance = inputs[:4]
    begin = norm_axes("LayerNormBackward", a["begin_norm_axis"], x.ndim)[0]
    rows, inner = x.shape[:begin], int(np.prod(x.shape[begin:]))
    gamma = inputs[4].reshape(inner) if a["use_affine"] and len(inputs) > 4 else None
    out = kernel_normalization_bwd.layer_backward_reference(
        x.reshape(*rows, inner), dd.reshape(*rows, inner), mean.reshape(rows), variance.reshape(rows),
        epsilon=a["epsilon"], scale=gamma)
    element = inputs[4].shape if len(inputs) > 4 else x.shape[begin:]
    return [out["diff_src"].reshape(x.shape), out["diff_scale"].reshape(element),
            out["diff_shift"].reshape(element)][:num_outputs]


def _bias_add(a: dict, x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    shape = [1] * x.ndim
    shape[1 if a["data_format"] == "NCX" else -1] = -1
    return x + bias.reshape(shape)


def _prelu(a: dict, x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    """src >= 0 ? src : slope * src, the slope placed as PReLU.md's broadcast rules say."""
    w = slope.reshape(prelu_slope_shape("PReLU", a, x.shape, slope.shape))
    return np.where(x >= 0, x, w * x)


def _interpolate(a: dict, x: np.ndarray) -> np.ndarray:
    """oneDNN's resampling (its float32 coordinates and roundf) through the kernels' reference."""
    out = infer_output_shapes("Interpolate", a, [x.shape])[0]
    nxc = a["data_format"] == "NXC"
    if nxc:
        x, out = np.moveaxis(x, -1, 1), (out[0], out[-1], *out[1:-1])
    alg = "nearest" if a["mode"] == "nearest" else "linear"
    y = kernel_resampling.reference(alg, x, tuple(out[2:]),
                                    align_corners=a["coordinate_transformation_mode"] == "align_corners")
    y = _f64(y)
    return np.moveaxis(y, 1, -1) if nxc else y


# -- softmax, PReLU and Interpolate backward (issue 21) ------------------------------------------


def _prelu_backward(a: dict, x: np.ndarray, slope: np.ndarray, diff_dst: np.ndarray) -> list[np.ndarray]:
    """[diff_src, diff_slope], the slope placed as PReLU's and its gradient summed back to its shape."""
    placed = prelu_slope_shape("PReLUBackward", a, x.shape, slope.shape)
    diff_src, diff_slope = kernel_prelu_bwd.reference(x, slope.reshape(placed), diff_dst)
    return [_f64(diff_src), _f64(diff_slope).reshape(slope.shape)]


def _interpolate_backward(a: dict, src: np.ndarray, diff_dst: np.ndarray) -> np.ndarray:
    """The transpose of ``_interpolate``'s resampling, src giving the shape only."""
    nxc = a["data_format"] == "NXC"
    if nxc:
        src, diff_dst = np.moveaxis(src, -1, 1), np.moveaxis(diff_dst, -1, 1)
    alg = "nearest" if a["mode"] == "nearest" else "linear"
    g = _f64(kernel_resampling_bwd.reference(alg, diff_dst, src.shape[2:],
                                             align_corners=a["coordinate_transformation_mode"] == "align_corners"))
    return np.moveaxis(g, 1, -1) if nxc else g


def _conv_transpose(a: dict, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    g = conv_transpose_geometry("ConvTranspose", a, x.shape, w.shape)
    nxc = a["data_format"] == "NXC"
    if nxc:
        x = np.moveaxis(x, -1, 1)
    w = np.transpose(w, conv_transpose_weights_order(a["weights_format"], w.ndim))
    y = _f64(kernel_deconvolution.reference(
        x, w, bias, strides=g.strides, padding_l=g.pads_begin, padding_r=g.pads_end, dilation=g.dilations,
        groups=g.groups, output_padding=g.output_padding))
    return np.moveaxis(y, 1, -1) if nxc else y

# -- convolution backward (training) --


def _conv_backward(kind: str, a: dict, values: list[np.ndarray]) -> np.ndarray:
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
        return _f64(np.transpose(w, np.argsort(g.weights_order)))
    diff_dst, w = ncx(values[0]), np.transpose(values[1], g.weights_order)
    if kind == "ConvTransposeBackwardData":
        y = kernel_convolution.reference(diff_dst, w, padding_r=g.pads_end, **geo)
    else:
        nsp = len(g.strides)
        output_padding = tuple(g.conv_src[2 + i] - ((g.conv_dst[2 + i] - 1) * g.strides[i] + (g.weights[2 + i] - 1)
                                                    * g.dilations[i] + 1 - g.pads_begin[i] - g.pads_end[i])
                               for i in range(nsp))
        y = kernel_deconvolution.reference(diff_dst, w, padding_r=g.pads_end, output_padding=output_padding, **geo)
    y = _f64(y)
    return np.moveaxis(y, 1, -1) if nxc else y



# -- reductions and data movement -----------------------------------------------------------


def _reduce(kind: str, a: dict, inputs: list[np.ndarray]) -> np.ndarray:
    x = inputs[0]
    if len(inputs) == 2:  # the axes as an s32 tensor
        raw = [int(v) for v in np.asarray(inputs[1]).ravel()]
        axes = reduce_axes(kind, {**a, "axes": raw}, x.ndim)
    else:
        axes = reduce_axes(kind, a, x.ndim)
    keep = a["keep_dims"]
    with np.errstate(all="ignore"):
        if kind == "ReduceSum":
            return np.sum(x, axis=axes, keepdims=keep)
        if kind == "ReduceMean":
            if x.size == 0:  # an empty axis: 0/0 (np.mean would warn)
                return np.sum(x, axis=axes, keepdims=keep) / 0.0
            return np.mean(x, axis=axes, keepdims=keep)
        if kind == "ReduceMax":  # an empty axis gives the identity, as oneDNN's reduction does
            return np.max(x, axis=axes, keepdims=keep, initial=-np.inf)
        if kind == "ReduceMin":
            return np.min(x, axis=axes, keepdims=keep, initial=np.inf)
        if kind == "ReduceProd":
            return np.prod(x, axis=axes, keepdims=keep)
        if kind == "ReduceL1":
            return np.sum(np.abs(x), axis=axes, keepdims=keep)
        if kind == "ReduceL2":
            return np.sqrt(np.sum(x * x, axis=axes, keepdims=keep))
    raise InvalidGraphError(f"{kind} is not a reduction")


def _gen_index(a: dict, x: np.ndarray) -> np.ndarray:
    axis = a["axis"] % x.ndim
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    return np.broadcast_to(np.arange(x.shape[axis]).reshape(shape), x.shape)


# Dropout (issue 21): oneDNN's Philox mask (kernels.dropout, bit for bit); seed and offset
# are read as int64 here, before any float conversion could round them.
def _dropout(inputs: list[np.ndarray]) -> list[np.ndarray]:
    x, seed_, offset_, p_ = inputs
    seed, offset = int(np.asarray(seed_).reshape(-1)[0]), int(np.asarray(offset_).reshape(-1)[0])
    p = float(np.asarray(p_, np.float32).reshape(-1)[0])
    mask = kernel_dropout.keep_mask(x.shape, seed, offset, p)
    return [np.where(mask != 0, _f64(x) * kernel_dropout.inverse_keep(p), 0.0), mask]


# -- entry point ----------------------------------------------------------------------------


def _as_input(array, kind: str, index: int) -> np.ndarray:
    x = np.asarray(array)
    if x.dtype == np.uint16:
        raise InvalidGraphError(
            f"{kind}: input {index} is uint16 (bf16 storage?); pass user-facing values "
            f"(triodnn._values._dtypes.from_storage)"
        )
    return x


def reference(kind: str, attrs: Mapping, inputs: Sequence[np.ndarray],
              output_dtypes: Sequence[str]) -> list[np.ndarray]:
    """The outputs of an op of ``kind`` on ``inputs``, one array per entry of ``output_dtypes``,
    each converted to that data type (see the module docstring for the value conventions).

    Float ops compute in float64. Shapes are checked with ``infer_output_shapes`` first, so a
    reference never broadcasts what oneDNN would refuse. Wildcard has no reference
    (UnsupportedError); End returns nothing.
    """
    inputs = [_as_input(x, kind, i) for i, x in enumerate(inputs)]
    output_dtypes = list(output_dtypes)
    a = check_op(kind, attrs, len(inputs), len(output_dtypes))
    if kind == "Wildcard":
        raise UnsupportedError("Wildcard ops have no reference: their semantics are the user's")
    if schema_of(kind).category == "unsupported":
        raise UnsupportedError(f"{kind}: triodnn does not run this op and has no reference for it")
    if kind == "End":
        return []
    if kind == "AvgPoolBackward" and len(inputs) == 2:  # oneDNN: the src_shape input wins over the attribute
        a = {**a, "src_shape": [int(v) for v in np.asarray(inputs[1]).reshape(-1)]}
    axes_from_input = schema_of(kind).category == "reduction" and len(inputs) == 2
    if axes_from_input:  # the shapes depend on the axes' values: _reduce checks them
        shapes = None
    else:
        shapes = infer_output_shapes(kind, a, [x.shape for x in inputs], len(output_dtypes))
    with np.errstate(all="ignore"):  # inf and NaN propagate as IEEE arithmetic says
        outputs = _compute(kind, a, inputs, len(output_dtypes))
    result = []
    for i, (value, dtype) in enumerate(zip(outputs, output_dtypes)):
        if shapes is not None and np.shape(value) != shapes[i]:
            value = np.broadcast_to(value, shapes[i])  # GenIndex and Select build broadcast views
        # A fresh C-contiguous array (not a view of an input, not 0-d turned 1-d).
        result.append(np.array(to_dtype_values(value, dtype), order="C", copy=True))
    return result


def _group_norm(a: dict, values: list[np.ndarray], num_outputs: int) -> list:
    x = values[0]
    if a["data_format"] == "NXC":
        x = np.moveaxis(x, -1, 1)
    n, c = x.shape[:2]
    g = a["groups"]
    grouped = x.reshape(n, g, -1)
    mean = grouped.mean(axis=-1)
    var = grouped.var(axis=-1)
    y = ((grouped - mean[..., None]) / np.sqrt(var[..., None] + a["epsilon"])).reshape(x.shape)
    if a["use_affine"] and len(values) >= 3:
        shape = (1, c) + (1,) * (x.ndim - 2)
        y = y * values[1].reshape(shape) + values[2].reshape(shape)
    if a["data_format"] == "NXC":
        y = np.moveaxis(y, 1, -1)
    return [y, mean, var][:num_outputs]


def _quantize(kind: str, a: dict, x: np.ndarray) -> np.ndarray:
    """Quantize.md / Dequantize.md: ``src / scale + zp`` (rounded and saturated by the output's
    conversion) or ``(src - zp) * scale``, per tensor or per channel along ``axis``."""
    shape = [1] * x.ndim
    if a["qtype"] == "per_channel":
        shape[a["axis"] % x.ndim] = len(a["scales"])
    scale = np.asarray(a["scales"], np.float64).reshape(shape if a["qtype"] == "per_channel" else ())
    zp = np.asarray(a["zps"] or [0] * len(a["scales"]), np.float64).reshape(scale.shape)
    return x / scale + zp if kind == "Quantize" else (x - zp) * scale


def _dynamic_quantize(kind: str, a: dict, inputs: list[np.ndarray]) -> np.ndarray:
    """DynamicQuantize / DynamicDequantize: as ``_quantize``, the scales (and zero points) given
    as tensors, each repeated over its group of src elements (DynamicDequantize.md)."""
    x = inputs[0]
    group = quantization_groups(kind, a, x.shape, inputs[1].shape)

    def expand(t: np.ndarray) -> np.ndarray:
        t = t.reshape(tuple(d // g for d, g in zip(x.shape, group)))
        for axis, g in enumerate(group):
            t = np.repeat(t, g, axis=axis)
        return t

    scale = expand(inputs[1])
    zp = expand(inputs[2]) if len(inputs) > 2 else 0.0
    return x / scale + zp if kind == "DynamicQuantize" else (x - zp) * scale


def _compute(kind: str, a: dict, inputs: list[np.ndarray], num_outputs: int) -> list:
    category = schema_of(kind).category
    if kind in ("Reorder", "TypeCast"):
        return [inputs[0]]  # the conversion to the output dtype is the whole op
    if kind == "StaticReshape":
        return [inputs[0].reshape(reshape_target(kind, a, inputs[0].shape))]
    if kind == "StaticTranspose":
        return [np.transpose(inputs[0], transpose_order(kind, a, inputs[0].ndim))]
    if kind == "Concat":
        return [np.concatenate(inputs, axis=a["axis"])]
    if kind == "GenIndex":
        return [_gen_index(a, inputs[0])]
    if kind == "Dropout":
        return _dropout(inputs)[:num_outputs]
    if kind in ("Quantize", "Dequantize"):
        return [_quantize(kind, a, _f64(inputs[0]))]
    if kind in ("DynamicQuantize", "DynamicDequantize"):
        return [_dynamic_quantize(kind, a, [_f64(x) for x in inputs])]
    if kind == "Select":
        condition = np.asarray(inputs[0]) != 0
        return [np.where(condition, _f64(inputs[1]), _f64(inputs[2]))]
    integer_math = category == "binary" and all(x.dtype.kind in "iub" for x in inputs)
    values = [x.astype(np.int64) if integer_math else _f64(x) for x in inputs]
    if category == "eltwise":
        return [_eltwise(kind, a, values[0])]
    if category == "eltwise_backward":
        return [_eltwise_backward(kind, a, values[0], values[1])]
    # softmax, PReLU and Interpolate backward (issue 21)
    if category == "softmax_backward":
        return [_f64(kernel_softmax_bwd.reference(str(schema_of(kind).algorithm), values[1], values[0],
                                                  axis=a["axis"] % values[1].ndim))]
    if kind == "PReLUBackward":
        return _prelu_backward(a, *values)[:num_outputs]
    if kind == "InterpolateBackward":
        return [_interpolate_backward(a, values[0], values[1])]
    if category == "binary":
        return [_binary(kind, a, values[0], values[1])]
    if kind == "MatMul":
        return [_matmul(a, values[0], values[1], values[2] if len(values) > 2 else None)]
    if kind == "Convolution":
        return [_convolution(a, values[0], values[1], values[2] if len(values) > 2 else None)]
    if kind == "BiasAdd":
        return [_bias_add(a, values[0], values[1])]
    if kind == "PReLU":
        return [_prelu(a, values[0], values[1])]
    if kind == "Interpolate":
        return [_interpolate(a, values[0])]
    if kind == "ConvTranspose":
        return [_conv_transpose(a, values[0], values[1], values[2] if len(values) > 2 else None)]
    if category == "convolution_backward":
        return [_conv_backward(kind, a, values)]
    if category == "pooling":
        return [_pool(kind, a, values[0])]
    if category == "pooling_backward":
        return [_pool_backward(kind, a, values)]
    if kind in ("SoftMax", "LogSoftmax"):
        return list(_softmax(kind, a, values[0]))[:num_outputs]
    if kind == "LayerNorm":
        return _layer_norm(a, values, num_outputs)
    if kind == "RMSNorm":
        return _rms_norm(a, values, num_outputs)
    if kind == "BatchNormInference":
        return [_batch_norm(a, values)]
    if kind == "BatchNormForwardTraining":  # normalization training (issue 21)
        return _batch_norm_training(a, values)
    if kind == "BatchNormTrainingBackward":
        return _batch_norm_backward(a, values, num_outputs)
    if kind == "LayerNormBackward":
        return _layer_norm_backward(a, values, num_outputs)
    if kind == "GroupNorm":
        return _group_norm(a, values, num_outputs)
    if category == "reduction":
        return [_reduce(kind, a, values)]
    raise InvalidGraphError(f"{kind}: no reference")  # not reached for kinds of OP_SCHEMAS


__all__ = ["FLOAT_DTYPES", "reference", "to_dtype_values"]
