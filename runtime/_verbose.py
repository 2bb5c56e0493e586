"""Verbose lines in oneDNN's style, on stdout, when ``TRIODNN_VERBOSE`` is 1 or more.

Level 1 prints a line per primitive creation:

    triodnn_verbose,primitive,create:cache_miss,cpu:0,eltwise,ocl:flat:v16l16,src:f32:1024:s1 dst:f32:1024:s1,alg:relu alpha:0 beta:0,212.451

(how it was found, engine, kind, implementation, memory descriptors, attributes, milliseconds).
Level 2 adds a line per execution, with the device time from OpenCL profiling (streams opened at
level 2 record it), printed when the command completes:

    triodnn_verbose,primitive,exec,cpu:0,eltwise,ocl:flat:v16l16,src:f32:1024:s1 dst:f32:1024:s1,alg:relu alpha:0 beta:0,0.021

Creation lines read the variable each time; streams read it when they open.
"""

from __future__ import annotations

import os
import sys

ENV = "TRIODNN_VERBOSE"


def level() -> int:
    try:
        return int(os.environ.get(ENV, "0") or 0)
    except ValueError:
        return 0


def _descs(desc) -> str:
    return " ".join(f"{name}:{md}" for name, md in desc.arg_descs.items())


def _is_memory(value) -> bool:
    from ._values._memory_desc import MemoryDesc

    if isinstance(value, tuple):
        return bool(value) and all(isinstance(v, MemoryDesc) for v in value)
    return isinstance(value, MemoryDesc)


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ":".join(_format(v) for v in value)
    return str(value)


def _attrs(desc) -> str:
    """Every descriptor field but its memory descriptors (listed apart), comma-free."""
    from .kernels import _post_ops

    fields = getattr(type(desc), "__attrs_attrs__", ())
    values = ((f.name, getattr(desc, f.name)) for f in fields)
    return " ".join(
        f"{name}:{_post_ops.describe(value) if name == 'post_ops' else _format(value)}"
        for name, value in values
        if value is not None and not _is_memory(value) and not (name == "post_ops" and value == ())
    )


def primitive_created(how: str, engine, primitive, seconds: float) -> None:
    if level() < 1:
        return
    print(
        f"triodnn_verbose,primitive,create:{how},{engine.kind}:{engine.index},{primitive.kind},"
        f"{primitive.impl},{_descs(primitive.desc)},{_attrs(primitive.desc)},{seconds * 1e3:.3f}",
        file=sys.stdout,
        flush=True,
    )


async def report_execution(engine, primitive, event) -> None:
    """Print ``primitive``'s exec line once ``event`` completes (a task of the runtime's nursery)."""
    try:
        await event.wait()
        device_ms = f"{event.profiling.duration_ns / 1e6:.3f}"
    except Exception as exc:  # the command failed; the line says so instead of a time
        device_ms = f"failed:{type(exc).__name__}"
    print(
        f"triodnn_verbose,primitive,exec,{engine.kind}:{engine.index},{primitive.kind},"
        f"{primitive.impl},{_descs(primitive.desc)},{_attrs(primitive.desc)},{device_ms}",
        file=sys.stdout,
        flush=True,
    )
