"""The resampling backward descriptor: the gradient of nearest or linear resampling, as a value."""

from __future__ import annotations

import attrs

from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, algorithm, check_memory_desc, memory_desc, op_kind
from ._resampling_desc import RESAMPLING_ALGORITHMS, check_resampling


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
        check_resampling(self.alg, self.diff_src.dims, self.diff_dst.dims, self.align_corners,
                         names=("diff_src", "diff_dst"))

    @property
    def spatial(self) -> tuple[tuple[int, int], ...]:
        """``(in, out)`` size of each spatial dim: diff_src's and diff_dst's."""
        return tuple(zip(self.diff_src.dims[2:], self.diff_dst.dims[2:]))
