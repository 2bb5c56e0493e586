"""The resampling descriptor: nearest or linear interpolation over the spatial dims, as a value."""

from __future__ import annotations

import attrs

from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, algorithm, check_memory_desc, memory_desc, op_kind

# oneDNN's resampling algorithms: ``linear`` is bilinear and trilinear too, by the spatial rank.
RESAMPLING_ALGORITHMS: tuple[str, ...] = ("nearest", "linear")
MAX_SPATIAL_DIMS = 3


def check_resampling(alg: str, src: tuple[int, ...], dst: tuple[int, ...], align_corners, *,
                     names: tuple[str, str] = ("src", "dst")) -> None:
    """The checks ``ResamplingDesc`` and ``ResamplingBackwardDesc`` share: (N, C) and 1 to 3
    spatial dims on both sides (``names``: the roles, as the error names them), same rank, N
    and C; ``align_corners`` a bool, for linear only."""
    s, d = names
    if not 3 <= len(src) <= 2 + MAX_SPATIAL_DIMS:
        raise ArgumentMismatchError(f"{s} dims {src} must be (N, C) and 1 to {MAX_SPATIAL_DIMS} spatial dims")
    if len(dst) != len(src) or dst[:2] != src[:2]:
        raise ArgumentMismatchError(f"{d} dims {dst} must keep {s}'s rank and its N and C {src[:2]} ({s} dims {src})")
    if not isinstance(align_corners, bool):
        raise InvalidArgumentError(f"align_corners must be a bool, got {align_corners!r}")
    if align_corners and alg != "linear":
        raise InvalidArgumentError(f"align_corners applies to linear resampling only, not {alg}")


@op_kind
@attrs.frozen(cache_hash=True)
class ResamplingDesc(OpDesc):
    """oneDNN's resampling forward: ``src`` (N, C, spatial...) resized to ``dst`` (N, C,
    spatial'...), 1 to 3 spatial dims, each output coordinate mapped back to the input by
    oneDNN's rule (``triodnn.kernels.resampling``).

    ``align_corners`` (keyword, ``linear`` only): oneDNN Graph's
    ``coordinate_transformation_mode="align_corners"``, ``x_in = x_out * (in - 1) / (out - 1)``
    instead of half-pixel centres. Any strides and storage types, f32 math.
    """

    alg: str = attrs.field(validator=algorithm("a resampling", RESAMPLING_ALGORITHMS))
    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    dst: MemoryDesc = attrs.field()
    align_corners: bool = attrs.field(default=False, kw_only=True)

    kind = "resampling"
    ARGS = (Arg("src"), Arg("dst", output=True))

    def __attrs_post_init__(self) -> None:
        check_memory_desc("dst", self.dst)
        check_resampling(self.alg, self.src.dims, self.dst.dims, self.align_corners)

    @property
    def spatial(self) -> tuple[tuple[int, int], ...]:
        """``(in, out)`` size of each spatial dim."""
        return tuple(zip(self.src.dims[2:], self.dst.dims[2:]))
