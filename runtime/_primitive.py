"""Primitives: a compiled operation on one engine, executed through streams."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import pyopencl as cl

from ._values._errors import (
    ArgumentMismatchError,
    EngineMismatchError,
    InvalidArgumentError,
    MissingArgumentError,
)
from ._memory import Memory
from .kernels import KernelSpec

if TYPE_CHECKING:
    from ._engine import Engine


@attrs.define(eq=False)
class Primitive:
    """An operation compiled for one engine. Create with ``await engine.create_primitive(desc)``."""

    engine: Engine
    desc: object
    spec: KernelSpec = attrs.field(repr=False)
    _kernel: cl.Kernel = attrs.field(alias="kernel", repr=False)
    build_seconds: float = 0.0
    _entry: object = attrs.field(default=None, alias="entry", repr=False)  # its PrimitiveImpl

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
        from . import _cache_blob
        from ._values._errors import CacheBlobError
        from ._version import __version__

        if not _cache_blob.serializable(self._entry.key):
            raise CacheBlobError(f"{type(self.desc).__name__} descriptors cannot be stored in a blob")
        return _cache_blob.dump([self._entry], self._entry.key.device, __version__)

    def _buffers(self, args, engine: Engine) -> tuple[cl.Buffer, ...]:
        """The kernel's buffer arguments in order, after checking every passed Memory."""
        if not isinstance(args, dict):
            raise InvalidArgumentError(f"args must be a dict of name -> Memory, got {type(args).__name__}")
        expected = self.desc.arg_descs
        buffers = []
        for name in self.spec.arg_names:
            memory = args.get(name)
            if memory is None:
                raise MissingArgumentError(f"{self.label} needs argument {name!r}")
            if not isinstance(memory, Memory):
                raise InvalidArgumentError(
                    f"argument {name!r} is {type(memory).__name__}, expected triodnn.Memory"
                )
            if not (memory.desc is expected[name] or memory.desc == expected[name]):
                raise ArgumentMismatchError(
                    f"argument {name!r} has memory {memory.desc}; {self.label} expects {expected[name]}"
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
            unknown = sorted(set(args) - set(expected))
            raise ArgumentMismatchError(
                f"{self.label} takes no argument {unknown[0]!r}; it takes {', '.join(expected)}"
            )
        return tuple(buffers)
