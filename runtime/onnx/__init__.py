"""triodnn.onnx: ONNX models as triodnn graphs (the ``onnx`` extra: ``pip install 'triodnn[onnx]'``).

    onnx_graph = triodnn.onnx.from_onnx("model.onnx")       # path, bytes or onnx.ModelProto
    runner = await triodnn.graph.compile_graph(onnx_graph.graph, engine,
                                               constants=onnx_graph.constants,
                                               handlers=onnx_graph.handlers())
    outputs = await runner.run(stream, {onnx_graph.inputs["x"]: x})   # {output id: array}

Initializers and everything computable from them fold into constant inputs, uploaded once per
engine; nodes become oneDNN Graph ops (``_nodes.CONVERTERS``, by ONNX op type), so fusion, the
caches, ``map``, dynamic batching and engine pools apply as to any graph. A node without a
converter becomes a ``Wildcard`` op; ``handlers()`` runs those through ONNX's reference
evaluator on the host. ``triodnn.onnx.backend`` is ONNX's backend interface over a blocking
portal (``prepare(model, device).run(inputs)``), the way ONNX's own backend tests drive it.
"""

from ._builder import Builder as Builder
from ._builder import OnnxImportError as OnnxImportError
from ._import import OnnxGraph as OnnxGraph
from ._import import from_onnx as from_onnx
from ._import import load_model as load_model
from ._nodes import CONVERTERS as CONVERTERS

__all__ = ["CONVERTERS", "Builder", "OnnxGraph", "OnnxImportError", "from_onnx", "load_model"]
