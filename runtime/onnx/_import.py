"""An ONNX model as a triodnn graph: ``from_onnx(model)``.

ONNX nodes are walked in their (topological) order. A node whose inputs are all known values
(initializers, ``Constant`` nodes, shapes ONNX's shape inference fixed, and whatever was folded
before it) is computed here by ONNX's reference evaluator and never reaches the graph: the
weight-generating ``ConstantOfShape`` of ONNX's "light" models and the shape arithmetic of
torch exports fold away. Every other node goes through its converter (``_nodes.CONVERTERS``) to
oneDNN Graph ops; a node without one (or one its converter declines) becomes a ``Wildcard`` op
that names the ONNX node, run by a handler: ``OnnxGraph.handlers()`` runs each through the
reference evaluator on the host, or the caller passes their own.

Values the graph needs at run time that are known here (weights, biases, folded constants)
become constant graph inputs (``property_type="constant"``) with their arrays in
``OnnxGraph.constants``, so ``compile_graph(..., constants=...)`` uploads them once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import attrs
import numpy as np
import onnx
import onnx.numpy_helper
import onnx.shape_inference

from .._values._errors import UnsupportedError
from ..graph import Graph, Handler
from ._builder import DTYPES, Builder, OnnxImportError, run_node
from ._nodes import CONVERTERS


@attrs.frozen
class OnnxGraph:
    """What ``from_onnx`` makes of a model: the ``graph``, its ONNX input and output names with
    their logical tensor ids (in the model's order), the constant inputs' arrays by id, and the
    ONNX node of each Wildcard op by op id (what ``handlers`` runs)."""

    graph: Graph
    inputs: dict[str, int]
    outputs: dict[str, int]
    constants: dict[int, np.ndarray] = attrs.field(repr=False)
    wildcard_nodes: dict[int, onnx.NodeProto] = attrs.field(repr=False)
    opset: int
    # The model inputs some op reads: one no converted node reads (an axes input shape inference
    # made known, say) is not a graph input, and is not fed.
    fed: tuple[str, ...] = attrs.field(default=(), repr=False)

    def feeds(self, arrays: Mapping[str, np.ndarray]) -> dict[int, np.ndarray]:
        """``{graph input id: array}`` for ``runner.run`` from arrays by model input name."""
        return {self.inputs[name]: np.asarray(arrays[name]) for name in self.fed}

    def ordered_outputs(self, results: Mapping[int, np.ndarray]) -> list[np.ndarray]:
        """A run's outputs (by logical tensor id) in the model's output order."""
        return [results[lt_id] for lt_id in self.outputs.values()]

    def handlers(self) -> dict:
        """A handler for every Wildcard op: its ONNX node run by ``onnx.reference`` on the host
        (``compile_graph(..., handlers=onnx_graph.handlers())``)."""
        if not self.wildcard_nodes:
            return {}
        return {"Wildcard": Handler(self._run_node, with_partition=True)}

    def _run_node(self, partition, *arrays):
        (op,) = partition.ops
        node = self.wildcard_nodes[op.id]
        return run_node(node, arrays, self.opset)


def load_model(model) -> onnx.ModelProto:
    """``model`` (a path, bytes or a ``ModelProto``) loaded and checked."""
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, bytes | bytearray):
        proto = onnx.load_model_from_string(bytes(model))
    elif isinstance(model, str | os.PathLike):
        if not os.path.exists(model):
            raise OnnxImportError(f"no ONNX model at {os.fspath(model)!r}")
        proto = onnx.load(os.fspath(model))
    else:
        raise OnnxImportError(f"model is {type(model).__name__}; expected a path, bytes or onnx.ModelProto")
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        raise OnnxImportError(f"the ONNX checker refuses the model: {exc}") from None
    return proto


def declared_dims(info: onnx.ValueInfoProto) -> tuple[int, ...]:
    """The dims ``info`` declares, -1 for each it leaves symbolic."""
    return tuple(d.dim_value if d.HasField("dim_value") else -1 for d in info.type.tensor_type.shape.dim)


def model_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The inputs a caller feeds: the graph's inputs that are not initializers (models before IR
    version 4 list their initializers as inputs too)."""
    initializers = {t.name for t in model.graph.initializer}
    return [info for info in model.graph.input if info.name not in initializers]


def _value_infos(model: onnx.ModelProto) -> tuple[dict[str, tuple | None], dict[str, str]]:
    """Static shapes and dtypes ONNX's shape inference finds, by name (a dim it leaves symbolic
    makes the shape None)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - a model shape inference cannot follow still imports
        inferred = model
    shapes: dict[str, tuple | None] = {}
    dtypes: dict[str, str] = {}
    g = inferred.graph
    for info in list(g.value_info) + list(g.input) + list(g.output):
        t = info.type.tensor_type
        if t.elem_type in DTYPES:
            dtypes[info.name] = DTYPES[t.elem_type]
        if t.HasField("shape"):
            dims = declared_dims(info)
            shapes[info.name] = dims if all(d >= 0 for d in dims) else None
    return shapes, dtypes


def from_onnx(model, *, input_shapes: Mapping[str, tuple] | None = None,
              converters: Mapping[str, Callable] | None = None) -> OnnxGraph:
    """The triodnn graph of ``model`` (a path, bytes or ``onnx.ModelProto``).

    ``input_shapes`` fixes the shapes of inputs the model leaves symbolic (a batch dim, say);
    inputs still symbolic get -1 dims, and ``compile_graph`` gives a runner compiled per input
    shape. ``converters`` adds or replaces node converters by ONNX op type (see ``_nodes``).
    """
    proto = load_model(model)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
    given = dict(input_shapes or {})
    if given:
        ranks = {i.name: len(i.type.tensor_type.shape.dim) for i in proto.graph.input}
        for name, dims in given.items():
            if name not in ranks:
                raise OnnxImportError(f"input_shapes names {name!r}; the model's inputs are {sorted(ranks)}")
            if len(dims) != ranks[name]:
                raise OnnxImportError(f"input_shapes gives {name!r} {len(dims)} dims; the model declares {ranks[name]}")
        own = onnx.ModelProto()
        own.CopyFrom(proto)  # the caller's model keeps its symbolic dims
        proto = own
        for info in proto.graph.input:
            if info.name in given:
                dims = info.type.tensor_type.shape.dim
                for d, size in zip(dims, given[info.name]):
                    d.Clear()
                    d.dim_value = int(size)
    shapes, dtypes = _value_infos(proto)
    used = {name for node in proto.graph.node for name in node.input} | {o.name for o in proto.graph.output}
    b = Builder(opset, shapes, dtypes, used)
    table = dict(CONVERTERS) | dict(converters or {})
    b.values.update((t.name, onnx.numpy_helper.to_array(t)) for t in proto.graph.initializer)
    inputs: dict[str, int] = {}
    for info in model_inputs(proto):
        elem_type = info.type.tensor_type.elem_type
        if elem_type not in DTYPES:
            raise UnsupportedError(f"input {info.name!r} has ONNX element type {elem_type}; triodnn takes "
                                   + ", ".join(DTYPES.values()))
        inputs[info.name] = b.graph_input(info.name, DTYPES[elem_type], declared_dims(info)).id
    for node in proto.graph.node:
        _convert(b, node, table)
    outputs: dict[str, int] = {}
    produced = {lt.id for op in b.graph.ops for lt in op.outputs}
    for info in proto.graph.output:
        lt = b.tensor(info.name)
        if lt.id not in produced:  # an input or a constant passed straight through: a copy
            passed = b.new(lt.dtype, lt.shape)
            b.add("Reorder", [lt], [passed], name=f"output {info.name}")
            lt = passed
        elif b.graph.consumers(lt.id):  # a node reads it too: oneDNN's End keeps it a graph output
            b.add("End", [lt], [], name=f"output {info.name}")
        outputs[info.name] = lt.id
    read = frozenset(lt.id for lt in b.graph.input_tensors())
    return OnnxGraph(b.graph, inputs, outputs, b.constants, b.wildcard_nodes, opset,
                     fed=tuple(name for name, lt_id in inputs.items() if lt_id in read))


# Random nodes differ at every run; a DequantizeLinear of int8 weights stays an op, so the int8
# patterns (Dequantize -> Convolution / MatMul -> Quantize) still fuse.
_NOT_FOLDED = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                         "DequantizeLinear", "QuantizeLinear"})


def _convert(b: Builder, node: onnx.NodeProto, table: Mapping[str, Callable]) -> None:
    present = [name for name in node.input if name]
    if node.domain in ("", "ai.onnx") and all(b.known(name) is not None for name in present) \
            and node.op_type not in _NOT_FOLDED:
        for name, value in zip([n for n in node.output if n], run_node(node, [b.values[n] for n in present], b.opset)):
            b.values[name] = value
        return
    if node.op_type == "Shape" and len(present) == 1 and b.shape(present[0]) is not None:
        attrs_ = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        full = np.array(b.shape(present[0]), np.int64)
        b.values[node.output[0]] = full[attrs_.get("start", 0):attrs_.get("end", len(full))]
        return
    convert = table.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    if convert is None or convert(b, node, {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}) is False:
        b.wildcard(node)
