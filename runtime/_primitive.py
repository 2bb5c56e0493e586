"""Primitives: a compiled operation on one engine, executed through streams."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import pyopencl as cl

from ._memory import Memory
from ._values import _cache_blob
from ._values._errors import (
    ArgumentMismatchError,
    CacheBlobError,
    EngineMismatchError,
    InvalidArgumentError,
    MissingArgumentError,
)
from ._values._kernel_spec import KernelSpec
from ._values._keys import PrimitiveImpl
from ._values._memory_desc import MemoryDesc
from ._values._op_desc import OpDesc
from ._version import __version__
from .actors import BuiltKernel, may_overlap

if TYPE_CHECKING:
    from ._engine import Engine


@attrs.define(eq=False)
class Primitive:
    """An operation compiled for one engine. Create with ``await engine.create_primitive(desc)``."""

    engine: Engine
    desc: OpDesc
    # The actors' handle of the kernel on this engine's context (a ``BuiltKernel``): what a
    # ``KernelLaunch`` enqueues. Opaque here: only the stream actor touches its OpenCL objects.
    launch: BuiltKernel = attrs.field(repr=False)
    build_seconds: float = 0.0
    # The primitive cache's entry it was made from (what ``cache_blob`` stores).
    _entry: PrimitiveImpl = attrs.field(alias="entry", kw_only=True, repr=False)
    # (argument name, expected MemoryDesc) in kernel order, worked out at the first execution and
    # kept: ``desc.arg_descs`` builds a dict per call (1.4 µs measured), which the execute path
    # paid per call before, and which a cache hit in create_primitive (~17 µs) need not pay.
    _expected: tuple[tuple[str, MemoryDesc], ...] | None = attrs.field(default=None, init=False, repr=False)
    _overlaps: bool | None = attrs.field(default=None, init=False, repr=False)

    @property
    def overlaps(self) -> bool:
        """Whether the kernel may take a lane of its own on an out-of-order stream: it leaves
        compute units idle and runs long (``triodnn.actors._ooo_policy.may_overlap``). Worked
        out at the first use and kept."""
        overlaps = self._overlaps
        if overlaps is None:
            spec = self.launch.spec
            touched = sum(desc.nbytes for desc in self.desc.arg_descs.values())
            overlaps = self._overlaps = may_overlap(
                spec.global_size, spec.local_size, touched, self.engine.info.max_compute_units
            )
        return overlaps

    def _expected_args(self) -> tuple[tuple[str, MemoryDesc], ...]:
        descs = self.desc.arg_descs
        self._expected = tuple((name, descs[name]) for name in self.launch.spec.arg_names)
        return self._expected

    @property
    def cache_entry(self) -> PrimitiveImpl:
        """The primitive cache's entry it was made from: key, kernel, binary (what a cache blob
        stores)."""
        return self._entry

    @property
    def spec(self) -> KernelSpec:
        """The generated kernel: source, entry point, argument order, launch geometry."""
        return self.launch.spec

    @property
    def kind(self) -> str:
        return self.desc.kind

    @property
    def impl(self) -> str:
        """The implementation chosen for this device (code path, vector width, local size)."""
        return self.spec.impl

    @property
    def label(self) -> str:
        return self.desc.label

    def cache_blob(self) -> bytes:
        """This primitive's implementation as bytes, for ``engine.create_primitive_from_cache_blob``
        in this or another process, on an engine of the same device."""
        if not _cache_blob.serializable(self._entry.key):
            raise CacheBlobError(f"{type(self.desc).__name__} descriptors cannot be stored in a blob")
        # The engine's answer, the device's truth: an entry made under another configuration
        # (a GPU-shaped kernel on a CPU) records that configuration's, which a loader must not take.
        return _cache_blob.dump([self._entry], self._entry.key.device, __version__,
                                splits_float16_calls=self.engine.info.splits_float16_calls)

    def kernel_buffers(self, args, engine: Engine) -> tuple[cl.Buffer, ...]:
        """The kernel's buffer arguments in order, after checking every passed Memory against
        this primitive and ``engine``'s context: what a stream submits the kernel with."""
        if not isinstance(args, dict):
            raise InvalidArgumentError(f"args must be a dict of name -> Memory, got {type(args).__name__}")
        buffers = []
        for name, expected in self._expected or self._expected_args():
            memory = args.get(name)
            if memory is None:
                raise MissingArgumentError(f"{self.label} needs argument {name!r}")
            if not isinstance(memory, Memory):
                raise InvalidArgumentError(
                    f"argument {name!r} is {type(memory).__name__}, expected triodnn.Memory"
                )
            if not (memory.desc is expected or memory.desc == expected):
                raise ArgumentMismatchError(
                    f"argument {name!r} has memory {memory.desc}; {self.label} expects {expected}"
                )
            if memory.engine is not engine and (
                memory.engine.cl_context.int_ptr != engine.cl_context.int_ptr
            ):
                raise EngineMismatchError(
                    f"argument {name!r} lives on {memory.engine}, not in this stream's context "
                    f"({engine})"
                )
            buffers.append(memory.cl_buffer)
        if len(args) != len(buffers):
            unknown = sorted(set(args) - set(self.desc.arg_descs))
            raise ArgumentMismatchError(
                f"{self.label} takes no argument {unknown[0]!r}; it takes {', '.join(self.desc.arg_descs)}"
            )
        return tuple(buffers)
