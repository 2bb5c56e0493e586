"""The typed errors triodnn raises.

A small hierarchy: catch ``TriodnnError`` for everything, or one branch. Argument errors also
derive from ``ValueError`` so code written against numpy conventions keeps working. Messages name
the offending argument and its value.
"""

from __future__ import annotations


class TriodnnError(Exception):
    """Base of every error triodnn raises on purpose."""

    def __reduce__(self):
        # Rebuilt by calling the class, as BaseException's reduce does. Stated here because
        # tblib, which Dask installs for every exception class, rebuilds a class that has no
        # __reduce__ of its own by ``cls.__new__(cls)``, and MemoryError's __new__ refuses
        # OutOfMemoryError: a device out of memory in a Dask worker failed to reach the client.
        return (type(self), self.args, self.__dict__ or None)


class InvalidArgumentError(TriodnnError, ValueError):
    """An argument is malformed: bad dims, dtype, strides, algorithm, flags."""


class MissingArgumentError(InvalidArgumentError):
    """An execution argument a primitive needs was not passed."""


class ArgumentMismatchError(InvalidArgumentError):
    """An argument is well formed but does not match what the primitive or stream expects."""


class CacheBlobError(InvalidArgumentError):
    """A cache blob is corrupt, or was made by another triodnn version or for another device."""


class EngineNotFoundError(TriodnnError, LookupError):
    """No OpenCL device matches the requested engine kind and index."""


class EngineMismatchError(TriodnnError):
    """Objects of two engines (OpenCL contexts or devices) were mixed in one call."""


class UnsupportedError(TriodnnError):
    """The request is valid but this device or version of triodnn cannot serve it."""


class BuildError(TriodnnError):
    """An OpenCL program failed to build; the message carries the build log."""


class ExecutionError(TriodnnError):
    """A submitted command failed on the device, or could not be submitted."""


class DependencyError(ExecutionError):
    """A command did not run because one of its dependencies failed."""


class DeviceLostError(ExecutionError):
    """An engine's device stopped working (a kernel fault on NVIDIA breaks its context for
    good): after a command failed, a probe command failed too. Every later submission,
    allocation and primitive creation on that engine raises this at the call; other engines and
    the runtime go on. The message names the failure that was first seen."""


class OutOfMemoryError(ExecutionError, MemoryError):
    """The device (or the caller's allocator) could not allocate a buffer, or the driver would
    not open another context. Nothing was counted or kept; smaller requests, or the same one
    after buffers or engines are released, may succeed. An ``ExecutionError`` as before it had
    a type of its own (an engine pool takes that engine out of its rotation)."""


class NotSubmittedError(TriodnnError):
    """An event's OpenCL event was asked for before the stream actor enqueued its command."""


class ProfilingError(TriodnnError):
    """Profiling times were asked of an event from a stream without the profiling flag."""


class ClosedError(TriodnnError):
    """A runtime, engine or stream was used after it was closed."""


class WrongThreadError(TriodnnError, RuntimeError):
    """A call came from a thread that cannot serve it: an engine, stream or event of an open
    runtime used outside that runtime's trio run (another thread, another trio run), or a
    blocking portal used inside a trio run. A ``RuntimeError`` too, as trio's own refusals of
    such calls are."""


class InvalidGraphError(InvalidArgumentError):
    """A graph is malformed: duplicate or conflicting logical tensors, a second producer, a cycle,
    an unknown op kind or attribute, bad JSON, or an op added after partitioning."""


class ShapeInferenceError(InvalidGraphError):
    """Output shapes of an op cannot be inferred from its inputs and attributes."""


class UnusableDeviceWarning(UserWarning):
    """An OpenCL device is registered but its compiler cannot build: triodnn leaves it out.

    Raised once per device per process by discovery; the message names the device, the
    compiler's message and the fix."""


# Every class above is public as ``triodnn.<Name>``: tracebacks and reprs print that name, not
# this private module's, and pickles (Dask sends errors between processes) name it too.
for _public in (TriodnnError, InvalidArgumentError, MissingArgumentError, ArgumentMismatchError, CacheBlobError,
                EngineNotFoundError, EngineMismatchError, UnsupportedError, BuildError, ExecutionError,
                DependencyError, DeviceLostError, OutOfMemoryError, NotSubmittedError, ProfilingError, ClosedError,
                WrongThreadError, InvalidGraphError, ShapeInferenceError, UnusableDeviceWarning):
    _public.__module__ = "triodnn"
del _public
