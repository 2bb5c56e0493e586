"""What a generator returns, and the small helpers every generator shares."""

from __future__ import annotations

import math
import re

import numpy as np

from .._values._kernel_spec import MIN_LOCAL_MEMORY as MIN_LOCAL_MEMORY
from .._values._kernel_spec import KernelConfig as KernelConfig
from .._values._kernel_spec import KernelSpec as KernelSpec
from .._values._kernel_spec import dense_strides as dense_strides
from .._values._kernel_spec import is_dense as is_dense


def select_config(
    device_type: str, max_work_group_size: int, local_memory: int = MIN_LOCAL_MEMORY,
    split_float16_calls: bool = False, native_vector_width: int = 16, nvidia_sm: int = 0,
) -> KernelConfig:
    """Pick vector width and local size from the device type (``"cpu"`` or ``"gpu"``); tiles
    fit ``local_memory`` (the device's ``CL_DEVICE_LOCAL_MEM_SIZE``); CPU register blocks fit
    ``native_vector_width`` (floats per SIMD register: 8 on AVX2, 16 on AVX-512); GPU kernels may
    use the tensor cores of ``nvidia_sm`` (NVIDIA's compute capability, 0 for none)."""
    if device_type == "cpu":
        native = native_vector_width if native_vector_width in (1, 2, 4, 8, 16) else 16
        return KernelConfig(vector_width=16, local_size=min(16, max_work_group_size),
                            local_memory=local_memory, split_float16_calls=split_float16_calls,
                            native_vector_width=native)
    return KernelConfig(vector_width=1, local_size=min(256, max_work_group_size),
                        local_memory=local_memory, split_float16_calls=split_float16_calls, nvidia_sm=nvidia_sm)


# A declaration of __local arrays: the element type, then its declarators up to the semicolon
# (pointers, ``__local float* p``, do not match: no space between type and star).
_LOCAL_DECLARATION = re.compile(r"__local\s+(float|int|uint|half)(2|4|8|16)?\s+([^;]*);")
_ARRAY_LENGTH = re.compile(r"\w+\s*\[(\d+)\]")
_SCALAR_BYTES = {"float": 4, "int": 4, "uint": 4, "half": 2}


def local_memory_bytes(source: str) -> int:
    """Bytes of the ``__local`` arrays an OpenCL source declares (``__local TYPE a[N], b[M];``):
    what a work-group of its kernel takes, for checks that a tile fits the device."""
    return sum(
        _SCALAR_BYTES[t] * int(w or 1) * sum(int(n) for n in _ARRAY_LENGTH.findall(declarators))
        for t, w, declarators in _LOCAL_DECLARATION.findall(source)
    )


# Elements per work-item of the flat and row kernels on GPUs, from this many elements. One float
# per work-item ran relu / gelu_erf at 0.70-0.80x the copy bandwidth at 16M-64M elements on an
# H100 (bench_sweep.py); torch's vectorised kernels were at the copy's speed.
GPU_VECTOR, GPU_VECTOR_MIN = 4, 1 << 20

VECTOR_TYPES: dict[int, str] = {1: "float", 2: "float2", 4: "float4", 8: "float8", 16: "float16"}


def c_float(value: float) -> str:
    """An OpenCL C literal that denotes exactly ``float32(value)``."""
    v = float(np.float32(value))
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    return f"({v.hex()}f)"


def up4(x: int) -> int:
    """``x`` rounded up to a multiple of 4 (a float4's elements)."""
    return (x + 3) // 4 * 4


def padded_global(work_items: int, local: int) -> int:
    """OpenCL 1.2 needs the global size to be a multiple of the local size; kernels guard the rest."""
    return max(1, math.ceil(work_items / local)) * local


def index_code(ndims_dims: tuple[int, ...], strides: dict[str, tuple[int, ...]], linear: str) -> str:
    """C statements turning linear index ``linear`` into one offset per tensor in ``strides``.

    Dimensions are peeled from the innermost; divisions are by constants, which compilers turn
    into multiplications.
    """
    names = list(strides)
    lines = [f"ulong r = {linear};"] + [f"ulong off_{n} = 0;" for n in names]
    for axis in reversed(range(len(ndims_dims))):
        d = ndims_dims[axis]
        if d == 1:
            continue
        lines.append(f"{{ const ulong c = r % {d}UL; r /= {d}UL;")
        for n in names:
            s = strides[n][axis]
            if s:
                lines.append(f"  off_{n} += c * {s}UL;")
        lines.append("}")
    return "\n    ".join(lines)
