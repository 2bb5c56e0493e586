"""Verbose lines in oneDNN's style, on stdout, when ``TRIODNN_VERBOSE`` is 1 or more.

Level 1 prints a line per primitive creation:

    triodnn_verbose,primitive,create:cache_miss,cpu:0,eltwise,ocl:flat:v16l16,src:f32:1024:s1 dst:f32:1024:s1,alg:relu alpha:0 beta:0,212.451

(how it was found, engine, kind, implementation, memory descriptors, attributes, milliseconds).
The variable is read at each line, so it can be switched on in a running program.
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


def _attrs(desc) -> str:
    fields = getattr(type(desc), "__attrs_attrs__", ())
    parts = [
        f"{f.name}:{getattr(desc, f.name):g}" if isinstance(getattr(desc, f.name), float)
        else f"{f.name}:{getattr(desc, f.name)}"
        for f in fields
        if f.name not in desc.arg_descs
    ]
    return " ".join(parts)


def primitive_created(how: str, engine, primitive, seconds: float) -> None:
    if level() < 1:
        return
    print(
        f"triodnn_verbose,primitive,create:{how},{engine.kind}:{engine.index},{primitive.kind},"
        f"{primitive.impl},{_descs(primitive.desc)},{_attrs(primitive.desc)},{seconds * 1e3:.3f}",
        file=sys.stdout,
        flush=True,
    )
