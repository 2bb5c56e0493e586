"""Binary ops (numpy broadcasting), SquaredDifference, Select and BiasAdd: one ``BinaryDesc`` each;
BiasAddBackward, BiasAdd's gradient: one ``ReductionDesc`` sum over all but the channel axis.

The schema, shape rule, lowering and numpy reference of each kind, registered in
``triodnn.graph._op_registry`` (see there)."""

from __future__ import annotations

import numpy as np

from ..._values import (
    BinaryDesc,
    ReductionDesc,
)
from ..._values._errors import InvalidGraphError
from ..._values._memory_desc import MemoryDesc
from ...kernels import tolerance as kt
from .._logical_tensor import known_shape
from .._lowering import (
    Builder,
    View,
)
from .._op import Op
from .._op_registry import GraphOp, Numbers, any_op, numbered, register
from .._op_schema import (
    OpSchema,
    attr_map,
    auto_broadcast_attr,
    data_format_attr,
)
from .._shape_inference import (
    UNKNOWN,
    Shape,
    broadcast_shapes,
    check_one_way,
    fmt_shape,
    one_output,
    same_shapes,
    shape_error,
)
from ._float64 import f64


def _binary_schema(kind: str, algorithm: str) -> OpSchema:
    return OpSchema(kind, (2, 2), (1, 1), attr_map([auto_broadcast_attr()]), "binary", algorithm,
                    ("src_0", "src_1"))


def _channel_axis(a: dict, ndims: int) -> int:
    """The channel axis of a BiasAdd's or BiasAddBackward's data: 1 for NCX, the last for NXC."""
    return 1 if a.get("data_format", "NXC") == "NCX" else ndims - 1


def _bias_add_shape(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    src, bias = shapes
    if len(src) < 2:
        raise shape_error(kind, f"src {fmt_shape(src)} needs at least 2 dims")
    if len(bias) != 1:
        raise shape_error(kind, f"bias {fmt_shape(bias)} must be 1-D")
    channels = src[_channel_axis(a, len(src))]
    if UNKNOWN not in (channels, bias[0]) and bias[0] != channels:
        raise shape_error(kind, f"bias {fmt_shape(bias)} does not match the {channels} channels of src "
                                f"{fmt_shape(src)} ({a['data_format']})")
    return src


def _bias_add_backward_shape(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    (src,) = shapes
    if len(src) < 2:
        raise shape_error(kind, f"output_delta {fmt_shape(src)} needs at least 2 dims")
    return (src[_channel_axis(a, len(src))],)


def _select_shape(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    cond, src0, src1 = shapes
    if a["auto_broadcast"] == "none":
        return same_shapes(kind, shapes)
    out = broadcast_shapes(kind, src0, src1)
    # oneDNN broadcasts cond one way (to the broadcast of the two sources).
    check_one_way(kind, out, cond, "cond")
    return out


_BINARY = {"Add": "add", "Subtract": "sub", "Multiply": "mul", "Divide": "div", "Maximum": "max",
           "Minimum": "min", "GreaterEqual": "ge"}
# The arithmetic kinds a post-op chain can absorb (the binary post-op's algorithm), and those
# whose chain value may be either operand.
POST_OP_ALGORITHMS = {kind: alg for kind, alg in _BINARY.items() if kind != "GreaterEqual"}
COMMUTATIVE_KINDS = frozenset({"Add", "Multiply", "Maximum", "Minimum"})


def _lower_binary(b: Builder, op: Op) -> None:
    alg = _BINARY[op.kind]
    b.run(op, lambda src0, src1, dst: BinaryDesc(alg, src0, src1, dst),
          {"src0": b.view(op.inputs[0]), "src1": b.view(op.inputs[1])},
          {"dst": b.output(op.outputs[0])})


def _lower_squared_difference(b: Builder, op: Op) -> None:
    """(a - b)^2: one binary with a square post-op."""
    b.run(op, lambda src0, src1, dst: BinaryDesc("sub", src0, src1, dst, post_ops=(("eltwise", "square"),)),
          {"src0": b.view(op.inputs[0]), "src1": b.view(op.inputs[1])},
          {"dst": b.output(op.outputs[0])})


def _lower_select(b: Builder, op: Op) -> None:
    cond, then, otherwise = (b.view(lt) for lt in op.inputs)
    b.run(op, lambda src0, src1, src2, dst: BinaryDesc("select", src0, src1, dst, src2=src2),
          {"src0": then, "src1": otherwise, "src2": cond}, {"dst": b.output(op.outputs[0])})


def _lower_bias_add(b: Builder, op: Op) -> None:
    src, bias = b.view(op.inputs[0]), b.view(op.inputs[1])
    ndims = len(known_shape(op.inputs[0]))
    if op.attrs.get("data_format", "NXC") == "NCX" and ndims > 2:
        c = bias.desc.dims[0]
        bias = View(bias.slot, MemoryDesc((c,) + (1,) * (ndims - 2), bias.desc.dtype,
                                          (bias.desc.strides[0],) + (1,) * (ndims - 2)))
    b.run(op, lambda src0, src1, dst: BinaryDesc("add", src0, src1, dst),
          {"src0": src, "src1": bias}, {"dst": b.output(op.outputs[0])})


def _lower_bias_add_backward(b: Builder, op: Op) -> None:
    # The bias gradient is output_delta summed over every axis but the channels: a reduction
    # whose dst keeps the channel axis (C,) and a 1 for each other axis.
    src = b.view(op.inputs[0])
    ndims = src.desc.ndims
    axis = _channel_axis(op.attrs, ndims)
    dst = b.output(op.outputs[0])
    dims = tuple(src.desc.dims[i] if i == axis else 1 for i in range(ndims))
    strides = tuple(dst.desc.strides[0] if i == axis else 1 for i in range(ndims))
    dst = View(dst.slot, MemoryDesc(dims, dst.desc.dtype, strides))
    b.run(op, lambda src, dst: ReductionDesc("sum", src, dst), {"src": src}, {"dst": dst})


def _bias_add_backward_reference(kind: str, a: dict, inputs: list, num_outputs: int) -> list:
    x = f64(inputs[0])
    axis = _channel_axis(a, x.ndim)
    return [x.sum(axis=tuple(i for i in range(x.ndim) if i != axis))]


def _binary_reference(kind: str, a: dict, x: np.ndarray, y: np.ndarray) -> np.ndarray:
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


def _bias_add_reference(a: dict, x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    shape = [1] * x.ndim
    shape[_channel_axis(a, x.ndim)] = -1
    return x + bias.reshape(shape)


_SCHEMAS = [
    OpSchema("BiasAdd", (2, 2), (1, 1), attr_map([data_format_attr()]), "bias", "add",
             ("src", "bias")),
    OpSchema("BiasAddBackward", (1, 1), (1, 1), attr_map([data_format_attr()]), "bias_backward", "sum",
             ("output_delta",), ("bias_delta",)),
    _binary_schema("Add", "add"),
    _binary_schema("Subtract", "sub"),
    _binary_schema("Multiply", "mul"),
    _binary_schema("Divide", "div"),
    _binary_schema("Maximum", "max"),
    _binary_schema("Minimum", "min"),
    _binary_schema("SquaredDifference", "squared_difference"),
    _binary_schema("GreaterEqual", "ge"),
    OpSchema("Select", (3, 3), (1, 1), attr_map([auto_broadcast_attr()]), "select", "select",
             ("cond", "src_0", "src_1")),
]
_BY_KIND = {schema.kind: schema for schema in _SCHEMAS}


def _binary_shape(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    if a["auto_broadcast"] == "none":
        return [same_shapes(kind, shapes)]
    return [broadcast_shapes(kind, *shapes)]


def _binary_op_reference(kind: str, a: dict, inputs: list, num_outputs: int) -> list:
    # Integer operands compute exactly, in int64 (a comparison of two s32 tensors, say).
    integer_math = all(x.dtype.kind in "iub" for x in inputs)
    values = [x.astype(np.int64) if integer_math else f64(x) for x in inputs]
    return [_binary_reference(kind, a, values[0], values[1])]


def _select_op_reference(kind: str, a: dict, inputs: list, num_outputs: int) -> list:
    condition = np.asarray(inputs[0]) != 0
    return [np.where(condition, f64(inputs[1]), f64(inputs[2]))]


def _bias_add_op_reference(kind: str, a: dict, inputs: list, num_outputs: int) -> list:
    return [_bias_add_reference(a, f64(inputs[0]), f64(inputs[1]))]


# One rounding per element (kernels.tolerance.BINARY, benchdnn binary's f32 eps), exact on the
# integer filling; Maximum, Minimum, GreaterEqual and Select pick an input: exact. OpenCL's
# single-precision division is within 2.5 ulp unless built with
# -cl-fp32-correctly-rounded-divide-sqrt: the non-transcendental eltwise bound (4e-6) covers it.
_NUMBERS = {
    **dict.fromkeys(("Add", "Subtract", "Multiply", "BiasAdd", "SquaredDifference"), Numbers(kt.BINARY)),
    "Divide": Numbers(kt.ELTWISE, inexact=True, filling="divisor"),
    # A sum over the batch and spatial axes: the reduction's threshold, exact on the integer filling.
    "BiasAddBackward": Numbers(kt.reduction("sum"), accumulates=True),
}


register(*numbered([
    *(GraphOp(_BY_KIND[kind], shapes=_binary_shape, lower=_lower_binary, reference=_binary_op_reference,
              post_op_anchor=any_op if kind in POST_OP_ALGORITHMS else None)
      for kind in _BINARY),
    GraphOp(_BY_KIND["SquaredDifference"], shapes=_binary_shape, lower=_lower_squared_difference,
            reference=_binary_op_reference),
    GraphOp(_BY_KIND["Select"], shapes=one_output(_select_shape), lower=_lower_select,
            reference=_select_op_reference),
    GraphOp(_BY_KIND["BiasAdd"], shapes=one_output(_bias_add_shape),
            lower=_lower_bias_add, reference=_bias_add_op_reference, post_op_anchor=any_op),
    GraphOp(_BY_KIND["BiasAddBackward"], shapes=one_output(_bias_add_backward_shape),
            lower=_lower_bias_add_backward, reference=_bias_add_backward_reference),
], _NUMBERS))
