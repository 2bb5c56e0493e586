"""The resampling backward descriptor: the gradient of nearest or linear resampling, as a value."""

from __future__ import annotations

import attrs

from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, algorithm, check_memory_desc, memory_desc, op_kind
from ._resampling_desc import MAX_SPATIAL_DIMS, RESAMPLING_ALGORITHMS


@op_kind
@attrs.frozen(cache_hash=True)
class ResamplingBackwardDesc(OpDesc):
    """oneDNN's resampling backward: ``diff_src`` (N, C, spatial...) receives each element of
    ``diff_dst`` (N, C, spatial'...) times the weight the forward gave the source element, for
    every dst element that read it (``triodnn.kernels.resampling_bwd``). Coordinates, weights
    and ``align_corners`` (linear only) are ``ResamplingDesc``'s. Any strides and storage types,
    f32 math.
    """

    alg: str = attrs.field(validator=algorithm("a resampling", RESAMPLING_ALGORITHMS))
    diff_dst: MemoryDesc = attrs.field(validator=memory_desc("diff_dst"))
    diff_src: MemoryDesc = attrs.field()
    align_corners: bool = attrs.field(default=False, kw_only=True)

    kind = "resampling_backward"
    ARGS = (Arg("diff_dst"), Arg("diff_src", output=True))

    def __attrs_post_init__(self) -> None:
        check_memory_desc("diff_src", self.diff_src)
        src, dst = self.diff_src.dims, self.diff_dst.dims
        if not 3 <= len(src) <= 2 + MAX_SPATIAL_DIMS:
            raise ArgumentMismatchError(
                f"diff_src dims {src} must be (N, C) and 1 to {MAX_SPATIAL_DIMS} spatial dims"
            )
        if len(dst) != len(src) or dst[:2] != src[:2]:
            raise ArgumentMismatchError(
                f"diff_dst dims {dst} must keep diff_src's rank and its N and C {src[:2]} (diff_src dims {src})"
            )
        if not isinstance(self.align_corners, bool):
            raise InvalidArgumentError(f"align_corners must be a bool, got {self.align_corners!r}")
        if self.align_corners and self.alg != "linear":
            raise InvalidArgumentError(f"align_corners applies to linear resampling only, not {self.alg}")

    @property
    def spatial(self) -> tuple[tuple[int, int], ...]:
        """``(in, out)`` size of each spatial dim: diff_src's and diff_dst's."""
        return tuple(zip(self.diff_src.dims[2:], self.diff_dst.dims[2:]))
