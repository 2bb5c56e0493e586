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
from ._engine import DeviceIdentity, DeviceInfo, Engine, EngineIdentity
from ._values._errors import (
    ArgumentMismatchError,
    BuildError,
    CacheBlobError,
    ClosedError,
    DependencyError,
    EngineMismatchError,
    EngineNotFoundError,
    ExecutionError,
    InvalidArgumentError,
    InvalidGraphError,
    MissingArgumentError,
    NotSubmittedError,
    ProfilingError,
    ShapeInferenceError,
    TriodnnError,
    UnsupportedError,
)
from .graph import (
    CompiledPartitionCacheStatistics,
    compiled_partition_cache_statistics,
    get_compiled_partition_cache_capacity,
    set_compiled_partition_cache_capacity,
)
from ._event import Event, ProfilingTimes
from ._memory import Memory
from ._values._memory_desc import MemoryDesc
from ._primitive import Primitive
from ._pool_norm_desc import (
    BatchNormInferenceDesc,
    GroupNormDesc,
    LayerNormDesc,
    PoolingDesc,
    RMSNormDesc,
)
from ._primitive_cache import (
    PrimitiveCacheStatistics,
    get_primitive_cache_capacity,
    primitive_cache_statistics,
    set_primitive_cache_capacity,
)
from ._convolution_desc import ConvolutionDesc
from ._matmul_desc import MatmulDesc
from ._primitive_desc import BinaryDesc, EltwiseDesc
from ._reduction_desc import ReductionDesc, SoftmaxDesc
from ._reorder_desc import ReorderDesc
from ._sdpa_desc import SdpaDesc
from ._gen_index_desc import GenIndexDesc
from ._sum_concat_desc import ConcatDesc, SumDesc
from ._values._keys import PrimitiveImpl, PrimitiveKey
from ._runtime import Runtime, available_engines, current_runtime, open_runtime
from ._stream import Stream, StreamFlags, StreamStatistics

from ._version import __version__

__all__ = [
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
]
