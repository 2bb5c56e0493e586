"""Engines: one OpenCL device in one context, with its identity."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import numpy as np
import pyopencl as cl

from ._errors import ClosedError, InvalidArgumentError
from ._memory import Memory
from ._memory_desc import MemoryDesc
from ._primitive import Primitive
from ._stream import Stream, StreamFlags
from .actors import EngineActor
from .actors._engine_actor import BuildRequest
from .kernels import select_config

if TYPE_CHECKING:
    from ._runtime import Runtime

ENGINE_KINDS = ("cpu", "gpu", "any")


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
    queue_properties: int
    single_fp_config: int
    extensions: tuple[str, ...] = attrs.field(repr=False)


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


@attrs.define(eq=False)
class Engine:
    """One OpenCL device in one context. Open with ``await runtime.engine(kind, index)``."""

    kind: str
    index: int
    info: DeviceInfo = attrs.field(repr=False)
    _actor: EngineActor = attrs.field(alias="actor", repr=False)
    _runtime: Runtime = attrs.field(alias="runtime", repr=False)
    out_of_order_strategy: object = attrs.field(repr=False, default=None)
    _host_stream: Stream | None = attrs.field(default=None, init=False, repr=False)

    def __str__(self) -> str:
        return f"{self.kind}:{self.index} ({self.info.name})"

    @property
    def identity(self) -> EngineIdentity:
        return EngineIdentity(DeviceIdentity.of(self.info), self.cl_context.int_ptr)

    @property
    def cl_context(self) -> cl.Context:
        return self._actor.context

    @property
    def cl_device(self) -> cl.Device:
        return self._actor.device

    @property
    def closed(self) -> bool:
        return self._actor.closed

    @property
    def _build_options(self) -> tuple[str, ...]:
        # OpenCL lets f32 division and sqrt be off by 2.5-3 ulp; where the device can round them
        # correctly, ask for it, so binary div matches numpy as add and mul do.
        if self.info.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT:
            return ("-cl-fp32-correctly-rounded-divide-sqrt",)
        return ()

    def statistics(self):
        """Live buffers and bytes, programs built, builds in flight (a frozen record)."""
        return self._actor.statistics()

    def memory(self, desc: MemoryDesc) -> Memory:
        """A new, uninitialised memory object of ``desc`` on this engine."""
        if not isinstance(desc, MemoryDesc):
            raise InvalidArgumentError(f"desc is {type(desc).__name__}, expected triodnn.MemoryDesc")
        if self._actor.closed:
            raise ClosedError(f"engine {self} is closed (its runtime has shut down)")
        return Memory(self, desc, buffer=self._actor.allocate(desc.nbytes))

    async def from_numpy(self, array, desc: MemoryDesc | None = None) -> Memory:
        """A memory object holding a copy of ``array`` (dense row-major unless ``desc`` says)."""
        array = np.asarray(array)
        memory = self.memory(desc if desc is not None else MemoryDesc.like(array))
        try:
            await memory.write(array)
        except BaseException:
            memory.release()
            raise
        return memory

    async def stream(self, flags: StreamFlags = StreamFlags.in_order) -> Stream:
        """A new stream on this engine; ``out_of_order`` picks the device's strategy."""
        return await self._runtime._open_stream(self, flags)

    async def create_primitive(self, desc) -> Primitive:
        """Compile ``desc`` (an EltwiseDesc, BinaryDesc …) for this engine."""
        if not hasattr(desc, "generate") or not hasattr(desc, "arg_descs"):
            raise InvalidArgumentError(f"desc is {type(desc).__name__}, not a triodnn primitive descriptor")
        config = select_config(self.info.type, self.info.max_work_group_size)
        spec = desc.generate(config)
        request = BuildRequest(
            source=spec.source,
            kernel_name=spec.name,
            options=self._build_options,
            warmup_local_size=spec.local_size,
            warmup_buffer_bytes=tuple(desc.arg_descs[name].nbytes for name in spec.arg_names),
        )
        built = await self._actor.build(request)
        return Primitive(self, desc, spec, kernel=built.kernel, build_seconds=built.build_seconds)
