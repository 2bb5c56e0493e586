"""The binary descriptor: ``dst = alg(src0, src1)`` with numpy broadcasting, as a value."""

from __future__ import annotations

import attrs

from . import _post_ops
from ._algorithms import BINARY_ALGORITHMS, TERNARY, broadcast_dims
from ._errors import ArgumentMismatchError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, algorithm, check_memory_desc, memory_desc, op_kind


@op_kind
@attrs.frozen(cache_hash=True)
class BinaryDesc(OpDesc):
    """``dst = alg(src0, src1)`` with numpy broadcasting; ``dst`` defaults to the dense broadcast shape.

    ``select`` (oneDNN's binary_select, ``dst = src2 ? src0 : src1``) takes its condition as the
    keyword ``src2``, broadcast like the sources; the other algorithms refuse one. Keyword-only so
    that ``BinaryDesc(alg, src0, src1, dst)`` keeps its meaning.

    Every argument may have any data type, the math f32: a comparison writes 1 or 0 into a dst of
    any type (``boolean`` included), select's condition may be boolean, u8, s32 or f32. ``dst``
    defaults to src0's data type.
    """

    alg: str = attrs.field(validator=algorithm("a binary", BINARY_ALGORITHMS))
    src0: MemoryDesc = attrs.field(validator=memory_desc("src0"))
    src1: MemoryDesc = attrs.field(validator=memory_desc("src1"))
    dst: MemoryDesc = attrs.field(default=None)
    src2: MemoryDesc | None = attrs.field(default=None, kw_only=True)
    post_ops: tuple = attrs.field(default=(), kw_only=True, eq=_post_ops.eq_key)

    kind = "binary"
    ARGS = (Arg("src0"), Arg("src1"), Arg("src2", optional=True), Arg("dst", output=True))

    def __attrs_post_init__(self) -> None:
        sources = {"src0": self.src0, "src1": self.src1}
        if self.alg in TERNARY:
            if self.src2 is None:
                raise ArgumentMismatchError(f"{self.alg} needs src2, the condition")
            check_memory_desc("src2", self.src2)
            sources["src2"] = self.src2
        elif self.src2 is not None:
            raise ArgumentMismatchError(
                f"{self.alg} takes no src2 (only {', '.join(sorted(TERNARY))} does)"
            )
        try:
            dims = broadcast_dims(*(md.dims for md in sources.values()))
        except ValueError:
            shapes = " and ".join(f"{name} dims {md.dims}" for name, md in sources.items())
            raise ArgumentMismatchError(f"{shapes} do not broadcast") from None
        if self.dst is None:
            self._set("dst", MemoryDesc(dims, self.src0.dtype))
        check_memory_desc("dst", self.dst)
        if self.dst.dims != dims:
            of = " and ".join(f"{name} {md.dims}" for name, md in sources.items())
            raise ArgumentMismatchError(
                f"dst dims {self.dst.dims} differ from the broadcast of {of}, which is {dims}"
            )
        self._set("post_ops", _post_ops.check(self.post_ops, self.dst.dims))
