"""triodnn.graph: oneDNN's Graph API on triodnn's engines and streams.

    graph = triodnn.graph.load("sdpa.json")           # or Graph("cpu") and add_op(Op(...))
    for partition in graph.get_partitions():          # policy "fusion" (default) or "debug"
        compiled = await partition.compile(engine)
        inputs = [await Tensor.from_numpy(lt, engine, array) for lt, array in ...]
        outputs = [Tensor(lt, engine) for lt in compiled.outputs]
        await compiled.execute(stream, inputs, outputs)

Logical tensors describe edges (shape, dtype, layout); ops connect them; partitions group the
ops that compile together; compiled partitions run on a stream and return awaitable events.
Compiled partitions are cached process-wide (``get/set_compiled_partition_cache_capacity``,
``compiled_partition_cache_statistics``); inputs marked ``constant`` and given as arrays are
uploaded once per engine (``get/set_constant_tensor_cache_capacity``,
``constant_tensor_cache_statistics``, ``clear_constant_tensor_cache``). Whole graphs run as
DAGs on one stream through ``compile_graph``'s ``GraphRunner``: ``await runner.run(stream, inputs)``, or many requests with
``async with runner.map(inputs, stream=stream) as results: async for outputs in results: ...``;
over several engines through ``compile_graph_pool``'s ``EnginePool`` (``pool.map(inputs)``).
"""

# Every op kind registers itself (graph.ops, by family) before anything can look one up.
from . import ops as ops
from ._batching import BatcherStatistics, DynamicBatcher
from ._compile_graph import compile_graph
from ._compiled_partition import CompiledPartition
from ._compiled_partition_cache import (
    CompiledPartitionCacheStatistics,
    compiled_partition_cache_statistics,
    get_compiled_partition_cache_capacity,
    set_compiled_partition_cache_capacity,
)
from ._constant_cache import (
    ConstantTensorCacheStatistics,
    clear_constant_tensor_cache,
    constant_tensor_cache_statistics,
    get_constant_tensor_cache_capacity,
    set_constant_tensor_cache_capacity,
)
from ._dynamic import DynamicGraphRunner
from ._engine_pool import (
    ENGINE_FAILURES,
    EnginePool,
    EnginePoolStatistics,
    EngineStatistics,
    PoolResult,
    compile_graph_pool,
)
from ._execution import GraphRunner, GraphRunnerStatistics
from ._graph import Graph
from ._handlers import Handler, MissingHandlerError
from ._json import dumps, from_dict, load, save, to_dict
from ._layouts import ROW_MAJOR
from ._logical_tensor import UNKNOWN_DIM, LogicalTensor
from ._op import Op
from ._partition import Partition
from ._pipeline import Pipeline, PipelineStatistics
from ._progress import progress_bar
from ._tensor import Tensor

__all__ = [
    "BatcherStatistics",
    "CompiledPartition",
    "DynamicBatcher",
    "ENGINE_FAILURES",
    "EnginePool",
    "EnginePoolStatistics",
    "EngineStatistics",
    "PoolResult",
    "compile_graph_pool",
    "CompiledPartitionCacheStatistics",
    "ConstantTensorCacheStatistics",
    "Graph",
    "DynamicGraphRunner",
    "GraphRunner",
    "GraphRunnerStatistics",
    "Handler",
    "LogicalTensor",
    "MissingHandlerError",
    "Op",
    "Partition",
    "Pipeline",
    "PipelineStatistics",
    "ROW_MAJOR",
    "Tensor",
    "UNKNOWN_DIM",
    "clear_constant_tensor_cache",
    "compile_graph",
    "compiled_partition_cache_statistics",
    "constant_tensor_cache_statistics",
    "dumps",
    "from_dict",
    "get_compiled_partition_cache_capacity",
    "get_constant_tensor_cache_capacity",
    "load",
    "progress_bar",
    "save",
    "set_compiled_partition_cache_capacity",
    "set_constant_tensor_cache_capacity",
    "to_dict",
]
