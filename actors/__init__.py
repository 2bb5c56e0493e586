"""The only code that owns OpenCL objects and concurrency.

Each actor is a trio task that owns its OpenCL state and serves requests from a memory channel;
requests carry a reply slot. Blocking OpenCL calls (program builds, waits) run in worker threads,
and completions come back through event callbacks and the completion actor.
"""

from ._allocator import DeviceAllocator
from ._allocator import SvmBuffer as SvmBuffer
from ._commands import Barrier, Command, KernelLaunch, KernelSequence, Marker, ReadBuffer, WriteBuffer
from ._compiler import BuildRequest, BuiltKernel, Compiler, build_program
from ._completion import CompletionActor
from ._context_pool import ContextPool, ContextPoolStatistics, context_pool
from ._device import DeviceActor
from ._devices import (
    CPU_RUNTIME_ORDER,
    DeviceProbe,
    DeviceRecord,
    UnusableDevice,
    cpu_runtime_rank,
    describe_device,
    device_kind,
    float16_calls_split,
    list_devices,
    probe_builds,
    probe_device,
    registered_devices,
    setup_problems,
    unusable_devices,
    vouch_for,
)
from ._health import DeviceHealth, probe_context
from ._icd import find_intel_cpu_runtime, pip_driver_problems, register_pip_drivers
from ._kernel_cache import KernelCache
from ._ooo_policy import OutOfOrderStrategy, choose_out_of_order_strategy, may_overlap
from ._plan import LaunchPlan, PlanStep
from ._primitive_cache import (
    COMPILED_PARTITION_CAPACITY_ENV_VARS,
    CacheActor,
    CacheStatistics,
    CompiledPartitionCacheStatistics,
    PrimitiveCache,
    PrimitiveCacheStatistics,
    capacity_from_env,
    global_compiled_partition_cache,
    global_primitive_cache,
)
from ._reply import ReplySlot
from ._stream_actor import StreamActor
from ._submission import Submission, execution_status

__all__ = [
    "Barrier",
    "BuildRequest",
    "BuiltKernel",
    "COMPILED_PARTITION_CAPACITY_ENV_VARS",
    "CacheActor",
    "CacheStatistics",
    "Command",
    "CompiledPartitionCacheStatistics",
    "ContextPool",
    "ContextPoolStatistics",
    "PrimitiveCache",
    "PrimitiveCacheStatistics",
    "capacity_from_env",
    "context_pool",
    "global_compiled_partition_cache",
    "global_primitive_cache",
    "CompletionActor",
    "Compiler",
    "build_program",
    "DeviceActor",
    "DeviceHealth",
    "probe_context",
    "DeviceAllocator",
    "CPU_RUNTIME_ORDER",
    "DeviceProbe",
    "DeviceRecord",
    "UnusableDevice",
    "cpu_runtime_rank",
    "find_intel_cpu_runtime",
    "pip_driver_problems",
    "probe_builds",
    "probe_device",
    "register_pip_drivers",
    "registered_devices",
    "setup_problems",
    "unusable_devices",
    "vouch_for",
    "KernelCache",
    "KernelLaunch",
    "KernelSequence",
    "LaunchPlan",
    "PlanStep",
    "may_overlap",
    "Marker",
    "OutOfOrderStrategy",
    "ReadBuffer",
    "ReplySlot",
    "StreamActor",
    "Submission",
    "execution_status",
    "WriteBuffer",
    "choose_out_of_order_strategy",
    "describe_device",
    "float16_calls_split",
    "device_kind",
    "list_devices",
]
