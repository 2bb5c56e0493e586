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
portal (``prepare(model, device).run(inputs)``), the way ONNX's own backend tests drive it;
``check_model`` checks a model against the data sets beside it and times it (``triodnn onnx``);
without data sets, against ``reference_outputs``: ONNX Runtime where it is installed, else
ONNX's reference evaluator (``reference_name()`` says which).
"""

from ._builder import Builder as Builder
from ._builder import OnnxImportError as OnnxImportError
from ._check import DataSetCheck as DataSetCheck
from ._check import ModelCheck as ModelCheck
from ._check import check_model as check_model
from ._check import reference_name as reference_name
from ._check import reference_outputs as reference_outputs
from ._import import OnnxGraph as OnnxGraph
from ._import import from_onnx as from_onnx
from ._import import load_model as load_model
from ._nodes import CONVERTERS as CONVERTERS

__all__ = ["CONVERTERS", "Builder", "DataSetCheck", "ModelCheck", "OnnxGraph", "OnnxImportError", "check_model",
           "from_onnx", "load_model", "reference_name", "reference_outputs"]
