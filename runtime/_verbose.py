"""Verbose lines in oneDNN's style, on stdout, when ``TRIODNN_VERBOSE`` is 1 or more.

Level 1 prints a line per primitive creation (one line, wrapped here after the implementation):

    triodnn_verbose,primitive,create:cache_miss,cpu:0,eltwise,ocl:flat:v16l16,
        src:f32:1024:s1 dst:f32:1024:s1,alg:relu alpha:0 beta:0,212.451

(how it was found, engine, kind, implementation, memory descriptors, attributes, milliseconds).
Level 2 adds a line per execution, with the device time from OpenCL profiling (streams opened at
level 2 record it), printed when the command completes:

    triodnn_verbose,primitive,exec,cpu:0,eltwise,ocl:flat:v16l16,src:f32:1024:s1 dst:f32:1024:s1,alg:relu alpha:0 beta:0,0.021

Creation lines read the variable each time; streams read it when they open (a stream opened at
level 2 profiles and prints its exec lines for good). ``VERBOSE``, the instrument doing this
(``triodnn._instruments``), is installed by every ``open_runtime()``.
"""

from __future__ import annotations

import os
import sys

from ._instruments import Instrument
from ._values._errors import ProfilingError
from ._values._memory_desc import MemoryDesc
from .actors import KernelLaunch
from .kernels import _post_ops

ENV = "TRIODNN_VERBOSE"


def level() -> int:
    try:
        return int(os.environ.get(ENV, "0") or 0)
    except ValueError:
        return 0


def _descs(desc) -> str:
    return " ".join(f"{name}:{md}" for name, md in desc.arg_descs.items())


def _is_memory(value) -> bool:
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
    fields = getattr(type(desc), "__attrs_attrs__", ())
    values = ((f.name, getattr(desc, f.name)) for f in fields)
    return " ".join(
        f"{name}:{_post_ops.describe(value) if name == 'post_ops' else _format(value)}"
        for name, value in values
        if value is not None and not _is_memory(value) and not (name == "post_ops" and value == ())
    )


def _line(what: str, engine, primitive, last: str) -> None:
    print(
        f"triodnn_verbose,primitive,{what},{engine.kind}:{engine.index},{primitive.kind},"
        f"{primitive.impl},{_descs(primitive.desc)},{_attrs(primitive.desc)},{last}",
        file=sys.stdout,
        flush=True,
    )


class Verbose(Instrument):
    """``TRIODNN_VERBOSE`` as an instrument: it watches no command unless a stream opened at
    level 2, so level 0 costs the command path nothing."""

    __slots__ = ()

    @property
    def needs_profiling(self) -> bool:
        return level() >= 2  # exec lines show device times

    @property
    def watches_completions(self) -> bool:
        return level() >= 2

    def primitive_created(self, engine, primitive, how: str, started: float, seconds: float) -> None:
        if level() >= 1:
            _line(f"create:{how}", engine, primitive, f"{seconds * 1e3:.3f}")

    def command_completed(self, stream, command, event, error: BaseException | None) -> None:
        """The exec line of a kernel launch (copies and markers have none)."""
        if type(command) is not KernelLaunch:
            return
        if error is not None:  # the command failed; the line says so instead of a time
            device_ms = f"failed:{type(error).__name__}"
        else:
            try:
                device_ms = f"{event.profiling.duration_ns / 1e6:.3f}"
            except ProfilingError as exc:  # a caller's queue without profiling (ocl_interop)
                device_ms = f"failed:{type(exc).__name__}"
        _line("exec", stream.engine, command.primitive, device_ms)

    def __repr__(self) -> str:
        return f"<triodnn verbose instrument, {ENV}={level()}>"


VERBOSE = Verbose()
