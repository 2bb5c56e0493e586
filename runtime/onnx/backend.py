"""ONNX's backend interface on triodnn, as ``onnxruntime.backend`` offers it for ONNX Runtime.

    import triodnn.onnx.backend as backend
    rep = backend.prepare(model, "CPU")          # "GPU", or an engine spec: "cpu:0", "gpu:1"
    outputs = rep.run([x])                       # or {"input name": x}; outputs in model order

``prepare`` imports the model (``from_onnx``), compiles it on the engine the device names and
returns a ``TriodnnRep``; the work runs in a blocking portal (``triodnn.start_blocking``) the
module starts at its first use and closes at interpreter exit (or at ``close()``), so the interface is the plain
synchronous one ONNX's backend tests (``onnx.backend.test.BackendTest``) call. Nodes without a
converter run through ONNX's reference evaluator (``OnnxGraph.handlers``).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Mapping

import onnx
from onnx.backend.base import Backend, BackendRep, namedtupledict

from .._blocking import BlockingPortal, start_blocking
from .._runtime import available_engines
from .._values._errors import InvalidArgumentError
from ..graph import compile_graph
from ._import import OnnxGraph, from_onnx

_portal_lock = threading.Lock()
_portal: list[BlockingPortal] = []


def _shared_portal() -> BlockingPortal:
    """The module's portal, started at first use; closed at interpreter exit."""
    with _portal_lock:
        if not _portal:
            portal = start_blocking()
            atexit.register(portal.close)
            _portal.append(portal)
        return _portal[0]


def close() -> None:
    """Close the module's portal (its runtime, engines and thread) now rather than at exit; the
    next ``prepare`` starts a new one. Reps prepared before cannot run after it."""
    with _portal_lock:
        portals, _portal[:] = list(_portal), []
    for portal in portals:
        atexit.unregister(portal.close)
        portal.close()


def engine_spec(device: str) -> tuple[str, int]:
    """ONNX's device names ("CPU", "GPU", "CUDA") and triodnn's engine specs ("cpu:0",
    "gpu:1") as ``(kind, index)``."""
    if not isinstance(device, str) or not device:
        raise InvalidArgumentError(f"device {device!r}: expected 'CPU', 'GPU' or an engine spec such as 'gpu:0'")
    kind, _, index = device.lower().partition(":")
    kind = {"cuda": "gpu"}.get(kind, kind)
    if kind not in ("cpu", "gpu") or (index and not index.isdigit()):
        raise InvalidArgumentError(f"device {device!r}: expected 'CPU', 'GPU' or an engine spec such as 'gpu:0'")
    return kind, int(index or 0)


class TriodnnRep(BackendRep):
    """A model compiled on one engine: ``run(inputs)`` returns its outputs in the model's order."""

    def __init__(self, onnx_graph: OnnxGraph, runner, stream) -> None:
        self.onnx_graph = onnx_graph
        self._runner = runner
        self._stream = stream

    def run(self, inputs, **kwargs):
        names = list(self.onnx_graph.inputs)
        if isinstance(inputs, Mapping):
            unknown = sorted(set(inputs) - set(names))
            missing = [name for name in names if name not in inputs]
            if unknown or missing:
                raise InvalidArgumentError(f"inputs {unknown} are not the model's; it takes {names}" if unknown
                                           else f"inputs lack {missing}; the model takes {names}")
            arrays = [inputs[name] for name in names]
        else:
            arrays = list(inputs) if isinstance(inputs, list | tuple) else [inputs]
            if len(arrays) != len(names):
                raise InvalidArgumentError(f"{len(arrays)} inputs given; the model takes {len(names)}: {names}")
        results = self._runner.run(self._stream, self.onnx_graph.feeds(dict(zip(names, arrays))))
        return namedtupledict("Outputs", list(self.onnx_graph.outputs))(*self.onnx_graph.ordered_outputs(results))


class TriodnnBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> TriodnnRep:
        """``model`` (path, bytes or ModelProto) compiled on the engine ``device`` names;
        ``input_shapes`` (keyword) fixes symbolic input dims, as ``from_onnx`` takes it."""
        kind, index = engine_spec(device)
        onnx_graph = from_onnx(model, input_shapes=kwargs.get("input_shapes"))
        portal = _shared_portal()
        engine = portal.engine(kind, index)
        runner = compile_graph(onnx_graph.graph, engine, constants=onnx_graph.constants,
                               handlers=onnx_graph.handlers())
        return TriodnnRep(onnx_graph, runner, engine.stream())

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device: str = "CPU", outputs_info=None, **kwargs):
        raise NotImplementedError("triodnn runs whole models: wrap the node in a model and prepare it")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Whether this machine has an engine of the kind ``device`` names (ONNX's backend tests
        skip the devices this says no to)."""
        try:
            kind, index = engine_spec(device)
        except InvalidArgumentError:
            return False
        return sum(1 for record in available_engines() if record.kind == kind) > index


prepare = TriodnnBackend.prepare
run_model = TriodnnBackend.run_model
supports_device = TriodnnBackend.supports_device
is_compatible = TriodnnBackend.is_compatible
