"""MatMul: a batched matrix product with optional transposes and bias, one ``MatmulDesc``.

The schema, shape rule, lowering and numpy reference of each kind, registered in
``triodnn.graph._op_registry`` (see there)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..._values import (
    MatmulDesc,
)
from ..._values._errors import UnsupportedError
from ..._values._memory_desc import MemoryDesc
from ..._values._op_desc import OpDesc
from .._logical_tensor import known_shape
from .._lowering import (
    Builder,
    View,
    as_dims,
    permuted,
    row_major,
)
from .._op import Op
from .._op_registry import GraphOp, Numbers, numbered, of_absolute_inputs, register
from .._op_schema import (
    AttrSpec,
    OpSchema,
    accumulation_mode_attr,
    attr_map,
)
from .._shape_inference import (
    UNKNOWN,
    Shape,
    broadcast_shapes,
    check_one_way,
    fmt_shape,
    one_output,
    shape_error,
)
from ._float64 import f64


def _matmul_shape(kind: str, a: dict, shapes: list[Shape]) -> Shape:
    src, wei = list(shapes[0]), list(shapes[1])
    if not src or not wei:
        raise shape_error(kind, f"operands must have rank >= 1, got src {fmt_shape(src)} and weights {fmt_shape(wei)}")
    if a["transpose_a"] and len(src) > 1:
        src[-2], src[-1] = src[-1], src[-2]
    if a["transpose_b"] and len(wei) > 1:
        wei[-2], wei[-1] = wei[-1], wei[-2]
    k_src = src[-1]
    k_wei = wei[0] if len(wei) == 1 else wei[-2]
    if k_src != k_wei and UNKNOWN not in (k_src, k_wei):
        raise shape_error(kind, f"src {fmt_shape(shapes[0])} and weights {fmt_shape(shapes[1])} (transpose_a="
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
        check_one_way(kind, out, shapes[2], "bias")
    return out


def lower_matmul(b: Builder, op: Op, make: Callable[..., OpDesc] | None = None) -> None:
    # make: another matmul kind on the same views (_int8_matmul's QuantizedMatmulDesc)
    a, w = b.view(op.inputs[0]), b.view(op.inputs[1])
    if op.attrs.get("transpose_a") and a.desc.ndims >= 2:
        a = permuted(a, tuple(range(a.desc.ndims - 2)) + (a.desc.ndims - 1, a.desc.ndims - 2))
    if op.attrs.get("transpose_b") and w.desc.ndims >= 2:
        w = permuted(w, tuple(range(w.desc.ndims - 2)) + (w.desc.ndims - 1, w.desc.ndims - 2))
    a_vector, w_vector = len(known_shape(op.inputs[0])) == 1, len(known_shape(op.inputs[1])) == 1
    if a_vector:
        a = View(a.slot, MemoryDesc((1, a.desc.dims[0]), a.desc.dtype, (a.desc.strides[0], a.desc.strides[0])))
    if w_vector:
        w = View(w.slot, MemoryDesc((w.desc.dims[0], 1), w.desc.dtype, (w.desc.strides[0], w.desc.strides[0])))
    dst = b.output(op.outputs[0])
    full = tuple(_batch(a.desc.dims[:-2], w.desc.dims[:-2])) + (a.desc.dims[-2], w.desc.dims[-1])
    if dst.desc.dims != full:
        if not row_major(dst.desc):
            raise UnsupportedError(f"MatMul {op.id}: a strided output of a vector product")
        dst = as_dims(b, op, dst, full)
    inputs = {"src": a, "weights": w}
    if len(op.inputs) > 2:
        inputs["bias"] = b.view(op.inputs[2])
    b.run(op, make or (lambda src, weights, dst, bias=None: MatmulDesc(src, weights, dst, bias, fpmath=b.fpmath_mode)),
          inputs, {"dst": dst})


def _batch(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(x), len(y))
    x, y = (1,) * (n - len(x)) + x, (1,) * (n - len(y)) + y
    return tuple(max(p, q) for p, q in zip(x, y))


def _matmul_reference(a: dict, src: np.ndarray, wei: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    if a["transpose_a"] and src.ndim > 1:
        src = np.swapaxes(src, -1, -2)
    if a["transpose_b"] and wei.ndim > 1:
        wei = np.swapaxes(wei, -1, -2)
    y = np.matmul(src, wei)  # numpy's 1-D rules are oneDNN's: [K] as [1, K] / [K, 1], squeezed
    if bias is not None:
        y = y + bias
    return y


_SCHEMAS = [
    OpSchema("MatMul", (2, 3), (1, 1), attr_map([
        AttrSpec("transpose_a", "bool", default=False),
        AttrSpec("transpose_b", "bool", default=False),
        accumulation_mode_attr(),
    ]), "matmul", None, ("src", "weights", "bias")),
]
_BY_KIND = {schema.kind: schema for schema in _SCHEMAS}


def _matmul_op_reference(kind: str, a: dict, inputs: list, num_outputs: int) -> list:
    values = [f64(x) for x in inputs]
    return [_matmul_reference(a, values[0], values[1], values[2] if len(values) > 2 else None)]


# On the integer filling a matmul is exact in any summation order: benchdnn graph says f32
# partitions are "supposed to be exact on both ends". Non-integer operands (a softmax before it)
# are covered by the chain allowance of the conformance check.
_NUMBERS = {"MatMul": Numbers(accumulates=True, filling="integer_sum")}


def _anchors_post_ops(op: Op) -> bool:
    # The matmul primitive's post-ops broadcast over its dst's last two dims: vectors first
    # become matrices in the lowering, so a chain needs both operands to be matrices already.
    return all(len(known_shape(lt)) >= 2 for lt in op.inputs[:2])


register(*numbered([
    GraphOp(_BY_KIND["MatMul"], shapes=one_output(_matmul_shape),
            lower=lower_matmul, reference=_matmul_op_reference, post_op_anchor=_anchors_post_ops,
            magnitude=of_absolute_inputs(_matmul_op_reference, 3)),
], _NUMBERS))
