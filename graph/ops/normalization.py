"""LayerNorm, RMSNorm, GroupNorm, BatchNormInference, and the normalization training ops
(BatchNormForwardTraining, BatchNormTrainingBackward, LayerNormBackward).

The schema, shape rule, lowering and numpy reference of each kind, registered in
``triodnn.graph._op_registry`` (see there)."""

from __future__ import annotations

import math

import numpy as np

from ..._values import (
    BatchNormBackwardDesc,
    BatchNormInferenceDesc,
    BatchNormTrainingDesc,
    GroupNormDesc,
    LayerNormBackwardDesc,
    LayerNormDesc,
    RMSNormDesc,
)
from ..._values._errors import UnsupportedError
from ...kernels import normalization_bwd
from ...kernels import normalization_bwd as kernel_normalization_bwd
from ...kernels import tolerance as kt
from .._logical_tensor import known_shape
from .._lowering import (
    Builder,
    View,
    as_dims,
    channels_first,
    row_major,
    row_major_as,
)
from .._op import Op
from .._op_registry import GraphOp, Numbers, any_op, numbered, register
from .._op_schema import (
    AttrSpec,
    OpSchema,
    attr_error,
    attr_map,
    data_format_attr,
    schema_of,
)
from .._shape_inference import (
    UNKNOWN,
    Shape,
    check_one_way,
    fmt_shape,
    normal_axis,
    one_output,
    shape_error,
)
from ._float64 import f64


def norm_axes(kind: str, begin_norm_axis: int, ndim: int) -> tuple[int, ...]:
    """The axes LayerNorm/RMSNorm normalise over: ``begin_norm_axis`` to the last."""
    begin = normal_axis(kind, begin_norm_axis, ndim, "begin_norm_axis")
    return tuple(range(begin, ndim))


def _layer_norm_shape(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    src = shapes[0]
    axes = norm_axes(kind, a["begin_norm_axis"], len(src))
    normalized = src[axes[0]:]
    for name, shape in zip(("gamma", "beta"), shapes[1:]):
        count = math.prod(normalized) if UNKNOWN not in normalized else UNKNOWN
        size = math.prod(shape) if UNKNOWN not in shape else UNKNOWN
        # The normalized dims themselves, or flattened to one dim of the same size.
        flattened = len(shape) == 1 and (size == count or UNKNOWN in (size, count))
        if tuple(shape) != normalized and not flattened:
            raise shape_error(kind, f"{name} shape {fmt_shape(shape)} must be the normalized dims "
                                    f"{fmt_shape(normalized)} of src {fmt_shape(src)} (begin_norm_axis="
                                    f"{a['begin_norm_axis']})")
    stats = src[:axes[0]]
    return [src] + [stats] * (num_outputs - 1)


def _rms_norm_shape(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    src = shapes[0]
    axes = norm_axes(kind, a["begin_norm_axis"], len(src))
    if len(shapes) == 2:
        check_one_way(kind, src, shapes[1], "gamma")
    return [src] + [src[:axes[0]]] * (num_outputs - 1)


def _batch_norm_shape(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    src = shapes[0]
    if len(src) < 2:
        raise shape_error(kind, f"src {fmt_shape(src)} needs at least 2 dims")
    channels = src[1] if a["data_format"] == "NCX" else src[-1]
    for name, shape in zip(("gamma", "beta", "mean", "variance"), shapes[1:]):
        if len(shape) != 1 or UNKNOWN not in (shape[0], channels) and shape[0] != channels:
            raise shape_error(kind, f"{name} shape {fmt_shape(shape)} must be [{channels}], the channels of "
                                    f"src {fmt_shape(src)} ({a['data_format']})")
    return src


def _norm_training_shape(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    """BatchNormForwardTraining, BatchNormTrainingBackward, LayerNormBackward: the data inputs
    (src, and diff_dst for the backward ops) alike; the rest per channel (batch) or per row and
    per normalised element (layer)."""
    src = shapes[0]
    if len(src) < 2:
        raise shape_error(kind, f"src {fmt_shape(src)} needs at least 2 dims")
    data = 1 if kind == "BatchNormForwardTraining" else 2
    for shape in shapes[1:data]:
        if len(shape) != len(src) or any(UNKNOWN not in (d, e) and d != e for d, e in zip(shape, src)):
            raise shape_error(kind, f"diff_dst shape {fmt_shape(shape)} differs from src shape {fmt_shape(src)}")
    names = schema_of(kind).input_names[data:]
    if kind == "LayerNormBackward":
        begin = norm_axes(kind, a["begin_norm_axis"], len(src))[0]
        rows, normalized = tuple(src[:begin]), tuple(src[begin:])
        count = math.prod(normalized) if UNKNOWN not in normalized else UNKNOWN
        for name, shape in zip(names, shapes[data:]):
            if name in ("mean", "variance"):
                ok = len(shape) == len(rows) and all(UNKNOWN in (d, e) or d == e for d, e in zip(shape, rows))
                want = fmt_shape(rows)
            else:
                size = math.prod(shape) if UNKNOWN not in shape else UNKNOWN
                ok = tuple(shape) == normalized or len(shape) == 1 and UNKNOWN in (size, count) or size == count
                want = f"{fmt_shape(normalized)} (or flattened)"
            if not ok:
                raise shape_error(kind, f"{name} shape {fmt_shape(shape)} must be {want} for src {fmt_shape(src)} and "
                                        f"begin_norm_axis {a['begin_norm_axis']}")
        element = tuple(shapes[4]) if len(shapes) > 4 else normalized
        return [src, element, element][:num_outputs]
    channels = src[1] if a["data_format"] == "NCX" else src[-1]
    for name, shape in zip(names, shapes[data:]):
        if len(shape) != 1 or UNKNOWN not in (shape[0], channels) and shape[0] != channels:
            raise shape_error(kind, f"{name} shape {fmt_shape(shape)} must be [{channels}], the channels of "
                                    f"src {fmt_shape(src)} ({a['data_format']})")
    return [src, *[(channels,)] * 4][:num_outputs]


def _norm_views(b: Builder, op: Op, begin_axis: int, views: dict[str, View]):
    """Views with the normalised dims collapsed into the last one when they are several."""
    shape = known_shape(op.inputs[0])
    begin = begin_axis % len(shape)
    if begin == len(shape) - 1:
        return views
    outer, inner = math.prod(shape[:begin]), math.prod(shape[begin:])
    out = {}
    for name, view in views.items():
        if name in ("src", "dst"):
            out[name] = as_dims(b, op, view, (outer, inner)) if name == "src" or row_major(view.desc) else None
            if out[name] is None:
                raise UnsupportedError(f"{op.kind} {op.id}: a strided dst over several normalised dims")
        elif name in ("mean", "variance", "rrms"):
            out[name] = as_dims(b, op, view, (outer,))
        else:
            out[name] = as_dims(b, op, view, (inner,))
    return out


def _lower_layer_norm(b: Builder, op: Op) -> None:
    a = op.attrs
    inputs = {"src": b.view(op.inputs[0])}
    if a.get("use_affine", True) and len(op.inputs) >= 3:
        inputs["scale"], inputs["shift"] = b.view(op.inputs[1]), b.view(op.inputs[2])
    outputs = {"dst": b.output(op.outputs[0])}
    if a.get("keep_stats", True) and len(op.outputs) >= 3:
        outputs["mean"], outputs["variance"] = b.output(op.outputs[1]), b.output(op.outputs[2])
    views = _norm_views(b, op, a.get("begin_norm_axis", -1), {**inputs, **outputs})
    eps = a.get("epsilon", 1e-5)
    b.run(op, lambda src, dst, scale=None, shift=None, mean=None, variance=None: LayerNormDesc(
        src, dst, -1, eps, scale, shift, mean, variance),
        {k: views[k] for k in inputs}, {k: views[k] for k in outputs})


def _lower_rms_norm(b: Builder, op: Op) -> None:
    a = op.attrs
    inputs = {"src": b.view(op.inputs[0])}
    if a.get("use_affine", True) and len(op.inputs) >= 2:
        inputs["scale"] = b.view(op.inputs[1])
    outputs = {"dst": b.output(op.outputs[0])}
    if len(op.outputs) >= 2:  # oneDNN's optional rrms, 1 / sqrt(mean(x^2) + eps) per row
        outputs["rrms"] = b.output(op.outputs[1])
    views = _norm_views(b, op, a.get("begin_norm_axis", -1), {**inputs, **outputs})
    eps = a.get("epsilon", 1e-5)
    b.run(op, lambda src, dst, scale=None, rrms=None: RMSNormDesc(src, dst, eps, scale, rrms),
          {k: views[k] for k in inputs}, {k: views[k] for k in outputs})


def _lower_batch_norm(b: Builder, op: Op) -> None:
    a = op.attrs
    src, gamma, beta, mean, var = (b.view(lt) for lt in op.inputs[:5])
    dst = b.output(op.outputs[0])
    if a.get("data_format", "NXC") == "NXC":
        src, dst = channels_first(src), channels_first(dst)
    eps = a.get("epsilon", 1e-5)
    b.run(op, lambda src, dst, mean, variance, scale, shift: BatchNormInferenceDesc(
        src, mean, variance, dst, eps, scale, shift),
        {"src": src, "mean": mean, "variance": var, "scale": gamma, "shift": beta}, {"dst": dst})


def _lower_batch_norm_training(b: Builder, op: Op) -> None:
    """BatchNormForwardTraining: inputs src, the old running mean and variance, [gamma, beta];
    outputs dst, the new running mean and variance, the batch mean and variance."""
    a = op.attrs
    src, dst = b.view(op.inputs[0]), b.output(op.outputs[0])
    if a.get("data_format", "NXC") == "NXC":
        src, dst = channels_first(src), channels_first(dst)
    inputs = {"src": src, "running_mean": b.view(op.inputs[1]), "running_variance": b.view(op.inputs[2])}
    if len(op.inputs) == 5:
        inputs["scale"], inputs["shift"] = b.view(op.inputs[3]), b.view(op.inputs[4])
    outputs = {"dst": dst}
    for name, lt in zip(("running_mean_dst", "running_variance_dst", "mean", "variance"), op.outputs[1:]):
        outputs[name] = b.output(lt)
    eps, momentum = a["epsilon"], a.get("momentum", 0.5)
    b.run(op, lambda src, dst, **named: BatchNormTrainingDesc(src, dst, eps, momentum, **named), inputs, outputs)


def _lower_batch_norm_backward(b: Builder, op: Op) -> None:
    """BatchNormTrainingBackward: gamma counts only with diff_gamma and diff_beta asked for, as
    oneDNN's documentation says."""
    a = op.attrs
    src, diff_dst = b.view(op.inputs[0]), b.view(op.inputs[1])
    diff_src = b.output(op.outputs[0])
    if a.get("data_format", "NXC") == "NXC":
        src, diff_dst, diff_src = (channels_first(v) for v in (src, diff_dst, diff_src))
    inputs = {"src": src, "diff_dst": diff_dst, "mean": b.view(op.inputs[2]), "variance": b.view(op.inputs[3])}
    outputs = {"diff_src": diff_src}
    if len(op.outputs) == 3:
        outputs["diff_scale"], outputs["diff_shift"] = b.output(op.outputs[1]), b.output(op.outputs[2])
        if len(op.inputs) == 5:
            inputs["scale"] = b.view(op.inputs[4])
    eps = a["epsilon"]
    b.run(op, lambda src, diff_dst, mean, variance, diff_src, **named: BatchNormBackwardDesc(
        src, diff_dst, mean, variance, diff_src, eps, **named), inputs, outputs)


def _lower_layer_norm_backward(b: Builder, op: Op) -> None:
    """LayerNormBackward over the dims from begin_norm_axis, collapsed into one (copies where the
    layout cannot be read so)."""
    a = op.attrs
    inputs = {name: b.view(lt) for name, lt in zip(("src", "diff_dst", "mean", "variance"), op.inputs)}
    if a.get("use_affine", True) and len(op.inputs) >= 5:
        inputs["scale"] = b.view(op.inputs[4])
    outputs = {"diff_src": b.output(op.outputs[0])}
    if len(op.outputs) == 3:
        outputs["diff_scale"], outputs["diff_shift"] = b.output(op.outputs[1]), b.output(op.outputs[2])
    shape = known_shape(op.inputs[0])
    begin = a.get("begin_norm_axis", -1) % len(shape)
    if begin != len(shape) - 1:
        outer, inner = math.prod(shape[:begin]), math.prod(shape[begin:])
        for name, view in inputs.items():
            dims = {"src": (outer, inner), "diff_dst": (outer, inner), "mean": (outer,), "variance": (outer,)}
            inputs[name] = as_dims(b, op, view, dims.get(name, (inner,)))
        for name, view in outputs.items():
            if not row_major(view.desc):
                raise UnsupportedError(f"{op.kind} {op.id}: a strided {name} over several normalised dims")
            outputs[name] = row_major_as(view, (outer, inner) if name == "diff_src" else (inner,))
    eps = a.get("epsilon", 1e-5)
    b.run(op, lambda src, diff_dst, mean, variance, diff_src, **named: LayerNormBackwardDesc(
        src, diff_dst, mean, variance, diff_src, eps, **named), inputs, outputs)


def _lower_group_norm(b: Builder, op: Op) -> None:
    a = op.attrs
    src, dst = b.view(op.inputs[0]), b.output(op.outputs[0])
    if a.get("data_format", "NXC") == "NXC":
        src, dst = channels_first(src), channels_first(dst)
    inputs = {"src": src}
    if a.get("use_affine", True) and len(op.inputs) >= 3:
        inputs["scale"], inputs["shift"] = b.view(op.inputs[1]), b.view(op.inputs[2])
    outputs = {"dst": dst}
    if a.get("keep_stats", True) and len(op.outputs) >= 3:  # (N, groups) each
        outputs["mean"], outputs["variance"] = b.output(op.outputs[1]), b.output(op.outputs[2])
    eps, groups = a.get("epsilon", 1e-5), a["groups"]
    b.run(op, lambda src, dst, scale=None, shift=None, mean=None, variance=None: GroupNormDesc(
        src, groups, dst, eps, scale, shift, mean, variance), inputs, outputs)


def _layer_norm_reference(a: dict, inputs: list[np.ndarray], num_outputs: int) -> list[np.ndarray]:
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


def _rms_norm_reference(a: dict, inputs: list[np.ndarray], num_outputs: int) -> list[np.ndarray]:
    x = inputs[0]
    axes = norm_axes("RMSNorm", a["begin_norm_axis"], x.ndim)
    rrms = 1.0 / np.sqrt((x * x).mean(axis=axes, keepdims=True) + a["epsilon"])
    y = x * rrms
    if len(inputs) > 1:
        y = y * inputs[1]
    return [y, rrms.reshape(x.shape[:axes[0]])][:num_outputs]


def _batch_norm_reference(a: dict, inputs: list[np.ndarray]) -> np.ndarray:
    x, gamma, beta, mean, variance = inputs
    shape = [1] * x.ndim
    shape[1 if a["data_format"] == "NCX" else -1] = -1
    gamma, beta, mean, variance = (v.reshape(shape) for v in (gamma, beta, mean, variance))
    return (x - mean) / np.sqrt(variance + a["epsilon"]) * gamma + beta

# The normalization training references: the kernels' float64 references, channels moved to
# dim 1 (batch) or the normalised dims flattened into the last (layer).


def _channels_first_reference(a: dict, x: np.ndarray) -> np.ndarray:
    return np.moveaxis(x, -1, 1) if a["data_format"] == "NXC" else x


def _channels_back_reference(a: dict, x: np.ndarray) -> np.ndarray:
    return np.moveaxis(x, 1, -1) if a["data_format"] == "NXC" else x


def _batch_norm_training_reference(a: dict, inputs: list[np.ndarray]) -> list[np.ndarray]:
    x, running_mean, running_variance = inputs[:3]
    gamma, beta = inputs[3:5] if len(inputs) == 5 else (None, None)
    out = kernel_normalization_bwd.batch_training_reference(
        _channels_first_reference(a, x), epsilon=a["epsilon"], momentum=a["momentum"], scale=gamma, shift=beta,
        running_mean=running_mean, running_variance=running_variance)
    return [_channels_back_reference(a, out["dst"]), out["running_mean_dst"], out["running_variance_dst"],
            out["mean"], out["variance"]]


def _batch_norm_backward_reference(a: dict, inputs: list[np.ndarray], num_outputs: int) -> list[np.ndarray]:
    x, dd, mean, variance = inputs[:4]
    gamma = inputs[4] if len(inputs) == 5 and num_outputs == 3 else None  # as the lowering: see there
    out = kernel_normalization_bwd.batch_backward_reference(
        _channels_first_reference(a, x), _channels_first_reference(a, dd), mean, variance, epsilon=a["epsilon"], scale=gamma)
    return [_channels_back_reference(a, out["diff_src"]), out["diff_scale"], out["diff_shift"]][:num_outputs]


def _layer_norm_backward_reference(a: dict, inputs: list[np.ndarray], num_outputs: int) -> list[np.ndarray]:
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


def _layer_norm_backward_magnitude(kind: str, a: dict, inputs: list, num_outputs: int) -> list:
    """diff_gamma and diff_beta are sums over every row (3072 at 8x384x1024) of dd * x_hat and
    dd: their sizes are the same sums of |dd| * |x_hat| and |dd|, taken with x mirrored above
    its mean. diff_src is no such sum (None)."""
    x, dd, mean, variance = _values(inputs[:4])
    centre = mean.reshape(mean.shape + (1,) * (x.ndim - mean.ndim))
    absolute = [centre + np.abs(x - centre), np.abs(dd), mean, variance, *inputs[4:]]
    sums = _layer_norm_backward_reference(a, absolute, num_outputs)
    return [None, *sums[1:]][:num_outputs]


def _group_norm_reference(a: dict, values: list[np.ndarray], num_outputs: int) -> list:
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


_SCHEMAS = [
    OpSchema("LayerNorm", (1, 3), (1, 3), attr_map([
        AttrSpec("keep_stats", "bool", default=True),
        AttrSpec("begin_norm_axis", "s64", default=-1),
        AttrSpec("use_affine", "bool", default=True),
        AttrSpec("epsilon", "f32", default=1e-5, minimum=0.0),
    ]), "norm", "layer_normalization", ("src", "gamma", "beta"), ("dst", "mean", "variance")),
    # oneDNN's op_def gives RMSNorm one output; its doc page lists an optional ``rrms``
    # (1 / sqrt(mean(x^2) + eps), shaped like LayerNorm's statistics), accepted here.
    OpSchema("RMSNorm", (1, 2), (1, 2), attr_map([
        AttrSpec("begin_norm_axis", "s64", default=-1),
        AttrSpec("epsilon", "f32", default=1e-5, minimum=0.0),
    ]), "norm", "rms_normalization", ("src", "gamma"), ("dst", "rrms")),
    OpSchema("BatchNormInference", (5, 5), (1, 1), attr_map([
        AttrSpec("epsilon", "f32", required=True, minimum=0.0),
        data_format_attr(),
    ]), "norm", "batch_normalization", ("src", "gamma", "beta", "mean", "variance")),
    # Normalization training: oneDNN's op_def order, the optional inputs and outputs
    # last. BatchNormForwardTraining's mean and variance are the old running statistics; its
    # momentum has no default in op_def, oneDNN's backend takes 0.5.
    OpSchema("BatchNormForwardTraining", (3, 5), (5, 5), attr_map([
        AttrSpec("epsilon", "f32", required=True, minimum=0.0),
        AttrSpec("momentum", "f32", default=0.5),
        data_format_attr(),
    ]), "norm_training", "batch_normalization", ("src", "mean", "variance", "gamma", "beta"),
        ("dst", "running_mean", "running_variance", "batch_mean", "batch_variance")),
    OpSchema("BatchNormTrainingBackward", (4, 5), (1, 3), attr_map([
        AttrSpec("epsilon", "f32", required=True, minimum=0.0),
        data_format_attr(),
    ]), "norm_training", "batch_normalization", ("src", "diff_dst", "mean", "variance", "gamma"),
        ("diff_src", "diff_gamma", "diff_beta")),
    OpSchema("LayerNormBackward", (4, 6), (1, 3), attr_map([
        AttrSpec("begin_norm_axis", "s64", default=-1),
        AttrSpec("use_affine", "bool", default=True),
        AttrSpec("epsilon", "f32", default=1e-5, minimum=0.0),
    ]), "norm_training", "layer_normalization", ("src", "diff_dst", "mean", "variance", "gamma", "beta"),
        ("diff_src", "diff_gamma", "diff_beta")),
    OpSchema("GroupNorm", (1, 3), (1, 3), attr_map([
        AttrSpec("groups", "s64", required=True, minimum=1),
        AttrSpec("keep_stats", "bool", default=True),
        AttrSpec("use_affine", "bool", default=False),
        AttrSpec("epsilon", "f32", default=1e-5, minimum=0.0),
        data_format_attr(),
    ]), "norm", "group_normalization", ("src", "gamma", "beta"), ("dst", "mean", "variance")),
]
_BY_KIND = {schema.kind: schema for schema in _SCHEMAS}


def _group_norm_shape(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    src = shapes[0]
    channel = 1 if a["data_format"] == "NCX" else len(src) - 1
    if len(src) < 2 or (src[channel] != UNKNOWN and src[channel] % a["groups"]):
        raise shape_error(kind, f"src {list(src)} has channels not divisible by groups {a['groups']}")
    return [src, (src[0], a["groups"]), (src[0], a["groups"])][:num_outputs]


def _layer_norm_arguments(kind: str, a: dict, num_inputs: int, num_outputs: int) -> None:
    if a["keep_stats"] and num_outputs != 3:
        raise attr_error(kind, f"keep_stats=True needs 3 outputs (dst, mean, variance), got {num_outputs}")


def _training_arguments(kind: str, a: dict, num_inputs: int, num_outputs: int) -> None:
    # oneDNN's pairings of the optional arguments of the normalization training ops.
    if kind == "BatchNormForwardTraining" and num_inputs == 4:
        raise attr_error(kind, "gamma and beta go together: 3 inputs (neither) or 5 (both), got 4")
    if kind in ("BatchNormTrainingBackward", "LayerNormBackward") and num_outputs == 2:
        raise attr_error(kind, "diff_gamma and diff_beta go together: 1 output or 3, got 2")
    if kind == "LayerNormBackward" and a["use_affine"] and num_inputs < 5:
        raise attr_error(kind, f"use_affine=True needs gamma (input 4): {num_inputs} inputs given")


def _values(inputs: list) -> list:
    return [f64(x) for x in inputs]


# The normalization primitives' thresholds (kernels.tolerance, kernels.normalization_bwd).
_NUMBERS = {
    "LayerNorm": Numbers(kt.normalization("layer_normalization"), inexact=True, accumulates=True, filling="norm"),
    "RMSNorm": Numbers(kt.normalization("rms_normalization"), inexact=True, accumulates=True, filling="norm"),
    "GroupNorm": Numbers(kt.normalization("group_normalization"), inexact=True, accumulates=True),
    "BatchNormInference": Numbers(kt.normalization("batch_normalization"), inexact=True, filling="norm"),
    "BatchNormForwardTraining": Numbers(normalization_bwd.TRAINING, inexact=True, accumulates=True, filling="norm"),
    "BatchNormTrainingBackward": Numbers(normalization_bwd.BACKWARD, inexact=True, accumulates=True,
                                         filling="norm"),
    "LayerNormBackward": Numbers(normalization_bwd.BACKWARD, inexact=True, accumulates=True, filling="norm"),
}


def _normalizes_last_axis(op: Op) -> bool:
    # The layer and RMS normalization primitives take post-ops over the last axis only.
    ndims = len(known_shape(op.inputs[0]))
    return op.attrs.get("begin_norm_axis", -1) % ndims == ndims - 1


register(*numbered([
    GraphOp(_BY_KIND["LayerNorm"], shapes=_layer_norm_shape, lower=_lower_layer_norm,
            reference=lambda kind, a, inputs, n: _layer_norm_reference(a, _values(inputs), n),
            check_arguments=_layer_norm_arguments, post_op_anchor=_normalizes_last_axis),
    GraphOp(_BY_KIND["RMSNorm"], shapes=_rms_norm_shape, lower=_lower_rms_norm,
            reference=lambda kind, a, inputs, n: _rms_norm_reference(a, _values(inputs), n),
            post_op_anchor=_normalizes_last_axis),
    GraphOp(_BY_KIND["BatchNormInference"], shapes=one_output(_batch_norm_shape),
            lower=_lower_batch_norm, reference=lambda kind, a, inputs, n: [_batch_norm_reference(a, _values(inputs))],
            post_op_anchor=any_op),
    GraphOp(_BY_KIND["BatchNormForwardTraining"], shapes=_norm_training_shape, lower=_lower_batch_norm_training,
            reference=lambda kind, a, inputs, n: _batch_norm_training_reference(a, _values(inputs)),
            check_arguments=_training_arguments),
    GraphOp(_BY_KIND["BatchNormTrainingBackward"], shapes=_norm_training_shape, lower=_lower_batch_norm_backward,
            reference=lambda kind, a, inputs, n: _batch_norm_backward_reference(a, _values(inputs), n),
            check_arguments=_training_arguments),
    GraphOp(_BY_KIND["LayerNormBackward"], shapes=_norm_training_shape, lower=_lower_layer_norm_backward,
            reference=lambda kind, a, inputs, n: _layer_norm_backward_reference(a, _values(inputs), n),
            check_arguments=_training_arguments, magnitude=_layer_norm_backward_magnitude),
    GraphOp(_BY_KIND["GroupNorm"], shapes=_group_norm_shape, lower=_lower_group_norm,
            reference=lambda kind, a, inputs, n: _group_norm_reference(a, _values(inputs), n),
            post_op_anchor=any_op),
], _NUMBERS))
