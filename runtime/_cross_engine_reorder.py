"""The cross-engine reorder: a reorder between memories of two OpenCL contexts
(``Engine.create_reorder``), the reorder's kernel with the copies through the host around it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import numpy as np

from ._memory import Memory
from ._primitive import Primitive
from ._values._errors import (
    ArgumentMismatchError,
    CacheBlobError,
    EngineMismatchError,
    InvalidArgumentError,
    MissingArgumentError,
)
from ._values._memory_desc import MemoryDesc

if TYPE_CHECKING:
    from ._engine import Engine
    from ._event import Event
    from ._stream import Stream


@attrs.define(eq=False)
class CrossEngineReorder(Primitive):
    """A reorder from memory of ``src_engine`` to memory of ``dst_engine``, two OpenCL contexts;
    it runs on ``engine``, the executing one. Create with ``await engine.create_reorder(...)``
    and execute on a stream of ``engine``: ``stream.execute(reorder, {"src": a, "dst": b})``.

    The data goes through the host. Executing on the source side: the kernel converts into a
    temporary of the executing context, the executing stream reads it into host memory, the
    destination engine's transfer stream writes it into ``dst``, and a marker on the executing
    stream waits for that write (so an in-order stream orders later commands after it). Executing
    on the destination side: the source engine's transfer stream reads ``src``, the executing
    stream writes it into a temporary and converts it into ``dst``. A ``dst`` with gaps between
    its elements first has its bytes copied into the temporary, so the gaps keep their contents,
    as a reorder within one engine keeps them.
    """

    src_engine: Engine = attrs.field(default=None, kw_only=True)
    dst_engine: Engine = attrs.field(default=None, kw_only=True)
    # The peer engine's transfer stream: set by ``Engine.create_reorder`` before it returns this.
    _peer_stream: Stream = attrs.field(init=False, repr=False)

    @property
    def impl(self) -> str:
        return "ocl:cross_engine:" + self.spec.impl.removeprefix("ocl:")

    def copy_through(self, peer_stream: Stream) -> None:
        """Copy through ``peer_stream``, the transfer stream of the engine that does not execute:
        ``Engine.create_reorder`` opens it once the primitive exists and gives it here."""
        self._peer_stream = peer_stream

    def cache_blob(self) -> bytes:
        raise CacheBlobError(
            "a cross-engine reorder is bound to its engines' OpenCL contexts; it cannot be stored "
            "in a blob (a reorder within one engine can)"
        )

    def _memories(self, args) -> tuple[Memory, Memory]:
        """``args``' src and dst after checking them, or a typed error naming the argument."""
        if not isinstance(args, dict):
            raise InvalidArgumentError(f"args must be a dict of name -> Memory, got {type(args).__name__}")
        memories = []
        for name, engine in (("src", self.src_engine), ("dst", self.dst_engine)):
            memory = args.get(name)
            if memory is None:
                raise MissingArgumentError(f"{self.label} needs argument {name!r}")
            if not isinstance(memory, Memory):
                raise InvalidArgumentError(
                    f"argument {name!r} is {type(memory).__name__}, expected triodnn.Memory"
                )
            expected = self.desc.arg_descs[name]
            if memory.desc != expected:
                raise ArgumentMismatchError(
                    f"argument {name!r} has memory {memory.desc}; {self.label} expects {expected}"
                )
            if memory.engine.cl_context.int_ptr != engine.cl_context.int_ptr:
                raise EngineMismatchError(
                    f"argument {name!r} lives on {memory.engine}, not in the OpenCL context of "
                    f"this reorder's {name}_engine ({engine})"
                )
            memories.append(memory)
        if len(args) != 2:
            unknown = sorted(map(repr, set(args) - {"src", "dst"}))
            raise ArgumentMismatchError(f"{self.label} takes no argument {unknown[0]}; it takes src, dst")
        return memories[0], memories[1]

    def submit_across(self, stream: Stream, args, deps: tuple) -> Event:
        """Submit the copies and the kernel (see the class) on ``stream``; returns the event of
        the last step. ``Stream.execute`` hands a cross-engine reorder over to this."""
        src, dst = self._memories(args)
        here, peer = stream.engine, self._peer_stream
        descs = self.desc.arg_descs  # the reorder's src and dst
        on_src = self.src_engine.cl_context.int_ptr == self.engine.cl_context.int_ptr
        tmp = here.memory(descs["dst"] if on_src else descs["src"])
        try:
            if on_src:
                before = deps
                if not descs["dst"].is_dense:
                    kept = _host_bytes(descs["dst"])
                    fetched = peer.read_bytes(dst, kept, deps)
                    before = (*deps, stream.write_bytes(tmp, kept, (fetched,)))
                converted = stream.submit_kernel(self, self.kernel_buffers({"src": src, "dst": tmp}, here), before)
                host = _host_bytes(descs["dst"])
                read = stream.read_bytes(tmp, host, (converted,))
                written = peer.write_bytes(dst, host, (read,))
                return stream.named_marker(self.desc.label + ":cross_engine", (written,))
            host = _host_bytes(descs["src"])
            read = peer.read_bytes(src, host, deps)
            written = stream.write_bytes(tmp, host, (read,))
            return stream.submit_kernel(self, self.kernel_buffers({"src": tmp, "dst": dst}, here), (*deps, written))
        finally:
            # Only stops counting it: the submissions hold the buffer, OpenCL keeps it until
            # the commands using it have finished.
            tmp.release()


def _host_bytes(desc: MemoryDesc) -> np.ndarray:
    """Host staging for a whole buffer of ``desc`` (gaps included)."""
    return np.empty(desc.nbytes, dtype=np.uint8)
