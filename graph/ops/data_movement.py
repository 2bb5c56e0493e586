"""Data movement: Reorder, TypeCast, StaticReshape, StaticTranspose, Concat and GenIndex.

The schema, shape rule, lowering and numpy reference of each kind, registered in
``triodnn.graph._op_registry`` (see there)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..._values import (
    ConcatDesc,
    GenIndexDesc,
)
from ..._values._memory_desc import MemoryDesc
from .._logical_tensor import known_shape
from .._lowering import (
    Builder,
    View,
    as_dims,
    dims_of,
    permuted,
    reshaped,
    row_major,
)
from .._op import Op
from .._op_registry import GraphOp, register
from .._op_schema import (
    AttrSpec,
    OpSchema,
    attr_error,
    attr_map,
    normalize_attrs,
)
from .._shape_inference import (
    UNKNOWN,
    Shape,
    fmt_shape,
    normal_axis,
    one_output,
    shape_error,
    shaped_as_input,
)


def reshape_target(kind: str, attrs_: Mapping, src: Shape) -> Shape:
    """StaticReshape's output shape: ``special_zero`` copies the input dim for a 0, one ``-1``
    takes what is left."""
    a = normalize_attrs(kind, attrs_)
    target = list(a["shape"])
    for i, d in enumerate(target):
        if d == 0 and a["special_zero"]:
            if i >= len(src):
                raise shape_error(kind, f"shape {a['shape']} has a 0 at position {i} with special_zero, "
                                        f"but src {fmt_shape(src)} has only {len(src)} dims")
            target[i] = src[i]
    if UNKNOWN in src:
        # Unknown input dims leave the -1 unknown and the sizes uncheckable.
        return tuple(target)
    in_size = math.prod(src)
    if target.count(-1) == 1:
        rest = math.prod(d for d in target if d != -1)
        if rest == 0 or in_size % rest:
            raise shape_error(kind, f"shape {a['shape']} (special_zero={a['special_zero']}) cannot "
                                    f"hold the {in_size} elements of src {fmt_shape(src)}")
        target[target.index(-1)] = in_size // rest
    if math.prod(target) != in_size:
        raise shape_error(kind, f"shape {a['shape']} (special_zero={a['special_zero']}) has "
                                f"{math.prod(target)} elements, src {fmt_shape(src)} has {in_size}")
    return tuple(target)


def transpose_order(kind: str, attrs_: Mapping, ndim: int) -> tuple[int, ...]:
    """StaticTranspose's order with negative entries made positive (empty: reversed axes)."""
    order = normalize_attrs(kind, attrs_)["order"]
    if not order:
        return tuple(reversed(range(ndim)))
    if len(order) != ndim:
        raise shape_error(kind, f"order {order} has {len(order)} entries for a rank-{ndim} src")
    normal = tuple(normal_axis(kind, axis, ndim, "order entry") for axis in order)
    if len(set(normal)) != ndim:
        raise shape_error(kind, f"order {order} is not a permutation of the {ndim} axes")
    return normal


def _concat_shape(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    first = shapes[0]
    axis = normal_axis(kind, a["axis"], len(first))
    total = 0
    for i, shape in enumerate(shapes):
        if len(shape) != len(first):
            raise shape_error(kind, f"input {i} shape {fmt_shape(shape)} rank differs from input 0 {fmt_shape(first)}")
        for d, (x, y) in enumerate(zip(shape, first)):
            if d != axis and x != y and UNKNOWN not in (x, y):
                raise shape_error(kind, f"input {i} shape {fmt_shape(shape)} differs from input 0 "
                                        f"{fmt_shape(first)} at dim {d} (concat axis {a['axis']})")
        total = UNKNOWN if UNKNOWN in (total, shape[axis]) else total + shape[axis]
    out = list(first)
    out[axis] = total
    for d in range(len(out)):
        if d != axis and out[d] == UNKNOWN:
            out[d] = max(shape[d] for shape in shapes)
    return tuple(out)


def _lower_reorder(b: Builder, op: Op) -> None:
    src, dst = b.view(op.inputs[0]), b.output(op.outputs[0])
    b.copy(src, dst, op.id)


def _lower_reshape(b: Builder, op: Op) -> None:
    out = op.outputs[0]
    src = b.view(op.inputs[0])
    view = reshaped(src, dims_of(known_shape(out)))
    if view is None and out.id in b.output_slots and row_major(b.output_slots[out.id].desc):
        # A strided source into a row-major port: one copy, into the port seen with the
        # source's dims (row-major either way, so the same bytes).
        port = b.output(out)
        b.copy(src, View(port.slot, MemoryDesc(src.desc.dims, port.desc.dtype)), op.id)
        return
    if view is None:
        view = as_dims(b, op, src, dims_of(known_shape(out)))
    b.alias(out, view)


def _lower_transpose(b: Builder, op: Op) -> None:
    src = b.view(op.inputs[0])
    ndims = src.desc.ndims
    order = tuple(o % ndims for o in op.attrs["order"]) if op.attrs.get("order") else tuple(reversed(range(ndims)))
    b.alias(op.outputs[0], permuted(src, order))


def _lower_concat(b: Builder, op: Op) -> None:
    srcs = [b.view(lt) for lt in op.inputs]
    axis = op.attrs["axis"]
    names = [f"src{i}" for i in range(len(srcs))]

    def make(dst, **descs):
        return ConcatDesc(tuple(descs[n] for n in names), axis, dst)

    b.run(op, make, dict(zip(names, srcs)), {"dst": b.output(op.outputs[0])})


def _lower_gen_index(b: Builder, op: Op) -> None:
    axis = op.attrs["axis"]
    b.run(op, lambda dst: GenIndexDesc(dst, axis), {}, {"dst": b.output(op.outputs[0])})


def _gen_index_reference(a: dict, x: np.ndarray) -> np.ndarray:
    axis = a["axis"] % x.ndim
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    return np.broadcast_to(np.arange(x.shape[axis]).reshape(shape), x.shape)


_SCHEMAS = [
    OpSchema("Reorder", (1, 1), (1, 1), {}, "reshape", None, ("src",)),
    OpSchema("TypeCast", (1, 1), (1, 1), {}, "reshape", None, ("src",)),
    OpSchema("StaticReshape", (1, 1), (1, 1), attr_map([
        AttrSpec("shape", "s64[]", required=True, minimum=-1),
        AttrSpec("special_zero", "bool", required=True),
    ]), "reshape", None, ("src",)),
    OpSchema("StaticTranspose", (1, 1), (1, 1), attr_map([
        AttrSpec("order", "s64[]", required=True),
    ]), "reshape", None, ("src",)),
    OpSchema("Concat", (1, 64), (1, 1), attr_map([AttrSpec("axis", "s64", required=True)]),
             "reshape", None, ("src_i",)),
    OpSchema("GenIndex", (1, 1), (1, 1), attr_map([AttrSpec("axis", "s64", required=True)]),
             "index", None, ("src",)),
]
_BY_KIND = {schema.kind: schema for schema in _SCHEMAS}


def _one_minus_one(kind: str, a: dict) -> None:
    if a["shape"].count(-1) > 1:
        raise attr_error(kind, f"attribute 'shape' {a['shape']} has more than one -1")


def _axes_once(kind: str, a: dict) -> None:
    order = a["order"]
    if order and len(set(order)) != len(order):
        raise attr_error(kind, f"attribute 'order' {order} repeats an axis")


def _transpose_shape(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    order = transpose_order(kind, a, len(shapes[0]))
    return [tuple(shapes[0][axis] for axis in order)]


def _gen_index_shape(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    normal_axis(kind, a["axis"], len(shapes[0]))
    return [shapes[0]]


def _as_given(kind: str, a: dict, inputs: list, num_outputs: int) -> list:
    return [inputs[0]]  # the conversion to the output's data type is the whole op


register(
    GraphOp(_BY_KIND["Reorder"], shapes=shaped_as_input, lower=_lower_reorder, reference=_as_given),
    GraphOp(_BY_KIND["TypeCast"], shapes=shaped_as_input, lower=_lower_reorder, reference=_as_given),
    GraphOp(_BY_KIND["StaticReshape"], shapes=lambda kind, a, shapes, n: [reshape_target(kind, a, shapes[0])],
            lower=_lower_reshape, check_attrs=_one_minus_one,
            reference=lambda kind, a, inputs, n: [inputs[0].reshape(reshape_target(kind, a, inputs[0].shape))]),
    GraphOp(_BY_KIND["StaticTranspose"], shapes=_transpose_shape, lower=_lower_transpose, check_attrs=_axes_once,
            reference=lambda kind, a, inputs, n: [np.transpose(inputs[0], transpose_order(kind, a, inputs[0].ndim))]),
    GraphOp(_BY_KIND["Concat"], shapes=one_output(_concat_shape), lower=_lower_concat,
            reference=lambda kind, a, inputs, n: [np.concatenate(inputs, axis=a["axis"])]),
    GraphOp(_BY_KIND["GenIndex"], shapes=_gen_index_shape, lower=_lower_gen_index,
            reference=lambda kind, a, inputs, n: [_gen_index_reference(a, inputs[0])]),
)
