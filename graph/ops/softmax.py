"""SoftMax and LogSoftmax (with the optional row statistic), and their backward ops.

The schema, shape rule, lowering and numpy reference of each kind, registered in
``triodnn.graph._op_registry`` (see there)."""

from __future__ import annotations

import numpy as np

from ..._values import (
    SoftmaxBackwardDesc,
    SoftmaxDesc,
)
from ...kernels import softmax_bwd as kernel_softmax_bwd
from ...kernels import tolerance as kt
from .._lowering import (
    Builder,
)
from .._op import Op
from .._op_registry import GraphOp, Numbers, any_op, numbered, register
from .._op_schema import (
    SOFTMAX_MODES,
    AttrSpec,
    OpSchema,
    attr_map,
    schema_of,
)
from .._shape_inference import (
    Shape,
    check_same_known,
    normal_axis,
)
from ._float64 import f64


def _lower_softmax(b: Builder, op: Op) -> None:
    alg = "logsoftmax" if op.kind == "LogSoftmax" else "softmax"
    axis = op.attrs.get("axis", 1)
    inf_as_zero = op.attrs.get("mode", "none") == "inf_as_zero"
    outputs = {"dst": b.output(op.outputs[0])}
    if len(op.outputs) > 1:
        outputs["stats"] = b.output(op.outputs[1])
    b.run(op, lambda src, dst, stats=None: SoftmaxDesc(alg, src, dst, axis, stats=stats, inf_as_zero=inf_as_zero),
          {"src": b.view(op.inputs[0])}, outputs)


def _lower_softmax_backward(b: Builder, op: Op) -> None:
    alg = "logsoftmax" if op.kind == "LogSoftmaxBackward" else "softmax"
    axis = op.attrs.get("axis", 1)
    b.run(op, lambda diff_dst, dst, diff_src: SoftmaxBackwardDesc(alg, dst, diff_dst, diff_src, axis),
          {"diff_dst": b.view(op.inputs[0]), "dst": b.view(op.inputs[1])}, {"diff_src": b.output(op.outputs[0])})


# Softmax works on slices of at most this many elements: attention scores reach 75M elements
# (GQA-f32: [32, 2, 8, 384, 384]), whose float64 temporaries would take gigabytes at once.
_SOFTMAX_SLICE = 1 << 22


def _softmax_reference(kind: str, a: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


_SCHEMAS = [
    # SoftMax's optional second output is the row statistic max + log(sum(exp(x - max))).
    OpSchema("SoftMax", (1, 1), (1, 2), attr_map([
        AttrSpec("axis", "s64", default=1),
        AttrSpec("mode", "string", default="none", choices=SOFTMAX_MODES),
    ]), "softmax", "softmax", ("src",), ("dst", "stats")),
    OpSchema("LogSoftmax", (1, 1), (1, 1), attr_map([AttrSpec("axis", "s64", default=-1)]),
             "softmax", "logsoftmax", ("src",)),
    # -- the backward ops (training) --
    # Input 0 is diff_dst, input 1 the forward's dst (oneDNN's op_def order).
    OpSchema("SoftMaxBackward", (2, 2), (1, 1), attr_map([AttrSpec("axis", "s64", default=1)]),
             "softmax_backward", "softmax", ("diff_dst", "dst"), ("diff_src",)),
    OpSchema("LogSoftmaxBackward", (2, 2), (1, 1), attr_map([AttrSpec("axis", "s64", default=-1)]),
             "softmax_backward", "logsoftmax", ("diff_dst", "dst"), ("diff_src",)),
]
_BY_KIND = {schema.kind: schema for schema in _SCHEMAS}


def _softmax_shape(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    src = shapes[0]
    axis = normal_axis(kind, a["axis"], len(src))
    stats = tuple(1 if i == axis else d for i, d in enumerate(src))
    return [src, stats][:num_outputs]


def _backward_shape(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    # Input 0 is diff_dst, input 1 the forward's dst (oneDNN's op_def order).
    normal_axis(kind, a["axis"], len(shapes[1]))
    check_same_known(kind, shapes[0], shapes[1], "diff_dst", "dst")
    return [shapes[1]]


def _backward_op_reference(kind: str, a: dict, inputs: list, num_outputs: int) -> list:
    diff_dst, dst = f64(inputs[0]), f64(inputs[1])
    algorithm = str(schema_of(kind).algorithm)
    return [f64(kernel_softmax_bwd.reference(algorithm, dst, diff_dst, axis=a["axis"] % dst.ndim))]


# The softmax primitives' thresholds; the backward ones are benchdnn's (4 times the forward's).
_NUMBERS = {
    "SoftMax": Numbers(kt.softmax("softmax"), inexact=True, accumulates=True),
    "LogSoftmax": Numbers(kt.softmax("logsoftmax"), inexact=True, accumulates=True),
    "SoftMaxBackward": Numbers(kernel_softmax_bwd.threshold("softmax"), accumulates=True,
                               filling="softmax_gradient"),
    "LogSoftmaxBackward": Numbers(kernel_softmax_bwd.threshold("logsoftmax"), inexact=True, accumulates=True,
                                  filling="log_softmax_gradient"),
}


register(*numbered([
    *(GraphOp(_BY_KIND[kind], shapes=_softmax_shape, lower=_lower_softmax,
              reference=lambda kind, a, inputs, n: list(_softmax_reference(kind, a, f64(inputs[0])))[:n],
              post_op_anchor=any_op)
      for kind in ("SoftMax", "LogSoftmax")),
    *(GraphOp(_BY_KIND[kind], shapes=_backward_shape, lower=_lower_softmax_backward, reference=_backward_op_reference)
      for kind in ("SoftMaxBackward", "LogSoftmaxBackward")),
], _NUMBERS))
