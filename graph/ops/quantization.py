"""Quantize and Dequantize (scales as attributes) and their dynamic forms (scales as inputs).

The schema, shape rule, lowering and numpy reference of each kind, registered in
``triodnn.graph._op_registry`` (see there)."""

from __future__ import annotations

import math

import numpy as np

from ..._values import (
    DynamicQuantizeDesc,
    QuantizeDesc,
)
from ..._values._memory_desc import MemoryDesc
from .._logical_tensor import LogicalTensor, dense_strides, known_shape
from .._lowering import (
    Builder,
    View,
)
from .._op import Op
from .._op_registry import GraphOp, register
from .._op_schema import (
    DYNAMIC_QTYPES,
    QTYPES,
    AttrSpec,
    OpSchema,
    attr_error,
    attr_map,
)
from .._shape_inference import (
    Shape,
    fmt_shape,
    normal_axis,
    quantization_groups,
    shape_error,
)
from ._float64 import f64


def _lower_quantize(b: Builder, op: Op) -> None:
    a = op.attrs
    axis = a["axis"] if a["qtype"] == "per_channel" else None
    alg = op.kind.lower()
    b.run(op, lambda src, dst: QuantizeDesc(alg, src, dst, scales=a["scales"], zps=a["zps"], axis=axis),
          {"src": b.view(op.inputs[0])}, {"dst": b.output(op.outputs[0])})


def grouped_view(b: Builder, lt: LogicalTensor, placed: tuple[int, ...]) -> View:
    """Scales or zero points ``lt`` with dims ``placed``, one element per group of the tensor
    they quantize: a view. One scale, one per channel, or per group (that rank already): the same
    elements in order, seen with the quantized tensor's rank; dims of 1 take any stride."""
    view = b.view(lt)
    if view.desc.dims == placed:
        return view
    step = view.desc.strides[-1] if view.desc.ndims else 1
    strides = tuple(step * (s if d > 1 else 1) for d, s in zip(placed, dense_strides(placed)))
    return View(view.slot, MemoryDesc(placed, view.desc.dtype, strides))


def _lower_dynamic_quantize(b: Builder, op: Op) -> None:
    src = b.view(op.inputs[0])
    group = quantization_groups(op.kind, op.attrs, src.desc.dims, known_shape(op.inputs[1]))
    placed = tuple(d // g for d, g in zip(src.desc.dims, group))
    inputs = {"src": src, "scales": grouped_view(b, op.inputs[1], placed)}
    if len(op.inputs) > 2:
        inputs["zps"] = grouped_view(b, op.inputs[2], placed)
    alg = op.kind[len("Dynamic"):].lower()
    b.run(op, lambda src, scales, dst, zps=None: DynamicQuantizeDesc(alg, src, scales, dst, group, zps),
          inputs, {"dst": b.output(op.outputs[0])})


def _quantize_reference(kind: str, a: dict, x: np.ndarray) -> np.ndarray:
    """Quantize.md / Dequantize.md: ``src / scale + zp`` (rounded and saturated by the output's
    conversion) or ``(src - zp) * scale``, per tensor or per channel along ``axis``."""
    shape = [1] * x.ndim
    if a["qtype"] == "per_channel":
        shape[a["axis"] % x.ndim] = len(a["scales"])
    scale = np.asarray(a["scales"], np.float64).reshape(shape if a["qtype"] == "per_channel" else ())
    zp = np.asarray(a["zps"] or [0] * len(a["scales"]), np.float64).reshape(scale.shape)
    return x / scale + zp if kind == "Quantize" else (x - zp) * scale


def _dynamic_quantize_reference(kind: str, a: dict, inputs: list[np.ndarray]) -> np.ndarray:
    """DynamicQuantize / DynamicDequantize: as ``_quantize_reference``, the scales (and zero points) given
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


_SCHEMAS = [
    # Static (de)quantization: scales and zero points are attributes (Quantize.md).
    *(OpSchema(kind, (1, 1), (1, 1), attr_map([
        AttrSpec("qtype", "string", default="per_tensor", choices=QTYPES),
        AttrSpec("axis", "s64", default=1),
        AttrSpec("scales", "f32[]", required=True),
        AttrSpec("zps", "s64[]", default=()),
    ]), "quantize", kind.lower(), ("src",)) for kind in ("Quantize", "Dequantize")),
    # Dynamic: scales (and zero points) are inputs; per_group scales have src's rank.
    *(OpSchema(kind, (2, 3), (1, 1), attr_map([
        AttrSpec("qtype", "string", default="per_tensor", choices=DYNAMIC_QTYPES),
        AttrSpec("axis", "s64", default=1),
        AttrSpec("group_shape", "s64[]", minimum=1),
    ]), "quantize", kind[len("Dynamic"):].lower(), ("src", "scales", "zps"))
      for kind in ("DynamicQuantize", "DynamicDequantize")),
]
_BY_KIND = {schema.kind: schema for schema in _SCHEMAS}


def _scales_and_zps(kind: str, a: dict) -> None:
    scales, zps = a["scales"], a["zps"]
    if a["qtype"] == "per_tensor" and len(scales) != 1:
        raise attr_error(kind, f"per_tensor takes one scale, attribute 'scales' has {len(scales)}")
    if zps and len(zps) != len(scales):
        raise attr_error(kind, f"attribute 'zps' has {len(zps)} entries, 'scales' {len(scales)}")


def _quantize_shape(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    if a["qtype"] == "per_channel":
        axis = normal_axis(kind, a["axis"], len(shapes[0]))
        if shapes[0][axis] >= 0 and len(a["scales"]) != shapes[0][axis]:
            raise shape_error(kind, f"{len(a['scales'])} scales for axis {a['axis']} of shape "
                                         f"{fmt_shape(shapes[0])}: one per channel expected")
    return [shapes[0]]


def _dynamic_quantize_shape(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    quantization_groups(kind, a, shapes[0], shapes[1])
    if len(shapes) > 2 and tuple(shapes[2]) != tuple(shapes[1]) and math.prod(shapes[2]) != 1:
        raise shape_error(kind, f"zps shape {fmt_shape(shapes[2])} differs from scales shape {fmt_shape(shapes[1])}")
    return [shapes[0]]


register(
    *(GraphOp(_BY_KIND[kind], shapes=_quantize_shape, lower=_lower_quantize, check_attrs=_scales_and_zps,
              reference=lambda kind, a, inputs, n: [_quantize_reference(kind, a, f64(inputs[0]))])
      for kind in ("Quantize", "Dequantize")),
    *(GraphOp(_BY_KIND[kind], shapes=_dynamic_quantize_shape, lower=_lower_dynamic_quantize,
              reference=lambda kind, a, inputs, n: [_dynamic_quantize_reference(kind, a, [f64(x) for x in inputs])])
      for kind in ("DynamicQuantize", "DynamicDequantize")),
)
