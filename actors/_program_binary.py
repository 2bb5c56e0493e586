"""A program's device binary, read without holding the GIL.

pyopencl's ``program.binaries`` keeps the GIL through ``clGetProgramInfo``, and PoCL takes 45–75 ms
there for a program it has not cached (measured by benchmarks/bench_cache.py): every other thread,
the trio thread included, stalls that long. A ctypes call releases the GIL, so the build thread
reads the binary through the very OpenCL library pyopencl loaded; where that library cannot be
found, it falls back to ``program.binaries``.
"""

from __future__ import annotations

import ctypes
import functools

import pyopencl as cl

_CL_PROGRAM_NUM_DEVICES = 0x1162
_CL_PROGRAM_DEVICES = 0x1163
_CL_PROGRAM_BINARY_SIZES = 0x1165
_CL_PROGRAM_BINARIES = 0x1166


@functools.cache
def _opencl_library() -> ctypes.CDLL | None:
    try:
        with open("/proc/self/maps") as maps:
            paths = [line.split()[-1] for line in maps if "libOpenCL" in line and "/" in line]
    except OSError:
        return None
    if not paths:
        return None
    try:
        lib = ctypes.CDLL(paths[0])
    except OSError:
        return None
    lib.clGetProgramInfo.restype = ctypes.c_int32
    lib.clGetProgramInfo.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)
    ]
    return lib


def _info(lib: ctypes.CDLL, program: ctypes.c_void_p, param: int, size: int, buffer) -> None:
    status = lib.clGetProgramInfo(program, param, size, buffer, None)
    if status != 0:
        raise OSError(f"clGetProgramInfo({param:#x}) returned {status}")


def program_binary(program: cl.Program, device: cl.Device) -> bytes:
    """The binary of ``program`` for ``device``."""
    lib = _opencl_library()
    if lib is None:
        return program.binaries[_device_index(program, device)]
    try:
        handle = ctypes.c_void_p(program.int_ptr)
        count = ctypes.c_uint32()
        _info(lib, handle, _CL_PROGRAM_NUM_DEVICES, ctypes.sizeof(count), ctypes.byref(count))
        devices = (ctypes.c_void_p * count.value)()
        _info(lib, handle, _CL_PROGRAM_DEVICES, ctypes.sizeof(devices), devices)
        index = [d or 0 for d in devices].index(device.int_ptr)
        sizes = (ctypes.c_size_t * count.value)()
        _info(lib, handle, _CL_PROGRAM_BINARY_SIZES, ctypes.sizeof(sizes), sizes)
        buffers = [ctypes.create_string_buffer(max(1, size)) for size in sizes]
        pointers = (ctypes.c_void_p * count.value)(*(ctypes.addressof(b) for b in buffers))
        _info(lib, handle, _CL_PROGRAM_BINARIES, ctypes.sizeof(pointers), pointers)
        return buffers[index].raw[: sizes[index]]
    except (OSError, ValueError):
        return program.binaries[_device_index(program, device)]


def _device_index(program: cl.Program, device: cl.Device) -> int:
    return [d.int_ptr for d in program.devices].index(device.int_ptr)
