"""Elementwise ops: the unary activations (one ``triodnn.kernels.eltwise`` algorithm each), their
backward ops, and PReLU with its backward op.

The schema, shape rule, lowering and numpy reference of each kind, registered in
``triodnn.graph._op_registry`` (see there)."""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import numpy as np

from ..._values import (
    EltwiseBackwardDesc,
    EltwiseDesc,
    PreluBackwardDesc,
    PreluDesc,
)
from ..._values._algorithms import eltwise_parameters as eltwise_defaults
from ..._values._errors import InvalidGraphError
from ..._values._memory_desc import MemoryDesc
from ...kernels import eltwise as kernel_eltwise
from ...kernels import eltwise_bwd
from ...kernels import eltwise_bwd as kernel_eltwise_bwd
from ...kernels import prelu_bwd as kernel_prelu_bwd
from ...kernels import tolerance as kt
from .._logical_tensor import known_shape
from .._lowering import (
    Builder,
    View,
)
from .._op import Op
from .._op_registry import GraphOp, Numbers, any_op, numbered, register
from .._op_schema import (
    GELU_MODES,
    AttrSpec,
    OpSchema,
    attr_map,
    data_format_attr,
    schema_of,
)
from .._shape_inference import (
    Shape,
    check_same_known,
    fmt_shape,
    prelu_slope_shape,
    shape_error,
    shaped_as_input,
)
from ._float64 import f64


def _eltwise_schema(kind: str, algorithm: str, *specs: AttrSpec) -> OpSchema:
    return OpSchema(kind, (1, 1), (1, 1), attr_map(specs), "eltwise", algorithm, ("src",))


def _eltwise_backward_schema(kind: str, algorithm: str, *specs: AttrSpec, use_dst: bool = False) -> OpSchema:
    # Input 0 is the forward's src, or its dst where the op has ``use_dst`` (default true there,
    # as oneDNN's op_def says) and it is set.
    if use_dst:
        specs = (*specs, AttrSpec("use_dst", "bool", default=True))
    return OpSchema(kind, (2, 2), (1, 1), attr_map(specs), "eltwise_backward", algorithm,
                    ("src", "diff_dst"), ("diff_src",))


def eltwise_parameters(kind: str, attrs: Mapping) -> tuple[str, float | None, float | None]:
    """``(algorithm, alpha, beta)`` of ``triodnn.kernels.eltwise`` that computes the unary op
    ``kind`` with normalised ``attrs`` (None: the algorithm's default)."""
    schema = schema_of(kind)
    if not schema.unary_elementwise or schema.algorithm is None:  # eltwise schemas name one
        raise InvalidGraphError(f"{kind} is not a unary elementwise op")
    if kind == "GELU":
        return attrs.get("mode", "gelu_erf"), None, None
    if kind == "LeakyReLU":
        return "leaky_relu", attrs["alpha"], None
    if kind == "Elu":
        return "elu", attrs["alpha"], None
    if kind == "Clamp":
        return "clip", attrs["min"], attrs["max"]
    if kind == "HardSigmoid":
        return "hardsigmoid", attrs["alpha"], attrs["beta"]
    if kind == "SoftPlus":
        # oneDNN Graph: log(1 + exp(beta * x)) / beta, the kernels' soft_relu with alpha = beta.
        return "soft_relu", attrs.get("beta", 1.0), None
    if kind == "Pow":
        return "pow", 1.0, attrs["beta"]
    return schema.algorithm, None, None


def eltwise_backward_parameters(kind: str, attrs: Mapping) -> tuple[str, float | None, float | None, bool]:
    """``(algorithm, alpha, beta, use_dst)`` of the ``EltwiseBackwardDesc`` computing the eltwise
    backward op ``kind`` with normalised ``attrs`` (None: the algorithm's default)."""
    schema = schema_of(kind)
    if schema.category != "eltwise_backward" or schema.algorithm is None:
        raise InvalidGraphError(f"{kind} is not an eltwise backward op")
    use_dst = bool(attrs.get("use_dst", False))
    if kind == "GELUBackward":
        return attrs.get("mode", "gelu_erf"), None, None, False
    if kind == "EluBackward":
        return "elu", attrs["alpha"], None, use_dst
    if kind == "ClampBackward":
        return "clip", attrs["min"], attrs["max"], use_dst
    if kind == "HardSigmoidBackward":
        return "hardsigmoid", attrs["alpha"], attrs["beta"], False
    if kind == "SoftPlusBackward":
        return "soft_relu", attrs.get("beta", 1.0), None, False  # as SoftPlus: alpha = beta
    return schema.algorithm, None, None, use_dst


def _lower_unary(b: Builder, op: Op) -> None:
    # The kernel algorithm the op schema names (eltwise_parameters above, which the numpy
    # reference uses too), so the lowering and the check cannot disagree.
    alg, alpha, beta = eltwise_parameters(op.kind, op.attrs)
    # None: the algorithm's default, resolved as the descriptor resolves an omitted parameter.
    alpha_, beta_ = eltwise_defaults(alg, alpha, beta)
    b.run(op, lambda src, dst: EltwiseDesc(alg, src, dst, alpha_, beta_),
          {"src": b.view(op.inputs[0])}, {"dst": b.output(op.outputs[0])})


def _lower_eltwise_backward(b: Builder, op: Op) -> None:
    # As _lower_unary: the algorithm of eltwise_backward_parameters above, which the numpy
    # reference uses too.
    alg, alpha, beta, use_dst = eltwise_backward_parameters(op.kind, op.attrs)
    alpha_, beta_ = eltwise_defaults(alg, alpha, beta)
    b.run(op, lambda src_or_dst, diff_dst, diff_src: EltwiseBackwardDesc(
              alg, src_or_dst, diff_dst, diff_src, alpha_, beta_, use_dst=use_dst),
          {"src_or_dst": b.view(op.inputs[0]), "diff_dst": b.view(op.inputs[1])},
          {"diff_src": b.output(op.outputs[0])})


def _lower_prelu(b: Builder, op: Op) -> None:
    src, slope = b.view(op.inputs[0]), b.view(op.inputs[1])
    placed = prelu_slope_shape(op.kind, op.attrs, known_shape(op.inputs[0]), known_shape(op.inputs[1]))
    pad = len(placed) - slope.desc.ndims
    if placed == (1,) * pad + slope.desc.dims:  # right-aligned: the slope's strides, 1s before
        strides = (1,) * pad + slope.desc.strides
    else:  # a 1-D slope on the channel dim of NCX
        strides = tuple(slope.desc.strides[0] if d != 1 else 1 for d in placed)
    slope = View(slope.slot, MemoryDesc(placed, slope.desc.dtype, strides))
    b.run(op, lambda src, weights, dst: PreluDesc(src, weights, dst),
          {"src": src, "weights": slope}, {"dst": b.output(op.outputs[0])})


def _placed_slope(view: View, placed: tuple[int, ...]) -> View:
    """A slope (or its gradient) as the dims ``placed`` it broadcasts to src with, as
    ``_lower_prelu`` places it: right-aligned, or a 1-D slope on NCX's channel dim."""
    pad = len(placed) - view.desc.ndims
    if placed == (1,) * pad + view.desc.dims:
        strides = (1,) * pad + view.desc.strides
    else:
        strides = tuple(view.desc.strides[0] if d != 1 else 1 for d in placed)
    return View(view.slot, MemoryDesc(placed, view.desc.dtype, strides))


def _lower_prelu_backward(b: Builder, op: Op) -> None:
    placed = prelu_slope_shape(op.kind, op.attrs, known_shape(op.inputs[0]), known_shape(op.inputs[1]))
    inputs = {"src": b.view(op.inputs[0]), "weights": _placed_slope(b.view(op.inputs[1]), placed),
              "diff_dst": b.view(op.inputs[2])}
    outputs = {"diff_src": b.output(op.outputs[0]), "diff_weights": _placed_slope(b.output(op.outputs[1]), placed)}
    b.run(op, lambda src, weights, diff_dst, diff_src, diff_weights: PreluBackwardDesc(
              src, weights, diff_dst, diff_src, diff_weights), inputs, outputs)


def _eltwise_reference(kind: str, a: dict, x: np.ndarray) -> np.ndarray:
    # The kernel algorithm the op schema maps the op to, as the lowering does.
    alg, alpha, beta = eltwise_parameters(kind, a)
    return f64(kernel_eltwise.reference(alg, x, alpha=alpha, beta=beta))


def _eltwise_backward_reference(kind: str, a: dict, x: np.ndarray, diff_dst: np.ndarray) -> np.ndarray:
    alg, alpha, beta, use_dst = eltwise_backward_parameters(kind, a)
    alpha_, beta_ = eltwise_defaults(alg, alpha, beta)
    return f64(kernel_eltwise_bwd.reference(alg, x, diff_dst, alpha=alpha_, beta=beta_, use_dst=use_dst))


def _prelu_reference(a: dict, x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    """src >= 0 ? src : slope * src, the slope placed as PReLU.md's broadcast rules say."""
    w = slope.reshape(prelu_slope_shape("PReLU", a, x.shape, slope.shape))
    return np.where(x >= 0, x, w * x)


def _prelu_backward_reference(a: dict, x: np.ndarray, slope: np.ndarray, diff_dst: np.ndarray) -> list[np.ndarray]:
    """[diff_src, diff_slope], the slope placed as PReLU's and its gradient summed back to its shape."""
    placed = prelu_slope_shape("PReLUBackward", a, x.shape, slope.shape)
    diff_src, diff_slope = kernel_prelu_bwd.reference(x, slope.reshape(placed), diff_dst)
    return [f64(diff_src), f64(diff_slope).reshape(slope.shape)]


_SCHEMAS = [
    _eltwise_schema("ReLU", "relu"),
    _eltwise_schema("GELU", "gelu_erf",
                    AttrSpec("mode", "string", default="gelu_erf", choices=GELU_MODES)),
    _eltwise_schema("Sigmoid", "sigmoid"),
    _eltwise_schema("Tanh", "tanh"),
    _eltwise_schema("Exp", "exp"),
    _eltwise_schema("Log", "log"),
    _eltwise_schema("Sqrt", "sqrt"),
    _eltwise_schema("Square", "square"),
    _eltwise_schema("Abs", "abs"),
    _eltwise_schema("Clamp", "clip", AttrSpec("min", "f32", required=True),
                    AttrSpec("max", "f32", required=True)),
    _eltwise_schema("Elu", "elu", AttrSpec("alpha", "f32", required=True)),
    _eltwise_schema("LeakyReLU", "leaky_relu", AttrSpec("alpha", "f32", required=True)),
    _eltwise_schema("HardSwish", "hardswish"),
    _eltwise_schema("HardSigmoid", "hardsigmoid", AttrSpec("alpha", "f32", required=True),
                    AttrSpec("beta", "f32", required=True)),
    _eltwise_schema("Mish", "mish"),
    _eltwise_schema("SoftPlus", "soft_relu", AttrSpec("beta", "f32", default=1.0)),
    _eltwise_schema("Pow", "pow", AttrSpec("beta", "f32", required=True)),
    _eltwise_schema("Round", "round"),
    _eltwise_backward_schema("AbsBackward", "abs"),
    _eltwise_backward_schema("ClampBackward", "clip", AttrSpec("min", "f32", required=True),
                             AttrSpec("max", "f32", required=True), use_dst=True),
    _eltwise_backward_schema("EluBackward", "elu", AttrSpec("alpha", "f32", required=True), use_dst=True),
    _eltwise_backward_schema("GELUBackward", "gelu_erf",
                             AttrSpec("mode", "string", default="gelu_erf", choices=GELU_MODES)),
    _eltwise_backward_schema("HardSigmoidBackward", "hardsigmoid", AttrSpec("alpha", "f32", required=True),
                             AttrSpec("beta", "f32", required=True)),
    _eltwise_backward_schema("HardSwishBackward", "hardswish"),
    _eltwise_backward_schema("MishBackward", "mish"),
    _eltwise_backward_schema("ReLUBackward", "relu", use_dst=True),
    _eltwise_backward_schema("SigmoidBackward", "sigmoid", use_dst=True),
    _eltwise_backward_schema("SoftPlusBackward", "soft_relu", AttrSpec("beta", "f32", default=1.0)),
    _eltwise_backward_schema("SqrtBackward", "sqrt", use_dst=True),
    _eltwise_backward_schema("TanhBackward", "tanh", use_dst=True),
    _eltwise_schema("Reciprocal", "reciprocal"),
    # dst = src >= 0 ? src : slope * src; a 1-D slope sits on the channel dim when
    # per_channel_broadcast (oneDNN's default), on the last dim otherwise.
    OpSchema("PReLU", (2, 2), (1, 1), attr_map([
        data_format_attr(),
        AttrSpec("per_channel_broadcast", "bool", default=True),
    ]), "prelu", None, ("src", "slope")),
    # The slope is placed as PReLU's (per_channel_broadcast, which this op lacks, as true);
    # diff_slope has its shape, the slope side summed over the dims it broadcasts on.
    OpSchema("PReLUBackward", (3, 3), (2, 2), attr_map([data_format_attr()]), "prelu_backward", None,
             ("src", "slope", "diff_dst"), ("diff_src", "diff_slope")),
]
_BY_KIND = {schema.kind: schema for schema in _SCHEMAS}


# Unary eltwise ops, each computed by one ``triodnn.kernels.eltwise`` algorithm: the lowering,
# the fusion of post-op chains and the numpy reference all take the kernel algorithm from
# ``eltwise_parameters``, so they cannot disagree.
UNARY_ELTWISE_KINDS = frozenset(schema.kind for schema in _SCHEMAS if schema.category == "eltwise")
# The eltwise backward ops, each computed by one ``EltwiseBackwardDesc`` algorithm.
ELTWISE_BACKWARD_KINDS = frozenset(schema.kind for schema in _SCHEMAS if schema.category == "eltwise_backward")


def _backward_shape(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    # diff_src is shaped like src (or dst); diff_dst must be too (no broadcasting).
    if tuple(shapes[1]) != tuple(shapes[0]) and all(d >= 0 for d in (*shapes[0], *shapes[1])):
        raise shape_error(kind, f"diff_dst shape {fmt_shape(shapes[1])} differs from src shape {fmt_shape(shapes[0])}")
    return [shapes[0]]


def _prelu_shape(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    prelu_slope_shape(kind, a, shapes[0], shapes[1])
    return [shapes[0]]


def _prelu_backward_shape(kind: str, a: dict, shapes: list[Shape], num_outputs: int) -> list[Shape]:
    prelu_slope_shape(kind, a, shapes[0], shapes[1])
    check_same_known(kind, shapes[2], shapes[0], "diff_dst", "src")
    return [shapes[0], shapes[1]][:num_outputs]


def _unary_op_reference(kind: str, a: dict, inputs: list, num_outputs: int) -> list:
    return [_eltwise_reference(kind, a, f64(inputs[0]))]


def _backward_op_reference(kind: str, a: dict, inputs: list, num_outputs: int) -> list:
    return [_eltwise_backward_reference(kind, a, f64(inputs[0]), f64(inputs[1]))]


def _prelu_op_reference(kind: str, a: dict, inputs: list, num_outputs: int) -> list:
    return [_prelu_reference(a, f64(inputs[0]), f64(inputs[1]))]


def _prelu_backward_op_reference(kind: str, a: dict, inputs: list, num_outputs: int) -> list:
    return _prelu_backward_reference(a, *(f64(x) for x in inputs))[:num_outputs]


def _unary_numbers(schema: OpSchema) -> Numbers:
    """Eltwise's threshold for its algorithm (4e-5 transcendental, else 4e-6), except where every
    output is an input value or a constant (exact) or one rounding per element (Square)."""
    if schema.kind in ("ReLU", "Abs", "Clamp", "Round"):
        return Numbers()
    if schema.kind == "Square":
        return Numbers(kt.BINARY)
    return Numbers(kt.eltwise(str(schema.algorithm)), inexact=True)


# The backward ops: eltwise_bwd's threshold for the algorithm (use_dst is not known here: the
# larger, src bound of the two); inexact where the forward is, or the derivative divides.
_NUMBERS = {
    **{kind: _unary_numbers(_BY_KIND[kind]) for kind in UNARY_ELTWISE_KINDS},
    **{kind: Numbers(eltwise_bwd.threshold(str(_BY_KIND[kind].algorithm)),
                     inexact=kind not in ("AbsBackward", "ClampBackward", "ReLUBackward"))
       for kind in ELTWISE_BACKWARD_KINDS},
    "PReLUBackward": Numbers(accumulates=True),  # PReLU's products and sums of integers: exact
}
# The conformance check's inputs: in the domain of Log, Sqrt, Pow and Reciprocal; quarters over
# a range that exercises the curves of the transcendental ones.
_FILLINGS = {
    **dict.fromkeys(("Log", "Sqrt", "Pow", "Reciprocal", "SqrtBackward"), "positive"),
    **dict.fromkeys(("GELU", "Tanh", "Sigmoid", "Exp", "Elu", "Mish", "SoftPlus", "GELUBackward", "TanhBackward",
                     "SigmoidBackward", "EluBackward", "MishBackward", "SoftPlusBackward"), "transcendental"),
}
_NUMBERS.update((kind, attrs.evolve(_NUMBERS[kind], filling=filling)) for kind, filling in _FILLINGS.items())


register(*numbered([
    *(GraphOp(_BY_KIND[kind], shapes=shaped_as_input, lower=_lower_unary, reference=_unary_op_reference,
              post_op_anchor=any_op)
      for kind in sorted(UNARY_ELTWISE_KINDS)),
    *(GraphOp(_BY_KIND[kind], shapes=_backward_shape, lower=_lower_eltwise_backward, reference=_backward_op_reference)
      for kind in sorted(ELTWISE_BACKWARD_KINDS)),
    GraphOp(_BY_KIND["PReLU"], shapes=_prelu_shape, lower=_lower_prelu, reference=_prelu_op_reference),
    GraphOp(_BY_KIND["PReLUBackward"], shapes=_prelu_backward_shape, lower=_lower_prelu_backward,
            reference=_prelu_backward_op_reference),
], _NUMBERS))
