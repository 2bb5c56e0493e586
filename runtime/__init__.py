"""triodnn: oneDNN's runtime ideas for async Python, on trio and pyopencl.

    async with triodnn.open_runtime() as rt:
        engine = await rt.engine()                      # PoCL's CPU device by default
        stream = await engine.stream(triodnn.StreamFlags.out_of_order)
        relu = await engine.create_primitive(triodnn.EltwiseDesc("relu", src_desc))
        done = stream.execute(relu, {"src": x, "dst": y}, deps=[...])
        await done
"""

from . import ocl_interop, trace
from ._blocking import Blocking, BlockingPortal, start_blocking
from ._engine import Engine
from ._event import Event, ProfilingTimes
from ._instruments import Instrument, add_instrument, remove_instrument
from ._memory import Memory
from ._primitive import Primitive
from ._primitive_cache import (
    PrimitiveCacheStatistics,
    get_primitive_cache_capacity,
    primitive_cache_statistics,
    set_primitive_cache_capacity,
)
from ._runtime import Runtime, available_engines, current_runtime, open_runtime
from ._stream import Stream, StreamFlags, StreamStatistics
from ._values import (
    ArgumentMismatchError,
    BatchNormInferenceDesc,
    BinaryDesc,
    BuildError,
    CacheBlobError,
    ClosedError,
    ConcatDesc,
    ConvolutionDesc,
    DependencyError,
    DeviceIdentity,
    DeviceInfo,
    EltwiseDesc,
    EngineIdentity,
    EngineMismatchError,
    EngineNotFoundError,
    ExecutionError,
    GenIndexDesc,
    GroupNormDesc,
    InvalidArgumentError,
    InvalidGraphError,
    LayerNormDesc,
    MatmulDesc,
    MemoryDesc,
    MissingArgumentError,
    NotSubmittedError,
    PoolingDesc,
    PrimitiveImpl,
    PrimitiveKey,
    ProfilingError,
    ReductionDesc,
    ReorderDesc,
    RMSNormDesc,
    SdpaDesc,
    ShapeInferenceError,
    SoftmaxDesc,
    SumDesc,
    TriodnnError,
    UnsupportedError,
)
from ._version import __version__
from .graph import (
    CompiledPartitionCacheStatistics,
    compiled_partition_cache_statistics,
    get_compiled_partition_cache_capacity,
    set_compiled_partition_cache_capacity,
)

__all__ = [
    "Instrument",
    "add_instrument",
    "remove_instrument",
    "BatchNormInferenceDesc",
    "Blocking",
    "BlockingPortal",
    "GenIndexDesc",
    "GroupNormDesc",
    "LayerNormDesc",
    "PoolingDesc",
    "RMSNormDesc",
    "ArgumentMismatchError",
    "BinaryDesc",
    "BuildError",
    "CacheBlobError",
    "ClosedError",
    "CompiledPartitionCacheStatistics",
    "ConcatDesc",
    "ConvolutionDesc",
    "DependencyError",
    "DeviceIdentity",
    "DeviceInfo",
    "EltwiseDesc",
    "Engine",
    "EngineIdentity",
    "EngineMismatchError",
    "EngineNotFoundError",
    "Event",
    "ExecutionError",
    "InvalidArgumentError",
    "InvalidGraphError",
    "MatmulDesc",
    "Memory",
    "MemoryDesc",
    "MissingArgumentError",
    "NotSubmittedError",
    "Primitive",
    "PrimitiveCacheStatistics",
    "PrimitiveImpl",
    "PrimitiveKey",
    "ProfilingError",
    "ProfilingTimes",
    "ReductionDesc",
    "ReorderDesc",
    "Runtime",
    "SdpaDesc",
    "ShapeInferenceError",
    "SoftmaxDesc",
    "Stream",
    "StreamFlags",
    "StreamStatistics",
    "SumDesc",
    "TriodnnError",
    "UnsupportedError",
    "available_engines",
    "compiled_partition_cache_statistics",
    "current_runtime",
    "get_compiled_partition_cache_capacity",
    "get_primitive_cache_capacity",
    "ocl_interop",
    "trace",
    "open_runtime",
    "primitive_cache_statistics",
    "set_compiled_partition_cache_capacity",
    "set_primitive_cache_capacity",
    "start_blocking",
    "__version__",
]
