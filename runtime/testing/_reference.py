"""Numpy references of oneDNN Graph ops, one op at a time.

``reference(kind, attrs, inputs, output_dtypes)`` computes an op the textbook way in float64 and
returns each output converted to its data type. Values are user-facing: f32, f16 and bf16
tensors are float32 arrays holding values of their type (bf16 and f16 already rounded), s32 is
int32, s8/u8 int8/uint8, ``boolean`` is ``np.bool_``. Outputs follow the same convention, so
one op's outputs feed the next op's inputs unchanged: an f16 or bf16 output is rounded to its
type (to nearest even) and returned as float32; integer outputs round to nearest and saturate.

Each kind's computation is declared with the kind, in its family module of ``triodnn.graph.ops``
(``GraphOp.reference``): elementwise algorithms reuse ``triodnn.kernels.eltwise.reference`` (the
formulas the kernels are tested against), MatMul and Convolution use float64 matmuls (exact on
integer data, so f32 results computed in any order agree), pooling goes through
``triodnn.kernels.pooling.reference`` after the graph's ``auto_pad``/``rounding_type`` are turned
into plain pads. This module checks the op, infers the output shapes and converts the outputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .._values import _dtypes
from .._values._errors import InvalidGraphError, UnsupportedError
from ..graph._op_registry import graph_op
from ..graph._op_schema import check_op
from ..graph._shape_inference import infer_output_shapes

FLOAT_DTYPES = ("f32", "f16", "bf16")
_INT4: dict[str, tuple[type[np.integer], tuple[int, int]]] = {"s4": (np.int8, (-8, 7)), "u4": (np.uint8, (0, 15))}
_INTEGER_DTYPES: dict[str, type[np.integer]] = {"s32": np.int32, "s8": np.int8, "u8": np.uint8,
                                                 "s64": np.int64}


# -- dtype conversions ----------------------------------------------------------------------


def to_dtype_values(values, dtype: str) -> np.ndarray:
    """``values`` (any numeric array) as the user-facing values of ``dtype``: f32 and bf16/f16
    rounded to nearest even and returned as float32, integers rounded to nearest (half to even)
    and saturated, booleans as ``values != 0``."""
    x = np.asarray(values)
    if dtype == "boolean":
        return np.asarray(x != 0, dtype=np.bool_)
    if dtype == "s64" and x.dtype.kind in "iub":
        return x.astype(np.int64)  # exact: float64 would round beyond 2**53
    if dtype == "s64":  # 2**63 is past int64: saturate it to the top, as the kernels store
        with np.errstate(invalid="ignore"):
            y = np.clip(np.rint(np.asarray(x, np.float64)), -(2.0**63), 2.0**63)
        top = y >= 2.0**63
        y = np.where(np.isnan(y) | top, 0, y).astype(np.int64)
        return np.where(top, np.iinfo(np.int64).max, y)
    if dtype in _INTEGER_DTYPES or dtype in _INT4:
        numpy_type, (low, high) = _INT4[dtype] if dtype in _INT4 else (
            _INTEGER_DTYPES[dtype], (np.iinfo(_INTEGER_DTYPES[dtype]).min, np.iinfo(_INTEGER_DTYPES[dtype]).max))
        with np.errstate(invalid="ignore"):
            y = np.clip(np.rint(np.asarray(x, np.float64)), low, high)
        return np.where(np.isnan(y), 0, y).astype(numpy_type)
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "f32":
            return np.asarray(x, dtype=np.float32)
        if dtype == "f16":
            return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float32)
        if dtype == "bf16":
            single = np.asarray(x, dtype=np.float32)
            return _dtypes.from_storage(_dtypes.to_storage(single, "bf16"), "bf16").reshape(single.shape)
        if dtype in ("f8_e4m3", "f8_e5m2"):  # oneDNN's f32 -> f8 rounding (triodnn._values._float8)
            single = np.asarray(x, dtype=np.float32)
            return _dtypes.from_storage(_dtypes.to_storage(single, dtype), dtype).reshape(single.shape)
    raise InvalidGraphError(f"no reference conversion to data type {dtype!r}")


# -- entry point ----------------------------------------------------------------------------


def _as_input(array, kind: str, index: int) -> np.ndarray:
    x = np.asarray(array)
    if x.dtype == np.uint16:
        raise InvalidGraphError(
            f"{kind}: input {index} is uint16 (bf16 storage?); pass user-facing values "
            f"(triodnn._values._dtypes.from_storage)"
        )
    return x


def reference(kind: str, attrs: Mapping, inputs: Sequence[np.ndarray],
              output_dtypes: Sequence[str]) -> list[np.ndarray]:
    """The outputs of an op of ``kind`` on ``inputs``, one array per entry of ``output_dtypes``,
    each converted to that data type (see the module docstring for the value conventions).

    Float ops compute in float64. Shapes are checked with ``infer_output_shapes`` first, so a
    reference never broadcasts what oneDNN would refuse. Wildcard has no reference
    (UnsupportedError); End returns nothing.
    """
    inputs = [_as_input(x, kind, i) for i, x in enumerate(inputs)]
    output_dtypes = list(output_dtypes)
    a = check_op(kind, attrs, len(inputs), len(output_dtypes))
    op = graph_op(kind)
    if op.reference is None:
        raise UnsupportedError(f"{kind}: {op.not_run}; there is no reference for it")
    if op.attrs_from_inputs is not None:  # an input's values standing for an attribute
        a = op.attrs_from_inputs(a, inputs)
    shapes = infer_output_shapes(kind, a, [x.shape for x in inputs], len(output_dtypes))
    with np.errstate(all="ignore"):  # inf and NaN propagate as IEEE arithmetic says
        outputs = op.reference(kind, a, inputs, len(output_dtypes))
    result = []
    for i, (value, dtype) in enumerate(zip(outputs, output_dtypes)):
        if np.shape(value) != shapes[i]:
            value = np.broadcast_to(value, shapes[i])  # GenIndex and Select build broadcast views
        # A fresh C-contiguous array (not a view of an input, not 0-d turned 1-d).
        result.append(np.array(to_dtype_values(value, dtype), order="C", copy=True))
    return result


def magnitudes(kind: str, attrs: Mapping, inputs: Sequence[np.ndarray], num_outputs: int) -> list:
    """Per output of an op of ``kind``, the size of the sums behind each element
    (``GraphOp.magnitude``: the same sums over absolute values) as float64, or None for an
    output that is no sum, or a kind that declares none."""
    op = graph_op(kind)
    if op.magnitude is None:
        return [None] * num_outputs
    inputs = [_as_input(x, kind, i) for i, x in enumerate(inputs)]
    a = check_op(kind, attrs, len(inputs), num_outputs)
    with np.errstate(all="ignore"):
        return [None if m is None else np.asarray(m, dtype=np.float64)
                for m in op.magnitude(kind, a, inputs, num_outputs)]


__all__ = ["FLOAT_DTYPES", "magnitudes", "reference", "to_dtype_values"]
