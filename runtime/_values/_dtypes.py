"""Data types triodnn names, with their storage in numpy and OpenCL C.

``boolean`` is oneDNN Graph's boolean: one byte holding 0 or 1. Its numpy storage is ``np.bool_``
(so a numpy bool array maps to it and ``to_numpy`` gives one back); OpenCL kernels address it as
``uchar`` and store ``value != 0`` as 0 or 1 (NaN is nonzero: true). Reading it back treats any
nonzero byte as true, so memory filled by other means still reads as a valid bool array.

f16 memory needs no cl_khr_fp16: kernels touch it only through ``vload_half``/``vstore_half``,
which are core OpenCL.
"""

from __future__ import annotations

import attrs
import numpy as np

from ._errors import InvalidArgumentError


@attrs.frozen
class DataTypeInfo:
    name: str
    itemsize: int
    numpy: np.dtype  # storage type; bf16 is stored as uint16 bit patterns, boolean as np.bool_
    opencl: str


DATA_TYPES: dict[str, DataTypeInfo] = {
    info.name: info
    for info in (
        DataTypeInfo("f32", 4, np.dtype(np.float32), "float"),
        DataTypeInfo("f16", 2, np.dtype(np.float16), "half"),
        DataTypeInfo("bf16", 2, np.dtype(np.uint16), "ushort"),
        DataTypeInfo("s32", 4, np.dtype(np.int32), "int"),
        DataTypeInfo("s8", 1, np.dtype(np.int8), "char"),
        DataTypeInfo("u8", 1, np.dtype(np.uint8), "uchar"),
        DataTypeInfo("boolean", 1, np.dtype(np.bool_), "uchar"),
    )
}

_FROM_NUMPY = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.int32): "s32",
               np.dtype(np.int8): "s8", np.dtype(np.uint8): "u8", np.dtype(np.bool_): "boolean"}


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
    return np.asarray(array, dtype=data_type(dtype).numpy)


def from_storage(array: np.ndarray, dtype: str) -> np.ndarray:
    """The user-facing values of storage ``array`` (bf16 becomes float32, boolean stays bool)."""
    if dtype == "bf16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    if dtype == "boolean":
        # A byte other than 0/1 (memory not written by triodnn) is not a valid numpy bool.
        return array.view(np.uint8) != 0
    return array
