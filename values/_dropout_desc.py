"""The dropout descriptor: oneDNN's Philox-driven dropout (Graph API's Dropout op), as a value."""

from __future__ import annotations

import attrs

from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._op_desc import ANY_STORAGE, Arg, OpDesc, check_memory_desc, memory_desc, op_kind

_S64 = ("s64",)
_SCALAR_WHY = "oneDNN's dropout seed and offset are s64 (64-bit Philox key and counter)"


def _optional_mask(instance, attribute, value) -> None:
    if value is not None:
        check_memory_desc("mask", value)


def _one_element(name: str, md: MemoryDesc) -> None:
    check_memory_desc(name, md)
    count = 1
    for d in md.dims:
        count *= d
    if count != 1:
        raise ArgumentMismatchError(f"{name} holds one value; its dims {md.dims} hold {count}")


@op_kind
@attrs.frozen(cache_hash=True)
class DropoutDesc(OpDesc):
    """``mask = philox(seed, offset, i) > p * (2**32 - 1)``, ``dst = mask ? src / (1 - p) : 0``.

    ``seed`` and ``offset`` are one-element s64 tensors, ``probability`` a one-element f32
    tensor (p, clamped to [0, 1] as oneDNN does): all three are read on the device at each
    execution, so one primitive serves every seed. ``i`` is an element's row-major index in
    src's dims (for a dense dst, oneDNN's dst offset). ``dst`` defaults to src's layout and
    type; ``mask`` (u8, 1 kept, 0 dropped) is written only when given. Any storage for src and
    dst, f32 math.
    """

    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    seed: MemoryDesc = attrs.field(validator=memory_desc("seed"))
    offset: MemoryDesc = attrs.field(validator=memory_desc("offset"))
    probability: MemoryDesc = attrs.field(validator=memory_desc("probability"))
    dst: MemoryDesc = attrs.field(default=None)
    mask: MemoryDesc | None = attrs.field(default=None, validator=_optional_mask)

    kind = "dropout"
    ARGS = (
        Arg("src"),
        Arg("seed", dtypes=_S64, why=_SCALAR_WHY),
        Arg("offset", dtypes=_S64, why=_SCALAR_WHY),
        Arg("probability", dtypes=("f32",), why="oneDNN's dropout probability is f32"),
        Arg("dst", output=True, dtypes=ANY_STORAGE),
        Arg("mask", output=True, optional=True, dtypes=("u8",), why="oneDNN's dropout mask is u8"),
    )

    def __attrs_post_init__(self) -> None:
        for name in ("seed", "offset", "probability"):
            _one_element(name, getattr(self, name))
        self._dst_like_src(self.src, self.dst)
        if self.mask is not None and self.mask.dims != self.src.dims:
            raise ArgumentMismatchError(f"mask dims {self.mask.dims} differ from src dims {self.src.dims}")
        if self.seed.dtype != "s64" or self.offset.dtype != "s64":
            raise InvalidArgumentError(
                f"seed and offset must be s64, got {self.seed.dtype!r} and {self.offset.dtype!r}"
            )
        if self.probability.dtype != "f32":
            raise InvalidArgumentError(f"probability must be f32, got {self.probability.dtype!r}")
        if self.mask is not None and self.mask.dtype != "u8":
            raise InvalidArgumentError(f"mask must be u8, got {self.mask.dtype!r}")
