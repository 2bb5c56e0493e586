"""The state of one ONNX import (``Builder``), what converters build with, and the node runner.

Kept apart from ``_import`` so the converters (``_nodes``) and the importer both import it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import onnx.defs
import onnx.reference
from onnx.reference.op_run import OpRun

from .._values._dtypes import dtype_of_numpy
from .._values._errors import InvalidArgumentError, UnsupportedError
from ..graph import Graph, LogicalTensor, Op

# ONNX element types triodnn's graph takes, as its dtype names.
DTYPES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "f32", onnx.TensorProto.FLOAT16: "f16", onnx.TensorProto.BFLOAT16: "bf16",
    onnx.TensorProto.INT8: "s8", onnx.TensorProto.UINT8: "u8", onnx.TensorProto.INT32: "s32",
    onnx.TensorProto.INT64: "s64", onnx.TensorProto.BOOL: "boolean",
}


class OnnxImportError(InvalidArgumentError):
    """The ONNX model cannot be read or checked, or is malformed where the importer looks."""


class LRN(OpRun):
    """LRN as ONNX's operator specification writes it, for ONNX's reference evaluator (its own
    loops the channel window over the batch dim in onnx 1.23, so on one image every channel
    but the first divided by ``bias ** beta``: AlexNet's probabilities came out 5.5e-4 off ONNX
    Runtime's, which follows the specification). Each element is divided by ``(bias + alpha /
    size * sum of squares over its channel window) ** beta``, the window ``[c - floor((size -
    1) / 2), c + ceil((size - 1) / 2)]`` clipped to the channels; in float64, stored in x's type.
    The class name is the op type the evaluator replaces."""

    op_domain = ""

    def _run(self, x, alpha=None, beta=None, bias=None, size=None):
        x64 = np.asarray(x, np.float64)
        squares = x64 ** 2
        square_sum = np.empty_like(x64)
        below, above = (size - 1) // 2, -(-(size - 1) // 2)
        for c in range(x64.shape[1]):
            square_sum[:, c] = squares[:, max(0, c - below):c + above + 1].sum(axis=1)
        return ((x64 / (bias + alpha / size * square_sum) ** beta).astype(np.asarray(x).dtype),)


def reference_evaluator(model: onnx.ModelProto) -> onnx.reference.ReferenceEvaluator:
    """ONNX's reference evaluator for ``model``, with the operators it departs from the
    specification on (``LRN``) replaced: what the import's folding, the Wildcard handlers and
    ``check_model``'s reference all run."""
    return onnx.reference.ReferenceEvaluator(model, new_ops=[LRN])


def run_node(node: onnx.NodeProto, arrays, opset: int) -> list[np.ndarray]:
    """``node``'s outputs for input ``arrays`` (its present inputs, in order), by
    ``reference_evaluator``."""
    names = [name for name in node.input if name]
    inputs = [onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype), None)
              for name, a in zip(names, arrays)]
    outputs = [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None) for name in node.output if name]
    graph = onnx.helper.make_graph([node], "node", inputs, outputs)
    feeds = dict(zip(names, (np.asarray(a) for a in arrays)))
    try:
        evaluator = reference_evaluator(
            onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)]))
    except RuntimeError:
        # The evaluator implements some operators only from a later version (DequantizeLinear
        # from 19): the node's semantics are those of the latest where the versions agree.
        evaluator = reference_evaluator(onnx.helper.make_model(
            graph, opset_imports=[onnx.helper.make_opsetid("", onnx.defs.onnx_opset_version())]))
    return [np.asarray(r) for r in evaluator.run(None, feeds)]


class Builder:
    """The state of one import: ONNX names bound to logical tensors or known arrays, and the
    graph being built. Converters (``_nodes``) use its methods only."""

    def __init__(self, opset: int, shapes: Mapping[str, tuple | None], dtypes: Mapping[str, str],
                 used: set[str]) -> None:
        self.opset = opset
        self.graph = Graph()
        self.values: dict[str, np.ndarray] = {}
        self.tensors: dict[str, LogicalTensor] = {}
        self.constants: dict[int, np.ndarray] = {}
        self.wildcard_nodes: dict[int, onnx.NodeProto] = {}
        self._shapes = shapes
        self._dtypes = dtypes
        # Names some node reads or the model outputs: a node's other outputs may be dropped.
        self.used = used
        self._next_tensor = 0
        self._next_op = 0

    # -- values ----------------------------------------------------------------------------
    def known(self, name: str) -> np.ndarray | None:
        """The array bound to ``name`` when it is known at import time."""
        return self.values.get(name)

    def shape(self, name: str) -> tuple[int, ...] | None:
        """``name``'s shape where known (an array's, or ONNX shape inference's when static)."""
        if name in self.values:
            return tuple(self.values[name].shape)
        lt = self.tensors.get(name)
        if lt is not None and lt.shape is not None and all(d >= 0 for d in lt.shape):
            return tuple(lt.shape)
        return self._shapes.get(name)

    def dtype(self, name: str) -> str | None:
        """``name``'s triodnn dtype where known."""
        if name in self.values:
            try:
                return _dtype_of(self.values[name], name)
            except UnsupportedError:
                return None
        if name in self.tensors:
            return self.tensors[name].dtype
        return self._dtypes.get(name)

    def rank(self, name: str) -> int | None:
        shape = self.shape(name)
        if shape is not None:
            return len(shape)
        lt = self.tensors.get(name)
        return None if lt is None or lt.shape is None else len(lt.shape)

    def tensor(self, name: str) -> LogicalTensor:
        """The logical tensor of ``name``; a known array becomes a constant graph input."""
        if name in self.tensors:
            return self.tensors[name]
        if name not in self.values:
            raise OnnxImportError(f"tensor {name!r} is used before any node or input defines it")
        array = self.values[name]
        dtype = _dtype_of(array, name)
        lt = LogicalTensor(self._tensor_id(), dtype, tuple(array.shape), property_type="constant")
        self.tensors[name] = lt
        self.constants[lt.id] = array if array.flags.c_contiguous else array.copy(order="C")
        return lt

    def constant(self, array: np.ndarray) -> LogicalTensor:
        """A constant graph input holding ``array`` (a scalar a converter needs, say)."""
        name = f"__triodnn_constant_{len(self.constants)}"
        self.values[name] = np.atleast_1d(array)
        return self.tensor(name)

    def output(self, name: str, dtype: str | None = None) -> LogicalTensor:
        """A new logical tensor for ONNX output ``name``, of its inferred dtype and shape."""
        lt = self.new(dtype or self._dtypes.get(name, "f32"), self._shapes.get(name))
        self.tensors[name] = lt
        return lt

    def graph_input(self, name: str, dtype: str, shape: tuple[int, ...]) -> LogicalTensor:
        """The logical tensor of model input ``name`` (-1 for a dim the model leaves symbolic)."""
        lt = LogicalTensor(self._tensor_id(), dtype, shape)
        self.tensors[name] = lt
        return lt

    def new(self, dtype: str = "f32", shape: tuple | None = None) -> LogicalTensor:
        """An intermediate logical tensor no ONNX name refers to."""
        return LogicalTensor(self._tensor_id(), dtype, shape)

    def alias(self, name: str, source: str) -> None:
        """``name`` is the same value as ``source`` (Identity, inference Dropout)."""
        if source in self.values:
            self.values[name] = self.values[source]
        else:
            self.tensors[name] = self.tensor(source)

    def add(self, kind: str, inputs: list[LogicalTensor], outputs: list[LogicalTensor], name: str = "",
            **attrs_) -> Op:
        op = Op(self._next_op, kind, inputs, outputs, attrs=attrs_, name=name)
        self._next_op += 1
        self.graph.add_op(op)
        return op

    def wildcard(self, node: onnx.NodeProto) -> None:
        """``node`` as a Wildcard op run by a handler (``OnnxGraph.handlers``)."""
        inputs = [self.tensor(name) for name in node.input if name]
        outputs = [self.output(name) for name in node.output if name]
        op = self.add("Wildcard", inputs, outputs, name=f"{node.op_type}:{node.name or node.output[0]}")
        self.wildcard_nodes[op.id] = node

    def _tensor_id(self) -> int:
        self._next_tensor += 1
        return self._next_tensor - 1


def _dtype_of(array: np.ndarray, name: str) -> str:
    """The graph dtype of known value ``array``: numpy's int64 (ONNX's shapes and indices) is
    s64 here, where ``dtype_of_numpy`` keeps user arrays of it as s32."""
    if array.dtype == np.int64:
        return "s64"
    try:
        return dtype_of_numpy(array.dtype)
    except InvalidArgumentError as exc:
        raise UnsupportedError(f"tensor {name!r}: {exc}") from None


