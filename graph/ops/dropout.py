"""Dropout with oneDNN's Philox mask (``triodnn.kernels.dropout``, bit for bit).

The schema, shape rule, lowering and numpy reference of each kind, registered in
``triodnn.graph._op_registry`` (see there)."""

from __future__ import annotations

import math

import numpy as np

from ..._values import (
    DropoutDesc,
)
from ...kernels import dropout as kernel_dropout
from ...kernels import tolerance as kt
from .._lowering import (
    Builder,
)
from .._op import Op
from .._op_registry import GraphOp, Numbers, numbered, register
from .._op_schema import (
    OpSchema,
)
from .._shape_inference import (
    Shape,
    fmt_shape,
    shape_error,
)
from ._float64 import f64


# Dropout: seed, offset and probability stay device buffers (a host scalar is
# uploaded per execution), so one compiled partition serves every seed.
def _lower_dropout(b: Builder, op: Op) -> None:
    inputs = {name: b.view(lt) for name, lt in zip(("src", "seed", "offset", "probability"), op.inputs)}
    outputs = {"dst": b.output(op.outputs[0])}
    if len(op.outputs) > 1:
        outputs["mask"] = b.output(op.outputs[1])
    b.run(op, lambda src, seed, offset, probability, dst, mask=None: DropoutDesc(
              src, seed, offset, probability, dst, mask), inputs, outputs)


# Dropout: oneDNN's Philox mask (kernels.dropout, bit for bit); seed and offset
# are read as int64 here, before any float conversion could round them.
def _dropout_reference(inputs: list[np.ndarray]) -> list[np.ndarray]:
    x, seed_, offset_, p_ = inputs
    seed, offset = int(np.asarray(seed_).reshape(-1)[0]), int(np.asarray(offset_).reshape(-1)[0])
    p = float(np.asarray(p_, np.float32).reshape(-1)[0])
    mask = kernel_dropout.keep_mask(x.shape, seed, offset, p)
    return [np.where(mask != 0, f64(x) * kernel_dropout.inverse_keep(p), 0.0), mask]


_SCHEMAS = [
    # One-element seed and offset (s64) and probability (f32), often
    # host scalars; the u8 mask output is optional. No attributes (oneDNN's op_def).
    OpSchema("Dropout", (4, 4), (1, 2), {}, "dropout", None, ("src", "seed", "offset", "probability"),
             ("dst", "mask")),
]
_BY_KIND = {schema.kind: schema for schema in _SCHEMAS}


def _dropout_shape(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    # dst and mask are shaped as src; seed, offset and probability hold one value each.
    for name, shape in zip(("seed", "offset", "probability"), shapes[1:]):
        if all(d >= 0 for d in shape) and math.prod(shape) != 1:
            raise shape_error(kind, f"{name} holds one value; its shape {fmt_shape(shape)} holds {math.prod(shape)}")
    return [shapes[0]] * num_outputs


# One product by the f32 1 / (1 - p); the mask is exact.
_NUMBERS = {"Dropout": Numbers(kt.BINARY)}


register(*numbered([
    GraphOp(_BY_KIND["Dropout"], shapes=_dropout_shape, lower=_lower_dropout,
            reference=lambda kind, a, inputs, n: _dropout_reference(inputs)[:n]),
], _NUMBERS))
