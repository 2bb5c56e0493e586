"""What a generator returns, and the small helpers every generator shares."""

from __future__ import annotations

import math
import re

import attrs
import numpy as np


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
    """

    vector_width: int = attrs.field(validator=attrs.validators.in_((1, 2, 4, 8, 16)))
    local_size: int = attrs.field(validator=attrs.validators.gt(0))
    local_memory: int = attrs.field(default=MIN_LOCAL_MEMORY, validator=attrs.validators.ge(4096))
    split_float16_calls: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

    @property
    def name(self) -> str:
        return f"v{self.vector_width}l{self.local_size}"


def select_config(
    device_type: str, max_work_group_size: int, local_memory: int = MIN_LOCAL_MEMORY,
    split_float16_calls: bool = False,
) -> KernelConfig:
    """Pick vector width and local size from the device type (``"cpu"`` or ``"gpu"``); tiles
    fit ``local_memory`` (the device's ``CL_DEVICE_LOCAL_MEM_SIZE``)."""
    device = dict(local_memory=local_memory, split_float16_calls=split_float16_calls)
    if device_type == "cpu":
        return KernelConfig(vector_width=16, local_size=min(16, max_work_group_size), **device)
    return KernelConfig(vector_width=1, local_size=min(256, max_work_group_size), **device)


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


VECTOR_TYPES: dict[int, str] = {1: "float", 2: "float2", 4: "float4", 8: "float8", 16: "float16"}


@attrs.frozen
class KernelSpec:
    """One generated kernel: its source, entry point and launch geometry.

    ``arg_names`` lists the memory arguments in kernel-parameter order; every other value is baked
    into the source, so a spec runs as is, with buffers only.
    """

    source: str
    name: str
    arg_names: tuple[str, ...]
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    impl: str


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


def c_float(value: float) -> str:
    """An OpenCL C literal that denotes exactly ``float32(value)``."""
    v = float(np.float32(value))
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    return f"({v.hex()}f)"


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
