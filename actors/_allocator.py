"""The allocator role of a device actor: device buffers, from ``cl.Buffer`` or a caller's
``ocl_interop.Allocator``, counted while live; a caller's buffers go back to its ``free`` after
their last use.
"""

from __future__ import annotations

import ctypes
import threading
import warnings

import attrs
import numpy as np
import pyopencl as cl
import trio

from .._values._errors import ExecutionError, InvalidArgumentError, OutOfMemoryError
from ._health import DeviceHealth
from ._submission import Submission, execution_status

_COMPLETE = cl.command_execution_status.COMPLETE
_OOO = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
# A buffer kernels read and write and the host copies both ways: none of these flags.
_RESTRICTING_FLAGS = (
    cl.mem_flags.READ_ONLY | cl.mem_flags.WRITE_ONLY | cl.mem_flags.HOST_NO_ACCESS
    | cl.mem_flags.HOST_READ_ONLY | cl.mem_flags.HOST_WRITE_ONLY
)


class SvmBuffer(cl.SVM):
    """A caller's shared-virtual-memory allocation (any ``cl.SVMPointer``: ``cl.SVMAllocation``,
    an ``SVMPool``'s, ``cl.SVM``) as triodnn's kernels and copies take it.

    It is itself an ``SVMPointer`` over the same address, so ``kernel.set_args`` passes it with
    ``clSetKernelArgSVMPointer`` and copies go through ``clEnqueueSVMMemcpy``; ``int_ptr`` (the
    address) stands where a ``cl.Buffer``'s handle does, as the key of argument caching,
    aliasing and use tracking. ``allocation`` is the caller's object, handed back to its
    ``free``. SVM has no sub-buffers, and triodnn makes none: every view starts at offset 0.
    """

    def __init__(self, allocation: cl.SVMPointer, nbytes: int, context: cl.Context) -> None:
        # cl.SVM wraps a buffer-protocol object: a bytes view at the allocation's address (its
        # contents are never touched from the host; coarse-grained SVM would need a map).
        view = (ctypes.c_ubyte * nbytes).from_address(allocation.svm_ptr)
        super().__init__(view)
        self.nbytes = nbytes
        self.allocation = allocation
        self.int_ptr = allocation.svm_ptr
        self.context = context
        self.flags = cl.mem_flags.READ_WRITE

    def __repr__(self) -> str:
        return f"SvmBuffer({type(self.allocation).__name__} at {self.int_ptr:#x}, {self.size} bytes)"


def device_has_svm(device: cl.Device) -> bool:
    """Coarse-grained SVM buffers, the least an SVM-capable OpenCL 2.0+ device offers."""
    try:
        capabilities = device.svm_capabilities
    except (cl.Error, AttributeError):  # OpenCL 1.2 devices have no such query
        return False
    return bool(capabilities & cl.device_svm_capabilities.COARSE_GRAIN_BUFFER)


@attrs.define(eq=False)
class UserAllocation:
    """A buffer from a caller's allocator, not yet handed back to its ``free``, and the submitted
    commands that may still use it (``note_uses``), pruned of finished ones as it grows."""

    buffer: cl.Buffer | SvmBuffer
    nbytes: int
    uses: list = attrs.field(factory=list)
    last: Submission | None = None  # the most recent use, even when pruned
    after: Submission | None = None  # a submission the owner says completes after every use
    prune_at: int = 16

    def note(self, submission) -> None:
        self.last = submission
        self.uses.append(submission)
        if len(self.uses) >= self.prune_at:
            self.uses = [u for u in self.uses if _may_be_running(u)]
            self.prune_at = max(16, 2 * len(self.uses))


def new_buffer(context: cl.Context, nbytes: int) -> cl.Buffer:
    """A read-write device buffer: every ``cl.Buffer`` triodnn allocates itself comes from here
    (the fault-injection tests replace it to play a device out of memory)."""
    return cl.Buffer(context, cl.mem_flags.READ_WRITE, nbytes)


# Codes with which a driver refuses an allocation for want of memory (the others are faults).
_OUT_OF_MEMORY = {
    cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE, cl.status_code.OUT_OF_HOST_MEMORY,
    cl.status_code.OUT_OF_RESOURCES,
}


def _allocation_failed(nbytes: int, health: DeviceHealth, exc: cl.Error) -> Exception:
    """The typed error of a ``cl.Buffer`` the driver refused; the context is probed after it
    (a lost device refuses allocations too)."""
    code = exc.code
    health.suspect(f"an allocation of {nbytes} bytes failed: {exc}")
    if code in _OUT_OF_MEMORY or isinstance(exc, cl.MemoryError):
        return OutOfMemoryError(f"the device could not allocate a buffer of {nbytes} bytes: {exc}")
    return ExecutionError(f"allocating a buffer of {nbytes} bytes failed: {exc}")


def _may_be_running(submission) -> bool:
    """Not known to be finished: waiting to be enqueued, or enqueued and not complete."""
    if submission.native is None:
        return submission.failure is None
    return execution_status(submission.native) > _COMPLETE


# Buffers of user allocators not yet freed, by cl_mem handle (process-wide: a stream of any engine
# on the context may use them). Streams report every command's buffers to ``note_uses``.
_user_allocations: dict[int, UserAllocation] = {}


def note_uses(buffers, submission) -> None:
    """Record ``submission`` as a use of each of ``buffers`` that a user allocator made (a
    dictionary test when no engine has an allocator)."""
    if _user_allocations:
        for buffer in buffers:
            record = _user_allocations.get(buffer.int_ptr)
            if record is not None:
                record.note(submission)


class DeviceAllocator:
    """Buffers of one device in one context: ``cl.Buffer``s, or the caller's allocator's
    (``user``, an ``ocl_interop.Allocator`` with ``allocate`` and ``free`` callables)."""

    def __init__(self, device: cl.Device, context: cl.Context, user=None, *,
                 health: DeviceHealth | None = None) -> None:
        self.device = device
        self.context = context
        self.user = user
        self.health = health if health is not None else DeviceHealth(context, device, device.name.strip())
        self.max_alloc_bytes = int(device.max_mem_alloc_size)
        self.alignment = max(1, int(device.mem_base_addr_align) // 8)
        self._release_queue: cl.CommandQueue | None = None
        self._map_queue: cl.CommandQueue | None = None  # maps pinned host arrays
        self._nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: int | None = None
        self.live_buffers = 0
        self.live_bytes = 0

    def run_frees_in(self, nursery: trio.Nursery | None) -> None:
        """Run the frees that wait for a use's enqueue in ``nursery`` (the device actor's, from
        its trio thread); None once it has closed."""
        if nursery is not None:
            self._token = trio.lowlevel.current_trio_token()
            self._thread = threading.get_ident()
        self._nursery = nursery

    def allocate(self, nbytes: int) -> cl.Buffer:
        """A device buffer of ``nbytes`` (from the caller's allocator when the engine has one);
        counted until ``release_buffer``."""
        if nbytes > self.max_alloc_bytes:
            raise InvalidArgumentError(
                f"a buffer of {nbytes} bytes exceeds the device's largest allocation "
                f"({self.max_alloc_bytes} bytes)"
            )
        self.health.refuse(f"a buffer of {nbytes} bytes")
        if self.user is None:
            try:
                buffer = new_buffer(self.context, nbytes)
            except cl.Error as exc:
                raise _allocation_failed(nbytes, self.health, exc) from exc
        else:
            buffer = self._user_allocate(nbytes)
            _user_allocations[buffer.int_ptr] = UserAllocation(buffer, nbytes)
        self.live_buffers += 1
        self.live_bytes += nbytes
        return buffer

    def release_buffer(self, buffer: cl.Buffer, nbytes: int, *, after=None) -> None:
        """Stop counting ``buffer``; a default buffer is freed when its last reference goes, a
        user allocator's goes back to its ``free`` once every command using it is enqueued
        (``after``: a submission that completes after every use, when the owner knows one).

        No explicit ``buffer.release()``: a submission still in a stream actor's channel holds
        the pyopencl object, and releasing it under that submission would crash the enqueue.
        Called from a finalizer, this may run in any thread.
        """
        self.live_buffers -= 1
        self.live_bytes -= nbytes
        if self.user is None:
            return
        record = _user_allocations.pop(buffer.int_ptr, None)
        if record is not None:
            record.after = after
            self._retire(record)

    def pinned_host_array(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of host memory the device copies to and from fastest: a buffer allocated
        with ``ALLOC_HOST_PTR`` (page-locked on NVIDIA), mapped once for as long as the array
        lives (unmapped when it goes). Measured on an H200, a read-back of 16 KiB into it took
        10.4 µs against 21.5 µs into pageable memory, and 34 against 76 µs for 256 KiB (copy
        out included). Host memory: not counted with the device's buffers."""
        self.health.refuse(f"a pinned host array of {nbytes} bytes")
        if self._map_queue is None:
            self._map_queue = cl.CommandQueue(self.context, self.device)
        try:
            buffer = cl.Buffer(self.context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, nbytes)
            # pyopencl's stub types the flags as one map_flags member and dtype as a numpy dtype
            # (unused-ignore: releases whose stub takes these need none).
            mapped = cl.enqueue_map_buffer(self._map_queue, buffer,
                                           cl.map_flags.READ | cl.map_flags.WRITE,  # type: ignore[arg-type, unused-ignore]
                                           0, (nbytes,), np.dtype(np.uint8), is_blocking=True)
            array: np.ndarray = mapped[0]
        except cl.Error as exc:
            raise _allocation_failed(nbytes, self.health, exc) from exc
        return array

    def scratch(self, nbytes: int) -> cl.Buffer:
        """An uncounted buffer for a build's warm-up launch (any thread): the caller's allocator's,
        checked, or a ``cl.Buffer``. Give it back with ``free_scratch``."""
        if self.user is None:
            return new_buffer(self.context, nbytes)
        return self._user_allocate(nbytes)

    def free_scratch(self, buffer: cl.Buffer, event: cl.Event | None) -> None:
        """Hand a ``scratch`` buffer back after ``event`` (a ``cl.Buffer`` just goes with its
        last reference)."""
        if self.user is not None:
            self._call_free(buffer, event)

    # User allocations go back to ``allocator.free`` with an event after which nothing uses them:
    # once every use is enqueued (a task of the actor's nursery waits for that), the one command
    # still running, a marker on a queue of the actor's waiting for several, or the last use when
    # all are complete (None when nothing ever used the buffer).

    def _retire(self, record: UserAllocation) -> None:
        """Hand ``record`` back now or once its uses are enqueued; never raises (it may run in a
        finalizer or a trio ``run_sync_soon`` callback)."""
        on_trio_thread = threading.get_ident() == self._thread
        token = self._token  # set with the nursery
        if self._nursery is not None and token is not None and not on_trio_thread:
            try:
                token.run_sync_soon(self._retire, record)
                return
            except trio.RunFinishedError:
                pass  # the run has ended: its streams finished every command
        candidates = [*record.uses, record.after] if record.after is not None else record.uses
        waiting = [u for u in candidates if u.pending_submit]
        if waiting and self._nursery is not None and on_trio_thread:
            try:
                self._nursery.start_soon(self._retire_when_enqueued, record, waiting)
                return
            except RuntimeError:
                pass  # the nursery is closing: the streams have already finished
        self._free_now(record)

    async def _retire_when_enqueued(self, record: UserAllocation, waiting: list) -> None:
        with trio.CancelScope(shield=True):  # stream actors settle every submission, even cancelled
            for submission in waiting:
                await submission.wait_submitted()
        self._free_now(record)

    def _free_now(self, record: UserAllocation) -> None:
        try:
            event = self._last_use(record)
        except cl.Error:
            # The marker could not be enqueued (rare): a thread waits for the uses, then frees.
            running = [u.native for u in record.uses if u.native is not None]

            def wait_then_free() -> None:
                try:
                    cl.wait_for_events(running)
                except cl.Error:
                    pass  # failed commands are over too
                self._call_free(record.buffer, running[-1])

            if running:
                threading.Thread(target=wait_then_free, name="triodnn-allocator-free", daemon=True).start()
                return
            event = None
        self._call_free(record.buffer, event)

    def _last_use(self, record: UserAllocation) -> cl.Event | None:
        after = record.after
        if after is not None and after.native is not None:
            return after.native
        running = [u.native for u in record.uses if u.native is not None
                   and execution_status(u.native) > _COMPLETE]
        if not running:
            last = record.last
            return last.native if last is not None else None
        if len(running) == 1:
            return running[0]
        if self._release_queue is None:
            ooo = self.device.queue_properties & _OOO
            self._release_queue = (
                cl.CommandQueue(self.context, self.device, _OOO) if ooo else cl.CommandQueue(self.context, self.device)
            )
        marker = cl.enqueue_marker(self._release_queue, wait_for=running)
        self._release_queue.flush()
        return marker

    def _user_allocate(self, nbytes: int):
        """A buffer of at least ``nbytes`` from the caller's allocator, checked."""
        allocate = self.user.allocate
        try:
            buffer = self._adopt(allocate(nbytes, self.alignment, self.device, self.context))
        except (MemoryError, cl.MemoryError) as exc:  # the caller's allocator is out of memory
            raise OutOfMemoryError(
                f"allocator.allocate({nbytes}, {self.alignment}, ...) raised {type(exc).__name__}: {exc}"
            ) from exc
        except Exception as exc:
            raise ExecutionError(
                f"allocator.allocate({nbytes}, {self.alignment}, ...) raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        problem = self._check_user_buffer(buffer, nbytes)
        if problem is not None:
            if buffer is not None and not (
                isinstance(buffer, (cl.Buffer, SvmBuffer)) and buffer.int_ptr in _user_allocations
            ):
                self._call_free(buffer, None)  # the allocation is the caller's again
            raise InvalidArgumentError(f"allocator.allocate({nbytes}, ...) returned {problem}")
        return buffer

    def _adopt(self, allocation):
        """``allocation`` as triodnn uses it: a ``cl.Buffer`` as is, an SVM pointer wrapped in
        an ``SvmBuffer`` when the device has SVM; anything else is returned unchanged (and
        refused by the check)."""
        if isinstance(allocation, cl.SVMPointer) and not isinstance(allocation, SvmBuffer) \
                and allocation.size is not None and device_has_svm(self.device):
            return SvmBuffer(allocation, allocation.size, self.context)
        return allocation

    def _check_user_buffer(self, buffer, nbytes: int) -> str | None:
        if isinstance(buffer, SvmBuffer):
            # An SVM pointer carries neither its context nor its flags: they are the caller's word.
            if buffer.nbytes < nbytes:
                return f"an SVM allocation of {buffer.nbytes} bytes, too small"
            if buffer.int_ptr in _user_allocations:
                return "an SVM allocation triodnn still holds (returned earlier and not freed yet)"
            return None
        if not isinstance(buffer, cl.Buffer):
            if isinstance(buffer, cl.SVMPointer) and buffer.size is None:
                return "an SVM pointer of unknown size (return a cl.SVMAllocation)"
            if isinstance(buffer, cl.SVMPointer):
                return (f"an SVM allocation, but {self.device.name.strip()} has no SVM "
                        "(return a pyopencl.Buffer)")
            return f"{type(buffer).__name__}, expected a pyopencl.Buffer or an SVM allocation"
        try:
            context = buffer.context.int_ptr
        except cl.Error:
            # Intel's CPU runtime refuses to retain the context of a buffer whose context object
            # its creator released (PoCL and NVIDIA keep it alive with its buffers): not ours.
            context = None
        if context != self.context.int_ptr:
            return "a buffer of another OpenCL context than the engine's"
        if buffer.size < nbytes:
            return f"a buffer of {buffer.size} bytes, too small"
        if buffer.flags & _RESTRICTING_FLAGS:
            return (f"a buffer with flags {buffer.flags:#x}; kernels read and write it and the "
                    "host copies both ways (READ_WRITE, no READ_ONLY/WRITE_ONLY/HOST_* flags)")
        if buffer.int_ptr in _user_allocations:
            return "a buffer triodnn still holds (returned earlier and not freed yet)"
        return None

    def _call_free(self, buffer, event: cl.Event | None) -> None:
        if isinstance(buffer, SvmBuffer):
            buffer = buffer.allocation  # the caller's own object back
        try:
            self.user.free(buffer, self.device, self.context, event)
        except Exception as exc:  # noqa: BLE001 (nobody to raise to: a finalizer, a callback, a cleanup)
            warnings.warn(
                f"allocator.free raised {type(exc).__name__}: {exc} (the buffer counts as freed)",
                RuntimeWarning, stacklevel=2,
            )
