"""Identities and cache keys: what makes two devices, engines or primitive creations the same."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ._kernel_spec import KernelConfig, KernelSpec
from ._op_desc import OpDesc


@attrs.frozen
class DeviceInfo:
    """What triodnn knows of a device, read once when the engine opens."""

    name: str
    vendor: str
    platform: str
    platform_version: str
    driver: str
    version: str
    type: str
    max_compute_units: int
    max_work_group_size: int
    global_mem_size: int
    local_mem_size: int
    queue_properties: int
    single_fp_config: int
    extensions: tuple[str, ...] = attrs.field(repr=False)
    # Built-ins take float16 arguments as float8 halves (PoCL 3.0 on AMD Zen 4: see
    # triodnn.kernels._float16_calls); probed at engine open, for CPU devices.
    splits_float16_calls: bool = False
    native_vector_width: int = 16  # floats per SIMD register (CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT)
    # NVIDIA's compute capability as major * 10 + minor (cl_nv_device_attribute_query); 0 elsewhere.
    nvidia_sm: int = 0


@attrs.frozen(cache_hash=True)
class DeviceIdentity:
    """The device as cache keys see it: compiled code is valid for any context of this identity."""

    platform: str
    platform_version: str
    device: str
    vendor: str
    driver: str
    type: str

    @classmethod
    def of(cls, info: DeviceInfo) -> DeviceIdentity:
        return cls(info.platform, info.platform_version, info.name, info.vendor, info.driver, info.type)


@attrs.frozen(cache_hash=True)
class EngineIdentity:
    """Device identity plus the OpenCL context: what per-engine resources are keyed on."""

    device: DeviceIdentity
    context: int


@attrs.frozen(cache_hash=True)
class PrimitiveKey:
    """Everything that decides a primitive's compiled code, and nothing per-context.

    The op descriptor carries the memory descriptors and algorithm parameters; ``attr`` the
    attributes (post-ops, scales; none yet); ``config`` the implementation's work-group and
    vector configuration; ``device`` the device identity (platform, device, driver). The hash is
    computed once; equality compares every field.
    """

    kind: str
    desc: OpDesc
    attr: tuple
    impl: str
    config: KernelConfig
    engine_kind: str
    runtime_kind: str
    device: DeviceIdentity
    build_options: tuple[str, ...]


@attrs.frozen(eq=False)
class PrimitiveImpl:
    """A cache entry: the immutable implementation, valid in any context of its device."""

    key: PrimitiveKey
    spec: KernelSpec = attrs.field(repr=False)
    # Reads the device binary: bytes, or None where no context of this process can give it any
    # more (the kernels were evicted before anyone asked, or their device was lost). A call, not
    # bytes: PoCL compiles each kernel of a program once more to hand its binary out, so it is
    # read only by those who need it (a second context of the device, a cache blob). Blocking;
    # the first call may take a compile.
    binary: Callable[[], bytes | None] = attrs.field(repr=False)
    build_seconds: float

    @property
    def impl(self) -> str:
        return self.spec.impl


@attrs.frozen(eq=False)
class StoredBinary:
    """A binary already in hand (read from a cache blob): ``PrimitiveImpl.binary`` for it."""

    data: bytes = attrs.field(repr=False)

    def __call__(self) -> bytes:
        return self.data
