"""oneDNN's serialized graph JSON: load it into a Graph, and save a Graph the same way.

The schema is the one oneDNN writes with ``ONEDNN_GRAPH_DUMP=graph`` and benchdnn reads:
``version``, ``engine_kind``, ``fpmath_mode``, ``graph`` (ops with ``id``, ``name``, ``kind``,
``attrs`` as ``{name: {"type", "value"}}``, ``inputs`` and ``outputs`` as logical tensors with
``id``, ``dtype``, ``shape``, ``stride``, ``layout_type``, ``property_type``), and optionally
``input_ports`` / ``output_ports``. Every malformed piece is an ``InvalidGraphError`` that says
where it is (``graph[3].inputs[1].shape``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .._values._errors import InvalidArgumentError, InvalidGraphError
from ._graph import Graph
from ._logical_tensor import LogicalTensor
from ._op import Op

FORMAT_VERSION = "3.0.0"

_ATTR_TYPES = ("bool", "s64", "s64[]", "f32", "f32[]", "string")


def _attr_value(where: str, entry) -> object:
    if not isinstance(entry, dict) or "type" not in entry or "value" not in entry:
        raise InvalidGraphError(f"{where} must be {{\"type\": ..., \"value\": ...}}, got {entry!r}")
    kind, value = entry["type"], entry["value"]
    if kind not in _ATTR_TYPES:
        raise InvalidGraphError(f"{where}: attribute type {kind!r} is not one of {', '.join(_ATTR_TYPES)}")
    try:
        if kind == "bool":
            if value not in (0, 1, True, False):
                raise ValueError
            return bool(value)
        if kind == "s64":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError
            return int(value)
        if kind == "f32":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError
            return float(value)
        if kind == "string":
            if not isinstance(value, str):
                raise ValueError
            return value
        if not isinstance(value, list):
            raise ValueError
        if kind == "s64[]":
            if any(isinstance(v, bool) or not isinstance(v, int) for v in value):
                raise ValueError
            return [int(v) for v in value]
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
            raise ValueError
        return [float(v) for v in value]
    except ValueError:
        raise InvalidGraphError(f"{where}: value {value!r} is not a {kind}") from None


def _tensor(where: str, entry) -> LogicalTensor:
    if not isinstance(entry, dict):
        raise InvalidGraphError(f"{where} must be an object, got {type(entry).__name__}")
    missing = [k for k in ("id", "dtype") if k not in entry]
    if missing:
        raise InvalidGraphError(f"{where} lacks {', '.join(missing)}")
    if "shape" not in entry:
        # oneDNN always writes a shape (unknown rank is [-9223372036854775808], see
        # _tensor_entry); without one the graph loaded and failed only at compile.
        raise InvalidGraphError(
            f"{where}: logical tensor {entry['id']!r} lacks 'shape': write its dims (-1 for a dim "
            "known only at run time), or null where even the rank is unknown"
        )
    try:
        return LogicalTensor(
            entry["id"],
            entry["dtype"],
            entry.get("shape"),
            entry.get("stride"),
            entry.get("layout_type", "undef"),
            entry.get("layout_id") if entry.get("layout_type") == "opaque" else None,
            entry.get("property_type", "undef"),
        )
    except InvalidArgumentError as exc:
        raise InvalidGraphError(f"{where}: {exc}") from None


def from_dict(document) -> Graph:
    """A Graph (ops added and checked, not yet finalized) from a parsed JSON document."""
    if not isinstance(document, dict):
        raise InvalidGraphError(f"a serialized graph is a JSON object, got {type(document).__name__}")
    if "graph" not in document or not isinstance(document["graph"], list):
        raise InvalidGraphError("a serialized graph needs a 'graph' list of ops")
    ports = {}
    for key in ("input_ports", "output_ports"):
        value = document.get(key)
        if value is not None and (not isinstance(value, list) or not all(isinstance(v, int) for v in value)):
            raise InvalidGraphError(f"{key} must be a list of logical tensor ids, got {value!r}")
        ports[key] = value
    graph = Graph(document.get("engine_kind", "cpu"), document.get("fpmath_mode", "strict"), **ports)
    for i, entry in enumerate(document["graph"]):
        where = f"graph[{i}]"
        if not isinstance(entry, dict):
            raise InvalidGraphError(f"{where} must be an object, got {type(entry).__name__}")
        for key in ("id", "kind"):
            if key not in entry:
                raise InvalidGraphError(f"{where} lacks {key!r}")
        attrs_ = entry.get("attrs", {})
        if not isinstance(attrs_, dict):
            raise InvalidGraphError(f"{where}.attrs must be an object, got {type(attrs_).__name__}")
        inputs, outputs = entry.get("inputs", []), entry.get("outputs", [])
        if not isinstance(inputs, list) or not isinstance(outputs, list):
            raise InvalidGraphError(f"{where}: inputs and outputs must be lists")
        try:
            op = Op(
                entry["id"],
                entry["kind"],
                [_tensor(f"{where}.inputs[{j}]", t) for j, t in enumerate(inputs)],
                [_tensor(f"{where}.outputs[{j}]", t) for j, t in enumerate(outputs)],
                {name: _attr_value(f"{where}.attrs.{name}", v) for name, v in attrs_.items()},
                entry.get("name", "") or "",
            )
            graph.add_op(op)
        except InvalidGraphError as exc:
            if str(exc).startswith("graph["):
                raise
            raise InvalidGraphError(f"{where}: {exc}") from None
    return graph


def load(source) -> Graph:
    """A Graph from a path, a JSON string, bytes, or an already parsed dict."""
    if isinstance(source, dict):
        return from_dict(source)
    if isinstance(source, (bytes, bytearray)):
        text = source.decode("utf-8", errors="replace")
    elif isinstance(source, Path) or (isinstance(source, str) and not source.lstrip().startswith(("{", "["))):
        path = Path(os.fspath(source))
        try:
            text = path.read_bytes().decode("utf-8", errors="replace")
        except OSError as exc:
            raise InvalidGraphError(f"cannot read graph file {str(path)!r}: {exc.strerror}") from None
        except ValueError as exc:  # a NUL byte in the path
            raise InvalidGraphError(f"cannot read graph file {str(path)!r}: {exc}") from None
    elif isinstance(source, str):
        text = source
    else:
        raise InvalidGraphError(f"cannot load a graph from {type(source).__name__}")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidGraphError(f"malformed graph JSON: {exc}") from None
    except RecursionError:
        raise InvalidGraphError("malformed graph JSON: nested too deeply") from None
    return from_dict(document)


def _attr_entry(value) -> dict:
    if isinstance(value, bool):
        return {"type": "bool", "value": int(value)}
    if isinstance(value, int):
        return {"type": "s64", "value": value}
    if isinstance(value, float):
        return {"type": "f32", "value": value}
    if isinstance(value, str):
        return {"type": "string", "value": value}
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return {"type": "s64[]", "value": list(value)}
        return {"type": "f32[]", "value": [float(v) for v in value]}
    raise InvalidGraphError(f"attribute value {value!r} has no JSON attribute type")


_UNKNOWN = -(2**63)


def _tensor_entry(lt: LogicalTensor) -> dict:
    shape = [_UNKNOWN] if lt.shape is None else [(_UNKNOWN if d == -1 else d) for d in lt.shape]
    if lt.strides is not None:
        stride = [(_UNKNOWN if s == -1 else s) for s in lt.strides]
    else:
        stride = [_UNKNOWN] * len(shape)
    entry = {"id": lt.id, "dtype": lt.dtype, "shape": shape, "stride": stride,
             "layout_type": lt.layout_type, "property_type": lt.property_type}
    if lt.layout_type == "opaque":
        entry["layout_id"] = lt.layout_id
    return entry


def to_dict(graph: Graph) -> dict:
    """The graph in oneDNN's schema; ``load(to_dict(g))`` rebuilds an equal graph."""
    document: dict[str, object] = {
        "version": FORMAT_VERSION,
        "engine_kind": graph.engine_kind,
        "fpmath_mode": graph.fpmath_mode,
        "graph": [
            {
                "id": op.id,
                "name": op.name,
                "kind": op.kind,
                "attrs": {name: _attr_entry(value) for name, value in op.attrs.items()},
                "inputs": [_tensor_entry(lt) for lt in op.inputs],
                "outputs": [_tensor_entry(lt) for lt in op.outputs],
            }
            for op in graph.ops
        ],
    }
    document["input_ports"] = graph.input_ports if graph.input_ports is not None else [
        lt.id for lt in graph.input_tensors()]
    document["output_ports"] = graph.output_ports if graph.output_ports is not None else [
        lt.id for lt in graph.output_tensors()]
    return document


def dumps(graph: Graph) -> str:
    return json.dumps(to_dict(graph), indent=2)


def save(graph: Graph, path) -> None:
    Path(os.fspath(path)).write_text(dumps(graph))
