"""Memory objects: a descriptor bound to a device buffer of one engine."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import attrs
import numpy as np
import pyopencl as cl

from ._dtypes import from_storage, to_storage
from ._errors import ArgumentMismatchError, ClosedError
from ._memory_desc import MemoryDesc, strides_for_tag

if TYPE_CHECKING:
    from ._engine import Engine


@attrs.define(eq=False)
class Memory:
    """A tensor's storage on an engine. Create it with ``engine.memory(desc)``.

    The buffer is freed by ``release()`` (or leaving a ``with`` block), or when the object is
    garbage collected; the engine counts live buffers either way (``engine.statistics()``).
    """

    engine: Engine
    desc: MemoryDesc
    _buffer: cl.Buffer | None = attrs.field(alias="buffer", repr=False)
    _finalizer: weakref.finalize | None = attrs.field(default=None, init=False, repr=False)
    # A view keeps the memory it looks into alive and frees nothing itself.
    _viewed: Memory | None = attrs.field(default=None, alias="viewed", repr=False)

    def __attrs_post_init__(self) -> None:
        if self._viewed is None:
            self._finalizer = weakref.finalize(
                self, self.engine._actor.release_buffer, self._buffer, self.desc.nbytes
            )

    def view(self, desc: MemoryDesc) -> Memory:
        """The same buffer seen through ``desc`` (a reshape, a transposition, a reinterpretation
        of its bytes); the view must fit in the buffer. Releasing a view frees nothing."""
        if desc.nbytes > self.cl_buffer.size:
            raise ArgumentMismatchError(
                f"view {desc} needs {desc.nbytes} bytes; the memory has {self.cl_buffer.size}"
            )
        return Memory(self.engine, desc, self.cl_buffer, viewed=self)

    @property
    def cl_buffer(self) -> cl.Buffer:
        if self._buffer is None:
            raise ClosedError(f"memory {self.desc} was released")
        return self._buffer

    @property
    def released(self) -> bool:
        return self._buffer is None

    def release(self) -> None:
        """Free the device buffer now; commands already enqueued on it still complete."""
        if self._buffer is not None:
            self._buffer = None
            if self._finalizer is not None:
                self._finalizer()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    async def write(self, array: np.ndarray, *, deps=()) -> None:
        """Copy ``array`` (shape ``desc.dims``) into this memory and wait for the copy."""
        await self.engine._host_stream.write(self, array, deps=deps)

    async def to_numpy(self, *, deps=()) -> np.ndarray:
        """A new array with this memory's contents, after ``deps`` complete."""
        staging = np.empty(self.desc.span, dtype=self.desc.numpy_dtype)
        await self.engine._host_stream._read_raw(self, staging, deps)
        return from_storage(unstage(self.desc, staging), self.desc.dtype)


def _is_row_major(desc: MemoryDesc) -> bool:
    return desc.strides == strides_for_tag(desc.dims, "abcdefghijkl"[: desc.ndims])


def stage(desc: MemoryDesc, array) -> np.ndarray:
    """``array`` laid out as ``desc`` says, as a flat host array of ``desc.span`` elements."""
    array = np.asarray(array)
    if array.shape != desc.dims:
        raise ArgumentMismatchError(
            f"array has shape {array.shape}; memory {desc} expects dims {desc.dims}"
        )
    values = to_storage(array, desc.dtype)
    if _is_row_major(desc):
        return np.ascontiguousarray(values).reshape(-1)
    staging = np.zeros(desc.span, dtype=desc.numpy_dtype)
    view = np.lib.stride_tricks.as_strided(
        staging, desc.dims, tuple(s * desc.itemsize for s in desc.strides)
    )
    view[...] = values
    return staging


def unstage(desc: MemoryDesc, staging: np.ndarray) -> np.ndarray:
    """The dense ``desc.dims`` array that a flat ``staging`` copy of the memory holds."""
    if _is_row_major(desc):
        return staging.reshape(desc.dims)
    view = np.lib.stride_tricks.as_strided(
        staging, desc.dims, tuple(s * desc.itemsize for s in desc.strides), writeable=False
    )
    return np.ascontiguousarray(view)
