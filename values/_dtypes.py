"""Data types triodnn names, with their storage in numpy and OpenCL C.

``boolean`` is oneDNN Graph's boolean: one byte holding 0 or 1. Its numpy storage is ``np.bool_``
(so a numpy bool array maps to it and ``to_numpy`` gives one back); OpenCL kernels address it as
``uchar`` and store ``value != 0`` as 0 or 1 (NaN is nonzero: true). Reading it back treats any
nonzero byte as true, so memory filled by other means still reads as a valid bool array.

f16 memory needs no cl_khr_fp16: kernels touch it only through ``vload_half``/``vstore_half``,
which are core OpenCL.

f8_e4m3 and f8_e5m2 (oneDNN's 8-bit floats) are stored as ``uint8`` bit patterns, as bf16 is as
``uint16``; their user-facing values are float32 and their conversions are ``_float8``'s.

s4 and u4 (``packed``) hold two values a byte on the device (``_int4``); on the host they are int8
and uint8 arrays (``itemsize`` 1 is the host's, ``MemoryDesc.nbytes`` the device's). Only the
kinds whose kernels are written for packed stores take them (``PACKED_TYPES``).
"""

from __future__ import annotations

import attrs
import numpy as np

from . import _float8, _int4
from ._errors import ArgumentMismatchError, InvalidArgumentError


@attrs.frozen
class DataTypeInfo:
    name: str
    itemsize: int
    numpy: np.dtype  # storage type; bf16 (f8) is stored as uint16 (uint8) bit patterns, boolean as np.bool_
    opencl: str
    packed: bool = False  # two values a byte on the device (s4, u4)


DATA_TYPES: dict[str, DataTypeInfo] = {
    info.name: info
    for info in (
        DataTypeInfo("f32", 4, np.dtype(np.float32), "float"),
        DataTypeInfo("f16", 2, np.dtype(np.float16), "half"),
        DataTypeInfo("bf16", 2, np.dtype(np.uint16), "ushort"),
        DataTypeInfo("s32", 4, np.dtype(np.int32), "int"),
        # oneDNN Graph's dropout seeds and offsets. Kernels compute through f32 as for s32
        # (exact to 2**24); a copy between s64 tensors moves the bits (exact).
        DataTypeInfo("s64", 8, np.dtype(np.int64), "long"),
        DataTypeInfo("s8", 1, np.dtype(np.int8), "char"),
        DataTypeInfo("u8", 1, np.dtype(np.uint8), "uchar"),
        DataTypeInfo("boolean", 1, np.dtype(np.bool_), "uchar"),
        DataTypeInfo("f8_e4m3", 1, np.dtype(np.uint8), "uchar"),
        DataTypeInfo("f8_e5m2", 1, np.dtype(np.uint8), "uchar"),
        DataTypeInfo("s4", 1, np.dtype(np.int8), "uchar", packed=True),
        DataTypeInfo("u4", 1, np.dtype(np.uint8), "uchar", packed=True),
    )
}

_FROM_NUMPY = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.int32): "s32",
               np.dtype(np.int8): "s8", np.dtype(np.uint8): "u8", np.dtype(np.bool_): "boolean"}


# Float types whose storage is bit patterns: host copies convert them both ways.
BIT_PATTERN_FLOATS = ("bf16", *_float8.FORMATS)
FLOAT_TYPES = ("f32", "f16", *BIT_PATTERN_FLOATS)
PACKED_TYPES = tuple(_int4.PACKED)


def stored_as_bits(dtype: str) -> bool:
    """Whether memory of ``dtype`` holds bit patterns or packed nibbles that host copies must
    convert (a row-major read of any other type is the user-facing array itself)."""
    return dtype in BIT_PATTERN_FLOATS or dtype in PACKED_TYPES


def data_type(name: str) -> DataTypeInfo:
    try:
        return DATA_TYPES[name]
    except (KeyError, TypeError):
        raise InvalidArgumentError(
            f"dtype {name!r} is not a triodnn data type; known: {', '.join(DATA_TYPES)}"
        ) from None


def dtype_of_numpy(dtype: np.dtype) -> str:
    try:
        return _FROM_NUMPY[np.dtype(dtype)]
    except KeyError:
        raise InvalidArgumentError(
            f"numpy dtype {np.dtype(dtype)} has no triodnn data type; "
            f"known: {', '.join(str(d) for d in _FROM_NUMPY)}"
        ) from None


# Input policy: the numpy dtypes ``engine.from_numpy`` stores without a descriptor that have no
# triodnn data type of their own (numpy's defaults, float64 and int64 above all: int64 stays
# s32 without a descriptor, as before s64 existed; s64 memory is asked for by its descriptor).
_DEFAULT_FOR_KIND = {"f": "f32", "i": "s32", "u": "s32"}


def input_dtype_of(dtype: np.dtype) -> str:
    """The triodnn data type an array of numpy ``dtype`` is stored as when nothing else says:
    its own where it has one (float32 is f32, int8 s8 …), else f32 for floats, s32 for integers
    (``convert_input`` then checks each value fits). Anything else (complex, objects, strings)
    is refused."""
    dtype = np.dtype(dtype)
    name = _FROM_NUMPY.get(dtype)
    if name is None:
        name = _DEFAULT_FOR_KIND.get(dtype.kind)
    if name is None:
        raise ArgumentMismatchError(
            f"numpy dtype {dtype} has no triodnn data type; pass real numbers or booleans "
            f"(known: {', '.join(str(d) for d in _FROM_NUMPY)}, and float64/integers, converted)"
        )
    return name


def convert_input(array, dtype: str, what: str = "array") -> np.ndarray:
    """``array`` as the storage of triodnn ``dtype``: triodnn's one input policy, applied by
    every entry point that takes host data (``engine.from_numpy``, ``Memory.write``,
    ``Stream.write``, graph ``Tensor.from_numpy``/``write``, ``GraphRunner.run``/``map``/
    ``set_constants`` and constant inputs, handler results).

    Float targets (f32, f16, bf16, f8_e4m3, f8_e5m2; f8 through f32 first, then oneDNN's f8
    rounding) take any real or boolean array, rounded to nearest even:
    float64 -> f32 is what numpy code hands over by default, and the rounding is the one the
    kernels' own stores do, so refusing it would only make every caller write ``.astype``.
    Boolean targets take any real array as ``value != 0`` (NaN true): triodnn's boolean
    semantics everywhere, the kernels' boolean stores included (module docstring). Integer
    targets take only values they hold exactly (integral and in range): a float array into s8
    memory would otherwise truncate and wrap silently, which is never what was meant, so those
    are refused with ``ArgumentMismatchError`` naming ``what`` and the fix; s4/u4 targets check
    their 4-bit ranges even for int8/uint8 arrays (their host dtypes). A bf16 target also
    takes uint16 arrays as bit patterns, as before.
    Complex, object and string arrays are refused everywhere. Checking values costs a pass over
    the array only when its dtype is not the storage dtype and the target is an integer type.
    """
    array = np.asarray(array)
    check_input(array, dtype, what)
    return to_storage(array, dtype)


def check_input(array: np.ndarray, dtype: str, what: str = "array") -> None:
    """Raise what ``convert_input(array, dtype, what)`` would, converting nothing (the graph
    runner checks constant inputs when a run is bound, and converts them only on a cache miss)."""
    info = data_type(dtype)
    kind = array.dtype.kind
    if kind not in "biuf":
        raise ArgumentMismatchError(
            f"{what} has numpy dtype {array.dtype}; triodnn stores real numbers or booleans only "
            f"(the memory is {dtype}): convert it first"
        )
    if dtype in FLOAT_TYPES or dtype == "boolean" or (array.dtype == info.numpy and not info.packed):
        return
    # An integer target from another dtype (or a 4-bit one from any): only exact values pass.
    if array.size and kind != "b":
        bounds = np.iinfo(info.numpy)
        low, high = _int4.PACKED.get(dtype, (bounds.min, bounds.max))
        exact = (
            (kind != "f" or bool(np.isfinite(array).all()))
            and bool(array.min() >= low) and bool(array.max() <= high)
            and (kind != "f" or bool((np.trunc(array) == array).all()))
        )
        if not exact:
            raise ArgumentMismatchError(
                f"{what} ({array.dtype}) does not convert exactly to {dtype}: its values must be "
                f"integers in [{low}, {high}]; round, clip or cast it yourself "
                f"(e.g. np.clip(np.rint(a), lo, hi).astype(np.{info.numpy}))"
            )


def to_storage(array: np.ndarray, dtype: str) -> np.ndarray:
    """``array`` converted to the storage representation of ``dtype`` (bf16: rounded bit patterns;
    boolean: ``array != 0``, NaN counting as true, as the kernels' boolean stores do)."""
    if dtype == "bf16":
        if array.dtype == np.uint16:
            return array
        bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
        # Round to nearest even on the 16 dropped bits; NaNs stay NaN (quiet bit kept).
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = np.where(np.isnan(array), (bits >> 16) | 0x40, rounded)
        return rounded.astype(np.uint16)
    if dtype in _float8.FORMATS:  # values, never bit patterns: a uint8 array is numbers here
        return _float8.encode(np.asarray(array, dtype=np.float32), dtype)
    return np.asarray(array, dtype=data_type(dtype).numpy)


def from_storage(array: np.ndarray, dtype: str) -> np.ndarray:
    """The user-facing values of storage ``array`` (bf16 becomes float32, boolean stays bool)."""
    if dtype == "bf16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    if dtype in _float8.FORMATS:
        return _float8.decode(array, dtype)
    if dtype == "boolean":
        # A byte other than 0/1 (memory not written by triodnn) is not a valid numpy bool.
        return array.view(np.uint8) != 0
    return array
