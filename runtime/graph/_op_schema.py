"""oneDNN Graph op schemas: the op kinds triodnn knows, their arity and attributes.

Facts follow oneDNN's ``src/graph/interface/op_def.hpp`` (``DNNL_GRAPH_OP_SCHEMA``, attribute
names, kinds, defaults and allowed values), ``op_def_constraint.cpp`` (cross-attribute checks:
non-negative pads, MaxPool dilations as long as the kernel, LayerNorm's ``keep_stats`` needing
three outputs, Reduce's axes given either as the attribute or as the second input) and the
operation pages under ``doc/graph/operations``. Only forward ops are described.

Attributes are Python values after ``check_op``: ``bool``, ``int``, ``float``, ``str``,
``list[int]``, ``list[float]``. Serialized graphs write booleans as 0/1 and may write an f32 as a
JSON integer, so both are accepted; ``{"type": ..., "value": ...}`` (the JSON attribute form) is
accepted too, and its declared type must match the schema's. f32 values are rounded to float32
(oneDNN stores them so), which keeps ``epsilon=1e-5`` the same number everywhere downstream.
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Mapping

import attrs
import numpy as np

from .._values._errors import InvalidGraphError

ATTR_TYPES = ("bool", "s64", "s64[]", "f32", "f32[]", "string")

# Upper bound of a variadic arity (Wildcard's "any number"): compares like an int.
UNBOUNDED = sys.maxsize


@attrs.frozen(slots=True)
class AttrSpec:
    """One attribute of an op kind.

    ``default`` is the normalised value filled in when the attribute is absent; ``None`` means
    the attribute stays absent (a required attribute, or one whose absence means something, like
    Reduce's ``axes``). List defaults are stored as tuples and handed out as fresh lists.
    ``choices`` restricts strings; ``minimum`` bounds every number of an s64/s64[]/f32 value.
    """

    name: str
    type: str = attrs.field(validator=attrs.validators.in_(ATTR_TYPES))
    required: bool = False
    default: object = None
    choices: tuple[str, ...] | None = None
    minimum: int | float | None = None


def _attr_map(specs) -> dict[str, AttrSpec]:
    return {spec.name: spec for spec in specs}


@attrs.frozen(slots=True, eq=False)
class OpSchema:
    """What an op kind accepts: arity ``(min, max)`` of inputs and outputs (``UNBOUNDED`` for no
    limit), its attributes, the names oneDNN gives its inputs/outputs, and how it lowers.

    ``category`` groups kinds by lowering: ``eltwise`` (one input, elementwise), ``binary``
    (two inputs, broadcasting), ``select``, ``matmul``, ``convolution``, ``deconvolution``,
    ``pooling``, ``resampling``, ``norm``, ``norm_training`` (batch norm training and the batch
    and layer norm backward ops, issue 21), ``softmax``, ``reduction``, ``reshape`` (data movement:
    reshape, transpose, concat, reorder, typecast), ``bias``, ``index``, ``prelu``,
    ``dropout`` (Dropout, issue 21), ``unsupported`` (recognised, not run) and ``special`` (Wildcard,
    End). ``algorithm`` is the name of
    the matching algorithm of ``triodnn.kernels`` (eltwise alg, binary alg, reduction alg,
    pooling alg) where there is one; attribute-dependent eltwise parameters come from
    ``eltwise_parameters`` below.
    """

    kind: str
    num_inputs: tuple[int, int]
    num_outputs: tuple[int, int]
    attrs: dict[str, AttrSpec] = attrs.field(factory=dict)
    category: str = "special"
    algorithm: str | None = None
    input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ("dst",)
    any_attrs: bool = False  # Wildcard: every attribute is accepted as given

    @property
    def unary_elementwise(self) -> bool:
        return self.category == "eltwise"

    @property
    def binary(self) -> bool:
        return self.category == "binary"


# -- attribute vocabularies (op_def.hpp) --------------------------------------------------------

DATA_FORMATS = ("NXC", "NCX")
CONV_WEIGHTS_FORMATS = ("XIO", "OIX")
# ConvTranspose's: O is the output channels per group, I all the input channels; oneDNN's
# op_def takes XOI (the default) and IOX, and its documentation OIX and XIO too.
CONV_TRANSPOSE_WEIGHTS_FORMATS = ("XOI", "IOX", "OIX", "XIO")
AUTO_PADS = ("None", "SAME_UPPER", "SAME_LOWER", "VALID")
AUTO_BROADCASTS = ("none", "numpy")
ROUNDING_TYPES = ("floor", "ceil")
GELU_MODES = ("gelu_erf", "gelu_tanh")
SOFTMAX_MODES = ("none", "inf_as_zero")
INTERPOLATE_MODES = ("nearest", "linear", "bilinear", "trilinear")
COORDINATE_TRANSFORMATION_MODES = ("half_pixel", "align_corners")
# Op-level accumulation mode (oneDNN's graph RFC "accumulation mode on op level", the values of
# dnnl::accumulation_mode); set on MatMul and Convolution by recent serialized graphs.
ACCUMULATION_MODES = ("strict", "relaxed", "any", "f32", "s32", "f16")
QTYPES = ("per_tensor", "per_channel")
DYNAMIC_QTYPES = (*QTYPES, "per_group")


def _auto_broadcast() -> AttrSpec:
    return AttrSpec("auto_broadcast", "string", default="numpy", choices=AUTO_BROADCASTS)


def _data_format() -> AttrSpec:
    return AttrSpec("data_format", "string", default="NXC", choices=DATA_FORMATS)


def _accumulation_mode() -> AttrSpec:
    return AttrSpec("accumulation_mode", "string", default="strict", choices=ACCUMULATION_MODES)


def _eltwise(kind: str, algorithm: str, *specs: AttrSpec) -> OpSchema:
    return OpSchema(kind, (1, 1), (1, 1), _attr_map(specs), "eltwise", algorithm, ("src",))


def _eltwise_backward(kind: str, algorithm: str, *specs: AttrSpec, use_dst: bool = False) -> OpSchema:
    # Input 0 is the forward's src, or its dst where the op has ``use_dst`` (default true there,
    # as oneDNN's op_def says) and it is set.
    if use_dst:
        specs = (*specs, AttrSpec("use_dst", "bool", default=True))
    return OpSchema(kind, (2, 2), (1, 1), _attr_map(specs), "eltwise_backward", algorithm,
                    ("src", "diff_dst"), ("diff_src",))


def _binary(kind: str, algorithm: str) -> OpSchema:
    return OpSchema(kind, (2, 2), (1, 1), _attr_map([_auto_broadcast()]), "binary", algorithm,
                    ("src_0", "src_1"))


def _reduce(kind: str, algorithm: str) -> OpSchema:
    # oneDNN's default for axes is an empty list, but an axes attribute the user did not set
    # means "the axes come as input 1"; absent (None) keeps that distinction.
    return OpSchema(
        kind, (1, 2), (1, 1),
        _attr_map([AttrSpec("axes", "s64[]"), AttrSpec("keep_dims", "bool", default=False)]),
        "reduction", algorithm, ("src", "axes"),
    )


def _pool(kind: str, algorithm: str | None) -> OpSchema:
    specs = [
        AttrSpec("strides", "s64[]", required=True, minimum=1),
        AttrSpec("kernel", "s64[]", required=True, minimum=1),
        AttrSpec("pads_begin", "s64[]", required=True, minimum=0),
        AttrSpec("pads_end", "s64[]", required=True, minimum=0),
        _data_format(),
        AttrSpec("rounding_type", "string", default="floor", choices=ROUNDING_TYPES),
        AttrSpec("auto_pad", "string", default="None", choices=AUTO_PADS),
    ]
    if kind == "MaxPool":
        # Default: ones, as many as kernel entries (oneDNN: a vector of ones, see check_op).
        specs.append(AttrSpec("dilations", "s64[]", minimum=1))
    else:
        specs.append(AttrSpec("exclude_pad", "bool", required=True))
    return OpSchema(kind, (1, 1), (1, 1), _attr_map(specs), "pooling", algorithm, ("src",))


# -- pooling backward (issue 21) --
def _pool_backward(kind: str) -> OpSchema:
    # The forward's attributes, with rounding_type kept (oneDNN's backward op_def omits it; a graph
    # setting it still says how diff_dst was shaped). MaxPoolBackward reads the maxima from the
    # forward's src; AvgPoolBackward gets the forward's src shape as an attribute or as input 1
    # (the attribute rules here: the input's values are not known when shapes are inferred).
    forward = _pool(kind[:-len("Backward")], None)
    specs = list(forward.attrs.values())
    if kind == "MaxPoolBackward":
        return OpSchema(kind, (2, 2), (1, 1), _attr_map(specs), "pooling_backward", "max",
                        ("src", "diff_dst"), ("diff_src",))
    specs.append(AttrSpec("src_shape", "s64[]", minimum=0))
    return OpSchema(kind, (1, 2), (1, 1), _attr_map(specs), "pooling_backward", None,
                    ("diff_dst", "src_shape"), ("diff_src",))


def _schemas() -> dict[str, OpSchema]:
    conv_attrs = [
        AttrSpec("strides", "s64[]", required=True, minimum=1),
        AttrSpec("pads_begin", "s64[]", required=True, minimum=0),
        AttrSpec("pads_end", "s64[]", required=True, minimum=0),
        AttrSpec("dilations", "s64[]", required=True, minimum=1),
        AttrSpec("auto_pad", "string", default="None", choices=AUTO_PADS),
        AttrSpec("groups", "s64", default=1, minimum=1),
        _data_format(),
        AttrSpec("weights_format", "string", default="XIO", choices=CONV_WEIGHTS_FORMATS),
        _accumulation_mode(),
    ]
    schemas = [
        OpSchema("MatMul", (2, 3), (1, 1), _attr_map([
            AttrSpec("transpose_a", "bool", default=False),
            AttrSpec("transpose_b", "bool", default=False),
            _accumulation_mode(),
        ]), "matmul", None, ("src", "weights", "bias")),
        OpSchema("Convolution", (2, 3), (1, 1), _attr_map(conv_attrs), "convolution", None,
                 ("src", "weights", "bias")),
        # output_padding: oneDNN's default is DNNL_MAX_NDIMS zeros, so serialized graphs carry
        # 12 entries; the first one per spatial dim counts.
        OpSchema("ConvTranspose", (2, 3), (1, 1), _attr_map([
            *(spec for spec in conv_attrs if spec.name != "weights_format"),
            AttrSpec("weights_format", "string", default="XOI", choices=CONV_TRANSPOSE_WEIGHTS_FORMATS),
            AttrSpec("output_padding", "s64[]", minimum=0),
        ]), "deconvolution", None, ("src", "weights", "bias")),
        # -- convolution backward (training) --
        # dst_shape / weights_shape: the output's shape in data_format / weights_format; oneDNN's
        # default is DNNL_MAX_NDIMS zeros, read as unset. The optional third input (the shape as a
        # tensor) is accepted as oneDNN's op_def does; the shape still comes from the attribute.
        OpSchema("ConvolutionBackwardData", (2, 3), (1, 1), _attr_map([
            *conv_attrs,
            AttrSpec("output_padding", "s64[]", minimum=0),
            AttrSpec("dst_shape", "s64[]", minimum=0),
        ]), "convolution_backward", None, ("diff_dst", "weights", "dst_shape"), ("diff_src",)),
        OpSchema("ConvolutionBackwardWeights", (2, 3), (1, 1), _attr_map([
            *conv_attrs,
            AttrSpec("weights_shape", "s64[]", minimum=0),
        ]), "convolution_backward", None, ("src", "diff_dst", "weights_shape"), ("diff_weights",)),
        OpSchema("ConvTransposeBackwardData", (2, 2), (1, 1), _attr_map([
            *(spec for spec in conv_attrs if spec.name != "weights_format"),
            AttrSpec("weights_format", "string", default="XOI", choices=CONV_TRANSPOSE_WEIGHTS_FORMATS),
        ]), "convolution_backward", None, ("diff_dst", "weights"), ("diff_src",)),
        OpSchema("ConvTransposeBackwardWeights", (2, 3), (1, 1), _attr_map([
            *(spec for spec in conv_attrs if spec.name != "weights_format"),
            AttrSpec("weights_format", "string", default="XOI", choices=CONV_TRANSPOSE_WEIGHTS_FORMATS),
            AttrSpec("weights_shape", "s64[]", minimum=0),
        ]), "convolution_backward", None, ("src", "diff_dst", "weights_shape"), ("diff_weights",)),
        OpSchema("BiasAdd", (2, 2), (1, 1), _attr_map([_data_format()]), "bias", "add",
                 ("src", "bias")),
        _binary("Add", "add"),
        _binary("Subtract", "sub"),
        _binary("Multiply", "mul"),
        _binary("Divide", "div"),
        _binary("Maximum", "max"),
        _binary("Minimum", "min"),
        _binary("SquaredDifference", "squared_difference"),
        _binary("GreaterEqual", "ge"),
        OpSchema("Select", (3, 3), (1, 1), _attr_map([_auto_broadcast()]), "select", "select",
                 ("cond", "src_0", "src_1")),
        _eltwise("ReLU", "relu"),
        _eltwise("GELU", "gelu_erf",
                 AttrSpec("mode", "string", default="gelu_erf", choices=GELU_MODES)),
        _eltwise("Sigmoid", "sigmoid"),
        _eltwise("Tanh", "tanh"),
        _eltwise("Exp", "exp"),
        _eltwise("Log", "log"),
        _eltwise("Sqrt", "sqrt"),
        _eltwise("Square", "square"),
        _eltwise("Abs", "abs"),
        _eltwise("Clamp", "clip", AttrSpec("min", "f32", required=True),
                 AttrSpec("max", "f32", required=True)),
        _eltwise("Elu", "elu", AttrSpec("alpha", "f32", required=True)),
        _eltwise("LeakyReLU", "leaky_relu", AttrSpec("alpha", "f32", required=True)),
        _eltwise("HardSwish", "hardswish"),
        _eltwise("HardSigmoid", "hardsigmoid", AttrSpec("alpha", "f32", required=True),
                 AttrSpec("beta", "f32", required=True)),
        _eltwise("Mish", "mish"),
        _eltwise("SoftPlus", "soft_relu", AttrSpec("beta", "f32", default=1.0)),
        _eltwise("Pow", "pow", AttrSpec("beta", "f32", required=True)),
        _eltwise("Round", "round"),
        _eltwise_backward("AbsBackward", "abs"),
        _eltwise_backward("ClampBackward", "clip", AttrSpec("min", "f32", required=True),
                          AttrSpec("max", "f32", required=True), use_dst=True),
        _eltwise_backward("EluBackward", "elu", AttrSpec("alpha", "f32", required=True), use_dst=True),
        _eltwise_backward("GELUBackward", "gelu_erf",
                          AttrSpec("mode", "string", default="gelu_erf", choices=GELU_MODES)),
        _eltwise_backward("HardSigmoidBackward", "hardsigmoid", AttrSpec("alpha", "f32", required=True),
                          AttrSpec("beta", "f32", required=True)),
        _eltwise_backward("HardSwishBackward", "hardswish"),
        _eltwise_backward("MishBackward", "mish"),
        _eltwise_backward("ReLUBackward", "relu", use_dst=True),
        _eltwise_backward("SigmoidBackward", "sigmoid", use_dst=True),
        _eltwise_backward("SoftPlusBackward", "soft_relu", AttrSpec("beta", "f32", default=1.0)),
        _eltwise_backward("SqrtBackward", "sqrt", use_dst=True),
        _eltwise_backward("TanhBackward", "tanh", use_dst=True),
        _eltwise("Reciprocal", "reciprocal"),
        # dst = src >= 0 ? src : slope * src; a 1-D slope sits on the channel dim when
        # per_channel_broadcast (oneDNN's default), on the last dim otherwise.
        OpSchema("PReLU", (2, 2), (1, 1), _attr_map([
            _data_format(),
            AttrSpec("per_channel_broadcast", "bool", default=True),
        ]), "prelu", None, ("src", "slope")),
        # SoftMax's optional second output is the row statistic max + log(sum(exp(x - max))).
        OpSchema("SoftMax", (1, 1), (1, 2), _attr_map([
            AttrSpec("axis", "s64", default=1),
            AttrSpec("mode", "string", default="none", choices=SOFTMAX_MODES),
        ]), "softmax", "softmax", ("src",), ("dst", "stats")),
        OpSchema("LogSoftmax", (1, 1), (1, 1), _attr_map([AttrSpec("axis", "s64", default=-1)]),
                 "softmax", "logsoftmax", ("src",)),
        OpSchema("LayerNorm", (1, 3), (1, 3), _attr_map([
            AttrSpec("keep_stats", "bool", default=True),
            AttrSpec("begin_norm_axis", "s64", default=-1),
            AttrSpec("use_affine", "bool", default=True),
            AttrSpec("epsilon", "f32", default=1e-5, minimum=0.0),
        ]), "norm", "layer_normalization", ("src", "gamma", "beta"), ("dst", "mean", "variance")),
        # oneDNN's op_def gives RMSNorm one output; its doc page lists an optional ``rrms``
        # (1 / sqrt(mean(x^2) + eps), shaped like LayerNorm's statistics), accepted here.
        OpSchema("RMSNorm", (1, 2), (1, 2), _attr_map([
            AttrSpec("begin_norm_axis", "s64", default=-1),
            AttrSpec("epsilon", "f32", default=1e-5, minimum=0.0),
        ]), "norm", "rms_normalization", ("src", "gamma"), ("dst", "rrms")),
        OpSchema("BatchNormInference", (5, 5), (1, 1), _attr_map([
            AttrSpec("epsilon", "f32", required=True, minimum=0.0),
            _data_format(),
        ]), "norm", "batch_normalization", ("src", "gamma", "beta", "mean", "variance")),
        # Normalization training (issue 21): oneDNN's op_def order, the optional inputs and outputs
        # last. BatchNormForwardTraining's mean and variance are the old running statistics; its
        # momentum has no default in op_def, oneDNN's backend takes 0.5.
        OpSchema("BatchNormForwardTraining", (3, 5), (5, 5), _attr_map([
            AttrSpec("epsilon", "f32", required=True, minimum=0.0),
            AttrSpec("momentum", "f32", default=0.5),
            _data_format(),
        ]), "norm_training", "batch_normalization", ("src", "mean", "variance", "gamma", "beta"),
            ("dst", "running_mean", "running_variance", "batch_mean", "batch_variance")),
        OpSchema("BatchNormTrainingBackward", (4, 5), (1, 3), _attr_map([
            AttrSpec("epsilon", "f32", required=True, minimum=0.0),
            _data_format(),
        ]), "norm_training", "batch_normalization", ("src", "diff_dst", "mean", "variance", "gamma"),
            ("diff_src", "diff_gamma", "diff_beta")),
        OpSchema("LayerNormBackward", (4, 6), (1, 3), _attr_map([
            AttrSpec("begin_norm_axis", "s64", default=-1),
            AttrSpec("use_affine", "bool", default=True),
            AttrSpec("epsilon", "f32", default=1e-5, minimum=0.0),
        ]), "norm_training", "layer_normalization", ("src", "diff_dst", "mean", "variance", "gamma", "beta"),
            ("diff_src", "diff_gamma", "diff_beta")),
        _pool("MaxPool", "max"),
        _pool("AvgPool", None),  # avg_include_padding or avg_exclude_padding by exclude_pad
        _pool_backward("MaxPoolBackward"),  # pooling backward (issue 21)
        _pool_backward("AvgPoolBackward"),
        # Exactly one of sizes and scales (op_def_constraint's check_interpolate_sizes_scales);
        # the optional input 1 is the sizes as an s32 tensor, the output shape then given.
        OpSchema("Interpolate", (1, 2), (1, 1), _attr_map([
            AttrSpec("mode", "string", required=True, choices=INTERPOLATE_MODES),
            AttrSpec("sizes", "s64[]", minimum=1),
            AttrSpec("scales", "f32[]"),
            AttrSpec("coordinate_transformation_mode", "string", default="half_pixel",
                     choices=COORDINATE_TRANSFORMATION_MODES),
            _data_format(),
        ]), "resampling", None, ("src", "sizes")),
        # -- softmax, PReLU and Interpolate backward (training; issue 21) --
        # Input 0 is diff_dst, input 1 the forward's dst (oneDNN's op_def order).
        OpSchema("SoftMaxBackward", (2, 2), (1, 1), _attr_map([AttrSpec("axis", "s64", default=1)]),
                 "softmax_backward", "softmax", ("diff_dst", "dst"), ("diff_src",)),
        OpSchema("LogSoftmaxBackward", (2, 2), (1, 1), _attr_map([AttrSpec("axis", "s64", default=-1)]),
                 "softmax_backward", "logsoftmax", ("diff_dst", "dst"), ("diff_src",)),
        # The slope is placed as PReLU's (per_channel_broadcast, which this op lacks, as true);
        # diff_slope has its shape, the slope side summed over the dims it broadcasts on.
        OpSchema("PReLUBackward", (3, 3), (2, 2), _attr_map([_data_format()]), "prelu_backward", None,
                 ("src", "slope", "diff_dst"), ("diff_src", "diff_slope")),
        # The forward's src gives diff_src's shape only; the optional sizes input is accepted as
        # oneDNN's op_def does, diff_dst's shape saying the same.
        OpSchema("InterpolateBackward", (2, 3), (1, 1), _attr_map([
            AttrSpec("mode", "string", required=True, choices=INTERPOLATE_MODES),
            AttrSpec("sizes", "s64[]", minimum=1),
            AttrSpec("scales", "f32[]"),
            AttrSpec("coordinate_transformation_mode", "string", default="half_pixel",
                     choices=COORDINATE_TRANSFORMATION_MODES),
            _data_format(),
        ]), "resampling_backward", None, ("src", "diff_dst", "sizes"), ("diff_src",)),
        OpSchema("Reorder", (1, 1), (1, 1), {}, "reshape", None, ("src",)),
        # Static (de)quantization: scales and zero points are attributes (Quantize.md).
        *(OpSchema(kind, (1, 1), (1, 1), _attr_map([
            AttrSpec("qtype", "string", default="per_tensor", choices=QTYPES),
            AttrSpec("axis", "s64", default=1),
            AttrSpec("scales", "f32[]", required=True),
            AttrSpec("zps", "s64[]", default=()),
        ]), "quantize", kind.lower(), ("src",)) for kind in ("Quantize", "Dequantize")),
        # Dynamic: scales (and zero points) are inputs; per_group scales have src's rank.
        *(OpSchema(kind, (2, 3), (1, 1), _attr_map([
            AttrSpec("qtype", "string", default="per_tensor", choices=DYNAMIC_QTYPES),
            AttrSpec("axis", "s64", default=1),
            AttrSpec("group_shape", "s64[]", minimum=1),
        ]), "quantize", kind[len("Dynamic"):].lower(), ("src", "scales", "zps"))
          for kind in ("DynamicQuantize", "DynamicDequantize")),
        OpSchema("TypeCast", (1, 1), (1, 1), {}, "reshape", None, ("src",)),
        OpSchema("StaticReshape", (1, 1), (1, 1), _attr_map([
            AttrSpec("shape", "s64[]", required=True, minimum=-1),
            AttrSpec("special_zero", "bool", required=True),
        ]), "reshape", None, ("src",)),
        OpSchema("StaticTranspose", (1, 1), (1, 1), _attr_map([
            AttrSpec("order", "s64[]", required=True),
        ]), "reshape", None, ("src",)),
        OpSchema("Concat", (1, 64), (1, 1), _attr_map([AttrSpec("axis", "s64", required=True)]),
                 "reshape", None, ("src_i",)),
        OpSchema("GenIndex", (1, 1), (1, 1), _attr_map([AttrSpec("axis", "s64", required=True)]),
                 "index", None, ("src",)),
        # Dropout (issue 21): one-element seed and offset (s64) and probability (f32), often
        # host scalars; the u8 mask output is optional. No attributes (oneDNN's op_def).
        OpSchema("Dropout", (4, 4), (1, 2), {}, "dropout", None, ("src", "seed", "offset", "probability"),
                 ("dst", "mask")),
        _reduce("ReduceSum", "sum"),
        _reduce("ReduceMean", "mean"),
        _reduce("ReduceMax", "max"),
        _reduce("ReduceMin", "min"),
        _reduce("ReduceProd", "mul"),
        _reduce("ReduceL1", "l1"),
        _reduce("ReduceL2", "l2"),
        OpSchema("Wildcard", (0, UNBOUNDED), (0, UNBOUNDED), {}, "special", None, ("src",),
                 any_attrs=True),
        OpSchema("End", (1, 1), (0, 0), {}, "special", None, ("src",), ()),
        OpSchema("GroupNorm", (1, 3), (1, 3), _attr_map([
            AttrSpec("groups", "s64", required=True, minimum=1),
            AttrSpec("keep_stats", "bool", default=True),
            AttrSpec("use_affine", "bool", default=False),
            AttrSpec("epsilon", "f32", default=1e-5, minimum=0.0),
            _data_format(),
        ]), "norm", "group_normalization", ("src", "gamma", "beta"), ("dst", "mean", "variance")),
        # oneDNN ops triodnn recognises but does not run: a graph holding one still loads and
        # partitions, the op landing in an unsupported partition (oneDNN's behaviour for ops a
        # backend lacks), instead of failing as an unknown kind.
        *(OpSchema(kind, (0, UNBOUNDED), (0, UNBOUNDED), {}, "unsupported", None, ("src",), any_attrs=True)
          for kind in RECOGNISED_NOT_RUN),
    ]
    return {schema.kind: schema for schema in schemas}


RECOGNISED_NOT_RUN = (
    "BiasAddBackward",
)


OP_SCHEMAS: dict[str, OpSchema] = _schemas()

# Unary eltwise ops, each computed by one ``triodnn.kernels.eltwise`` algorithm: the lowering,
# the fusion of post-op chains and the numpy reference all take the kernel algorithm from
# ``eltwise_parameters``, so they cannot disagree.
UNARY_ELTWISE_KINDS = frozenset(kind for kind, schema in OP_SCHEMAS.items() if schema.unary_elementwise)


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


# The eltwise backward ops, each computed by one ``EltwiseBackwardDesc`` algorithm.
ELTWISE_BACKWARD_KINDS = frozenset(
    kind for kind, schema in OP_SCHEMAS.items() if schema.category == "eltwise_backward"
)


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


# -- checking -------------------------------------------------------------------------------


def _fail(kind: str, message: str) -> InvalidGraphError:
    return InvalidGraphError(f"{kind}: {message}")


def _is_integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _as_list(kind: str, spec: AttrSpec, value) -> list:
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise _fail(kind, f"attribute {spec.name!r} must be a {spec.type} list, got {value!r}")
    return list(value.tolist() if isinstance(value, np.ndarray) else value)


def _check_minimum(kind: str, spec: AttrSpec, numbers_) -> None:
    if spec.minimum is None:
        return
    for number in numbers_:
        if not number >= spec.minimum:  # NaN fails too
            raise _fail(kind, f"attribute {spec.name!r} value {number!r} is below the minimum "
                              f"{spec.minimum!r} (given {numbers_ if len(numbers_) > 1 else number!r})")


def _normalise_value(kind: str, spec: AttrSpec, value):
    """``value`` as the Python type of ``spec.type``, or InvalidGraphError naming the problem."""
    if isinstance(value, Mapping) and set(value) == {"type", "value"}:
        if value["type"] != spec.type:
            raise _fail(kind, f"attribute {spec.name!r} is declared {value['type']!r} in the "
                              f"serialized form, the schema says {spec.type!r}")
        value = value["value"]
    if spec.type == "bool":
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        if _is_integer(value) and int(value) in (0, 1):  # JSON writes bools as 0/1
            return bool(value)
        raise _fail(kind, f"attribute {spec.name!r} must be a bool (or 0/1), got {value!r}")
    if spec.type == "s64":
        if not _is_integer(value):
            raise _fail(kind, f"attribute {spec.name!r} must be an s64 integer, got {value!r}")
        number = int(value)
        _check_minimum(kind, spec, [number])
        return number
    if spec.type == "f32":
        if not _is_number(value):
            raise _fail(kind, f"attribute {spec.name!r} must be an f32 number, got {value!r}")
        real = float(np.float32(value))
        _check_minimum(kind, spec, [real])
        return real
    if spec.type == "string":
        if not isinstance(value, str):
            raise _fail(kind, f"attribute {spec.name!r} must be a string, got {value!r}")
        if spec.choices is not None and value not in spec.choices:
            raise _fail(kind, f"attribute {spec.name!r} value {value!r} is not one of "
                              f"{', '.join(repr(c) for c in spec.choices)}")
        return value
    items = _as_list(kind, spec, value)
    numbers_: list[int] | list[float]
    if spec.type == "s64[]":
        if not all(_is_integer(v) for v in items):
            raise _fail(kind, f"attribute {spec.name!r} must be a list of s64 integers, got {value!r}")
        numbers_ = [int(v) for v in items]
    else:  # f32[]
        if not all(_is_number(v) for v in items):
            raise _fail(kind, f"attribute {spec.name!r} must be a list of f32 numbers, got {value!r}")
        numbers_ = [float(np.float32(v)) for v in items]
    _check_minimum(kind, spec, numbers_)
    return numbers_


def _default(spec: AttrSpec):
    return list(spec.default) if isinstance(spec.default, tuple) else spec.default


def schema_of(kind: str) -> OpSchema:
    """The schema of ``kind``, or InvalidGraphError listing the known kinds."""
    try:
        return OP_SCHEMAS[kind]
    except (KeyError, TypeError):
        raise InvalidGraphError(
            f"unknown op kind {kind!r}; known kinds: {', '.join(sorted(OP_SCHEMAS))}"
        ) from None


def normalize_attrs(kind: str, attrs_: Mapping) -> dict:
    """``attrs_`` checked against ``kind``'s schema and normalised (defaults filled, Python
    types), without the arity checks of ``check_op``; shape inference and the references use it
    so they accept attributes as given by a user as well as ``check_op``'s output."""
    schema = schema_of(kind)
    if not isinstance(attrs_, Mapping):
        raise _fail(kind, f"attributes must be a mapping of names to values, got {type(attrs_).__name__}")
    if schema.any_attrs:
        return dict(attrs_)
    for name in attrs_:
        if name not in schema.attrs:
            known = ", ".join(schema.attrs) or "none"
            raise _fail(kind, f"unknown attribute {name!r} (value {attrs_[name]!r}); "
                              f"{kind} takes: {known}")
    out: dict = {}
    for name, spec in schema.attrs.items():
        if name in attrs_:
            out[name] = _normalise_value(kind, spec, attrs_[name])
        elif spec.required:
            raise _fail(kind, f"missing required attribute {name!r} ({spec.type})")
        elif spec.default is not None:
            # Through the same normalisation: an f32 default is a float32 value too.
            out[name] = _normalise_value(kind, spec, _default(spec))
    _check_cross_attrs(kind, out)
    return out


def _check_cross_attrs(kind: str, attrs_: dict) -> None:
    """Checks across attributes that need no shapes (op_def_constraint.cpp and friends)."""
    schema = OP_SCHEMAS[kind]
    if schema.category in ("convolution", "deconvolution", "pooling", "convolution_backward", "pooling_backward"):
        lengths = "kernel" if schema.category in ("pooling", "pooling_backward") else "strides"
        spatial = len(attrs_[lengths])
        if kind in ("MaxPool", "MaxPoolBackward") and "dilations" not in attrs_:
            attrs_["dilations"] = [1] * spatial
        # oneDNN reads empty pads as zeros (shape_infer.cpp); name the zeros here once.
        for pads in ("pads_begin", "pads_end"):
            if attrs_[pads] == []:
                attrs_[pads] = [0] * spatial
        for name in ("strides", "kernel", "dilations", "pads_begin", "pads_end"):
            if name in attrs_ and len(attrs_[name]) != spatial:
                raise _fail(kind, f"attribute {name!r} {attrs_[name]} has {len(attrs_[name])} "
                                  f"entries, {lengths} {attrs_[lengths]} has {spatial}")
        if spatial == 0:
            raise _fail(kind, f"attribute {lengths!r} is empty: no spatial dimension")
    if kind in ("Interpolate", "InterpolateBackward") and bool(attrs_.get("sizes")) == bool(attrs_.get("scales")):
        raise _fail(kind, "exactly one of the attributes 'sizes' and 'scales' must be given "
                          f"(sizes {attrs_.get('sizes')}, scales {attrs_.get('scales')})")
    if kind in ("Quantize", "Dequantize"):
        scales, zps = attrs_["scales"], attrs_["zps"]
        if attrs_["qtype"] == "per_tensor" and len(scales) != 1:
            raise _fail(kind, f"per_tensor takes one scale, attribute 'scales' has {len(scales)}")
        if zps and len(zps) != len(scales):
            raise _fail(kind, f"attribute 'zps' has {len(zps)} entries, 'scales' {len(scales)}")
    if kind == "StaticReshape" and attrs_["shape"].count(-1) > 1:
        raise _fail(kind, f"attribute 'shape' {attrs_['shape']} has more than one -1")
    if kind == "StaticTranspose":
        order = attrs_["order"]
        if order and len(set(order)) != len(order):
            raise _fail(kind, f"attribute 'order' {order} repeats an axis")
    if kind in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                "ReduceL2") and "axes" in attrs_:
        axes = attrs_["axes"]
        if len(set(axes)) != len(axes):
            raise _fail(kind, f"attribute 'axes' {axes} repeats an axis")


def check_op(kind: str, attrs: Mapping, num_inputs: int, num_outputs: int) -> dict:
    """Check an op of ``kind`` with ``attrs`` and the given numbers of inputs and outputs against
    its schema; return the attributes normalised (defaults filled in, Python types).

    Raises InvalidGraphError (naming the kind, the attribute and the value) for an unknown kind,
    an unknown or missing attribute, a value of the wrong type or outside the allowed values,
    and a wrong number of inputs or outputs.
    """
    schema = schema_of(kind)
    for what, count, (low, high) in (("inputs", num_inputs, schema.num_inputs),
                                     ("outputs", num_outputs, schema.num_outputs)):
        if not _is_integer(count) or not low <= count <= high:
            expected = f"{low}" if low == high else (f"at least {low}" if high == UNBOUNDED
                                                     else f"{low} to {high}")
            raise _fail(kind, f"takes {expected} {what}, got {count!r}")
    out = normalize_attrs(kind, attrs)
    if kind == "LayerNorm" and out["keep_stats"] and num_outputs != 3:
        raise _fail(kind, f"keep_stats=True needs 3 outputs (dst, mean, variance), got {num_outputs}")
    # Normalization training (issue 21): oneDNN's pairings of the optional arguments.
    if kind == "BatchNormForwardTraining" and num_inputs == 4:
        raise _fail(kind, "gamma and beta go together: 3 inputs (neither) or 5 (both), got 4")
    if kind in ("BatchNormTrainingBackward", "LayerNormBackward") and num_outputs == 2:
        raise _fail(kind, "diff_gamma and diff_beta go together: 1 output or 3, got 2")
    if kind == "LayerNormBackward" and out["use_affine"] and num_inputs < 5:
        raise _fail(kind, f"use_affine=True needs gamma (input 4): {num_inputs} inputs given")
    if schema.category == "reduction":
        has_attr = "axes" in attrs
        if has_attr == (num_inputs == 2):
            raise _fail(kind, "exactly one of the attribute 'axes' and the second input 'axes' "
                              f"must be given (attribute {'given' if has_attr else 'absent'}, "
                              f"{num_inputs} inputs)")
    return out


def is_known_kind(kind: str) -> bool:
    return kind in OP_SCHEMAS


__all__ = [
    "ATTR_TYPES", "AttrSpec", "OpSchema", "OP_SCHEMAS", "UNARY_ELTWISE_KINDS", "UNBOUNDED",
    "check_op", "eltwise_parameters", "normalize_attrs", "schema_of", "is_known_kind",
]
