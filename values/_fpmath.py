"""oneDNN's floating-point math modes: the implicit down-conversions a computation may make.

``strict`` makes none; ``bf16``, ``f16`` and ``tf32`` allow that type (and f32); ``any`` allows
each. A mode permits, never requires: an implementation without the lower-precision path
computes in f32, as oneDNN's do. Graphs carry one (``fpmath_mode``); a matmul descriptor
carries its graph's, or its caller's.
"""

from __future__ import annotations

from ._errors import InvalidArgumentError

FPMATH_MODES = ("strict", "bf16", "f16", "tf32", "any")


def check_fpmath(what: str, mode: str) -> str:
    """``mode`` when it is one of ``FPMATH_MODES``, else ``InvalidArgumentError`` naming ``what``."""
    if mode not in FPMATH_MODES:
        raise InvalidArgumentError(f"{what} {mode!r} is not one of {', '.join(FPMATH_MODES)}")
    return mode


def allows(mode: str, dtype: str) -> bool:
    """Whether ``mode`` lets f32 math run in ``dtype`` ("bf16", "f16" or "tf32")."""
    return mode in (dtype, "any")
