"""Memory objects: a descriptor bound to a device buffer of one engine."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import attrs
import numpy as np
import pyopencl as cl

from ._event import Event
from ._values import _int4
from ._values._dtypes import PACKED_TYPES, convert_input, from_storage, stored_as_bits
from ._values._errors import ArgumentMismatchError, ClosedError
from ._values._memory_desc import MemoryDesc, strides_for_tag

if TYPE_CHECKING:
    from ._engine import Engine


@attrs.define(eq=False)
class Memory:
    """A tensor's storage on an engine. Create it with ``engine.memory(desc)``.

    The buffer is freed by ``release()`` (or leaving a ``with`` block), or when the object is
    garbage collected; the engine counts live buffers either way (``engine.statistics()``). On an
    engine with a user allocator (``ocl_interop.make_engine(..., allocator=)``) the buffer then
    goes back to ``allocator.free`` with the event of its last use, once that is enqueued.
    """

    engine: Engine
    desc: MemoryDesc
    _buffer: cl.Buffer | None = attrs.field(alias="buffer", repr=False)
    _finalizer: weakref.finalize | None = attrs.field(default=None, init=False, repr=False)
    # A view keeps the memory it looks into alive and frees nothing itself.
    _viewed: Memory | None = attrs.field(default=None, alias="viewed", repr=False)

    def __attrs_post_init__(self) -> None:
        if self._viewed is None:
            assert self._buffer is not None, "a new memory holds its buffer (None only once released)"
            self._finalizer = weakref.finalize(
                self, self.engine.buffer_releaser, self._buffer, self.desc.nbytes
            )

    def view(self, desc: MemoryDesc) -> Memory:
        """The same buffer seen through ``desc`` (a reshape, a transposition, a reinterpretation
        of its bytes); the view must fit in the buffer. Releasing a view frees nothing."""
        if desc.nbytes > self.cl_buffer.size:
            raise ArgumentMismatchError(
                f"view {desc} needs {desc.nbytes} bytes; the memory has {self.cl_buffer.size}"
            )
        return Memory(self.engine, desc, self.cl_buffer, viewed=self._viewed or self)

    @property
    def cl_buffer(self) -> cl.Buffer:
        buffer = self._buffer
        if buffer is None or self.released:
            raise ClosedError(f"memory {self.desc} was released")
        return buffer

    @property
    def released(self) -> bool:
        """True once this memory, or the memory it is a view of, was released."""
        return self._buffer is None or (self._viewed is not None and self._viewed._buffer is None)

    def release(self) -> None:
        """Free the device buffer now; commands already submitted on it still complete (a user
        allocator's ``free`` gets the event after which they have)."""
        self.release_after(None)

    def release_after(self, after: Event | None) -> None:
        """``release()``; ``after``, an Event known to complete after every use of the buffer,
        spares the engine working that out (a compiled partition's temporaries)."""
        if self._buffer is not None:
            self._buffer = None
            finalizer = self._finalizer
            detached = finalizer.detach() if finalizer is not None else None
            if detached is not None:
                _, release_buffer, args, _ = detached
                release_buffer(*args, after=None if after is None else after.submission)

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    async def write(self, array: np.ndarray, *, deps=()) -> None:
        """Copy ``array`` (shape ``desc.dims``) into this memory and wait for the copy. Its
        dtype is converted by triodnn's input policy (docs/runtime.md, Inputs): floats round into float
        memory, boolean memory takes ``value != 0``, integer memory exact values only (else
        ``ArgumentMismatchError``)."""
        self._check_runtime_open("write")
        await self.engine.host_stream.write(self, array, deps=deps)

    def _check_runtime_open(self, doing: str) -> None:
        # The copy would fail on the engine's closed host stream, whose message names a stream
        # the caller never opened.
        if self.engine.host_stream.closed:
            raise ClosedError(
                f"cannot {doing} memory {list(self.desc.dims)} {self.desc.dtype} of {self.engine}: its runtime "
                "has shut down. Read results inside 'async with triodnn.open_runtime()' (to_numpy gives "
                "arrays that outlive it)"
            )

    async def to_numpy(self, *, deps=()) -> np.ndarray:
        """A new array with this memory's contents, after ``deps`` complete."""
        self._check_runtime_open("read")
        if self.desc.dtype in PACKED_TYPES:  # the buffer's nibbles, unpacked to one a value
            packed = np.empty(self.desc.nbytes, dtype=np.uint8)
            await self.engine.host_stream.read_bytes(self, packed, deps)
            return unstage(self.desc, _int4.unpack(packed, self.desc.span, self.desc.dtype))
        staging = np.empty(self.desc.span, dtype=self.desc.numpy_dtype)
        await self.engine.host_stream.read_bytes(self, staging, deps)
        return from_storage(unstage(self.desc, staging), self.desc.dtype)


def _is_row_major(desc: MemoryDesc) -> bool:
    return desc.strides == strides_for_tag(desc.dims, "abcdefghijkl"[: desc.ndims])


def _reads_directly(desc: MemoryDesc) -> bool:
    """Whether ``Stream.read`` copies memory of ``desc`` straight into a numpy array: row-major
    and of a numpy dtype (bf16 and the f8 types need ``to_numpy``'s conversion)."""
    return _is_row_major(desc) and not stored_as_bits(desc.dtype)


def stage(desc: MemoryDesc, array, what: str | None = None) -> np.ndarray:
    """``array`` laid out as ``desc`` says, as a flat host array of ``desc.span`` elements,
    converted by the one input policy (``_dtypes.convert_input``: floats round into float
    memory, boolean memory takes ``value != 0``, integer memory exact values only); ``what``
    names it in errors."""
    array = np.asarray(array)
    if array.shape != desc.dims:
        raise ArgumentMismatchError(
            f"array has shape {array.shape}; memory {desc} expects dims {desc.dims}"
        )
    values = convert_input(array, desc.dtype, what or f"array for memory {desc}")
    if _is_row_major(desc) and desc.dtype not in PACKED_TYPES:
        return np.ascontiguousarray(values).reshape(-1)
    staging = np.zeros(desc.span, dtype=desc.numpy_dtype)
    view = np.lib.stride_tricks.as_strided(
        staging, desc.dims, tuple(s * desc.itemsize for s in desc.strides)
    )
    view[...] = values
    if desc.dtype in PACKED_TYPES:  # one value a host byte -> two a device byte
        return _int4.pack(staging, desc.nbytes)
    return staging


def unstage(desc: MemoryDesc, staging: np.ndarray) -> np.ndarray:
    """The dense ``desc.dims`` array that a flat ``staging`` copy of the memory holds."""
    if _is_row_major(desc):
        return staging.reshape(desc.dims)
    view = np.lib.stride_tricks.as_strided(
        staging, desc.dims, tuple(s * desc.itemsize for s in desc.strides), writeable=False
    )
    return np.ascontiguousarray(view)
