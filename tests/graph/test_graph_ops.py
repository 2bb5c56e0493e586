"""oneDNN Graph op semantics: schemas, shape inference, numpy references, filling, tolerances.

Everything here is pure numpy (no device). The last section walks the serialized graphs of
oneDNN's benchdnn inputs under ../shared/graphs/public (see tests/_shared.py where absent).
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from _shared import GRAPHS, require

from triodnn import InvalidArgumentError, InvalidGraphError, ShapeInferenceError, UnsupportedError
from triodnn.graph._op_schema import (
    OP_SCHEMAS,
    UNBOUNDED,
    AttrSpec,
    check_op,
    normalize_attrs,
)
from triodnn.graph._shape_inference import (
    auto_pads,
    infer_output_shapes,
    spatial_geometry,
)
from triodnn.graph.ops.eltwise import eltwise_parameters
from triodnn.testing import ROLES, fill_input, narrowest_dtype, reference, to_dtype_values, tolerance

PUBLIC_GRAPHS = GRAPHS / "public"
INT64_MIN = -(2**63)

CONV_NCX = {"strides": [1, 1], "pads_begin": [0, 0], "pads_end": [0, 0], "dilations": [1, 1],
            "data_format": "NCX", "weights_format": "OIX"}
POOL_NCX = {"strides": [2, 2], "kernel": [3, 3], "pads_begin": [1, 1], "pads_end": [1, 1],
            "data_format": "NCX"}


@pytest.fixture
def rng():
    return np.random.default_rng(20240611)


def ints(rng, shape, low=-4, high=4):
    return rng.integers(low, high + 1, size=shape).astype(np.float32)


# == schemas ==================================================================================

BRIEF_KINDS = """MatMul Convolution BiasAdd Add Subtract Multiply Divide Maximum Minimum ReLU GELU
Sigmoid Tanh Exp Log Sqrt Square Abs Clamp Elu LeakyReLU HardSwish HardSigmoid Mish SoftPlus Pow
Round Reciprocal SoftMax LogSoftmax LayerNorm RMSNorm BatchNormInference MaxPool AvgPool Reorder
StaticReshape StaticTranspose Concat Select GreaterEqual GenIndex ReduceSum ReduceMean ReduceMax
ReduceMin ReduceProd ReduceL1 ReduceL2 TypeCast Wildcard End""".split()


def test_every_listed_kind_has_a_schema():
    missing = [kind for kind in BRIEF_KINDS if kind not in OP_SCHEMAS]
    assert not missing
    for kind, schema in OP_SCHEMAS.items():
        assert schema.kind == kind
        assert 0 <= schema.num_inputs[0] <= schema.num_inputs[1]
        assert 0 <= schema.num_outputs[0] <= schema.num_outputs[1]
        for name, spec in schema.attrs.items():
            assert isinstance(spec, AttrSpec) and spec.name == name
            assert not (spec.required and spec.default is not None)


def test_schema_flags_and_arity():
    assert OP_SCHEMAS["ReLU"].unary_elementwise and not OP_SCHEMAS["ReLU"].binary
    assert OP_SCHEMAS["Add"].binary and not OP_SCHEMAS["Add"].unary_elementwise
    assert OP_SCHEMAS["MatMul"].num_inputs == (2, 3)
    assert OP_SCHEMAS["Concat"].num_inputs == (1, 64)
    assert OP_SCHEMAS["LayerNorm"].num_outputs == (1, 3)
    assert OP_SCHEMAS["BatchNormInference"].num_inputs == (5, 5)
    assert OP_SCHEMAS["End"].num_outputs == (0, 0)
    assert OP_SCHEMAS["Wildcard"].num_inputs == (0, UNBOUNDED)
    assert OP_SCHEMAS["ReduceSum"].algorithm == "sum"
    assert OP_SCHEMAS["ReduceProd"].algorithm == "mul"


def test_check_op_fills_defaults():
    assert check_op("MatMul", {}, 2, 1) == {"transpose_a": False, "transpose_b": False,
                                            "accumulation_mode": "strict"}
    conv = check_op("Convolution", {"strides": [1, 1], "pads_begin": [0, 0], "pads_end": [1, 1],
                                    "dilations": [1, 1]}, 2, 1)
    assert conv["groups"] == 1 and conv["data_format"] == "NXC" and conv["weights_format"] == "XIO"
    assert conv["auto_pad"] == "None"
    assert check_op("SoftMax", {}, 1, 1) == {"axis": 1, "mode": "none"}
    assert check_op("LogSoftmax", {}, 1, 1) == {"axis": -1}
    assert check_op("GELU", {}, 1, 1) == {"mode": "gelu_erf"}
    assert check_op("SoftPlus", {}, 1, 1) == {"beta": 1.0}
    ln = check_op("LayerNorm", {}, 3, 3)
    assert ln == {"keep_stats": True, "begin_norm_axis": -1, "use_affine": True,
                  "epsilon": float(np.float32(1e-5))}
    assert check_op("ReduceSum", {"axes": [1]}, 1, 1) == {"axes": [1], "keep_dims": False}
    assert check_op("Add", {}, 2, 1) == {"auto_broadcast": "numpy"}
    pool = check_op("MaxPool", {**POOL_NCX}, 1, 1)
    assert pool["dilations"] == [1, 1] and pool["rounding_type"] == "floor"
    assert check_op("End", {}, 1, 0) == {}
    assert check_op("Wildcard", {"anything": 3}, 4, 0) == {"anything": 3}


def test_check_op_normalises_types():
    # JSON writes bools as 0/1 and f32 values as JSON integers; numpy scalars pass too.
    assert check_op("MatMul", {"transpose_a": 1, "transpose_b": np.int64(0)}, 2, 1)["transpose_a"] is True
    clamp = check_op("Clamp", {"min": 0, "max": np.float64(6.5)}, 1, 1)
    assert clamp == {"min": 0.0, "max": 6.5} and isinstance(clamp["min"], float)
    assert check_op("Elu", {"alpha": 0.1}, 1, 1)["alpha"] == float(np.float32(0.1))
    reshape = check_op("StaticReshape", {"shape": (2, -1), "special_zero": False}, 1, 1)
    assert reshape["shape"] == [2, -1] and type(reshape["shape"]) is list
    # The serialized form {"type", "value"} is taken as it is written.
    json_form = {"strides": {"type": "s64[]", "value": [2, 2]},
                 "pads_begin": {"type": "s64[]", "value": [1, 1]},
                 "pads_end": {"type": "s64[]", "value": [1, 1]},
                 "dilations": {"type": "s64[]", "value": [1, 1]},
                 "groups": {"type": "s64", "value": 64},
                 "data_format": {"type": "string", "value": "NCX"},
                 "weights_format": {"type": "string", "value": "OIX"},
                 "auto_pad": {"type": "string", "value": "None"}}
    conv = check_op("Convolution", json_form, 3, 1)
    assert conv["strides"] == [2, 2] and conv["groups"] == 64 and conv["data_format"] == "NCX"
    # Empty pads read as zeros, as oneDNN's shape inference does.
    assert check_op("Convolution", {**CONV_NCX, "pads_begin": [], "pads_end": []}, 2, 1)["pads_end"] == [0, 0]


@pytest.mark.parametrize(
    ("kind", "attrs", "n_in", "n_out", "words"),
    [
        ("Conv2D", {}, 2, 1, ["unknown op kind", "'Conv2D'"]),
        ("MatMul", {"transpose_c": True}, 2, 1, ["MatMul", "unknown attribute", "'transpose_c'", "True"]),
        ("Convolution", {**CONV_NCX, "data_format": "NCHW"}, 2, 1,
         ["Convolution", "'data_format'", "'NCHW'", "'NCX'"]),
        ("Convolution", {"strides": [1, 1], "pads_begin": [0, 0], "pads_end": [0, 0]}, 2, 1,
         ["Convolution", "missing required attribute", "'dilations'"]),
        ("MatMul", {"transpose_a": 2}, 2, 1, ["MatMul", "'transpose_a'", "bool", "2"]),
        ("MatMul", {"transpose_a": "yes"}, 2, 1, ["MatMul", "'transpose_a'", "'yes'"]),
        ("Concat", {"axis": 1.0}, 2, 1, ["Concat", "'axis'", "s64", "1.0"]),
        ("Concat", {"axis": True}, 2, 1, ["Concat", "'axis'", "True"]),
        ("Clamp", {"min": True, "max": 1.0}, 1, 1, ["Clamp", "'min'", "f32"]),
        ("Clamp", {"min": "0", "max": 1.0}, 1, 1, ["Clamp", "'min'", "'0'"]),
        ("StaticTranspose", {"order": [0, 1.5]}, 1, 1, ["StaticTranspose", "'order'", "1.5"]),
        ("StaticTranspose", {"order": 3}, 1, 1, ["StaticTranspose", "'order'", "3"]),
        ("StaticTranspose", {"order": [0, 0]}, 1, 1, ["StaticTranspose", "'order'", "repeats"]),
        ("StaticReshape", {"shape": [-1, -1], "special_zero": False}, 1, 1, ["more than one -1"]),
        ("SoftMax", {"mode": "inf_as_nan"}, 1, 1, ["SoftMax", "'mode'", "'inf_as_nan'"]),
        ("GELU", {"mode": "erf"}, 1, 1, ["GELU", "'mode'", "'erf'"]),
        ("Add", {"auto_broadcast": "bidirectional"}, 2, 1, ["Add", "'auto_broadcast'"]),
        ("MaxPool", {**POOL_NCX, "auto_pad": "same_upper"}, 1, 1, ["MaxPool", "'auto_pad'", "'same_upper'"]),
        ("MaxPool", {**POOL_NCX, "pads_begin": [-1, 0]}, 1, 1, ["MaxPool", "'pads_begin'", "-1", "minimum"]),
        ("MaxPool", {**POOL_NCX, "kernel": [3, 3, 3]}, 1, 1, ["MaxPool", "'strides'", "kernel [3, 3, 3]"]),
        ("MaxPool", {**POOL_NCX, "dilations": [1]}, 1, 1, ["MaxPool", "'dilations'"]),
        ("AvgPool", {**POOL_NCX}, 1, 1, ["AvgPool", "missing required attribute", "'exclude_pad'"]),
        ("Convolution", {**CONV_NCX, "groups": 0}, 2, 1, ["Convolution", "'groups'", "0"]),
        ("Convolution", {**CONV_NCX, "strides": [0, 1]}, 2, 1, ["Convolution", "'strides'"]),
        ("Convolution", {**CONV_NCX, "weights_format": "XOI"}, 2, 1, ["Convolution", "'XOI'"]),
        ("MatMul", {"accumulation_mode": "fast"}, 2, 1, ["MatMul", "'accumulation_mode'", "'fast'"]),
        ("MatMul", {}, 1, 1, ["MatMul", "takes 2 to 3 inputs, got 1"]),
        ("MatMul", {}, 4, 1, ["MatMul", "inputs, got 4"]),
        ("ReLU", {}, 1, 2, ["ReLU", "takes 1 outputs, got 2"]),
        ("End", {}, 1, 1, ["End", "outputs, got 1"]),
        ("Concat", {"axis": 0}, 65, 1, ["Concat", "1 to 64 inputs"]),
        ("LayerNorm", {"keep_stats": True}, 1, 1, ["LayerNorm", "keep_stats", "3 outputs"]),
        ("ReduceSum", {}, 1, 1, ["ReduceSum", "'axes'"]),
        ("ReduceSum", {"axes": [0]}, 2, 1, ["ReduceSum", "'axes'"]),
        ("ReduceMean", {"axes": [1, 1]}, 1, 1, ["ReduceMean", "'axes'", "repeats"]),
        ("Add", {"auto_broadcast": {"type": "s64", "value": 1}}, 2, 1, ["Add", "'auto_broadcast'", "'s64'"]),
        ("Add", "numpy", 2, 1, ["Add", "mapping"]),
        ("BatchNormInference", {"epsilon": -1.0}, 5, 1, ["BatchNormInference", "'epsilon'", "-1.0"]),
    ],
)
def test_check_op_errors_name_kind_attribute_and_value(kind, attrs, n_in, n_out, words):
    with pytest.raises(InvalidGraphError) as info:
        check_op(kind, attrs, n_in, n_out)
    for word in words:
        assert word in str(info.value)
    assert isinstance(info.value, InvalidArgumentError) and isinstance(info.value, ValueError)


def test_check_op_accepts_both_reduce_axes_forms():
    assert "axes" not in check_op("ReduceMax", {"keep_dims": True}, 2, 1)
    assert check_op("ReduceMax", {"axes": [-1]}, 1, 1)["axes"] == [-1]


def test_normalize_attrs_does_not_mutate_input():
    attrs = {"strides": [1, 1], "pads_begin": [], "pads_end": [], "dilations": [1, 1]}
    normalize_attrs("Convolution", attrs)
    assert attrs["pads_begin"] == []
    first = normalize_attrs("Convolution", attrs)
    first["pads_begin"].append(9)
    assert normalize_attrs("Convolution", attrs)["pads_begin"] == [0, 0]


# == shape inference ==========================================================================

SHAPE_CASES = [
    ("ReLU", {}, [(2, 3)], [(2, 3)]),
    ("GELU", {"mode": "gelu_tanh"}, [(4,)], [(4,)]),
    ("Clamp", {"min": 0, "max": 6}, [(1, 2, 3)], [(1, 2, 3)]),
    ("Reorder", {}, [(2, 5)], [(2, 5)]),
    ("TypeCast", {}, [(7,)], [(7,)]),
    ("Add", {}, [(2, 1, 4), (3, 1)], [(2, 3, 4)]),
    ("Multiply", {}, [(1, 16, 384, 384), (1,)], [(1, 16, 384, 384)]),
    ("Divide", {}, [(), (5,)], [(5,)]),
    ("Subtract", {"auto_broadcast": "none"}, [(2, 3), (2, 3)], [(2, 3)]),
    ("GreaterEqual", {}, [(1, 1, 4, 1), (1, 1, 1, 5)], [(1, 1, 4, 5)]),
    ("Maximum", {}, [(-1, 3), (2, 1)], [(2, 3)]),
    ("Minimum", {}, [(-1, 3), (1, 3)], [(-1, 3)]),
    ("Select", {}, [(1, 1, 4, 4), (2, 3, 4, 4), (1,)], [(2, 3, 4, 4)]),
    ("Select", {"auto_broadcast": "none"}, [(2, 2), (2, 2), (2, 2)], [(2, 2)]),
    ("MatMul", {}, [(3, 4), (4, 5)], [(3, 5)]),
    ("MatMul", {"transpose_a": True, "transpose_b": True}, [(4, 3), (5, 4)], [(3, 5)]),
    ("MatMul", {}, [(2, 1, 3, 4), (6, 4, 5)], [(2, 6, 3, 5)]),
    ("MatMul", {}, [(4,), (2, 4, 5)], [(2, 5)]),
    ("MatMul", {}, [(2, 3, 4), (4,)], [(2, 3)]),
    ("MatMul", {}, [(4,), (4,)], [()]),
    ("MatMul", {"transpose_a": True}, [(4,), (4, 5)], [(5,)]),  # no transpose below rank 2
    ("MatMul", {}, [(3, 4), (4, 5), (5,)], [(3, 5)]),
    ("MatMul", {}, [(2, 3, 4), (4, 5), (1, 3, 1)], [(2, 3, 5)]),
    ("BiasAdd", {"data_format": "NCX"}, [(2, 8, 5, 5), (8,)], [(2, 8, 5, 5)]),
    ("BiasAdd", {}, [(2, 5, 5, 8), (8,)], [(2, 5, 5, 8)]),
    ("Convolution", CONV_NCX, [(50, 64, 56, 56), (64, 64, 1, 1)], [(50, 64, 56, 56)]),
    ("Convolution", {**CONV_NCX, "strides": [2, 2], "pads_begin": [1, 1], "pads_end": [1, 1]},
     [(1, 3, 224, 224), (64, 3, 3, 3), (64,)], [(1, 64, 112, 112)]),
    ("Convolution", {**CONV_NCX, "groups": 64, "pads_begin": [1, 1], "pads_end": [1, 1]},
     [(1, 64, 10, 10), (64, 1, 3, 3)], [(1, 64, 10, 10)]),
    ("Convolution", {**CONV_NCX, "dilations": [2, 3]}, [(1, 4, 10, 10), (8, 4, 3, 3)], [(1, 8, 6, 4)]),
    ("Convolution", {"strides": [2, 2], "pads_begin": [0, 0], "pads_end": [0, 0],
                     "dilations": [1, 1]},  # NXC data, XIO weights by default
     [(1, 9, 9, 4), (3, 3, 4, 8)], [(1, 4, 4, 8)]),
    ("Convolution", {**CONV_NCX, "strides": [2, 2], "auto_pad": "SAME_UPPER"},
     [(1, 4, 9, 10), (8, 4, 3, 3)], [(1, 8, 5, 5)]),
    ("Convolution", {**CONV_NCX, "auto_pad": "VALID", "pads_begin": [5, 5], "pads_end": [5, 5]},
     [(1, 4, 9, 10), (8, 4, 3, 3)], [(1, 8, 7, 8)]),
    ("Convolution", {"strides": [1], "pads_begin": [1], "pads_end": [1], "dilations": [1],
                     "data_format": "NCX", "weights_format": "OIX"},
     [(2, 3, 7), (5, 3, 3)], [(2, 5, 7)]),
    ("Convolution", {**CONV_NCX, "strides": [1, 1, 1], "pads_begin": [0] * 3, "pads_end": [0] * 3,
                     "dilations": [1] * 3}, [(1, 2, 4, 5, 6), (3, 2, 2, 2, 2)], [(1, 3, 3, 4, 5)]),
    ("Convolution", CONV_NCX, [(-1, 4, -1, 6), (8, 4, 3, 3)], [(-1, 8, -1, 4)]),
    ("MaxPool", POOL_NCX, [(1, 3, 112, 112)], [(1, 3, 56, 56)]),
    ("MaxPool", {**POOL_NCX, "data_format": "NXC"}, [(1, 112, 112, 3)], [(1, 56, 56, 3)]),
    ("MaxPool", {**POOL_NCX, "pads_begin": [0, 0], "pads_end": [0, 0]}, [(1, 3, 8, 8)], [(1, 3, 3, 3)]),
    ("MaxPool", {**POOL_NCX, "pads_begin": [0, 0], "pads_end": [0, 0], "rounding_type": "ceil"},
     [(1, 3, 8, 8)], [(1, 3, 4, 4)]),
    ("MaxPool", {**POOL_NCX, "dilations": [2, 2]}, [(1, 3, 9, 9)], [(1, 3, 4, 4)]),
    ("AvgPool", {**POOL_NCX, "exclude_pad": True, "auto_pad": "SAME_LOWER"}, [(1, 3, 7, 8)], [(1, 3, 4, 4)]),
    ("SoftMax", {"axis": -1}, [(2, 3, 5)], [(2, 3, 5)]),
    ("LogSoftmax", {"axis": 0}, [(2, 3)], [(2, 3)]),
    ("LayerNorm", {"keep_stats": False}, [(2, 3, 8), (8,), (8,)], [(2, 3, 8)]),
    ("LayerNorm", {}, [(2, 3, 8)], [(2, 3, 8), (2, 3), (2, 3)]),
    ("LayerNorm", {"begin_norm_axis": 1}, [(2, 3, 8), (3, 8), (24,)], [(2, 3, 8), (2,), (2,)]),
    ("RMSNorm", {}, [(2, 3, 8), (8,)], [(2, 3, 8)]),
    ("BatchNormInference", {"epsilon": 1e-5, "data_format": "NCX"},
     [(2, 4, 3, 3), (4,), (4,), (4,), (4,)], [(2, 4, 3, 3)]),
    ("StaticReshape", {"shape": [32, 16, 384, 64], "special_zero": False}, [(32, 2, 8, 384, 64)],
     [(32, 16, 384, 64)]),
    ("StaticReshape", {"shape": [0, -1], "special_zero": True}, [(4, 3, 2)], [(4, 6)]),
    ("StaticReshape", {"shape": [0, 4, 0], "special_zero": False}, [(0, 5)], [(0, 4, 0)]),
    ("StaticReshape", {"shape": [-1], "special_zero": False}, [(4, 3, 2)], [(24,)]),
    ("StaticTranspose", {"order": [0, 2, 1, 3]}, [(1, 2, 3, 4)], [(1, 3, 2, 4)]),
    ("StaticTranspose", {"order": [-1, 0, -2]}, [(2, 3, 4)], [(4, 2, 3)]),
    ("StaticTranspose", {"order": []}, [(2, 3, 4)], [(4, 3, 2)]),
    ("Concat", {"axis": 1}, [(2, 3), (2, 5), (2, 1)], [(2, 9)]),
    ("Concat", {"axis": -1}, [(2, 3)], [(2, 3)]),
    ("GenIndex", {"axis": 2}, [(1, 16, 384, 384)], [(1, 16, 384, 384)]),
    ("ReduceSum", {"axes": [3], "keep_dims": True}, [(1, 16, 384, 384)], [(1, 16, 384, 1)]),
    ("ReduceMean", {"axes": [0, -1]}, [(2, 3, 4)], [(3,)]),
    ("ReduceL2", {"axes": [1]}, [(2, 3)], [(2,)]),
    ("End", {}, [(2, 3)], []),
]


@pytest.mark.parametrize(("kind", "attrs", "inputs", "expected"), SHAPE_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(SHAPE_CASES)])
def test_infer_output_shapes(kind, attrs, inputs, expected):
    assert infer_output_shapes(kind, attrs, inputs) == expected


def test_infer_output_shapes_with_optional_outputs():
    assert infer_output_shapes("SoftMax", {"axis": 2}, [(2, 3, 5)], num_outputs=2) == [(2, 3, 5), (2, 3, 1)]
    assert infer_output_shapes("LayerNorm", {"keep_stats": False}, [(2, 8)], num_outputs=3) == [
        (2, 8), (2,), (2,)]
    assert infer_output_shapes("RMSNorm", {"begin_norm_axis": -2}, [(2, 3, 8)], num_outputs=2) == [
        (2, 3, 8), (2,)]


@pytest.mark.parametrize(
    ("kind", "attrs", "inputs", "words"),
    [
        ("Add", {}, [(2, 3), (4, 3)], ["Add", "[2, 3]", "[4, 3]", "broadcast"]),
        ("Add", {"auto_broadcast": "none"}, [(2, 3), (1, 3)], ["Add", "none", "[2, 3]", "[1, 3]"]),
        ("Select", {}, [(2, 2, 4), (2, 4), (1,)], ["Select", "cond", "[2, 2, 4]"]),
        ("MatMul", {}, [(3, 4), (5, 6)], ["MatMul", "[3, 4]", "[5, 6]", "4 vs 5"]),
        ("MatMul", {"transpose_b": True}, [(3, 4), (4, 5)], ["MatMul", "transpose_b=True"]),
        ("MatMul", {}, [(2, 3, 4), (3, 4, 5)], ["MatMul", "broadcast"]),
        ("MatMul", {}, [(3, 4), (4, 5), (4,)], ["MatMul", "bias", "[4]", "[3, 5]"]),
        ("MatMul", {}, [(), (4,)], ["MatMul", "rank"]),
        ("BiasAdd", {"data_format": "NCX"}, [(2, 8, 5), (5,)], ["BiasAdd", "[5]", "8 channels"]),
        ("BiasAdd", {}, [(2, 8), (2, 8)], ["BiasAdd", "1-D"]),
        ("Convolution", CONV_NCX, [(1, 6, 5, 5), (8, 4, 3, 3)], ["Convolution", "6", "groups 1", "4"]),
        ("Convolution", {**CONV_NCX, "groups": 2}, [(1, 6, 5, 5), (5, 3, 3, 3)], ["divisible by groups 2"]),
        ("Convolution", CONV_NCX, [(1, 4, 2, 2), (8, 4, 3, 3)], ["Convolution", "no output"]),
        ("Convolution", CONV_NCX, [(1, 4, 5), (8, 4, 3)], ["Convolution", "strides", "[1, 1]"]),
        ("Convolution", CONV_NCX, [(1, 4, 5, 5), (8, 4, 3)], ["Convolution", "rank"]),
        ("Convolution", CONV_NCX, [(1, 4, 5, 5), (8, 4, 3, 3), (4,)], ["Convolution", "bias", "8"]),
        ("MaxPool", POOL_NCX, [(1, 3)], ["MaxPool", "spatial"]),
        ("SoftMax", {"axis": 3}, [(2, 3, 5)], ["SoftMax", "axis 3", "rank 3"]),
        ("LayerNorm", {"begin_norm_axis": -1, "keep_stats": False}, [(2, 8), (4,), (8,)],
         ["LayerNorm", "gamma", "[4]", "[8]"]),
        ("LayerNorm", {"begin_norm_axis": 2}, [(2, 8)], ["LayerNorm", "begin_norm_axis 2"]),
        ("RMSNorm", {}, [(2, 8), (3,)], ["RMSNorm", "gamma", "[3]"]),
        ("BatchNormInference", {"epsilon": 0.0}, [(2, 3, 3, 4), (4,), (4,), (3,), (4,)],
         ["BatchNormInference", "mean", "[3]"]),
        ("StaticReshape", {"shape": [5, -1], "special_zero": False}, [(4, 3)], ["StaticReshape", "[5, -1]", "12"]),
        ("StaticReshape", {"shape": [5, 3], "special_zero": False}, [(4, 3)], ["StaticReshape", "15", "12"]),
        ("StaticReshape", {"shape": [0, 0, 0], "special_zero": True}, [(4, 3)], ["special_zero", "only 2 dims"]),
        ("StaticTranspose", {"order": [0, 1]}, [(2, 3, 4)], ["StaticTranspose", "order", "rank-3"]),
        ("StaticTranspose", {"order": [0, -3]}, [(2, 3)], ["StaticTranspose", "-3"]),
        ("StaticTranspose", {"order": [0, -2]}, [(2, 3)], ["StaticTranspose", "permutation"]),
        ("Concat", {"axis": 0}, [(2, 3), (2, 4)], ["Concat", "input 1", "[2, 4]", "dim 1"]),
        ("Concat", {"axis": 0}, [(2, 3), (2, 3, 1)], ["Concat", "rank"]),
        ("Concat", {"axis": 2}, [(2, 3), (2, 3)], ["Concat", "axis 2"]),
        ("GenIndex", {"axis": -3}, [(2, 3)], ["GenIndex", "axis -3"]),
        ("ReduceSum", {"axes": [2]}, [(2, 3)], ["ReduceSum", "axes entry 2"]),
        ("ReduceSum", {"axes": [1, -1]}, [(2, 3)], ["ReduceSum", "twice"]),
        ("ReduceSum", {"axes": []}, [(2, 3)], ["ReduceSum", "empty"]),
        ("ReduceSum", {}, [(2, 3), (1,)], ["ReduceSum", "second input"]),
        ("Wildcard", {}, [(2, 3)], ["Wildcard"]),
        ("ReLU", {}, [(2, -3)], ["ReLU", "negative"]),
        ("ReLU", {}, [None], ["ReLU", "unknown rank"]),
        ("ReLU", {}, [(2,), (2,)], ["ReLU", "inputs, got 2"]),
    ],
)
def test_infer_output_shapes_errors(kind, attrs, inputs, words):
    with pytest.raises(ShapeInferenceError) as info:
        infer_output_shapes(kind, attrs, inputs)
    for word in words:
        assert word in str(info.value)
    assert isinstance(info.value, InvalidGraphError)


@pytest.mark.parametrize(
    ("size", "stride", "kernel", "dilation", "mode", "expected"),
    [
        (9, 2, 3, 1, "SAME_UPPER", (1, 1)),
        (10, 2, 3, 1, "SAME_UPPER", (0, 1)),
        (10, 2, 3, 1, "SAME_LOWER", (1, 0)),
        (10, 1, 4, 1, "SAME_UPPER", (1, 2)),
        (10, 1, 4, 1, "SAME_LOWER", (2, 1)),
        (10, 1, 3, 2, "SAME_UPPER", (2, 2)),
        (10, 4, 2, 1, "SAME_UPPER", (0, 0)),  # negative totals clamp to 0
        (10, 1, 3, 1, "VALID", (0, 0)),
        (10, 1, 3, 1, "None", (5, 7)),
    ],
)
def test_auto_pads(size, stride, kernel, dilation, mode, expected):
    pads = auto_pads(size, stride, kernel, dilation, mode, 5, 7)
    assert pads == expected
    if mode.startswith("SAME"):  # SAME keeps out = ceil(in / stride)
        out = (size + sum(pads) - ((kernel - 1) * dilation + 1)) // stride + 1
        assert out == -(-size // stride)


def test_spatial_geometry_ceil_pads():
    geometry = spatial_geometry("AvgPool", {**POOL_NCX, "pads_begin": [0, 0], "pads_end": [0, 0],
                                            "rounding_type": "ceil", "exclude_pad": False},
                                (1, 1, 8, 8))
    assert geometry.out_spatial == (4, 4)
    assert geometry.pads_end == (0, 0) and geometry.pads_end_ceil == (1, 1)


# == references ===============================================================================


def naive_convolution(src, wei, bias, strides, pads_begin, dilations, groups, out_spatial):
    """Loops over every output element: (N, C, H, W) src, (O, I/g, KH, KW) weights."""
    n, c, h, w = src.shape
    o, icg, kh, kw = wei.shape
    ocg = o // groups
    dst = np.zeros((n, o) + tuple(out_spatial))
    for b, oc, oy, ox in itertools.product(range(n), range(o), range(out_spatial[0]), range(out_spatial[1])):
        g = oc // ocg
        acc = 0.0 if bias is None else float(bias[oc])
        for ic, ky, kx in itertools.product(range(icg), range(kh), range(kw)):
            iy = oy * strides[0] + ky * dilations[0] - pads_begin[0]
            ix = ox * strides[1] + kx * dilations[1] - pads_begin[1]
            if 0 <= iy < h and 0 <= ix < w:
                acc += float(src[b, g * icg + ic, iy, ix]) * float(wei[oc, ic, ky, kx])
        dst[b, oc, oy, ox] = acc
    return dst


CONV_GEOMETRIES = {
    "plain": dict(c=3, o=4, k=(3, 3), strides=[1, 1], pads=([1, 1], [1, 1]), dil=[1, 1], groups=1),
    "strided_asym_pads": dict(c=2, o=3, k=(3, 2), strides=[2, 3], pads=([0, 1], [2, 0]), dil=[1, 1], groups=1),
    "dilated": dict(c=2, o=2, k=(2, 3), strides=[1, 1], pads=([1, 2], [0, 1]), dil=[2, 2], groups=1),
    "grouped": dict(c=6, o=4, k=(3, 3), strides=[1, 2], pads=([1, 1], [1, 1]), dil=[1, 1], groups=2),
    "depthwise": dict(c=4, o=4, k=(3, 3), strides=[2, 2], pads=([1, 1], [1, 1]), dil=[1, 1], groups=4),
    "depthwise_multiplier": dict(c=3, o=6, k=(2, 2), strides=[1, 1], pads=([0, 0], [1, 1]), dil=[2, 1], groups=3),
}


@pytest.mark.parametrize("name", list(CONV_GEOMETRIES))
@pytest.mark.parametrize("formats", [("NCX", "OIX"), ("NXC", "XIO"), ("NXC", "OIX"), ("NCX", "XIO")])
@pytest.mark.parametrize("with_bias", [False, True])
def test_convolution_reference_against_loops(name, formats, with_bias, rng):
    g = CONV_GEOMETRIES[name]
    data_format, weights_format = formats
    src = ints(rng, (2, g["c"], 7, 8))
    wei = ints(rng, (g["o"], g["c"] // g["groups"], *g["k"]))
    bias = ints(rng, (g["o"],)) if with_bias else None
    attrs = {"strides": g["strides"], "pads_begin": g["pads"][0], "pads_end": g["pads"][1],
             "dilations": g["dil"], "groups": g["groups"], "data_format": data_format,
             "weights_format": weights_format}
    src_in = np.moveaxis(src, 1, -1) if data_format == "NXC" else src
    wei_in = np.transpose(wei, (2, 3, 1, 0)) if weights_format == "XIO" else wei
    inputs = [src_in, wei_in] + ([bias] if with_bias else [])
    (got,) = reference("Convolution", attrs, inputs, ["f32"])
    expected_shape = infer_output_shapes("Convolution", attrs, [x.shape for x in inputs])[0]
    assert got.shape == expected_shape and got.dtype == np.float32
    out_spatial = expected_shape[2:] if data_format == "NCX" else expected_shape[1:3]
    expected = naive_convolution(src, wei, bias, g["strides"], g["pads"][0], g["dil"], g["groups"],
                                 out_spatial)
    if data_format == "NXC":
        expected = np.moveaxis(expected, 1, -1)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_convolution_auto_pad(mode, rng):
    src = ints(rng, (1, 2, 9, 8))
    wei = ints(rng, (3, 2, 4, 3))
    attrs = {**CONV_NCX, "strides": [2, 1], "auto_pad": mode, "pads_begin": [9, 9], "pads_end": [9, 9]}
    (got,) = reference("Convolution", attrs, [src, wei], ["f32"])
    pads = [auto_pads(s, st, k, 1, mode, 9, 9) for s, st, k in zip((9, 8), (2, 1), (4, 3))]
    explicit = {**CONV_NCX, "strides": [2, 1], "pads_begin": [p[0] for p in pads],
                "pads_end": [p[1] for p in pads]}
    (same,) = reference("Convolution", explicit, [src, wei], ["f32"])
    np.testing.assert_array_equal(got, same)
    if mode != "VALID":
        assert got.shape[2:] == (5, 8)


def test_convolution_reference_is_fast_on_public_shapes(rng):
    # conv_bias_sum_fusion's shape: [50, 64, 56, 56] x [64, 64, 1, 1]; spot-check a few outputs.
    src = ints(rng, (50, 64, 56, 56))
    wei = ints(rng, (64, 64, 1, 1))
    bias = ints(rng, (64,))
    attrs = {**CONV_NCX}
    (got,) = reference("Convolution", attrs, [src, wei, bias], ["f32"])
    assert got.shape == (50, 64, 56, 56)
    for n, o, y, x in [(0, 0, 0, 0), (49, 63, 55, 55), (17, 5, 30, 2)]:
        assert got[n, o, y, x] == float(src[n, :, y, x].astype(np.float64) @ wei[o, :, 0, 0] + bias[o])


def test_convolution_reference_resnet_3x3(rng):
    src = ints(rng, (2, 64, 56, 56))
    wei = ints(rng, (64, 64, 3, 3))
    attrs = {**CONV_NCX, "pads_begin": [1, 1], "pads_end": [1, 1]}
    (got,) = reference("Convolution", attrs, [src, wei], ["f32"])
    padded = np.pad(src.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    for n, o, y, x in [(0, 0, 0, 0), (1, 63, 55, 55), (1, 7, 20, 33)]:
        expected = np.sum(padded[n, :, y:y + 3, x:x + 3] * wei[o])
        assert got[n, o, y, x] == expected


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "ta", "tb"),
    [
        ((3, 4), (4, 5), False, False),
        ((4, 3), (4, 5), True, False),
        ((3, 4), (5, 4), False, True),
        ((4, 3), (5, 4), True, True),
        ((2, 1, 3, 4), (6, 5, 4), False, True),
        ((1, 16, 32, 8), (1, 16, 32, 8), False, True),
        ((4,), (2, 4, 5), False, False),
        ((2, 3, 4), (4,), False, False),
        ((4,), (4,), True, True),
    ],
)
def test_matmul_reference(a_shape, b_shape, ta, tb, rng):
    a, b = ints(rng, a_shape), ints(rng, b_shape)
    (got,) = reference("MatMul", {"transpose_a": ta, "transpose_b": tb}, [a, b], ["f32"])
    a64 = np.swapaxes(a, -1, -2) if ta and a.ndim > 1 else a
    b64 = np.swapaxes(b, -1, -2) if tb and b.ndim > 1 else b
    expected = np.matmul(a64.astype(np.float64), b64.astype(np.float64))
    assert got.shape == infer_output_shapes("MatMul", {"transpose_a": ta, "transpose_b": tb},
                                            [a_shape, b_shape])[0]
    np.testing.assert_array_equal(got, expected)


def test_matmul_bias_broadcasts(rng):
    a, b, bias = ints(rng, (2, 3, 4)), ints(rng, (4, 5)), ints(rng, (1, 3, 1))
    (got,) = reference("MatMul", {}, [a, b, bias], ["f32"])
    np.testing.assert_array_equal(got, a.astype(np.float64) @ b + bias)


def test_matmul_bf16_output_rounds(rng):
    a = np.full((1, 3), 1.0 + 2.0**-8, np.float32)  # exact in f32, between two bf16 values
    b = np.ones((3, 1), np.float32)
    (got,) = reference("MatMul", {}, [a, b], ["bf16"])
    exact = 3 * (1.0 + 2.0**-8)
    assert got.dtype == np.float32 and got[0, 0] != exact
    assert abs(got[0, 0] - exact) <= 2.0**-8 * exact
    (f16,) = reference("MatMul", {}, [a, b], ["f16"])
    assert f16[0, 0] == float(np.float16(exact))


def test_softmax_reference(rng):
    x = ints(rng, (2, 3, 5))
    (got,) = reference("SoftMax", {"axis": 1}, [x], ["f32"])
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-7)
    (log,) = reference("LogSoftmax", {"axis": -1}, [x], ["f32"])
    np.testing.assert_allclose(log, np.log(reference("SoftMax", {"axis": -1}, [x], ["f32"])[0]),
                               rtol=1e-6, atol=1e-6)


def test_softmax_inf_as_zero():
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 0.0]], np.float32)
    with np.errstate(invalid="ignore"):
        (plain,) = reference("SoftMax", {"axis": -1}, [x], ["f32"])
    assert np.all(np.isnan(plain[0]))
    np.testing.assert_array_equal(plain[1], [0.5, 0.0, 0.5])
    dst, stats = reference("SoftMax", {"axis": -1, "mode": "inf_as_zero"}, [x], ["f32", "f32"])
    np.testing.assert_array_equal(dst, [[0, 0, 0], [0.5, 0.0, 0.5]])
    assert stats.shape == (2, 1) and stats[0, 0] == -np.inf
    assert stats[1, 0] == np.float32(np.log(2.0))


def test_softmax_large_tensors_are_computed_in_slices(rng):
    # Over 2^22 elements the reference works slice by slice; the result must not change.
    x = rng.integers(-8, 9, (9, 700, 700)).astype(np.float32)
    x[3, :, 5] = -np.inf  # a fully masked row along axis 1
    dst, stats = reference("SoftMax", {"axis": 1, "mode": "inf_as_zero"}, [x], ["f32", "f32"])
    x64 = x.astype(np.float64)
    row_max = x64.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(x64 - row_max)
        expected = e / e.sum(axis=1, keepdims=True)
    expected[3, :, 5] = 0.0
    np.testing.assert_allclose(dst, expected, rtol=1e-7, atol=0)
    assert stats[3, 0, 5] == -np.inf and np.isfinite(np.delete(stats[3, 0], 5)).all()
    (log,) = reference("LogSoftmax", {"axis": 1}, [x[:, :, :4]], ["f32"])
    np.testing.assert_allclose(log, np.log(expected[:, :, :4]), rtol=1e-6)


def test_softmax_stats_output(rng):
    x = ints(rng, (3, 4))
    dst, stats = reference("SoftMax", {"axis": 0}, [x], ["bf16", "f32"])
    assert dst.shape == (3, 4) and stats.shape == (1, 4)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(stats[0], np.log(np.exp(x64).sum(axis=0)), rtol=1e-7)
    np.testing.assert_array_equal(dst, to_dtype_values(np.exp(x64 - stats.astype(np.float64)), "bf16"))


def test_layer_norm_reference(rng):
    x = rng.integers(-64, 65, (2, 3, 8)) / 16.0
    gamma, beta = rng.integers(1, 9, (8,)) / 4.0, rng.integers(-8, 9, (8,)) / 4.0
    dst, mean, var = reference("LayerNorm", {"epsilon": 0.0625}, [x, gamma, beta], ["f32"] * 3)
    m = x.mean(axis=-1, keepdims=True)
    v = x.var(axis=-1, keepdims=True)
    np.testing.assert_allclose(dst, (x - m) / np.sqrt(v + 0.0625) * gamma + beta, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(mean, m[..., 0], rtol=1e-7)
    np.testing.assert_allclose(var, v[..., 0], rtol=1e-7)
    # begin_norm_axis=1 normalises over the last two dims; gamma may come flattened.
    (dst2,) = reference("LayerNorm", {"begin_norm_axis": 1, "keep_stats": False},
                        [x, np.ones(24), np.zeros((3, 8))], ["f32"])
    m2 = x.mean(axis=(1, 2), keepdims=True)
    v2 = x.var(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(dst2, (x - m2) / np.sqrt(v2 + 1e-5), rtol=1e-6, atol=1e-6)
    # use_affine=False ignores gamma and beta.
    (plain,) = reference("LayerNorm", {"use_affine": False, "keep_stats": False}, [x, gamma, beta], ["f32"])
    np.testing.assert_allclose(plain, (x - m) / np.sqrt(v + 1e-5), rtol=1e-6, atol=1e-6)


def test_rms_norm_reference(rng):
    x = rng.integers(-64, 65, (4, 6)) / 16.0
    gamma = rng.integers(1, 9, (6,)) / 4.0
    dst, rrms = reference("RMSNorm", {"epsilon": 1e-6}, [x, gamma], ["f32", "f32"])
    expected_rrms = 1 / np.sqrt((x * x).mean(axis=-1) + float(np.float32(1e-6)))
    np.testing.assert_allclose(rrms, expected_rrms, rtol=1e-7)
    np.testing.assert_allclose(dst, x * expected_rrms[:, None] * gamma, rtol=1e-6)


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_batch_norm_inference_reference(data_format, rng):
    x = ints(rng, (2, 3, 4, 5))
    gamma, beta, mean = ints(rng, (3,)), ints(rng, (3,)), ints(rng, (3,))
    var = rng.integers(1, 9, (3,)).astype(np.float32)
    src = x if data_format == "NCX" else np.moveaxis(x, 1, -1)
    (got,) = reference("BatchNormInference", {"epsilon": 0.5, "data_format": data_format},
                       [src, gamma, beta, mean, var], ["f32"])
    shape = (1, 3, 1, 1)
    x, gamma, beta, mean, var = (v.astype(np.float64) for v in (x, gamma, beta, mean, var))
    expected = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + 0.5) * gamma.reshape(shape) + beta.reshape(shape)
    if data_format == "NXC":
        expected = np.moveaxis(expected, 1, -1)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def naive_pool(x, kind, kernel, strides, pb, out, dil, exclude_pad):
    n, c, h, w = x.shape
    y = np.zeros((n, c) + out)
    for b, ch, oy, ox in itertools.product(range(n), range(c), range(out[0]), range(out[1])):
        taps, count = [], 0
        for ky, kx in itertools.product(range(kernel[0]), range(kernel[1])):
            iy, ix = oy * strides[0] + ky * dil[0] - pb[0], ox * strides[1] + kx * dil[1] - pb[1]
            count += 1
            if 0 <= iy < h and 0 <= ix < w:
                taps.append(float(x[b, ch, iy, ix]))
        if kind == "MaxPool":
            y[b, ch, oy, ox] = max(taps)
        else:
            y[b, ch, oy, ox] = sum(taps) / (len(taps) if exclude_pad else count)
    return y


@pytest.mark.parametrize(("kind", "exclude_pad"),
                         [("MaxPool", False), ("AvgPool", False), ("AvgPool", True)])
@pytest.mark.parametrize("rounding", ["floor", "ceil"])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_pooling_reference(kind, exclude_pad, rounding, data_format, rng):
    x = ints(rng, (2, 3, 8, 7))
    attrs = {"strides": [2, 2], "kernel": [3, 2], "pads_begin": [1, 0], "pads_end": [0, 0],
             "rounding_type": rounding, "data_format": data_format}
    if kind == "AvgPool":
        attrs["exclude_pad"] = exclude_pad
    src = x if data_format == "NCX" else np.moveaxis(x, 1, -1)
    (got,) = reference(kind, attrs, [src], ["f32"])
    geometry = spatial_geometry(kind, attrs, src.shape)
    expected = naive_pool(x, kind, (3, 2), (2, 2), (1, 0), geometry.out_spatial, (1, 1), exclude_pad)
    if data_format == "NXC":
        expected = np.moveaxis(expected, 1, -1)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-7)


def test_max_pool_dilations(rng):
    x = ints(rng, (1, 2, 9, 9))
    attrs = {**POOL_NCX, "dilations": [2, 1]}
    (got,) = reference("MaxPool", attrs, [x], ["f32"])
    out = spatial_geometry("MaxPool", attrs, x.shape).out_spatial
    np.testing.assert_array_equal(got, naive_pool(x, "MaxPool", (3, 3), (2, 2), (1, 1), out, (2, 1), False))


ELTWISE_CASES = [
    ("ReLU", {}, lambda x: np.maximum(x, 0)),
    ("LeakyReLU", {"alpha": 0.25}, lambda x: np.where(x > 0, x, 0.25 * x)),
    ("Elu", {"alpha": 0.5}, lambda x: np.where(x > 0, x, 0.5 * np.expm1(x))),
    ("GELU", {}, lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))),
    ("GELU", {"mode": "gelu_tanh"},
     lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))),
    ("Sigmoid", {}, lambda x: 1 / (1 + np.exp(-x))),
    ("Tanh", {}, np.tanh),
    ("Exp", {}, np.exp),
    ("Abs", {}, np.abs),
    ("Square", {}, np.square),
    ("Clamp", {"min": -1.5, "max": 2}, lambda x: np.clip(x, -1.5, 2)),
    # HardSwish's 1/6 is the f32 literal the kernels use, as for HardSigmoid's alpha below.
    ("HardSwish", {}, lambda x: x * np.clip(float(np.float32(1 / 6)) * x + 0.5, 0, 1)),
    ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}, lambda x: np.clip(np.float32(0.2) * x + 0.5, 0, 1)),
    ("Mish", {}, lambda x: x * np.tanh(np.log1p(np.exp(x)))),
    ("SoftPlus", {}, lambda x: np.log1p(np.exp(x))),
    ("SoftPlus", {"beta": 2.0}, lambda x: np.log1p(np.exp(2 * x)) / 2),
    ("Round", {}, np.rint),
]


@pytest.mark.parametrize(("kind", "attrs", "formula"), ELTWISE_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(ELTWISE_CASES)])
def test_eltwise_reference(kind, attrs, formula):
    x = np.arange(-16, 17, dtype=np.float32) / 4  # includes the halves Round ties on
    (got,) = reference(kind, attrs, [x], ["f32"])
    np.testing.assert_allclose(got, formula(x.astype(np.float64)), rtol=2e-7, atol=1e-30)


def test_positive_domain_eltwise():
    x = np.arange(1, 33, dtype=np.float32) / 8
    for kind, attrs, formula in [("Log", {}, np.log), ("Sqrt", {}, np.sqrt),
                                 ("Reciprocal", {}, lambda v: 1 / v),
                                 ("Pow", {"beta": 1.5}, lambda v: v**1.5)]:
        (got,) = reference(kind, attrs, [x], ["f32"])
        np.testing.assert_allclose(got, formula(x.astype(np.float64)), rtol=2e-7)


def test_round_is_half_to_even():
    (got,) = reference("Round", {}, [np.array([0.5, 1.5, 2.5, -0.5, -2.5], np.float32)], ["f32"])
    np.testing.assert_array_equal(got, [0, 2, 2, -0.0, -2])


def test_eltwise_parameters_map_to_kernel_algorithms():
    assert eltwise_parameters("GELU", {"mode": "gelu_tanh"}) == ("gelu_tanh", None, None)
    assert eltwise_parameters("Clamp", {"min": 0.0, "max": 6.0}) == ("clip", 0.0, 6.0)
    assert eltwise_parameters("SoftPlus", {"beta": 2.0}) == ("soft_relu", 2.0, None)
    assert eltwise_parameters("Pow", {"beta": 3.0}) == ("pow", 1.0, 3.0)
    assert eltwise_parameters("HardSwish", {}) == ("hardswish", None, None)
    with pytest.raises(InvalidGraphError):
        eltwise_parameters("Add", {})


def test_binary_references(rng):
    a, b = ints(rng, (2, 1, 4)), ints(rng, (3, 1))
    b_nonzero = np.where(b == 0, 1, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    for kind, expected in [("Add", a64 + b64), ("Subtract", a64 - b64), ("Multiply", a64 * b64),
                           ("Maximum", np.maximum(a64, b64)), ("Minimum", np.minimum(a64, b64)),
                           ("SquaredDifference", (a64 - b64) ** 2)]:
        (got,) = reference(kind, {}, [a, b], ["f32"])
        np.testing.assert_array_equal(got, expected)
    (quotient,) = reference("Divide", {}, [a, b_nonzero], ["f32"])
    np.testing.assert_array_equal(quotient, (a64 / b_nonzero).astype(np.float32))
    (ge,) = reference("GreaterEqual", {}, [a, b], ["boolean"])
    assert ge.dtype == np.bool_ and ge.shape == (2, 3, 4)
    np.testing.assert_array_equal(ge, a64 >= b64)
    with pytest.raises(ShapeInferenceError):
        reference("Add", {"auto_broadcast": "none"}, [a, b], ["f32"])


def test_integer_binary_reference():
    a = np.array([2**31 - 1, -5], np.int32)
    b = np.array([1, 3], np.int32)
    (got,) = reference("Add", {}, [a, b], ["s32"])
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [2**31 - 1, -2])  # saturates, as conversions to s32 do


def test_divide_by_zero_gives_inf():
    (got,) = reference("Divide", {}, [np.array([1.0, -1.0, 0.0], np.float32), np.zeros(3, np.float32)], ["f32"])
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2])


def test_select_and_gen_index_build_a_causal_mask(rng):
    scores = ints(rng, (1, 2, 4, 4))
    rows, = reference("GenIndex", {"axis": 2}, [scores], ["s32"])
    cols, = reference("GenIndex", {"axis": 3}, [scores], ["s32"])
    assert rows.dtype == np.int32 and rows.flags.c_contiguous
    np.testing.assert_array_equal(rows[0, 1, :, 0], [0, 1, 2, 3])
    np.testing.assert_array_equal(cols[0, 0, 2], [0, 1, 2, 3])
    keep, = reference("GreaterEqual", {}, [rows, cols], ["boolean"])
    neg_inf = np.array([-np.inf], np.float32)
    masked, = reference("Select", {}, [keep, scores, neg_inf], ["f32"])
    np.testing.assert_array_equal(masked, np.where(np.tril(np.ones((4, 4), bool)), scores, -np.inf))
    probs, = reference("SoftMax", {"axis": -1, "mode": "inf_as_zero"}, [masked], ["f32"])
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-6)
    assert np.all(probs[..., 0, 1:] == 0)


def test_data_movement_references(rng):
    x = ints(rng, (32, 2, 8, 6))
    (reshaped,) = reference("StaticReshape", {"shape": [0, -1, 6], "special_zero": True}, [x], ["f32"])
    np.testing.assert_array_equal(reshaped, x.reshape(32, 16, 6))
    (transposed,) = reference("StaticTranspose", {"order": [0, -1, 1, 2]}, [x], ["f32"])
    np.testing.assert_array_equal(transposed, x.transpose(0, 3, 1, 2))
    (joined,) = reference("Concat", {"axis": -1}, [x, x[..., :2]], ["f32"])
    np.testing.assert_array_equal(joined, np.concatenate([x, x[..., :2]], axis=-1))
    (copy,) = reference("Reorder", {}, [x], ["f32"])
    np.testing.assert_array_equal(copy, x)
    (as_bf16,) = reference("TypeCast", {}, [np.array([1 + 2.0**-9, 3.0], np.float32)], ["bf16"])
    np.testing.assert_array_equal(as_bf16, [1.0, 3.0])
    (as_f16,) = reference("TypeCast", {}, [np.array([1 + 2.0**-12, 65520.0], np.float32)], ["f16"])
    np.testing.assert_array_equal(as_f16, [1.0, np.inf])


@pytest.mark.parametrize(
    ("kind", "numpy_fn"),
    [("ReduceSum", np.sum), ("ReduceMean", np.mean), ("ReduceMax", np.max), ("ReduceMin", np.min),
     ("ReduceProd", np.prod), ("ReduceL1", lambda x, axis, keepdims: np.sum(np.abs(x), axis=axis, keepdims=keepdims)),
     ("ReduceL2", lambda x, axis, keepdims: np.sqrt(np.sum(x * x, axis=axis, keepdims=keepdims)))],
)
@pytest.mark.parametrize("keep_dims", [False, True])
def test_reduction_references(kind, numpy_fn, keep_dims, rng):
    x = ints(rng, (2, 3, 4))
    expected = numpy_fn(x.astype(np.float64), axis=(0, 2), keepdims=keep_dims)
    (got,) = reference(kind, {"axes": [-1, 0], "keep_dims": keep_dims}, [x], ["f32"])
    np.testing.assert_allclose(got, expected, rtol=1e-7)
    # The axes may come as an s32 input instead.
    (from_input,) = reference(kind, {"keep_dims": keep_dims}, [x, np.array([0, 2], np.int32)], ["f32"])
    np.testing.assert_array_equal(from_input, got)


def test_bias_add_reference(rng):
    x, bias = ints(rng, (2, 3, 4)), ints(rng, (3,))
    (got,) = reference("BiasAdd", {"data_format": "NCX"}, [x, bias], ["f32"])
    np.testing.assert_array_equal(got, x + bias[None, :, None])
    (nxc,) = reference("BiasAdd", {}, [x, ints(rng, (4,))], ["f32"])
    assert nxc.shape == x.shape


def test_end_and_wildcard():
    assert reference("End", {}, [np.zeros(3, np.float32)], []) == []
    with pytest.raises(UnsupportedError):
        reference("Wildcard", {}, [np.zeros(3, np.float32)], ["f32"])


def test_reference_rejects_bf16_storage_and_bad_arity():
    with pytest.raises(InvalidGraphError, match="uint16"):
        reference("ReLU", {}, [np.zeros(3, np.uint16)], ["bf16"])
    with pytest.raises(InvalidGraphError, match="outputs"):
        reference("ReLU", {}, [np.zeros(3, np.float32)], ["f32", "f32"])


def test_to_dtype_values():
    x = np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -2.5, 3.5, 1e10, np.nan])
    np.testing.assert_array_equal(to_dtype_values(x, "bf16")[:4], [1.0, 1.0 + 2.0**-6, -2.5, 3.5])
    assert np.isnan(to_dtype_values(x, "bf16")[5])
    s32 = to_dtype_values(x, "s32")
    np.testing.assert_array_equal(s32, [1, 1, -2, 4, 2**31 - 1, 0])
    np.testing.assert_array_equal(to_dtype_values(x, "u8")[:5], [1, 1, 0, 4, 255])
    np.testing.assert_array_equal(to_dtype_values(x, "boolean"), [True] * 6)
    assert to_dtype_values(x, "f16").dtype == np.float32
    with pytest.raises(InvalidGraphError):
        to_dtype_values(x, "f64")


# == filling and tolerances ===================================================================


def test_fill_matmul_inputs_are_small_integers_and_exact(rng):
    a = fill_input("f32", (64, 256), {"MatMul"}, rng)
    b = fill_input("f32", (256, 32), {"MatMul"}, rng)
    assert a.dtype == np.float32 and np.all(a == np.rint(a)) and np.abs(a).max() <= 4
    assert len(np.unique(a)) == 9
    np.testing.assert_array_equal(a @ b, a.astype(np.float64) @ b.astype(np.float64))


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize(
    ("consumers", "role"),
    [({"MatMul"}, None), ({"Log"}, None), ({"Divide"}, None), ({"Multiply"}, "scale"),
     ({"Divide"}, "divisor"), ({"LayerNorm"}, None), ({"LayerNorm"}, "gamma"),
     ({"BatchNormInference"}, "variance"), ({"GELU", "Tanh"}, None), ({"SoftMax"}, None),
     ({"Add"}, "mask")],
)
def test_fill_values_are_exact_in_every_float_type(dtype, consumers, role, rng):
    x = fill_input(dtype, (8, 33), consumers, rng, role=role)
    assert x.dtype == np.float32 and x.shape == (8, 33)
    finite = x[np.isfinite(x)]
    for narrow in ("bf16", "f16"):
        np.testing.assert_array_equal(to_dtype_values(finite, narrow), finite)


def test_fill_rules(rng):
    shape = (16, 16)
    assert fill_input("f32", shape, {"Log"}, rng).min() > 0
    assert fill_input("f32", shape, {"Sqrt", "MatMul"}, rng).min() > 0  # positivity wins
    divisor = fill_input("f32", shape, {"Divide"}, rng, role="divisor")
    assert set(np.unique(divisor)) <= {0.5, 1.0, 2.0, 4.0}
    assert np.all(fill_input("f32", shape, {"Divide"}, rng) != 0)
    scale = fill_input("f32", (1,), {"Multiply"}, rng, role="scale")
    assert scale.shape == (1,) and np.log2(scale[0]) == np.rint(np.log2(scale[0]))
    assert fill_input("f32", (), {"Divide"}, rng, role="scale").shape == ()
    mask = fill_input("f32", (4, 6), {"Add"}, rng, role="mask")
    assert set(np.unique(mask)) <= {0.0, -np.inf} and np.all(mask[:, 0] == 0)
    norm = fill_input("f32", (32, 64), {"LayerNorm"}, rng)
    assert np.all(norm.var(axis=-1) > 0) and np.all(norm * 16 == np.rint(norm * 16))
    assert np.all(fill_input("f32", shape, {"LayerNorm"}, rng, role="gamma") > 0)
    assert np.all(fill_input("f32", shape, {"BatchNormInference"}, rng, role="variance") > 0)
    curved = fill_input("f32", (256,), {"Tanh"}, rng)
    assert np.any(curved != np.rint(curved)) and np.abs(curved).max() <= 4


def test_fill_booleans_and_integers(rng):
    cond = fill_input("boolean", (3, 5), {"Select"}, rng)
    assert cond.dtype == np.bool_ and cond.any() and not cond.all()
    assert fill_input("boolean", (1,), {"Select"}, rng).dtype == np.bool_
    s32 = fill_input("s32", (10,), {"Add"}, rng)
    assert s32.dtype == np.int32 and np.abs(s32).max() <= 4
    assert fill_input("s32", (10,), {"Divide"}, rng, role="divisor").min() >= 1
    assert fill_input("u8", (10,), set(), rng).dtype == np.uint8
    assert fill_input("s8", (10,), set(), rng).dtype == np.int8


def test_fill_errors(rng):
    assert "scale" in ROLES
    with pytest.raises(InvalidArgumentError, match="role"):
        fill_input("f32", (2,), {"Add"}, rng, role="weights")
    with pytest.raises(InvalidArgumentError, match="data type"):
        fill_input("f64", (2,), {"Add"}, rng)
    with pytest.raises(InvalidArgumentError, match="unknown"):
        fill_input("f32", (-1, 2), {"Add"}, rng)


def test_fill_is_deterministic_per_seed():
    a = fill_input("f32", (5, 5), {"MatMul"}, np.random.default_rng(3))
    b = fill_input("f32", (5, 5), {"MatMul"}, np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)


def test_tolerances():
    assert tolerance({"StaticReshape", "StaticTranspose", "Reorder"}, "f32") == (0.0, 0.0)
    assert tolerance({"MatMul"}, "f32") == (0.0, 0.0)
    assert tolerance({"Convolution", "ReLU"}, "f32") == (0.0, 0.0)
    eps = float(np.finfo(np.float32).eps)
    assert tolerance({"Convolution", "Add"}, "f32") == (eps, eps)  # exact sum, one rounding
    assert tolerance({"GELU"}, "f32") == (4e-5, 4e-5)
    assert tolerance({"Sqrt"}, "f32") == (4e-6, 4e-6)
    assert tolerance({"SoftMax"}, "f32") == pytest.approx((10 * eps, 10 * eps))
    assert tolerance({"LayerNorm"}, "f32") == (8 * eps, 8 * eps)
    # A softmax feeding a matmul: benchdnn's relaxed chain check.
    rtol, atol = tolerance({"MatMul", "Divide", "Add", "SoftMax"}, "f32")
    assert rtol >= 8e-6 and atol >= 2e-5
    assert tolerance({"MatMul", "Sigmoid", "Multiply"}, "f32") == (4e-5, 4e-5)
    bf16 = tolerance({"MatMul"}, "bf16")
    assert bf16 == (2.0**-7, 2.0**-7)
    assert tolerance({"MatMul", "SoftMax"}, "bf16")[0] == 2.0**-6
    assert tolerance({"Add"}, "f16") == (2.0**-10, 2.0**-10)
    assert tolerance({"GreaterEqual"}, "boolean") == (0.0, 0.0)
    assert tolerance({"Add"}, "s32") == (0.0, 0.0)
    with pytest.raises(InvalidGraphError):
        tolerance({"Conv2D"}, "f32")
    with pytest.raises(InvalidArgumentError):
        tolerance({"Add"}, "f64")


def test_narrowest_dtype():
    assert narrowest_dtype(["f32", "bf16", "f16"]) == "bf16"
    assert narrowest_dtype(["f32", "f16", "boolean"]) == "f16"
    assert narrowest_dtype(["s32", "boolean"]) == "f32"


# == the public benchdnn graphs ===============================================================


def public_graphs() -> list[Path]:
    require(PUBLIC_GRAPHS)
    paths = sorted(PUBLIC_GRAPHS.glob("*.json"))
    assert paths, f"no serialized graphs under {PUBLIC_GRAPHS}"
    return paths


def load_ops(path: Path) -> list[dict]:
    return json.loads(path.read_text())["graph"]


def json_shape(tensor: dict):
    """A serialized shape: INT64_MIN dims are unknown (-1); ``[INT64_MIN]`` alone is an unknown
    rank (None), as gemma2's SoftMax input shows: its producer's output has rank 5."""
    shape = tensor["shape"]
    if shape == [INT64_MIN]:
        return None
    return tuple(-1 if d == INT64_MIN else d for d in shape)


def test_every_public_op_kind_has_a_schema_and_its_attrs_pass():
    for path in public_graphs():
        for op in load_ops(path):
            kind, raw = op["kind"], op.get("attrs", {})
            assert kind in OP_SCHEMAS, f"{path.name}: {kind}"
            counts = (len(op["inputs"]), len(op["outputs"]))
            # As serialized ({"type", "value"}), and unwrapped to the bare JSON values (bools 0/1).
            from_json = check_op(kind, raw, *counts)
            bare = check_op(kind, {name: attr["value"] for name, attr in raw.items()}, *counts)
            assert from_json == bare
            for name, attr in raw.items():
                spec = OP_SCHEMAS[kind].attrs[name]
                assert spec.type == attr["type"], f"{path.name}: {kind}.{name}"
                if attr["type"] == "bool":
                    assert from_json[name] is bool(attr["value"])


def _infer_graph(path: Path) -> tuple[dict, list[str]]:
    """Infer every op's outputs in file order (the files list producers first), feeding inferred
    shapes forward; returns the shapes by tensor id and the mismatches with the file."""
    shapes: dict[int, tuple] = {}
    mismatches = []
    for op in load_ops(path):
        inputs = []
        for tensor in op["inputs"]:
            inputs.append(shapes.get(tensor["id"], json_shape(tensor)))
        attrs = check_op(op["kind"], op.get("attrs", {}), len(op["inputs"]), len(op["outputs"]))
        inferred = infer_output_shapes(op["kind"], attrs, inputs, len(op["outputs"]))
        for tensor, shape in zip(op["outputs"], inferred):
            written = json_shape(tensor)
            if written is not None and (len(written) != len(shape) or any(
                    w not in (-1, s) for w, s in zip(written, shape))):
                mismatches.append(f"{path.name} op {op['id']} ({op['kind']}): inferred "
                                  f"{list(shape)}, file says {list(written)}")
            shapes[tensor["id"]] = shape
    return shapes, mismatches


def test_shape_inference_reproduces_public_graphs():
    checked = 0
    for path in public_graphs():
        _, mismatches = _infer_graph(path)
        assert not mismatches, "\n".join(mismatches)
        checked += 1
    assert checked >= 1


def _role(kinds: set[str], shape: tuple, dtype: str) -> str | None:
    if dtype != "boolean" and math.prod(shape) == 1 and kinds and kinds <= {"Multiply", "Divide"}:
        return "scale"
    return None


def test_references_run_through_public_graphs():
    """Fill each graph's inputs, run every op's reference in file order and check each output's
    shape and dtype against the file (and the inferred shapes)."""
    numpy_dtype = {"f32": np.float32, "bf16": np.float32, "f16": np.float32, "s32": np.int32,
                   "boolean": np.bool_}
    for path in public_graphs():
        ops = load_ops(path)
        # GQA's 75M scores and gelu's 25M-element maps took 13 of this test's 20 s (CPU, numpy):
        # test_graph_conformance runs those graphs' references in full against the kernels.
        if max(math.prod(json_shape(t) or ()) for op in ops for t in op["inputs"]) > 8_000_000:
            continue
        consumers: dict[int, set[str]] = {}
        produced = {t["id"] for op in ops for t in op["outputs"]}
        for op in ops:
            for tensor in op["inputs"]:
                consumers.setdefault(tensor["id"], set()).add(op["kind"])
        inferred, _ = _infer_graph(path)
        rng = np.random.default_rng(7)
        values: dict[int, np.ndarray] = {}
        overflowing: set[int] = set()
        for op in ops:
            inputs = []
            for tensor in op["inputs"]:
                if tensor["id"] not in values:
                    assert tensor["id"] not in produced, f"{path.name}: ops are not in order"
                    shape = json_shape(tensor)
                    kinds = consumers[tensor["id"]]
                    values[tensor["id"]] = fill_input(tensor["dtype"], shape, kinds, rng,
                                                      role=_role(kinds, shape, tensor["dtype"]))
                inputs.append(values[tensor["id"]])
            outputs = reference(op["kind"], op.get("attrs", {}), inputs,
                                [t["dtype"] for t in op["outputs"]])
            # Exp of unrelated filled inputs may overflow (sdpa backward subtracts a filled
            # "stats" input that no softmax produced); what it feeds is not checked for finiteness.
            tainted = op["kind"] == "Exp" or any(t["id"] in overflowing for t in op["inputs"])
            for tensor, value in zip(op["outputs"], outputs):
                assert value.shape == inferred[tensor["id"]], f"{path.name} op {op['id']}"
                assert value.dtype == numpy_dtype[tensor["dtype"]], f"{path.name} op {op['id']}"
                if tainted:
                    overflowing.add(tensor["id"])
                elif value.dtype == np.float32:
                    assert not np.any(np.isnan(value)), f"{path.name} op {op['id']} ({op['kind']})"
                values[tensor["id"]] = value
