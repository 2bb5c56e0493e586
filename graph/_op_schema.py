"""oneDNN Graph op schemas: how an op kind's arity and attributes are declared and checked.

Facts follow oneDNN's ``src/graph/interface/op_def.hpp`` (``DNNL_GRAPH_OP_SCHEMA``, attribute
names, kinds, defaults and allowed values), ``op_def_constraint.cpp`` (cross-attribute checks:
non-negative pads, MaxPool dilations as long as the kernel, LayerNorm's ``keep_stats`` needing
three outputs, Reduce's axes given either as the attribute or as the second input) and the
operation pages under ``doc/graph/operations``. The schemas themselves are declared with their
kinds, by family, in ``triodnn.graph.ops`` (``_op_registry``); this module holds the machinery:
``AttrSpec``/``OpSchema``, the attribute vocabularies and the checks every kind goes through, and
runs a kind's own checks (``GraphOp.check_attrs``, ``check_arguments``) after them.

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
from ._op_registry import graph_op, is_registered, schema_view

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


def attr_map(specs) -> dict[str, AttrSpec]:
    return {spec.name: spec for spec in specs}


@attrs.frozen(slots=True, eq=False)
class OpSchema:
    """What an op kind accepts: arity ``(min, max)`` of inputs and outputs (``UNBOUNDED`` for no
    limit), its attributes, the names oneDNN gives its inputs/outputs, and how it lowers.

    ``category`` groups kinds by lowering: ``eltwise`` (one input, elementwise), ``binary``
    (two inputs, broadcasting), ``select``, ``matmul``, ``convolution``, ``deconvolution``,
    ``pooling``, ``resampling``, ``norm``, ``norm_training`` (batch norm training and the batch
    and layer norm backward ops), ``softmax``, ``reduction``, ``reshape`` (data movement:
    reshape, transpose, concat, reorder, typecast), ``bias``, ``index``, ``prelu``,
    ``dropout`` (Dropout), ``unsupported`` (recognised, not run) and ``special`` (Wildcard,
    End). ``algorithm`` is the name of
    the matching algorithm of ``triodnn.kernels`` (eltwise alg, binary alg, reduction alg,
    pooling alg) where there is one; attribute-dependent eltwise parameters come from
    ``triodnn.graph.ops.eltwise.eltwise_parameters``.
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


def auto_broadcast_attr() -> AttrSpec:
    return AttrSpec("auto_broadcast", "string", default="numpy", choices=AUTO_BROADCASTS)


def data_format_attr() -> AttrSpec:
    return AttrSpec("data_format", "string", default="NXC", choices=DATA_FORMATS)


def accumulation_mode_attr() -> AttrSpec:
    return AttrSpec("accumulation_mode", "string", default="strict", choices=ACCUMULATION_MODES)


# Every registered kind's schema, by name (a live view of ``_op_registry``).

OP_SCHEMAS: Mapping[str, OpSchema] = schema_view()


# -- checking -------------------------------------------------------------------------------


def attr_error(kind: str, message: str) -> InvalidGraphError:
    return InvalidGraphError(f"{kind}: {message}")


def _is_integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _as_list(kind: str, spec: AttrSpec, value) -> list:
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise attr_error(kind, f"attribute {spec.name!r} must be a {spec.type} list, got {value!r}")
    return list(value.tolist() if isinstance(value, np.ndarray) else value)


def _check_minimum(kind: str, spec: AttrSpec, numbers_) -> None:
    if spec.minimum is None:
        return
    for number in numbers_:
        if not number >= spec.minimum:  # NaN fails too
            raise attr_error(kind, f"attribute {spec.name!r} value {number!r} is below the minimum "
                                   f"{spec.minimum!r} (given {numbers_ if len(numbers_) > 1 else number!r})")


def _normalise_value(kind: str, spec: AttrSpec, value):
    """``value`` as the Python type of ``spec.type``, or InvalidGraphError naming the problem."""
    if isinstance(value, Mapping) and set(value) == {"type", "value"}:
        if value["type"] != spec.type:
            raise attr_error(kind, f"attribute {spec.name!r} is declared {value['type']!r} in the "
                                   f"serialized form, the schema says {spec.type!r}")
        value = value["value"]
    if spec.type == "bool":
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        if _is_integer(value) and int(value) in (0, 1):  # JSON writes bools as 0/1
            return bool(value)
        raise attr_error(kind, f"attribute {spec.name!r} must be a bool (or 0/1), got {value!r}")
    if spec.type == "s64":
        if not _is_integer(value):
            raise attr_error(kind, f"attribute {spec.name!r} must be an s64 integer, got {value!r}")
        number = int(value)
        _check_minimum(kind, spec, [number])
        return number
    if spec.type == "f32":
        if not _is_number(value):
            raise attr_error(kind, f"attribute {spec.name!r} must be an f32 number, got {value!r}")
        real = float(np.float32(value))
        _check_minimum(kind, spec, [real])
        return real
    if spec.type == "string":
        if not isinstance(value, str):
            raise attr_error(kind, f"attribute {spec.name!r} must be a string, got {value!r}")
        if spec.choices is not None and value not in spec.choices:
            raise attr_error(kind, f"attribute {spec.name!r} value {value!r} is not one of "
                                   f"{', '.join(repr(c) for c in spec.choices)}")
        return value
    items = _as_list(kind, spec, value)
    numbers_: list[int] | list[float]
    if spec.type == "s64[]":
        if not all(_is_integer(v) for v in items):
            raise attr_error(kind, f"attribute {spec.name!r} must be a list of s64 integers, got {value!r}")
        numbers_ = [int(v) for v in items]
    else:  # f32[]
        if not all(_is_number(v) for v in items):
            raise attr_error(kind, f"attribute {spec.name!r} must be a list of f32 numbers, got {value!r}")
        numbers_ = [float(np.float32(v)) for v in items]
    _check_minimum(kind, spec, numbers_)
    return numbers_


def _default(spec: AttrSpec):
    return list(spec.default) if isinstance(spec.default, tuple) else spec.default


def schema_of(kind: str) -> OpSchema:
    """The schema of ``kind``, or InvalidGraphError listing the known kinds."""
    return graph_op(kind).schema


def normalize_attrs(kind: str, attrs_: Mapping) -> dict:
    """``attrs_`` checked against ``kind``'s schema and normalised (defaults filled, Python
    types), without the arity checks of ``check_op``; shape inference and the references use it
    so they accept attributes as given by a user as well as ``check_op``'s output."""
    op = graph_op(kind)
    schema = op.schema
    if not isinstance(attrs_, Mapping):
        raise attr_error(kind, f"attributes must be a mapping of names to values, got {type(attrs_).__name__}")
    if schema.any_attrs:
        return dict(attrs_)
    for name in attrs_:
        if name not in schema.attrs:
            known = ", ".join(schema.attrs) or "none"
            raise attr_error(kind, f"unknown attribute {name!r} (value {attrs_[name]!r}); "
                                   f"{kind} takes: {known}")
    out: dict = {}
    for name, spec in schema.attrs.items():
        if name in attrs_:
            out[name] = _normalise_value(kind, spec, attrs_[name])
        elif spec.required:
            raise attr_error(kind, f"missing required attribute {name!r} ({spec.type})")
        elif spec.default is not None:
            # Through the same normalisation: an f32 default is a float32 value too.
            out[name] = _normalise_value(kind, spec, _default(spec))
    if op.check_attrs is not None:
        op.check_attrs(kind, out)
    return out


def check_spatial_attrs(kind: str, attrs_: dict, lengths: str) -> None:
    """The spatial attributes of a convolution or pooling op (op_def_constraint.cpp): as many
    entries as ``lengths`` (``strides`` or ``kernel``) has, at least one. oneDNN reads empty
    pads as zeros (shape_infer.cpp); the zeros are named here once."""
    spatial = len(attrs_[lengths])
    for pads in ("pads_begin", "pads_end"):
        if attrs_[pads] == []:
            attrs_[pads] = [0] * spatial
    for name in ("strides", "kernel", "dilations", "pads_begin", "pads_end"):
        if name in attrs_ and len(attrs_[name]) != spatial:
            raise attr_error(kind, f"attribute {name!r} {attrs_[name]} has {len(attrs_[name])} "
                                        f"entries, {lengths} {attrs_[lengths]} has {spatial}")
    if spatial == 0:
        raise attr_error(kind, f"attribute {lengths!r} is empty: no spatial dimension")


def check_op(kind: str, attrs: Mapping, num_inputs: int, num_outputs: int) -> dict:
    """Check an op of ``kind`` with ``attrs`` and the given numbers of inputs and outputs against
    its schema; return the attributes normalised (defaults filled in, Python types).

    Raises InvalidGraphError (naming the kind, the attribute and the value) for an unknown kind,
    an unknown or missing attribute, a value of the wrong type or outside the allowed values,
    and a wrong number of inputs or outputs.
    """
    schema = graph_op(kind).schema
    for what, count, (low, high) in (("inputs", num_inputs, schema.num_inputs),
                                     ("outputs", num_outputs, schema.num_outputs)):
        if not _is_integer(count) or not low <= count <= high:
            expected = f"{low}" if low == high else (f"at least {low}" if high == UNBOUNDED
                                                     else f"{low} to {high}")
            raise attr_error(kind, f"takes {expected} {what}, got {count!r}")
    out = normalize_attrs(kind, attrs)
    check_arguments = graph_op(kind).check_arguments
    if check_arguments is not None:
        check_arguments(kind, out, num_inputs, num_outputs)
    return out


def is_known_kind(kind: str) -> bool:
    return is_registered(kind)


__all__ = [
    "ATTR_TYPES", "AttrSpec", "OpSchema", "OP_SCHEMAS", "UNBOUNDED",
    "check_op", "check_spatial_attrs", "normalize_attrs", "schema_of", "is_known_kind",
]
