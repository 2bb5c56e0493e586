"""What a kernel generator is given (the device's shape for kernels) and what it returns.

Pure values, shared by the kernels (which produce ``KernelSpec``s), the actors (which build and
launch them) and the cache keys (which include the ``KernelConfig``).
"""

from __future__ import annotations

import attrs

# Bytes of __local memory per work-group that OpenCL 1.2's full profile guarantees.
MIN_LOCAL_MEMORY = 32 * 1024


@attrs.frozen
class KernelConfig:
    """How a kernel is shaped for a device: items per work-item and the work-group size.

    PoCL keeps OpenCL math built-ins as calls, so on the CPU device each work-item takes a float16
    vector to amortise them; GPUs want one element per work-item and wide work-groups for
    coalesced access.

    ``local_memory`` is the device's ``__local`` memory per work-group in bytes: generators size
    their tiles to it. The default is the 32 KiB every full-profile OpenCL device guarantees; PoCL
    offers 1 MiB, NVIDIA 48 KiB, Oclgrind exactly 32 KiB (where a tile asking for more fails).

    ``split_float16_calls``: the device's compiler and its built-in library disagree on how a
    float16 argument travels (see ``_float16_calls``); the program source then passes float16
    to built-ins as float8 halves.

    ``native_vector_width``: floats per SIMD register of the device (``CL_DEVICE_NATIVE_VECTOR_
    WIDTH_FLOAT``: PoCL reports 16 with AVX-512, 8 with AVX2). The CPU kernels compute on float16
    vectors either way; where a float16 takes two registers, their register blocks hold half as
    many accumulators (the AVX-512 matmul block spilled on an AVX2 host: 55 against 145 GFLOP/s).
    """

    vector_width: int = attrs.field(validator=attrs.validators.in_((1, 2, 4, 8, 16)))
    local_size: int = attrs.field(validator=attrs.validators.gt(0))
    local_memory: int = attrs.field(default=MIN_LOCAL_MEMORY, validator=attrs.validators.ge(4096))
    split_float16_calls: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    native_vector_width: int = attrs.field(default=16, validator=attrs.validators.in_((1, 2, 4, 8, 16)))
    # NVIDIA's compute capability as an SM number (90 for an H100 or H200; 0 on other vendors):
    # which tensor-core instructions the kernels may issue as inline PTX (``matmul_mma``).
    nvidia_sm: int = attrs.field(default=0, validator=attrs.validators.ge(0))

    @property
    def name(self) -> str:
        # Implementation names embed it; cache keys hold the whole configuration.
        return f"v{self.vector_width}l{self.local_size}"


@attrs.frozen
class KernelSpec:
    """One generated kernel: its source, entry point and launch geometry.

    ``arg_names`` lists the memory arguments in kernel-parameter order; every other value is baked
    into the source, so a spec runs as is, with buffers only.

    ``ptx_target`` (NVIDIA only, e.g. ``"sm_90a"``): the kernel issues instructions of a newer PTX
    target than the one NVIDIA's OpenCL compiler writes (``sm_90``, where Hopper's ``wgmma`` is
    refused). Its source carries them inside PTX comments (``kernels._ptx``); the program is built
    to PTX, the comments opened, the target raised and the PTX built again. A spec with it runs
    only through a builder that does so (``actors.build_program``).
    """

    source: str
    name: str
    arg_names: tuple[str, ...]
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    impl: str
    ptx_target: str | None = None


def dense_strides(dims: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides, in elements, of a tensor with ``dims``."""
    strides = []
    step = 1
    for d in reversed(dims):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def is_dense(dims: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """True when the strides cover exactly prod(dims) elements with no gap or overlap, in any order."""
    order = sorted((s, d) for s, d in zip(strides, dims) if d != 1)
    step = 1
    for s, d in order:
        if s != step:
            return False
        step *= d
    return True
