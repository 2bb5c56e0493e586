"""Memory descriptors: the shape, data type and layout of a tensor, as a value."""

from __future__ import annotations

import math

import attrs
import numpy as np

from ._dtypes import data_type, dtype_of_numpy
from ._errors import InvalidArgumentError
from ._int4 import packed_nbytes

MAX_NDIMS = 12  # oneDNN's DNNL_MAX_NDIMS

# oneDNN's named layouts, as plain permutation tags (letters outermost first).
_TAG_ALIASES = {
    "x": "a", "nc": "ab", "cn": "ba", "ncw": "abc", "nwc": "acb", "nchw": "abcd", "nhwc": "acdb",
    "chwn": "bcda", "ncdhw": "abcde", "ndhwc": "acdeb", "oi": "ab", "io": "ba", "oiw": "abc",
    "wio": "cba", "oihw": "abcd", "hwio": "cdba", "ihwo": "bcda", "oidhw": "abcde", "dhwio": "cdeba",
    "tnc": "abc", "ntc": "bac",
}


def strides_for_tag(dims: tuple[int, ...], tag: str) -> tuple[int, ...]:
    """Dense strides of ``dims`` in the layout ``tag`` (``"abcd"``, ``"acdb"``, ``"nhwc"`` …)."""
    plain = _TAG_ALIASES.get(tag, tag)
    letters = "abcdefghijkl"[: len(dims)]
    if sorted(plain) != sorted(letters):
        raise InvalidArgumentError(
            f"format_tag {tag!r} does not describe a {len(dims)}-D layout "
            f"(expected a permutation of {letters!r} or a name such as 'nchw')"
        )
    strides = [0] * len(dims)
    step = 1
    for letter in reversed(plain):
        axis = letters.index(letter)
        strides[axis] = step
        step *= dims[axis]
    return tuple(strides)


def _to_dims(value) -> tuple[int, ...]:
    if isinstance(value, (int, np.integer)):
        value = (value,)
    try:
        dims = tuple(value)
    except TypeError:
        raise InvalidArgumentError(f"dims {value!r} is not a sequence of integers") from None
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in dims):
        raise InvalidArgumentError(f"dims {dims!r} must hold integers")
    return tuple(int(d) for d in dims)


def _validate_dims(instance, attribute, dims: tuple[int, ...]) -> None:
    if not 1 <= len(dims) <= MAX_NDIMS:
        raise InvalidArgumentError(f"dims {dims!r} must have 1 to {MAX_NDIMS} dimensions")
    if any(d <= 0 for d in dims):
        raise InvalidArgumentError(f"dims {dims!r} must all be positive")


def _validate_dtype(instance, attribute, dtype: str) -> None:
    data_type(dtype)


def _to_strides(value):
    if value is None or isinstance(value, str):
        return value
    try:
        strides = tuple(value)
    except TypeError:
        raise InvalidArgumentError(f"strides {value!r} is neither a sequence nor a format tag") from None
    if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in strides):
        raise InvalidArgumentError(f"strides {strides!r} must hold integers")
    return tuple(int(s) for s in strides)


@attrs.frozen(cache_hash=True)
class MemoryDesc:
    """Dims, data type and strides (in elements) of a tensor.

    ``strides`` may be omitted (dense row-major), given per dimension, or given as a format tag
    (``"nhwc"``, ``"acdb"``); a tag is resolved to strides at construction, so two descriptors of
    one layout compare equal however they were written.
    """

    dims: tuple[int, ...] = attrs.field(converter=_to_dims, validator=_validate_dims)
    dtype: str = attrs.field(default="f32", validator=_validate_dtype)
    strides: tuple[int, ...] = attrs.field(default=None, converter=_to_strides)
    # Worked out once: the request path asks for it several times a request, and computing it
    # took 2.3 µs (timeit, this 2-core VM).
    _nbytes: int = attrs.field(init=False, default=0, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.strides is None:
            strides = strides_for_tag(self.dims, "abcdefghijkl"[: len(self.dims)])
        elif isinstance(self.strides, str):
            strides = strides_for_tag(self.dims, self.strides)
        else:
            strides = self.strides
            self._validate_strides(strides)
        # Frozen classes resolve derived fields through object.__setattr__, as attrs documents.
        object.__setattr__(self, "strides", strides)
        span = 1 + sum(s * (d - 1) for s, d in zip(strides, self.dims))
        kind = data_type(self.dtype)
        object.__setattr__(self, "_nbytes", packed_nbytes(span) if kind.packed else span * kind.itemsize)

    def _validate_strides(self, strides: tuple[int, ...]) -> None:
        if len(strides) != len(self.dims):
            raise InvalidArgumentError(
                f"strides {strides!r} has {len(strides)} entries for dims {self.dims!r} "
                f"of {len(self.dims)}"
            )
        if any(s < 0 for s in strides):
            raise InvalidArgumentError(f"strides {strides!r} must be non-negative")
        # Sorted by stride, each dimension must step over the whole extent of the inner ones;
        # otherwise two indices would share an address.
        extent = 0
        for s, d in sorted((s, d) for s, d in zip(strides, self.dims) if d > 1):
            if s <= extent:
                raise InvalidArgumentError(
                    f"strides {strides!r} overlap for dims {self.dims!r}: "
                    f"stride {s} does not step past an inner extent of {extent + 1} elements"
                )
            extent += s * (d - 1)

    @property
    def ndims(self) -> int:
        return len(self.dims)

    @property
    def nelems(self) -> int:
        return math.prod(self.dims)

    @property
    def itemsize(self) -> int:
        return data_type(self.dtype).itemsize

    @property
    def span(self) -> int:
        """Elements from the first to one past the last addressed, padding included."""
        return 1 + sum(s * (d - 1) for s, d in zip(self.strides, self.dims))

    @property
    def nbytes(self) -> int:
        """Bytes a buffer needs to hold this tensor (s4/u4: packed, in whole words, ``_int4``)."""
        return self._nbytes

    @property
    def numpy_dtype(self) -> np.dtype:
        return data_type(self.dtype).numpy

    @property
    def is_dense(self) -> bool:
        return self.span == self.nelems

    @classmethod
    def like(cls, array: np.ndarray) -> MemoryDesc:
        """A dense row-major descriptor with the shape and dtype of ``array``."""
        return cls(tuple(array.shape), dtype_of_numpy(array.dtype))

    def __str__(self) -> str:
        dims = "x".join(map(str, self.dims))
        strides = ":".join(map(str, self.strides))
        return f"{self.dtype}:{dims}:s{strides}"
