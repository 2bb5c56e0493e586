"""Primitive kinds that fail on purpose, declared in the op registry like any other, for the tests
of failed creations (the primitive cache's, the stress test's): one whose generated source the
device compiler refuses, one whose generator raises."""

from __future__ import annotations

import attrs

import triodnn
from triodnn import MemoryDesc
from triodnn.kernels import KernelSpec


@attrs.frozen
class BrokenDesc:
    """A descriptor whose generated source is not OpenCL C: the device compiler refuses it."""

    n: int

    kind = "test_broken"

    @property
    def label(self) -> str:
        return f"test_broken:{self.n}"

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        return {"src": MemoryDesc((self.n,)), "dst": MemoryDesc((self.n,))}

    def generate(self, config) -> KernelSpec:
        return KernelSpec(
            source="__kernel void broken(__global const float* src, __global float* dst) "
                   "{ this is not OpenCL C; }\n",
            name="broken",
            arg_names=("src", "dst"),
            global_size=(16,),
            local_size=(16,),
            impl="test:broken",
        )


@attrs.frozen
class RaisingDesc:
    """A descriptor whose source generation itself raises ``error``."""

    n: int
    error: type = RuntimeError

    kind = "test_raising"

    @property
    def label(self) -> str:
        return f"test_raising:{self.n}"

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        return {"src": MemoryDesc((self.n,)), "dst": MemoryDesc((self.n,))}

    def generate(self, config) -> KernelSpec:
        raise self.error(f"generator of {self.label} gave up")


triodnn.kernels.register(BrokenDesc, generate=BrokenDesc.generate)
triodnn.kernels.register(RaisingDesc, generate=RaisingDesc.generate)
