"""Number fields of descriptors: finite floats, and the key under which they compare."""

from __future__ import annotations

import math

from ._errors import InvalidArgumentError


def finite_float(name: str):
    """An attrs converter: ``float(value)``, or ``InvalidArgumentError`` naming ``name`` when the
    value is not a number or not finite (a NaN or inf parameter would bake a meaningless kernel)."""

    def convert(value) -> float:
        if isinstance(value, bool):
            raise InvalidArgumentError(f"{name} {value!r} is not a number")
        try:
            result = float(value)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"{name} {value!r} is not a number") from None
        if not math.isfinite(result):
            raise InvalidArgumentError(f"{name} {value!r} must be finite")
        return result

    return convert


def float_key(value: float) -> tuple[float, bool]:
    """Equality and hash key of a float parameter: -0.0 and 0.0 bake different kernel literals
    (x * alpha keeps the sign of zero), so they are different descriptors."""
    return (value, math.copysign(1.0, value) < 0)
