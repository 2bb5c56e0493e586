"""triodnn.graph: oneDNN's Graph API on triodnn's engines and streams.

    graph = triodnn.graph.load("sdpa.json")           # or Graph("cpu") and add_op(Op(...))
    for partition in graph.get_partitions():          # policy "fusion" (default) or "debug"
        compiled = await partition.compile(engine)
        inputs = [await Tensor.from_numpy(lt, engine, array) for lt, array in ...]
        outputs = [Tensor(lt, engine) for lt in compiled.outputs]
        await compiled.execute(stream, inputs, outputs)

Logical tensors describe edges (shape, dtype, layout); ops connect them; partitions group the
ops that compile together; compiled partitions run on a stream and return awaitable events.
"""

from ._compiled_partition import CompiledPartition
from ._graph import Graph
from ._json import dumps, from_dict, load, save, to_dict
from ._layouts import ROW_MAJOR
from ._logical_tensor import UNKNOWN_DIM, LogicalTensor
from ._op import Op
from ._partition import Partition
from ._runner import GraphRunner, Handler, MissingHandlerError, Pipeline, compile_graph
from ._tensor import Tensor

__all__ = [
    "CompiledPartition",
    "Graph",
    "GraphRunner",
    "Handler",
    "LogicalTensor",
    "MissingHandlerError",
    "Op",
    "Partition",
    "Pipeline",
    "ROW_MAJOR",
    "Tensor",
    "UNKNOWN_DIM",
    "compile_graph",
    "dumps",
    "from_dict",
    "load",
    "save",
    "to_dict",
]
