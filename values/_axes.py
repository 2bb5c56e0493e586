"""Axis parameters of descriptors (softmax, reduction, concat, group normalization, gen_index):
an integer, negative counting from the end as numpy's, stored normalised to ``[0, ndims)`` so
``axis=-1`` and the last index make one descriptor (and one cache entry)."""

from __future__ import annotations

import operator

from ._errors import InvalidArgumentError


def axis_index(value) -> int:
    """An attrs converter: ``value`` as a Python int, ``InvalidArgumentError`` when it is none.

    operator.index accepts ints and numpy integers but not floats; bools are ints to Python and
    would silently mean axis 0 or 1, so they are refused by name."""
    if isinstance(value, bool):
        raise InvalidArgumentError(f"axis {value!r} must be an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"axis {value!r} must be an integer") from None


def to_axis(value, ndims: int, name: str) -> int:
    """``value`` (``axis_index``) normalised to ``[0, ndims)``; ``InvalidArgumentError``
    "axis {value} is out of range for {name}" outside ``[-ndims, ndims)``. ``name`` says what the
    axis indexes, e.g. ``f"dst dims {dims}"`` or ``f"src of {ndims} dimensions {dims}"``."""
    axis = axis_index(value)
    if not -ndims <= axis < ndims:
        raise InvalidArgumentError(f"axis {axis} is out of range for {name}")
    return axis % ndims
