"""The reductions (ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2),
their axes given as an attribute or as a second input.

The schema, shape rule, lowering and numpy reference of each kind, registered in
``triodnn.graph._op_registry`` (see there)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..._values import (
    ReductionDesc,
)
from ..._values._errors import InvalidGraphError
from ..._values._memory_desc import MemoryDesc
from ...kernels import reduction as kernel_reduction
from ...kernels import tolerance as kt
from .._lowering import (
    Builder,
    View,
)
from .._op import Op
from .._op_registry import GraphOp, Numbers, numbered, of_absolute_inputs, register
from .._op_schema import (
    AttrSpec,
    OpSchema,
    attr_error,
    attr_map,
    normalize_attrs,
)
from .._shape_inference import (
    Shape,
    normal_axis,
    one_output,
    shape_error,
)
from ._float64 import f64


def _reduce_schema(kind: str, algorithm: str) -> OpSchema:
    # oneDNN's default for axes is an empty list, but an axes attribute the user did not set
    # means "the axes come as input 1"; absent (None) keeps that distinction.
    return OpSchema(
        kind, (1, 2), (1, 1),
        attr_map([AttrSpec("axes", "s64[]"), AttrSpec("keep_dims", "bool", default=False)]),
        "reduction", algorithm, ("src", "axes"),
    )


def reduce_axes(kind: str, attrs_: Mapping, ndim: int) -> tuple[int, ...]:
    """A reduction's axes from its ``axes`` attribute, made positive and sorted."""
    a = normalize_attrs(kind, attrs_)
    if "axes" not in a:
        raise shape_error(kind, "the axes come as the second input; output shapes cannot be inferred "
                                "without its values")
    axes = a["axes"]
    if not axes:
        raise shape_error(kind, "axes is empty (oneDNN does not implement an empty reduction)")
    normal = [normal_axis(kind, axis, ndim, "axes entry") for axis in axes]
    if len(set(normal)) != len(normal):
        raise shape_error(kind, f"axes {axes} name an axis twice for a rank-{ndim} src")
    return tuple(sorted(normal))


def _reduce_shape(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    src = shapes[0]
    axes = reduce_axes(kind, a, len(src))
    if a["keep_dims"]:
        return tuple(1 if i in axes else d for i, d in enumerate(src))
    return tuple(d for i, d in enumerate(src) if i not in axes)


_REDUCE = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
           "ReduceProd": "mul", "ReduceL1": "l1", "ReduceL2": "l2"}


def _lower_reduce(b: Builder, op: Op) -> None:
    src = b.view(op.inputs[0])
    dst = b.output(op.outputs[0])
    ndims = src.desc.ndims
    axes = sorted({x % ndims for x in op.attrs.get("axes", [])})
    keep_dims = [1 if i in axes else d for i, d in enumerate(src.desc.dims)]
    if not op.attrs.get("keep_dims", False):
        # Insert the reduced dims back as 1s: a size-1 dim may take any stride.
        strides, it = [], iter(dst.desc.strides if op.outputs[0].shape else ())
        for i in range(ndims):
            strides.append(1 if i in axes else next(it))
        dst = View(dst.slot, MemoryDesc(tuple(keep_dims), dst.desc.dtype, tuple(strides)))
    alg = _REDUCE[op.kind]
    b.run(op, lambda src, dst: ReductionDesc(alg, src, dst), {"src": src}, {"dst": dst})


def _reduce_reference(kind: str, a: dict, inputs: list[np.ndarray]) -> np.ndarray:
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
            return kernel_reduction.product(x, axes, keepdims=keep)
        if kind == "ReduceL1":
            return np.sum(np.abs(x), axis=axes, keepdims=keep)
        if kind == "ReduceL2":
            return np.sqrt(np.sum(x * x, axis=axes, keepdims=keep))
    raise InvalidGraphError(f"{kind} is not a reduction")


def _reduce_op_reference(kind: str, a: dict, inputs: list, num_outputs: int) -> list:
    return [_reduce_reference(kind, a, [f64(x) for x in inputs])]


_SCHEMAS = [
    _reduce_schema("ReduceSum", "sum"),
    _reduce_schema("ReduceMean", "mean"),
    _reduce_schema("ReduceMax", "max"),
    _reduce_schema("ReduceMin", "min"),
    _reduce_schema("ReduceProd", "mul"),
    _reduce_schema("ReduceL1", "l1"),
    _reduce_schema("ReduceL2", "l2"),
]
_BY_KIND = {schema.kind: schema for schema in _SCHEMAS}


def _axes_once(kind: str, a: dict) -> None:
    if "axes" in a and len(set(a["axes"])) != len(a["axes"]):
        raise attr_error(kind, f"attribute 'axes' {a['axes']} repeats an axis")


def _axes_given_once(kind: str, a: dict, num_inputs: int, num_outputs: int) -> None:
    if ("axes" in a) == (num_inputs == 2):
        raise attr_error(kind, "exactly one of the attribute 'axes' and the second input 'axes' must be given "
                                    f"(attribute {'given' if 'axes' in a else 'absent'}, {num_inputs} inputs)")


def _axes_input(a: dict, inputs: list) -> dict:
    """The axes given as an s32 tensor (input 1), as the attribute they stand for."""
    if len(inputs) == 2:
        return {**a, "axes": [int(v) for v in np.asarray(inputs[1]).ravel()]}
    return a


# The reduction primitive's thresholds per algorithm; the product's grows with the count, unknown
# here: 64 factors assumed.
_NUMBERS = {
    "ReduceSum": Numbers(kt.reduction("sum"), accumulates=True),
    "ReduceMean": Numbers(kt.reduction("mean"), inexact=True, accumulates=True),
    "ReduceMax": Numbers(kt.reduction("max")),
    "ReduceMin": Numbers(kt.reduction("min")),
    "ReduceL1": Numbers(kt.reduction("l1"), accumulates=True),
    "ReduceL2": Numbers(kt.reduction("l2"), inexact=True, accumulates=True),
    "ReduceProd": Numbers(kt.reduction("mul", 64), accumulates=True),
}


register(*numbered([
    GraphOp(_BY_KIND[kind], shapes=one_output(_reduce_shape), lower=_lower_reduce,
            reference=_reduce_op_reference,
            check_attrs=_axes_once, check_arguments=_axes_given_once, attrs_from_inputs=_axes_input,
            # attention backward's bf16 dK/dV group sums cancel to small results
            magnitude=of_absolute_inputs(_reduce_op_reference, 1) if kind == "ReduceSum" else None)
    for kind in _REDUCE
], _NUMBERS))
